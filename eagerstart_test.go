package dagrun_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun"
	"github.com/dagrun/dagrun/handlers"
	"github.com/dagrun/dagrun/storage"
)

// claimedAtCreation reports whether the instance's step was claimed in the
// transaction that created the instance: a store writes one time per
// transaction, so its step.started event then carries the instance.created
// time.
func claimedAtCreation(t *testing.T, inst *storage.Instance, stepName string) bool {
	t.Helper()
	var created, started time.Time
	for _, e := range inst.Events {
		switch {
		case e.Type == storage.EventInstanceCreated:
			created = e.At
		case e.Type == storage.EventStepStarted && e.Step == stepName && started.IsZero():
			started = e.At
		}
	}
	require.False(t, created.IsZero() || started.IsZero(), "instance %s lacks created or started events", inst.ID)
	return started.Equal(created)
}

func TestStartClaimsForAnIdleLocalWorker(t *testing.T) {
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		b := setup(t, open, nil, chainWorkflow)
		// No polling: only the start itself or a wake-up can run a step.
		b.runWorker(t, &dagrun.WorkerConfig{Poll: time.Hour})
		// The first instance proves the worker is running.
		b.wait(t, b.start(t, "chain", `{"n": 1}`))

		// The worker's claim loop may hold its free slots for a moment
		// (it takes them all, claims, and gives back what it did not
		// fill), and then a start finds none to reserve and leaves the root
		// to the next claim: correct, only slower. Without eager start no
		// attempt would ever be claimed at creation.
		eager := false
		for try := 0; try < 5 && !eager; try++ {
			inst := b.wait(t, b.start(t, "chain", `{"n": 2}`))
			require.Equal(t, storage.InstanceCompleted, inst.Status)
			eager = claimedAtCreation(t, inst, "a")
		}
		require.True(t, eager, "the root was claimed in the creating transaction")
	})
}

func TestStartLeavesAFullWorkerAlone(t *testing.T) {
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		registry := handlers.NewRegistry()
		release := make(chan struct{})
		registry.Register("hold", func(ctx context.Context, in json.RawMessage) (json.RawMessage, error) {
			select {
			case <-release:
			case <-ctx.Done():
			}
			return in, nil
		})
		b := setup(t, open, registry, "name: held\nsteps:\n  - {name: a, handler: hold}\n")
		b.runWorker(t, &dagrun.WorkerConfig{Concurrency: 1})
		first := b.start(t, "held", "")
		require.Eventually(t, func() bool {
			inst, err := b.store.GetInstance(context.Background(), first)
			require.NoError(t, err)
			return step(t, inst, "a").Status == storage.StepRunning
		}, 10*time.Second, 5*time.Millisecond, "the first instance holds the only slot")

		second := b.start(t, "held", "")
		inst, err := b.store.GetInstance(context.Background(), second)
		require.NoError(t, err)
		require.Equal(t, storage.StepPending, step(t, inst, "a").Status, "no slot: the start claimed nothing")
		close(release)
		require.Equal(t, storage.InstanceCompleted, b.wait(t, first).Status)
		inst = b.wait(t, second)
		require.Equal(t, storage.InstanceCompleted, inst.Status)
		require.False(t, claimedAtCreation(t, inst, "a"))
	})
}
