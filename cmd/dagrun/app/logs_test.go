package app_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/cmd/dagrun/app"
	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/sqlite"
)

func TestLogsCommand(t *testing.T) {
	t.Parallel()
	b := setup(t)
	res := b.run(t, "", "start", "fanout", "--detach", "--input", `{"numbers": [1, 2, 3]}`)
	require.Equal(t, app.ExitOK, res.code, res.stderr)
	id := strings.TrimSpace(res.stdout)

	// Records as a worker writes them, at known times.
	store, err := sqlite.Open(t.Context(), b.env["DAGRUN_DB"], nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, store.Close()) })
	at := time.Date(2026, 3, 4, 5, 6, 7, 890_000_000, time.UTC)
	rec := func(step string, item, attempt int, level, msg, attrs string) storage.LogRecord {
		at = at.Add(time.Second)
		r := storage.LogRecord{InstanceID: id, Step: step, Item: item, Attempt: attempt, Time: at, Level: level, Message: msg}
		if attrs != "" {
			r.Attrs = json.RawMessage(attrs)
		}
		return r
	}
	require.NoError(t, store.AppendLogs(t.Context(), nil, []storage.LogRecord{
		rec("wait", -1, 1, "INFO", "splitting", `{"parts":3,"order":{"id":"A-7","note":"two words"}}`),
		rec("wait", -1, 2, "WARN", "slow\nsecond line", `{"empty":"","ok":true}`),
		rec("square", 2, 1, "ERROR", "boom", ""),
	}))

	res = b.run(t, "", "logs", id)
	require.Equal(t, app.ExitOK, res.code, res.stderr)
	golden(t, "logs", res.stdout)

	// Interrupted while the instance is unfinished, --follow has printed
	// what there was and says it stopped before it was done. The interrupt
	// comes later on a machine too loaded to have printed by then.
	for delay := 200 * time.Millisecond; ; delay *= 2 {
		ctx, cancel := context.WithCancel(t.Context())
		time.AfterFunc(delay, cancel)
		res = b.runContext(ctx, "logs", id, "--follow")
		if strings.Count(res.stdout, "\n") == 3 || delay > 5*time.Second {
			break
		}
	}
	require.Equal(t, app.ExitInterrupted, res.code, res.stderr)
	require.Equal(t, 3, strings.Count(res.stdout, "\n"), res.stdout)

	// Once the instance finished, --follow prints what there is and ends.
	require.Equal(t, app.ExitOK, b.run(t, "", "cancel", id).code)
	res = b.run(t, "", "logs", id, "square", "--json", "--follow")
	require.Equal(t, app.ExitOK, res.code, res.stderr)
	var got map[string]any
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &got))
	require.Equal(t, map[string]any{"seq": got["seq"], "step": "square", "item": 2.0, "attempt": 1.0,
		"time": "2026-03-04T05:06:10.89Z", "level": "ERROR", "message": "boom"}, got)

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"logs", id, "nope"}, `has no step "nope"`},
		{[]string{"logs", "no-such-id"}, "no instance with ID"},
		{[]string{"logs"}, "usage: dagrun logs ID [STEP]"},
		{[]string{"logs", id, "wait", "extra"}, "usage: dagrun logs ID [STEP]"},
	} {
		res := b.run(t, "", tc.args...)
		require.Equal(t, app.ExitUsage, res.code, "%v: %s", tc.args, res.stderr)
		require.Contains(t, res.stderr, tc.want)
		require.Empty(t, res.stdout)
	}
}

// TestLogsOfAnInstanceThatLoggedNothing: logs says on stderr that there is
// nothing, and whether more may come, rather than print nothing at all;
// stdout, and --json's, stay empty.
func TestLogsOfAnInstanceThatLoggedNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.startDetached(t)

	res := b.run(t, "", "logs", id)
	require.Equal(t, app.ExitOK, res.code)
	require.Empty(t, res.stdout)
	require.Equal(t, "no log records yet (handlers log through handlers.Logger(ctx)); add --follow to wait for them\n", res.stderr)

	require.Equal(t, app.ExitOK, b.run(t, "", "cancel", id).code)
	res = b.run(t, "", "logs", id, "hello")
	require.Equal(t, app.ExitOK, res.code)
	require.Empty(t, res.stdout)
	require.Equal(t, "no log records of step hello: its handlers logged nothing (they log through handlers.Logger(ctx))\n", res.stderr)

	res = b.run(t, "", "logs", id, "--json")
	require.Equal(t, app.ExitOK, res.code)
	require.Empty(t, res.stdout, "JSON Lines of no record are no lines")
	require.Empty(t, res.stderr)
}

// TestDebugLogsAttempts: --log-level debug has the worker log each
// attempt's start and end; the default level logs neither.
func TestDebugLogsAttempts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.run(t, "", "--log-level", "debug", "start", "greet", "--input", `{"name": "Ada"}`)
	require.Equal(t, app.ExitOK, r.code, r.stderr)
	require.Regexp(t, `level=DEBUG msg="dagrun: attempt started" worker=\S+ instance=\S+ step=hello attempt=1 handler=`, r.stderr)
	require.Regexp(t, `level=DEBUG msg="dagrun: attempt recorded" worker=\S+ instance=\S+ step=hello attempt=1 outcome=completed duration=`, r.stderr)

	r = b.run(t, "", "start", "greet", "--input", `{"name": "Ada"}`)
	require.Equal(t, app.ExitOK, r.code, r.stderr)
	require.NotContains(t, r.stderr, "attempt started")
}
