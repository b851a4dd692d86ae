package app_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/cmd/dagrun/app"
	"github.com/dagrun/dagrun/storage/sqlite"
)

// TestBadValuesAtTheEdge records, in one golden file, the one-line error of
// each number or string out of what dagrun accepts: each is refused with
// exit 2 before the database is touched, and nothing is written.
func TestBadValuesAtTheEdge(t *testing.T) {
	t.Parallel()
	b := setup(t)
	longKey := strings.Repeat("k", 10<<10)
	deep := `{"name": ` + strings.Repeat("[", 1000) + strings.Repeat("]", 1000) + `}`
	cases := [][]string{
		{"start", "greet", "--priority", "-2147483648"},
		{"start", "greet", "--priority", "2147483648"},
		{"start", "greet", "--priority", "99999999999999999999"},
		{"start", "greet", "--delay", "-1s"},
		{"start", "greet", "--delay", "100000h"},
		{"start", "greet", "--delay", "366d"},
		{"start", "greet", "--key", longKey},
		{"start", "greet", "--key", "a\xffb"},
		{"start", "greet", "--input", deep},
		{"status", "a\xffb"},
		{"status", longKey},
		{"cancel", "a\xffb"},
		{"retry", longKey},
		{"list", "--workflow", "a\xffb"},
		{"list", "--limit", "100000"},
		{"worker", "--concurrency", "1000000000"},
		{"worker", "--lease", "48h"},
		{"worker", "--poll", "2h"},
		{"worker", "--queues", "a\xffb"},
		{"serve", "--worker", "--concurrency", "1000000000"},
		{"bench", "--concurrency", "1000000000"},
		{"bench", "--instances", "-1"},
		{"prune", "--older-than", "1.5d"},
		{"prune", "--older-than", "-7d"},
		{"prune", "--older-than", "100000w"},
		{"graph", "../outside"}, // testdata/outside.yaml
		{"graph", "../../../../../../../../etc/passwd"},
		{"start", "../outside"},
		{"start", longKey},
	}
	var report strings.Builder
	for _, args := range cases {
		res := b.run(t, "", args...)
		require.Equal(t, app.ExitUsage, res.code, "dagrun %q\n%s", args, res.stderr)
		require.Empty(t, res.stdout, "dagrun %q", args)
		require.Equal(t, 1, strings.Count(res.stderr, "\n"), "one line for dagrun %q:\n%s", args, res.stderr)
		require.Less(t, len(res.stderr), 400, "dagrun %q: the error does not repeat a long value", args)
		fmt.Fprintf(&report, "$ dagrun %s\n%s(exit %d)\n\n", strings.Join(shortArgs(args), " "), mask(res.stderr), res.code)
	}
	golden(t, "edges", report.String())

	res := b.run(t, "", "list", "--json")
	require.Equal(t, app.ExitOK, res.code, res.stderr)
	require.Equal(t, "[]\n", res.stdout, "nothing is written")
}

// shortArgs writes arguments for a golden file: long ones by their length,
// and unprintable ones Go-quoted.
func shortArgs(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		switch {
		case len(a) > 40:
			a = fmt.Sprintf("<%d bytes>", len(a))
		case strconv.Quote(a) != `"`+a+`"`:
			a = strconv.Quote(a)
		}
		out[i] = a
	}
	return out
}

// TestListShowsCancelledStepsApart: a cancelled step did not run to an
// end, so list does not count it as done.
func TestListShowsCancelledStepsApart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.startDetached(t)
	res := b.run(t, "", "cancel", id)
	require.Equal(t, app.ExitOK, res.code, res.stderr)
	res = b.run(t, "", "start", "greet", "--input", `{"name": "Bo"}`)
	require.Equal(t, app.ExitOK, res.code, res.stderr)
	res = b.run(t, "", "list")
	require.Equal(t, app.ExitOK, res.code, res.stderr)
	golden(t, "list-cancelled", mask(res.stdout))
}

// TestPruneAcceptsDaysAndWeeks: --older-than takes days and weeks, alone
// or with Go's units.
func TestPruneAcceptsDaysAndWeeks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, age := range []string{"7d", "2w", "1w3d12h", "36h", "90m", "0d"} {
		res := b.run(t, "", "prune", "--older-than", age, "--dry-run")
		require.Equal(t, app.ExitOK, res.code, "%s: %s", age, res.stderr)
		require.Equal(t, "would prune 0 finished instances older than "+age+"\n", res.stdout)
	}
	for _, age := range []string{"7 d", "d", "1.5w", "7days", "-1d"} {
		res := b.run(t, "", "prune", "--older-than", age, "--dry-run")
		require.Equal(t, app.ExitUsage, res.code, "%s: %s", age, res.stdout)
	}
	// One finished instance is one instance.
	res := b.run(t, "", "start", "greet", "--input", `{"name": "Ada"}`)
	require.Equal(t, app.ExitOK, res.code, res.stderr)
	res = b.run(t, "", "prune", "--older-than", "0d", "--dry-run")
	require.Equal(t, "would prune 1 finished instance older than 0d\n", res.stdout)
}

// TestSignalStopsWorkflowLoading: a command whose context ends while its
// workflows load (a SIGINT or SIGTERM; a folder on a file system that
// hangs would hold the load) stops at once, having done nothing. The
// pipe in the folder is refused unread now, so the load ends at once
// too: the ended context wins over its answer (a load that waits is
// TestWhileRunningStopsAtItsContext's).
func TestSignalStopsWorkflowLoading(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"list"}, {"worker"}, {"validate"}, {"graph", "slow"}, {"start", "nope"}} {
		t.Run(args[0], func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			dir := t.TempDir()
			fifo := filepath.Join(dir, "slow.yaml")
			require.NoError(t, syscall.Mkfifo(fifo, 0o644))
			t.Cleanup(func() {
				// Let the abandoned read end.
				if f, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
					_ = f.Close()
				}
			})
			b.env["DAGRUN_WORKFLOWS"] = dir

			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			done := make(chan runResult, 1)
			go func() { done <- b.runContext(ctx, args...) }()
			var res runResult
			select {
			case res = <-done:
			case <-time.After(30 * time.Second):
				t.Fatalf("dagrun %v ignores its cancelled context while loading workflows", args)
			}
			require.Equal(t, app.ExitInterrupted, res.code, res.stderr)
			require.Equal(t, "dagrun: interrupted while reading workflows; nothing was done (context canceled)\n", res.stderr)
			_, err := os.Stat(b.env["DAGRUN_DB"])
			require.ErrorIs(t, err, os.ErrNotExist, "no database was opened")
		})
	}
}

// TestSignalEndsAWaitForTheLock: a start waiting for another process's
// SQLite write lock stops as soon as its context ends (SIGINT, SIGTERM),
// says it was interrupted, and writes nothing.
func TestSignalEndsAWaitForTheLock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	res := b.run(t, "", "list")
	require.Equal(t, app.ExitOK, res.code, res.stderr)
	holder, err := sql.Open("sqlite3", sqlite.DSN(b.env["DAGRUN_DB"]))
	require.NoError(t, err)
	t.Cleanup(func() { _ = holder.Close() })
	tx, err := holder.Begin() // BEGIN IMMEDIATE: the write lock
	require.NoError(t, err)

	// The signal comes once the start waits for the lock (10 s at most),
	// after it read the workflows: on a loaded machine that reading can
	// outlast the first delay, and the start then stops there instead
	// (see TestSignalStopsWorkflowLoading), so the delay doubles.
	for delay := 100 * time.Millisecond; ; delay *= 2 {
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(delay, cancel)
		done := make(chan runResult, 1)
		go func() { done <- b.runContext(ctx, "start", "greet", "--input", `{"name": "Ada"}`, "--detach") }()
		select {
		case res = <-done:
		case <-time.After(30 * time.Second):
			t.Fatal("a start waiting for the write lock ignores its cancelled context")
		}
		if !strings.Contains(res.stderr, "while reading workflows") || delay >= 3*time.Second {
			break
		}
	}
	require.Equal(t, app.ExitInterrupted, res.code, res.stderr)
	require.True(t, strings.HasPrefix(res.stderr, "dagrun: interrupted ("), res.stderr)
	require.Equal(t, 1, strings.Count(res.stderr, "\n"), res.stderr)

	require.NoError(t, tx.Rollback())
	res = b.run(t, "", "list", "--json")
	require.Equal(t, "[]\n", res.stdout, "nothing is written")
}

// TestServeRefusesAnAddressItCannotListenOn: an address serve cannot
// listen on is the user's to change (exit 2), with a hint that fits why.
func TestServeRefusesAnAddressItCannotListenOn(t *testing.T) {
	t.Parallel()
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = taken.Close() })
	for _, tc := range []struct{ addr, hint string }{
		{"127.0.0.1:99999", "give --addr as HOST:PORT"},
		{taken.Addr().String(), "is another dagrun serve running?"},
	} {
		t.Run(tc.addr, func(t *testing.T) {
			t.Parallel()
			res := setup(t).run(t, "", "serve", "--addr", tc.addr)
			require.Equal(t, app.ExitUsage, res.code, res.stderr)
			require.Contains(t, res.stderr, tc.hint)
			require.Equal(t, 1, strings.Count(res.stderr, "dagrun: "), res.stderr)
		})
	}
}

// TestDetachWithJSONPrintsTheInstance: --json with --detach prints the
// instance object as it stands once started (or re-armed), not the bare
// ID, for start and for retry.
func TestDetachWithJSONPrintsTheInstance(t *testing.T) {
	t.Parallel()
	b := setup(t)
	type instance struct {
		ID       string `json:"id"`
		Workflow string `json:"workflow"`
		Status   string `json:"status"`
		Steps    []struct {
			Name   string `json:"name"`
			Status string `json:"status"`
		} `json:"steps"`
	}
	decode := func(t *testing.T, res runResult) instance {
		t.Helper()
		require.Equal(t, app.ExitOK, res.code, res.stderr)
		var inst instance
		require.NoError(t, json.Unmarshal([]byte(res.stdout), &inst), res.stdout)
		return inst
	}

	started := decode(t, b.run(t, "", "start", "greet", "--input", `{"name": "Ada"}`, "--detach", "--json"))
	require.NotEmpty(t, started.ID)
	require.Equal(t, "greet", started.Workflow)
	require.Equal(t, "pending", started.Status)
	require.NotEmpty(t, started.Steps)
	require.Equal(t, "pending", started.Steps[0].Status)

	res := b.run(t, "", "cancel", started.ID)
	require.Equal(t, app.ExitOK, res.code, res.stderr)
	retried := decode(t, b.run(t, "", "retry", started.ID, "--detach", "--json"))
	require.Equal(t, started.ID, retried.ID)
	require.Equal(t, "pending", retried.Steps[0].Status, "the retry re-armed the cancelled step")
}

// TestDelayInDays: --delay takes days and weeks, as --older-than does.
func TestDelayInDays(t *testing.T) {
	t.Parallel()
	b := setup(t)
	res := b.run(t, "", "start", "greet", "--input", `{"name": "Ada"}`, "--delay", "2d", "--detach", "--json")
	require.Equal(t, app.ExitOK, res.code, res.stderr)
	var inst struct {
		CreatedAt time.Time `json:"createdAt"`
		Steps     []struct {
			RunAfter time.Time `json:"runAfter"`
		} `json:"steps"`
	}
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &inst), res.stdout)
	require.WithinDuration(t, inst.CreatedAt.Add(48*time.Hour), inst.Steps[0].RunAfter, time.Minute)

	res = b.run(t, "", "start", "greet", "--delay", "2x")
	require.Equal(t, app.ExitUsage, res.code)
	require.Contains(t, res.stderr, `invalid --delay "2x": use a duration such as 30s, 5m or 2d`)
}

// TestListByKey: list --workflow W --key K finds the instance started with
// that idempotency key; a key without its workflow is a usage error.
func TestListByKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	first := b.run(t, "", "start", "greet", "--input", `{"name": "Ada"}`, "--key", "k-1", "--detach")
	require.Equal(t, app.ExitOK, first.code, first.stderr)
	res := b.run(t, "", "start", "greet", "--input", `{"name": "Bo"}`, "--key", "k-2", "--detach")
	require.Equal(t, app.ExitOK, res.code, res.stderr)

	res = b.run(t, "", "list", "--workflow", "greet", "--key", "k-1", "--json")
	require.Equal(t, app.ExitOK, res.code, res.stderr)
	var found []struct {
		ID string `json:"id"`
	}
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &found), res.stdout)
	require.Len(t, found, 1)
	require.Equal(t, strings.TrimSpace(first.stdout), found[0].ID)

	res = b.run(t, "", "list", "--key", "k-1")
	require.Equal(t, app.ExitUsage, res.code)
	require.Equal(t, "dagrun: --key needs --workflow: an idempotency key names one instance of one workflow\n", res.stderr)
}
