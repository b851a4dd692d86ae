package dagrun

import (
	"context"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/dag"
	"github.com/dagrun/dagrun/handlers"
	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/sqlite"
)

// TestOneSweepRecoversMoreThanABatch: a worker that stopped holding more
// steps than one recovery batch gets them all taken back by one sweep, not
// one batch per half-lease.
func TestOneSweepRecoversMoreThanABatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var now atomic.Int64
	now.Store(time.Now().UnixNano())
	store, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "dagrun.db"), &sqlite.Config{
		Now: func() time.Time { return time.Unix(0, now.Load()) },
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	w, err := dag.Parse("one.yaml", []byte("name: one\nsteps:\n  - {name: a, handler: noop}\n"), nil)
	require.NoError(t, err)
	registry := handlers.NewRegistry()
	handlers.RegisterBuiltins(registry)
	engine, err := New(store, registry, &Config{Workflows: []*dag.Workflow{w}})
	require.NoError(t, err)

	const stranded = 2*recoverBatch + recoverBatch/2
	ids := make([]string, stranded)
	for i := range ids {
		started, err := engine.Start(ctx, "one", nil, nil)
		require.NoError(t, err)
		ids[i] = started.ID
	}
	claimed, err := store.ClaimSteps(ctx, storage.ClaimParams{WorkerID: "stopped", Limit: stranded, Lease: time.Minute})
	require.NoError(t, err)
	require.Len(t, claimed, stranded)
	now.Add(int64(2 * time.Minute))

	worker, err := engine.NewWorker(&WorkerConfig{})
	require.NoError(t, err)
	worker.recoverExpired(ctx)

	held := 0
	for _, id := range ids {
		inst, err := store.GetInstance(ctx, id)
		require.NoError(t, err)
		if inst.Steps[0].Status == storage.StepRunning {
			held++
		}
	}
	require.Zero(t, held, "steps of the stopped worker still held after one sweep")
}
