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

// TestNamedPipeInTheWorkflowsFolder: a pipe named *.yaml in the folder
// (nothing writes to it) would have held every command in its load,
// waiting for a writer; a worker leaves it out as a file with errors,
// names it, runs the other workflows, and stops on SIGTERM as usual.
func TestNamedPipeInTheWorkflowsFolder(t *testing.T) {
	t.Parallel()
	e := newEnv(t, filepath.Join(t.TempDir(), "dagrun.db"), nil)
	fifo := filepath.Join(e.workflows, "slow.yaml")
	require.NoError(t, syscall.Mkfifo(fifo, 0o644))
	t.Cleanup(func() {
		// Let a read the code before this would have left waiting end.
		if f, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			_ = f.Close()
		}
	})

	w := e.spawn(t, "worker")
	waitFor(t, 30*time.Second, "the worker's start", func() bool { return strings.Contains(w.stderr.String(), "dagrun worker started") })
	require.Contains(t, w.stderr.String(), `workflow left out: its file has errors" workflow=slow error="`+fifo+`:1:1: cannot read the file: slow.yaml is a named pipe, not a regular file: move it out of the workflows folder"`)
	id := strings.TrimSpace(e.mustRun(t, "start", "order-processing", "--input", validOrder, "--detach").stdout)
	waitFor(t, 30*time.Second, "the instance to complete", func() bool { return e.status(t, id).Status == "completed" })
	w.signal(t, syscall.SIGTERM)
	require.Equal(t, 0, w.wait(t, 30*time.Second), "stderr:\n%s", w.stderr.String())
}
