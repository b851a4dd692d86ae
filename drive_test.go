package dagrun_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun"
	"github.com/dagrun/dagrun/handlers"
	"github.com/dagrun/dagrun/storage"
)

// TestDriveRunsWhatIsDue: one Drive runs a whole chain in the calling
// goroutine, with no worker, and then reports nothing due.
func TestDriveRunsWhatIsDue(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		b := setup(t, open, nil, chainWorkflow)
		id := b.start(t, "chain", `{"n": 7}`)
		res, err := b.engine.Drive(t.Context(), nil)
		require.NoError(t, err)
		require.Equal(t, 0, res.Expired)
		require.True(t, res.NextWake.IsZero(), "nothing is due later: %v", res.NextWake)
		inst, err := b.engine.Get(t.Context(), id)
		require.NoError(t, err)
		require.Equal(t, storage.InstanceCompleted, inst.Status, "ran %d attempts", res.Ran)
		requireJSON(t, `{"result": 16, "label": "n=7"}`, inst.Output)
		require.Equal(t, 2, res.Ran)
	})
}

// TestDriveReportsTheNextWake: a failed attempt is retried by the step's
// policy, and Drive says when the retry is due instead of waiting for it.
func TestDriveReportsTheNextWake(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		var calls atomic.Int32
		registry := handlers.NewRegistry()
		registry.Register("flaky", func(context.Context, json.RawMessage) (json.RawMessage, error) {
			calls.Add(1)
			return nil, errors.New("not yet")
		})
		b := setup(t, open, registry, `
name: retried
steps:
  - name: a
    handler: flaky
    retry: {maxAttempts: 3, backoff: 1h, maxBackoff: 1h}
`)
		id := b.start(t, "retried", `{}`)
		before := time.Now()
		res, err := b.engine.Drive(t.Context(), &dagrun.DriveOptions{InstanceID: id})
		require.NoError(t, err)
		require.Equal(t, 1, res.Ran)
		require.Equal(t, int32(1), calls.Load())
		// The backoff has up to 20% jitter taken off.
		require.WithinRange(t, res.NextWake, before.Add(48*time.Minute-time.Second), time.Now().Add(time.Hour+time.Second))

		again, err := b.engine.Drive(t.Context(), &dagrun.DriveOptions{InstanceID: id})
		require.NoError(t, err)
		require.Equal(t, 0, again.Ran, "the retry is not due yet")
		inst, err := b.engine.Get(t.Context(), id)
		require.NoError(t, err)
		require.Equal(t, storage.StepPending, step(t, inst, "a").Status)
		require.Equal(t, 1, step(t, inst, "a").Attempts)
	})
}

// TestDriveGivesBackWhatItCouldNotFinish: when Drive's context ends while
// a handler runs, the step is released (pending again, the attempt not
// counted) rather than held until its lease runs out.
func TestDriveGivesBackWhatItCouldNotFinish(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		ctx, cancel := context.WithCancel(t.Context())
		registry := handlers.NewRegistry()
		registry.Register("interrupted", func(ctx context.Context, _ json.RawMessage) (json.RawMessage, error) {
			cancel() // as SIGINT would, while the handler runs
			<-ctx.Done()
			return nil, ctx.Err()
		})
		b := setup(t, open, registry, "name: interrupted\nsteps:\n  - name: a\n    handler: interrupted\n")
		id := b.start(t, "interrupted", `{}`)
		_, err := b.engine.Drive(ctx, nil)
		require.ErrorIs(t, err, context.Canceled)
		inst, err := b.engine.Get(t.Context(), id)
		require.NoError(t, err)
		require.Equal(t, storage.StepPending, step(t, inst, "a").Status)
	})
}

// TestDriveTimesOutInstances: Drive enforces a workflow timeout as a
// worker's loop does, with no handler of the instance running.
func TestDriveTimesOutInstances(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		b := setup(t, open, handlers.NewRegistry(), `
name: bounded
timeout: 50ms
steps:
  - name: approval
    wait: {signal: approve}
`)
		id := b.start(t, "bounded", `{}`)
		res, err := b.engine.Drive(t.Context(), &dagrun.DriveOptions{InstanceID: id})
		require.NoError(t, err)
		// A loaded machine may reach the first Drive after the deadline;
		// before it, the deadline is what Drive says to wake for.
		if res.Expired == 0 {
			require.False(t, res.NextWake.IsZero(), "the deadline is a wake")
		}
		expired := res.Expired
		require.Eventually(t, func() bool {
			res, err := b.engine.Drive(t.Context(), &dagrun.DriveOptions{InstanceID: id})
			require.NoError(t, err)
			expired += res.Expired
			return expired > 0
		}, 10*time.Second, 10*time.Millisecond)
		require.Equal(t, 1, expired)
		inst, err := b.engine.Get(t.Context(), id)
		require.NoError(t, err)
		require.Equal(t, storage.InstanceFailed, inst.Status)
		require.Equal(t, "workflow timed out after 50ms", inst.Error)
	})
}
