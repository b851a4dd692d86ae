package app_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/cmd/dagrun/app"
	"github.com/dagrun/dagrun/cmd/dagrun/app/view"
)

const limitedWorkflow = `name: limited
concurrency: {key: "${{ input.customer }}", limit: 1}
steps:
  - {name: a, handler: echo, queue: mail}
`

const laterWorkflow = `name: later
steps:
  - {name: a, handler: echo, queue: later}
`

func TestQueueSetAndQueues(t *testing.T) {
	t.Parallel()
	b := setup(t)
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "limited.yaml"), []byte(limitedWorkflow), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "later.yaml"), []byte(laterWorkflow), 0o644))
	b.env["DAGRUN_WORKFLOWS"] = dir

	r := b.run(t, "", "queues")
	require.Equal(t, app.ExitOK, r.code, r.stderr)
	require.Equal(t, "No queues: no step is ready, running or scheduled, and no queue has a limit.\n", r.stdout)

	r = b.run(t, "", "queue", "set", "mail", "--concurrency", "2", "--rate", "10/s")
	require.Equal(t, app.ExitOK, r.code, r.stderr)
	require.Equal(t, "queue mail: concurrency 2, rate 10/1s\n", r.stdout)
	require.Empty(t, r.stderr, "a workflow's queue")
	// A queue nothing uses is most likely a typo: set, with a warning.
	r = b.run(t, "", "queue", "set", "mial", "--concurrency", "2")
	require.Equal(t, app.ExitOK, r.code, r.stderr)
	require.Equal(t, "queue mial: concurrency 2, rate none\n", r.stdout)
	require.Equal(t, "dagrun: warning: no workflow of "+dir+" puts steps in queue mial, nor has the database any of its steps (the workflows' queues: later, mail); the limit is stored anyway\n", r.stderr)
	r = b.run(t, "", "queue", "set", "mial", "--concurrency", "0")
	require.Equal(t, app.ExitOK, r.code, r.stderr)
	require.Empty(t, r.stderr, "known now: its limit is stored")
	for rate, shown := range map[string]string{"100/1m": "100/1m", "5/90s": "5/1m30s", "2/h": "2/1h", "1/150ms": "1/150ms"} {
		r = b.run(t, "", "queue", "set", "mail", "--rate", rate)
		require.Equal(t, app.ExitOK, r.code, r.stderr)
		require.Equal(t, "queue mail: concurrency 2, rate "+shown+"\n", r.stdout, "--rate %s", rate)
	}
	r = b.run(t, "", "queue", "set", "mail", "--rate", "none")
	require.Equal(t, app.ExitOK, r.code, r.stderr)
	require.Equal(t, "queue mail: concurrency 2, rate none\n", r.stdout, "the concurrency not named is kept")

	for range 2 {
		r = b.run(t, "", "start", "limited", "--input", `{"customer": "acme"}`, "--detach")
		require.Equal(t, app.ExitOK, r.code, r.stderr)
	}
	// A delayed start is scheduled, not in the depth, and lists its queue.
	r = b.run(t, "", "start", "later", "--delay", "1h", "--detach")
	require.Equal(t, app.ExitOK, r.code, r.stderr)
	r = b.run(t, "", "queues", "--json")
	require.Equal(t, app.ExitOK, r.code, r.stderr)
	var list []view.Queue
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &list))
	require.Len(t, list, 2)
	require.Equal(t, view.Queue{Queue: "later", Scheduled: 1}, list[0])
	require.Equal(t, view.Queue{Queue: "mail", Depth: 2, Ready: 2, Held: 1, Concurrency: 2, OldestWaitSeconds: list[1].OldestWaitSeconds}, list[1])
	require.Contains(t, r.stdout, `"scheduled": 1`)

	r = b.run(t, "", "queues")
	require.Equal(t, app.ExitOK, r.code, r.stderr)
	require.Regexp(t, `(?m)^QUEUE\s+DEPTH\s+HELD\s+RUNNING\s+SCHEDULED\s+OLDEST WAIT\s+CONCURRENCY\s+RATE$`, r.stdout)
	require.Regexp(t, `(?m)^later\s+0\s+0\s+0\s+1\s+-\s+none\s+none$`, r.stdout)
	require.Regexp(t, `(?m)^mail\s+2\s+1\s+0\s+0\s+\S+\s+2\s+none$`, r.stdout)

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"queue", "set", "mail"}, "dagrun: queue set mail: give --concurrency N, --rate N/DUR or both (0 or none clears one)\n"},
		{[]string{"queue", "set", "mail", "--concurrency", "-1"}, "dagrun: invalid queue limit: concurrency -1 is out of range: use 0 (no limit) to 1000000\n"},
		{[]string{"queue", "set", "mail", "--concurrency", "two"}, "dagrun: --concurrency \"two\": want a whole number, or 0 or none for no limit\n"},
		{[]string{"queue", "set", "mail", "--rate", "10"}, "dagrun: invalid rate: \"10\" is not N/DUR: write e.g. 10/s, 100/1m or none\n"},
		{[]string{"queue", "set"}, "dagrun: usage: dagrun queue set NAME [--concurrency N] [--rate N/DUR] (got 0 arguments)\n"},
	} {
		r := b.run(t, "", tc.args...)
		require.Equal(t, app.ExitUsage, r.code, "%v", tc.args)
		require.Equal(t, tc.want, r.stderr, "%v", tc.args)
		require.Empty(t, r.stdout)
	}

	r = b.run(t, "", "queue", "set", "mail", "--concurrency", "none")
	require.Equal(t, app.ExitOK, r.code, r.stderr)
	require.Equal(t, "queue mail: concurrency none, rate none\n", r.stdout, "none clears a concurrency as it does a rate")
}
