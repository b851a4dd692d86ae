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
)

// TestIdleWorkerTakesWorkStartedElsewhereAsItFinishes: an idle worker
// whose last step finishes just as another process starts an instance runs
// that instance without waiting for a poll, and so does one that has
// nothing to do. On PostgreSQL the finish may leave its eager claim out
// (the worker's claim loop found nothing to claim, and the other process's
// NOTIFY is still on its way): the claim loop must then take the instance
// when the NOTIFY arrives. On SQLite the finish's claim takes it, and an
// idle worker hears of the other process's commit from the database file.
// The worker polls once an hour, so a lost wake-up fails the test.
func TestIdleWorkerTakesWorkStartedElsewhereAsItFinishes(t *testing.T) {
	t.Parallel()
	backendtest.EachShared(t, idleWorkerTakesWorkStartedElsewhere)
}

func idleWorkerTakesWorkStartedElsewhere(t *testing.T, connect func() storage.Store) {
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
	// Two processes: two stores on one database, each with its own
	// connections (and, on PostgreSQL, its own listener).
	engine := func() *dagrun.Engine {
		e, err := dagrun.New(connect(), registry, &dagrun.Config{Workflows: workflows})
		require.NoError(t, err)
		return e
	}
	worker, other := engine(), engine()
	b := &testBundle{engine: worker, registry: registry}
	b.runWorker(t, &dagrun.WorkerConfig{Poll: time.Hour, Concurrency: 1})

	// runs starts quick from the other process and waits for the worker to
	// run it.
	runs := func(round int, when string) {
		t.Helper()
		res, err := other.Start(context.Background(), "quick", json.RawMessage(`{}`), nil)
		require.NoError(t, err)
		if when == "as the worker's step finishes" {
			release <- struct{}{} // the worker's step finishes as the news travels
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		inst, err := other.Follow(ctx, res.ID, nil)
		require.NoError(t, err, "round %d: an instance another process started %s did not run within 10 s", round, when)
		require.Equal(t, storage.InstanceCompleted, inst.Status)
	}
	for round := range 20 {
		held := b.start(t, "hold", `{}`)
		<-started
		runs(round, "as the worker's step finishes")
		require.Equal(t, storage.InstanceCompleted, b.wait(t, held).Status)
		runs(round, "while the worker had nothing to do")
	}
}
