package dagrun_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun"
	"github.com/dagrun/dagrun/handlers"
	"github.com/dagrun/dagrun/storage"
)

// countingWorkflow adds what its steps return; each step counts its runs.
const countingWorkflow = `
name: counting
steps:
  - {name: one, handler: one}
  - {name: two, handler: two, dependsOn: [one]}
  - {name: three, handler: three, dependsOn: [two]}
output:
  sum: ${{ steps.one.output.v + steps.two.output.v + steps.three.output.v }}
`

func countingRegistry(calls map[string]*atomic.Int32, failTwo *atomic.Bool) *handlers.Registry {
	r := handlers.NewRegistry()
	for i, name := range []string{"one", "two", "three"} {
		calls[name] = &atomic.Int32{}
		r.Register(name, func(context.Context, json.RawMessage) (json.RawMessage, error) {
			calls[name].Add(1)
			if name == "two" && failTwo.Load() {
				return nil, handlers.Permanent(errors.New("two is broken"))
			}
			return json.RawMessage(`{"v": ` + itoa(i+1) + `}`), nil
		})
	}
	return r
}

func TestRetryFromReRunsTheStepAndWhatFollows(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		calls := map[string]*atomic.Int32{}
		b := setup(t, open, countingRegistry(calls, &atomic.Bool{}), countingWorkflow)
		b.runWorker(t, nil)
		id := b.start(t, "counting", ``)
		require.Equal(t, storage.InstanceCompleted, b.wait(t, id).Status)

		ctx := storage.WithActor(context.Background(), "cli")
		require.NoError(t, b.engine.RetryFrom(ctx, id, "two"))
		inst := b.wait(t, id)
		require.Equal(t, storage.InstanceCompleted, inst.Status, inst.Error)
		requireJSON(t, `{"sum": 6}`, inst.Output)
		require.Equal(t, int32(1), calls["one"].Load(), "upstream keeps its output")
		require.Equal(t, int32(2), calls["two"].Load())
		require.Equal(t, int32(2), calls["three"].Load())

		err := b.engine.RetryFrom(ctx, id, "four")
		require.ErrorIs(t, err, storage.ErrNotFound)
		require.ErrorContains(t, err, "its steps: one, two, three")
	})
}

func TestSkipRepairsAFailedInstanceWithTheGivenOutput(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		calls := map[string]*atomic.Int32{}
		var failTwo atomic.Bool
		failTwo.Store(true)
		b := setup(t, open, countingRegistry(calls, &failTwo), countingWorkflow)
		b.runWorker(t, nil)
		id := b.start(t, "counting", ``)
		require.Equal(t, storage.InstanceFailed, b.wait(t, id).Status)

		var argErr *dagrun.ArgumentError
		require.ErrorAs(t, b.engine.Skip(context.Background(), id, "two", json.RawMessage(`{oops`)), &argErr)
		require.NoError(t, b.engine.Skip(context.Background(), id, "two", json.RawMessage(`{"v": 20}`)))
		inst := b.wait(t, id)
		require.Equal(t, storage.InstanceCompleted, inst.Status, inst.Error)
		requireJSON(t, `{"sum": 24}`, inst.Output)
		require.ErrorIs(t, b.engine.Skip(context.Background(), id, "two", nil), storage.ErrConflict)
	})
}

func TestPausedInstanceWaitsForResume(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		calls := map[string]*atomic.Int32{}
		b := setup(t, open, countingRegistry(calls, &atomic.Bool{}), countingWorkflow)
		paused := b.start(t, "counting", ``)
		require.NoError(t, b.engine.Pause(context.Background(), paused))
		other := b.start(t, "counting", ``)
		b.runWorker(t, nil)
		require.Equal(t, storage.InstanceCompleted, b.wait(t, other).Status)
		inst, err := b.engine.Get(context.Background(), paused)
		require.NoError(t, err)
		require.True(t, inst.Paused)
		require.Equal(t, storage.StepPending, step(t, inst, "one").Status, "not claimed while the worker ran another")

		require.NoError(t, b.engine.Resume(context.Background(), paused))
		require.Equal(t, storage.InstanceCompleted, b.wait(t, paused).Status)
		require.ErrorIs(t, b.engine.Resume(context.Background(), paused), storage.ErrConflict)
	})
}

// vanishingStore matches, beside the instances there are, one that is
// gone by the time it is acted on, as one a prune deletes meanwhile.
type vanishingStore struct {
	storage.Store
	storage.Operator
}

func (s vanishingStore) MatchInstances(ctx context.Context, f storage.InstanceFilter) ([]string, error) {
	ids, err := s.Operator.MatchInstances(ctx, f)
	if len(ids) > 1 {
		ids = slices.Insert(ids, 1, "0190d2a8-0000-7000-8000-000000000000")
	}
	return ids, err
}

// TestBulkOperationsPassOverAnInstanceGone: an instance deleted between
// a bulk operation's match and its turn is passed over, as one that
// changed state is; the others are still acted on.
func TestBulkOperationsPassOverAnInstanceGone(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		vanishing := func(t *testing.T) storage.Store {
			s := open(t)
			return vanishingStore{Store: s, Operator: s.(storage.Operator)}
		}
		calls := map[string]*atomic.Int32{}
		b := setup(t, vanishing, countingRegistry(calls, &atomic.Bool{}), countingWorkflow)
		for range 3 {
			b.start(t, "counting", ``)
		}
		n, err := b.engine.CancelSelected(t.Context(), dagrun.Selection{Workflow: "counting"})
		require.NoError(t, err)
		require.Equal(t, 3, n)
		n, err = b.engine.RetrySelected(t.Context(), dagrun.Selection{Workflow: "counting"})
		require.NoError(t, err)
		require.Equal(t, 3, n)
	})
}

func TestCancelSelectedCountsWhatItCancelled(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		calls := map[string]*atomic.Int32{}
		b := setup(t, open, countingRegistry(calls, &atomic.Bool{}), countingWorkflow, chainWorkflow)
		for range 3 {
			b.start(t, "counting", ``)
		}
		keep := b.start(t, "chain", `{"n": 1}`)
		n, err := b.engine.CancelSelected(context.Background(), dagrun.Selection{Workflow: "counting", Status: storage.InstancePending})
		require.NoError(t, err)
		require.Equal(t, 3, n)
		n, err = b.engine.CancelSelected(context.Background(), dagrun.Selection{Workflow: "counting"})
		require.NoError(t, err)
		require.Zero(t, n, "finished ones are passed over")
		inst, err := b.engine.Get(context.Background(), keep)
		require.NoError(t, err)
		require.Equal(t, storage.InstancePending, inst.Status)

		n, err = b.engine.RetrySelected(context.Background(), dagrun.Selection{Status: storage.InstanceCancelled})
		require.NoError(t, err)
		require.Equal(t, 3, n)
		_, err = b.engine.CancelSelected(context.Background(), dagrun.Selection{})
		var argErr *dagrun.ArgumentError
		require.ErrorAs(t, err, &argErr, "no filter is refused")
	})
}
