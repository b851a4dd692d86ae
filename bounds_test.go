package dagrun_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun"
	"github.com/dagrun/dagrun/storage"
)

const echoWorkflow = `
name: echo-input
steps:
  - name: only
    handler: echo
    input: {value: "${{ input }}"}
output: ${{ steps.only.output.value }}
`

// badStrings are strings no backend can hold as text: PostgreSQL refuses
// the first two and cannot index the third.
var badStrings = map[string]string{
	"invalid UTF-8": "a\xffb",
	"NUL byte":      "a\x00b",
	"10 KB":         strings.Repeat("k", 10<<10),
}

// TestStartRefusesOutOfRangeOptions starts with options outside the
// documented bounds: each is refused with an ArgumentError through Start
// and StartMany alike, and nothing is written. The bounds themselves work
// end to end on every backend.
func TestStartRefusesOutOfRangeOptions(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		b := setup(t, open, nil, echoWorkflow)
		ctx := context.Background()
		cases := map[string]dagrun.StartOptions{
			"priority int32 min":     {Priority: -2147483648},
			"priority wraps to min":  {Priority: 2147483648},
			"priority below range":   {Priority: dagrun.MinPriority - 1},
			"priority above range":   {Priority: dagrun.MaxPriority + 1},
			"delay negative":         {Delay: -time.Second},
			"delay over the maximum": {Delay: dagrun.MaxDelay + time.Second},
			"key invalid UTF-8":      {Key: badStrings["invalid UTF-8"]},
			"key with NUL byte":      {Key: badStrings["NUL byte"]},
			"key of 10 KB":           {Key: badStrings["10 KB"]},
			"key one byte too long":  {Key: strings.Repeat("k", dagrun.MaxKeyBytes+1)},
		}
		for name, opts := range cases {
			_, err := b.engine.Start(ctx, "echo-input", nil, &opts)
			var argErr *dagrun.ArgumentError
			require.ErrorAs(t, err, &argErr, name)
			require.NotContains(t, err.Error(), "\n", name)
			require.Less(t, len(err.Error()), 200, "%s: the message does not repeat the value", name)
			_, err = b.engine.StartMany(ctx, []dagrun.StartRequest{{Workflow: "echo-input"}, {Workflow: "echo-input", Options: opts}})
			require.ErrorAs(t, err, &argErr, name)
			// Refused before the caller's transaction is touched, so any
			// value stands in for it.
			_, err = b.engine.StartTx(ctx, struct{}{}, "echo-input", nil, &opts)
			require.ErrorAs(t, err, &argErr, name)
		}
		list, err := b.engine.List(ctx, storage.ListParams{})
		require.NoError(t, err)
		require.Empty(t, list, "nothing is written")

		// The extremes are stored and run.
		b.runWorker(t, nil)
		for _, opts := range []dagrun.StartOptions{
			{Priority: dagrun.MinPriority, Key: strings.Repeat("k", dagrun.MaxKeyBytes)},
			{Priority: dagrun.MaxPriority, Key: "ключ ✓"},
		} {
			res, err := b.engine.Start(ctx, "echo-input", json.RawMessage(`{"a": 1}`), &opts)
			require.NoError(t, err)
			inst := b.wait(t, res.ID)
			require.Equal(t, storage.InstanceCompleted, inst.Status, inst.Error)
			require.Equal(t, opts.Priority, inst.Priority)
			require.Equal(t, opts.Key, inst.Key)
		}
	})
}

// TestBadStringsAreRefusedAlike passes strings no backend can hold as an
// instance ID, a list filter, a key or a queue: every backend answers the
// same, an ID that cannot exist is not found, and the rest are argument
// errors, never a database error.
func TestBadStringsAreRefusedAlike(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		b := setup(t, open, nil, echoWorkflow)
		ctx := context.Background()
		for name, s := range badStrings {
			_, err := b.engine.Get(ctx, s)
			require.ErrorIs(t, err, storage.ErrNotFound, "get: %s", name)
			require.ErrorIs(t, b.engine.Cancel(ctx, s), storage.ErrNotFound, "cancel: %s", name)
			require.ErrorIs(t, b.engine.Retry(ctx, s), storage.ErrNotFound, "retry: %s", name)
			_, err = b.engine.Follow(ctx, s, nil)
			require.ErrorIs(t, err, storage.ErrNotFound, "follow: %s", name)

			var argErr *dagrun.ArgumentError
			_, err = b.engine.List(ctx, storage.ListParams{Workflow: s})
			require.ErrorAs(t, err, &argErr, "list by workflow: %s", name)
			_, err = b.engine.List(ctx, storage.ListParams{BeforeID: s})
			require.ErrorAs(t, err, &argErr, "list before: %s", name)
			_, err = b.engine.Start(ctx, "echo-input", nil, &dagrun.StartOptions{Key: s})
			require.ErrorAs(t, err, &argErr, "key: %s", name)
			_, err = b.engine.NewWorker(&dagrun.WorkerConfig{Queues: []string{s}})
			require.ErrorAs(t, err, &argErr, "queue: %s", name)
		}
		var argErr *dagrun.ArgumentError
		for _, p := range []storage.ListParams{{Status: "done"}, {Limit: -1}, {Limit: dagrun.MaxListLimit + 1}} {
			_, err := b.engine.List(ctx, p)
			require.ErrorAs(t, err, &argErr, "%+v", p)
		}
		for _, c := range []dagrun.WorkerConfig{
			{Concurrency: -1}, {Concurrency: dagrun.MaxConcurrency + 1},
			{Lease: time.Millisecond}, {Lease: dagrun.MaxLease + time.Second},
			{Poll: dagrun.MaxPoll + time.Second}, {ShutdownGrace: -time.Second},
		} {
			_, err := b.engine.NewWorker(&c)
			require.ErrorAs(t, err, &argErr, "%+v", c)
		}
	})
}

// nested returns JSON with depth levels of arrays and objects.
func nested(depth int) string {
	var open, closing strings.Builder
	for i := range depth {
		if i%2 == 0 {
			open.WriteString(`{"a":`)
			closing.WriteString(`}`)
		} else {
			open.WriteString(`[`)
			closing.WriteString(`]`)
		}
	}
	return open.String() + "1" + reverse(closing.String())
}

func reverse(s string) string {
	r := []byte(s)
	for i, j := 0, len(r)-1; i < j; i, j = i+1, j-1 {
		r[i], r[j] = r[j], r[i]
	}
	return string(r)
}

// TestStartRefusesDeeplyNestedInput starts with input nested past
// MaxInputDepth: refused at start and nothing written. Input at the limit
// is stored and runs to the end; brackets inside strings do not count.
func TestStartRefusesDeeplyNestedInput(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		b := setup(t, open, nil, echoWorkflow)
		ctx := context.Background()
		for _, depth := range []int{dagrun.MaxInputDepth + 1, 1000, 10000} {
			_, err := b.engine.Start(ctx, "echo-input", json.RawMessage(nested(depth)), nil)
			var inputErr *dagrun.InputError
			require.ErrorAs(t, err, &inputErr, "depth %d", depth)
			require.ErrorContains(t, err, "levels deep")
		}
		list, err := b.engine.List(ctx, storage.ListParams{})
		require.NoError(t, err)
		require.Empty(t, list, "nothing is written")

		b.runWorker(t, nil)
		for _, input := range []string{nested(dagrun.MaxInputDepth), `{"s": "` + strings.Repeat("[{", 500) + `\"]"}`} {
			id := b.start(t, "echo-input", input)
			inst := b.wait(t, id)
			require.Equal(t, storage.InstanceCompleted, inst.Status, inst.Error)
			requireJSON(t, input, inst.Output)
		}
	})
}
