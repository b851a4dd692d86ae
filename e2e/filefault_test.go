package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// lastLine is the last line a process wrote.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// TestSQLiteFileLostUnderWorker truncates or deletes the database file
// under a running worker: the worker stops at once with exit code 3 and one
// line saying what happened and what to do, instead of logging errors
// forever or running on in a file no other process sees.
func TestSQLiteFileLostUnderWorker(t *testing.T) {
	t.Parallel()
	faults := []struct {
		name  string
		fault func(path string) error
		says  string
	}{
		{"truncated", func(path string) error { return os.Truncate(path, 0) }, "was truncated, overwritten or corrupted while this process had it open"},
		{"deleted", os.Remove, "was deleted or replaced while this process had it open"},
	}
	commands := map[string][]string{
		"worker":       {"worker", "--poll", "50ms"},
		"serve-worker": {"serve", "--worker", "--addr", "127.0.0.1:0"},
	}
	for _, c := range faults {
		for command, args := range commands {
			t.Run(c.name+"/"+command, func(t *testing.T) {
				t.Parallel()
				db := filepath.Join(t.TempDir(), "dagrun.db")
				e := newEnv(t, db, nil)
				e.mustRun(t, "start", "order-processing", "--input", validOrder)
				w := e.spawnPlain(t, args...)
				require.Eventually(t, func() bool { return strings.Contains(w.stderr.String(), "dagrun worker started") },
					30*time.Second, 10*time.Millisecond)

				require.NoError(t, c.fault(db))
				require.Equal(t, 3, w.wait(t, 30*time.Second), w.stderr.String())
				line := lastLine(w.stderr.String())
				require.True(t, strings.HasPrefix(line, "dagrun: storage unavailable: database lost: SQLite database "), line)
				require.Contains(t, line, c.says)
				require.Contains(t, line, "stop every dagrun process using it")
			})
		}
	}
}

// TestSQLiteWriteLockHeld holds the write lock past the busy timeout, as a
// stuck sqlite3 shell would: a start fails with exit code 3 and one line
// that says the database is locked and what to do, and reads still work.
func TestSQLiteWriteLockHeld(t *testing.T) {
	t.Parallel()
	db := filepath.Join(t.TempDir(), "dagrun.db")
	e := newEnv(t, db, nil)
	e.mustRun(t, "list")

	conn, err := openSQLite(t, db).Conn(context.Background())
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	_, err = conn.ExecContext(context.Background(), "BEGIN IMMEDIATE")
	require.NoError(t, err)

	res := e.run(t, "start", "order-processing", "--input", validOrder, "--detach")
	require.Equal(t, 3, res.code, res.stderr)
	require.Empty(t, res.stdout)
	line := requireOneLine(t, res.stderr)
	require.Contains(t, line, "dagrun: storage unavailable: SQLite database")
	require.Contains(t, line, "is locked: a transaction held its write lock for longer than the busy timeout")
	e.requireEmpty(t, "a start refused for a held lock")

	_, err = conn.ExecContext(context.Background(), "ROLLBACK")
	require.NoError(t, err)
	e.mustRun(t, "start", "order-processing", "--input", validOrder, "--detach")
}

// TestSignalDuringWorkflowLoad sends SIGTERM to a worker whose workflows
// are still loading (a file that is a pipe, read once a writer opens it
// and never written): the worker exits at once, saying it did nothing.
func TestSignalDuringWorkflowLoad(t *testing.T) {
	t.Parallel()
	e := newEnv(t, filepath.Join(t.TempDir(), "dagrun.db"), nil)
	fifo := filepath.Join(e.workflows, "slow.yaml")
	require.NoError(t, syscall.Mkfifo(fifo, 0o644))

	w := e.spawn(t, "worker")
	// Opening the pipe for writing returns once the worker opened it for
	// reading: from then on the worker waits inside the load.
	writer, err := os.OpenFile(fifo, os.O_WRONLY, 0)
	require.NoError(t, err)
	t.Cleanup(func() { _ = writer.Close() })

	w.signal(t, syscall.SIGTERM)
	require.Equal(t, 130, w.wait(t, 30*time.Second), "exit code of an interrupted command; stderr:\n%s", w.stderr.String())
	require.Equal(t, "dagrun: interrupted while reading workflows; nothing was done (terminated signal received)", lastLine(w.stderr.String()))
}
