package dagrun_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun"
	"github.com/dagrun/dagrun/storage"
)

// laterWorkflow is one no-op step, which the idle-worker tests start
// now or after a delay.
const laterWorkflow = `
name: later
steps:
  - name: a
    handler: noop
`

// wakeClaimCounting counts what a worker that finds too little to do asks
// its store: claims that also tell the next wake, and (nextWakeCounter's
// calls) NextWake reads of their own. Embedding storage.Store, it hides
// the eager claims, so every step is claimed by the claim loop; it passes
// storage.WakeClaimer on.
type wakeClaimCounting struct {
	nextWakeCounter
	claimsAndWakes atomic.Int64
}

func (s *wakeClaimCounting) ClaimStepsAndWake(ctx context.Context, p storage.ClaimParams) ([]storage.ClaimedStep, time.Time, error) {
	s.claimsAndWakes.Add(1)
	return s.Store.(storage.WakeClaimer).ClaimStepsAndWake(ctx, p)
}

// TestIdleWorkerPollsInOneCall: over a store that tells the next wake in
// the transaction of a claim, an idle worker's poll is that one call, with
// no NextWake read of its own; and the wake it learns is kept: a delayed
// step runs at its time, though the next poll is an hour away.
func TestIdleWorkerPollsInOneCall(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		t.Run("polls", func(t *testing.T) {
			store := &wakeClaimCounting{}
			setup(t, func(t *testing.T) storage.Store { store.Store = open(t); return store }, nil, laterWorkflow).
				runWorker(t, &dagrun.WorkerConfig{Poll: 5 * time.Millisecond, Lease: time.Hour})
			require.Eventually(t, func() bool { return store.claimsAndWakes.Load() >= 10 }, 10*time.Second, time.Millisecond)
			require.Zero(t, store.calls.Load(), "NextWake reads of an idle worker")
		})
		t.Run("delayed step", func(t *testing.T) {
			store := &wakeClaimCounting{}
			b := setup(t, func(t *testing.T) storage.Store { store.Store = open(t); return store }, nil, laterWorkflow)
			b.runWorker(t, &dagrun.WorkerConfig{Poll: time.Hour, Lease: time.Hour})
			res, err := b.engine.Start(context.Background(), "later", nil, &dagrun.StartOptions{Delay: 100 * time.Millisecond})
			require.NoError(t, err)
			require.Equal(t, storage.InstanceCompleted, b.wait(t, res.ID).Status)
			require.Zero(t, store.calls.Load(), "NextWake reads of an idle worker")
		})
	})
}

// failingWakeClaims fails its first fails claim-and-wake calls with err,
// then passes them on.
type failingWakeClaims struct {
	storage.Store
	err          error
	fails, calls atomic.Int64
}

func (s *failingWakeClaims) ClaimStepsAndWake(ctx context.Context, p storage.ClaimParams) ([]storage.ClaimedStep, time.Time, error) {
	if s.calls.Add(1) <= s.fails.Load() {
		return nil, time.Time{}, s.err
	}
	return s.Store.(storage.WakeClaimer).ClaimStepsAndWake(ctx, p)
}

// TestIdleWorkerClaimFaults: a claim-and-wake call the store refuses
// gives its slots back and is tried again after a pause, so a
// one-slot worker still runs the instance; one that reports the database
// lost stops the worker with that error.
func TestIdleWorkerClaimFaults(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		t.Run("unavailable", func(t *testing.T) {
			store := &failingWakeClaims{err: fmt.Errorf("claim steps: %w", storage.ErrUnavailable)}
			store.fails.Store(3)
			b := setup(t, func(t *testing.T) storage.Store { store.Store = open(t); return store }, nil, laterWorkflow)
			b.runWorker(t, &dagrun.WorkerConfig{Concurrency: 1, Poll: 5 * time.Millisecond, Lease: time.Hour})
			id := b.start(t, "later", `{}`)
			require.Equal(t, storage.InstanceCompleted, b.wait(t, id).Status)
			require.Greater(t, store.calls.Load(), int64(3), "claims after the refused ones")
		})
		t.Run("database lost", func(t *testing.T) {
			store := &failingWakeClaims{err: fmt.Errorf("claim steps: %w", storage.ErrDatabaseLost)}
			store.fails.Store(1 << 30)
			b := setup(t, func(t *testing.T) storage.Store { store.Store = open(t); return store }, nil, laterWorkflow)
			worker, err := b.engine.NewWorker(&dagrun.WorkerConfig{Poll: 5 * time.Millisecond, Lease: time.Hour})
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			require.ErrorIs(t, worker.Run(ctx), storage.ErrDatabaseLost)
			require.NoError(t, ctx.Err(), "the worker stopped on its own")
		})
	})
}
