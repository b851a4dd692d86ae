package dagrun_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun"
	"github.com/dagrun/dagrun/dag"
	"github.com/dagrun/dagrun/handlers"
	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/backendtest"
	"github.com/dagrun/dagrun/storage/postgres"
)

// TestIdleWorkerTakesWorkStartedElsewhereAsItFinishes: an idle worker on
// PostgreSQL whose last step finishes just as another process starts an
// instance runs that instance without waiting for a poll. Such a finish
// may leave its eager claim out (the worker's claim loop found nothing to
// claim, and the other process's NOTIFY is still on its way): the claim
// loop must then take the instance when the NOTIFY arrives. The worker
// polls once an hour, so a lost wake-up fails the test.
func TestIdleWorkerTakesWorkStartedElsewhereAsItFinishes(t *testing.T) {
	t.Parallel()
	if !backendtest.PostgresAvailable(t) {
		t.Skip("set DAGRUN_TEST_POSTGRES to run the PostgreSQL tests")
	}
	url := backendtest.PostgresURL(t)
	registry := handlers.NewRegistry()
	handlers.RegisterBuiltins(registry)
	started, release := make(chan struct{}), make(chan struct{})
	registry.Register("hold", func(ctx context.Context, _ json.RawMessage) (json.RawMessage, error) {
		started <- struct{}{}
		select {
		case <-release:
			return json.RawMessage(`{}`), nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	})
	var workflows []*dag.Workflow
	for _, src := range []string{"name: hold\nsteps:\n  - {name: hold, handler: hold}\n", "name: quick\nsteps:\n  - {name: quick, handler: noop}\n"} {
		w, err := dag.Parse("", []byte(src), &dag.ParseOptions{HandlerExists: registry.Has})
		require.NoError(t, err)
		workflows = append(workflows, w)
	}
	// Two processes: two stores, each with its own pool and listener.
	engine := func() *dagrun.Engine {
		store, err := postgres.Open(t.Context(), url, nil)
		require.NoError(t, err)
		t.Cleanup(func() { _ = store.Close() })
		e, err := dagrun.New(store, registry, &dagrun.Config{Workflows: workflows})
		require.NoError(t, err)
		return e
	}
	worker, other := engine(), engine()
	b := &testBundle{engine: worker, registry: registry}
	b.runWorker(t, &dagrun.WorkerConfig{Poll: time.Hour, Concurrency: 1})

	for round := range 20 {
		held := b.start(t, "hold", `{}`)
		<-started
		res, err := other.Start(context.Background(), "quick", json.RawMessage(`{}`), nil)
		require.NoError(t, err)
		release <- struct{}{} // the worker's step finishes as the NOTIFY travels
		require.Equal(t, storage.InstanceCompleted, b.wait(t, held).Status)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		inst, err := other.Follow(ctx, res.ID, nil)
		cancel()
		require.NoError(t, err, "round %d: the instance another process started did not run within 10 s", round)
		require.Equal(t, storage.InstanceCompleted, inst.Status)
	}
}
