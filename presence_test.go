package dagrun_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun"
	"github.com/dagrun/dagrun/handlers"
	"github.com/dagrun/dagrun/storage"
)

const mixedWorkflow = `
name: mixed
steps:
  - {name: a, handler: mine}
  - {name: b, handler: theirs}
  - {name: c, handler: mine, dependsOn: [a]}
`

// TestWorkerClaimsOnlyItsHandlers: workers of binaries with different
// handlers share one store. A worker never claims a step whose handler it
// lacks (a worker with no handler at all claims nothing), stats name that
// step as served by no live worker, and a worker that has the handler runs
// it; a stopped worker leaves the presence list.
func TestWorkerClaimsOnlyItsHandlers(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		ok := func(context.Context, json.RawMessage) (json.RawMessage, error) { return json.RawMessage(`1`), nil }
		full := handlers.NewRegistry()
		full.Register("mine", ok)
		full.Register("theirs", ok)
		b := setup(t, open, full, mixedWorkflow)
		narrow := handlers.NewRegistry()
		narrow.Register("mine", ok)
		runOn := func(registry *handlers.Registry, id string) (stop func()) {
			engine, err := dagrun.New(b.store, registry, nil)
			require.NoError(t, err)
			worker, err := engine.NewWorker(&dagrun.WorkerConfig{ID: id, Poll: 20 * time.Millisecond})
			require.NoError(t, err)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); _ = worker.Run(ctx) }()
			stop = func() { cancel(); <-done }
			t.Cleanup(stop)
			return stop
		}
		stopNarrow := runOn(narrow, "narrow")
		runOn(handlers.NewRegistry(), "empty")
		ctx := t.Context()
		var workers []storage.WorkerInfo
		require.Eventually(t, func() bool {
			var err error
			workers, err = b.store.ListWorkers(ctx)
			require.NoError(t, err)
			return len(workers) == 2
		}, 30*time.Second, 10*time.Millisecond, "both workers announce themselves when they start")
		require.Equal(t, "empty", workers[0].ID)
		require.Empty(t, workers[0].Handlers)
		require.Equal(t, "narrow", workers[1].ID)
		require.Equal(t, []string{"mine"}, workers[1].Handlers)

		id := b.start(t, "mixed", ``)
		var inst *storage.Instance
		require.Eventually(t, func() bool {
			var err error
			inst, err = b.store.GetInstance(ctx, id)
			require.NoError(t, err)
			return step(t, inst, "c").Status == storage.StepCompleted
		}, 30*time.Second, 10*time.Millisecond)
		require.Equal(t, storage.StepPending, step(t, inst, "b").Status)
		require.Zero(t, step(t, inst, "b").Attempts, "no worker without the handler spent an attempt")

		st, err := b.store.Stats(ctx)
		require.NoError(t, err)
		require.Len(t, st.Unserved, 1)
		require.Equal(t, "theirs", st.Unserved[0].Handler)
		require.Equal(t, 1, st.Unserved[0].Ready)

		stopNarrow()
		workers, err = b.store.ListWorkers(ctx)
		require.NoError(t, err)
		require.False(t, slices.ContainsFunc(workers, func(w storage.WorkerInfo) bool { return w.ID == "narrow" }),
			"a stopped worker removes its announcement")

		runOn(full, "full")
		inst = b.wait(t, id)
		require.Equal(t, storage.InstanceCompleted, inst.Status, inst.Error)
		require.Equal(t, 1, step(t, inst, "b").Attempts)
		st, err = b.store.Stats(ctx)
		require.NoError(t, err)
		require.Empty(t, st.Unserved)
	})
}
