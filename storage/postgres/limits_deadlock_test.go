package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/storagetest"
)

// deadlockCounter counts the statements of a pool that PostgreSQL ended
// as deadlocked; the store retries them, so only a count shows them.
type deadlockCounter struct{ n atomic.Int64 }

func (d *deadlockCounter) count(err error) {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "40P01" {
		d.n.Add(1)
	}
}

func (d *deadlockCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (d *deadlockCounter) TraceQueryEnd(_ context.Context, _ *pgx.Conn, e pgx.TraceQueryEndData) {
	d.count(e.Err)
}
func (d *deadlockCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}
func (d *deadlockCounter) TraceBatchQuery(_ context.Context, _ *pgx.Conn, q pgx.TraceBatchQueryData) {
	d.count(q.Err)
}
func (d *deadlockCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// TestLimitsDueWorkNoDeadlock: claimers promoting delayed steps under a
// step key and a queue limit, and finishing them (a slot freed releases
// held steps of the key and of the queue), never deadlock one another.
// Before the limits' locks had one order, this load deadlocked tens of
// times a run, and each deadlock cost a transaction and a retry.
func TestLimitsDueWorkNoDeadlock(t *testing.T) {
	t.Parallel()
	const (
		claimers  = 12
		instances = 360
		keys      = 6
	)
	ctx := t.Context()
	deadlocks := &deadlockCounter{}
	pcfg, err := pgxpool.ParseConfig(testURL(t))
	require.NoError(t, err)
	pcfg.MaxConns = claimers + 2
	pcfg.ConnConfig.Tracer = deadlocks
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	s, err := New(ctx, pool, &Config{Schema: newSchema(t)})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })

	_, err = s.SetQueueLimit(ctx, storage.SetAll(storage.QueueLimit{Queue: "q.work", Concurrency: 4}))
	require.NoError(t, err)
	all := make([]storage.CreateParams, instances)
	soon := time.Now().Add(50 * time.Millisecond)
	for i := range all {
		work := storage.StepSpec{Name: "work", Handler: "h", Queue: "q.work", ConcurrencyLimit: 2,
			Retry: storage.RetryPolicy{MaxAttempts: 3, Backoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond}}
		all[i] = params(work)
		all[i].Input, _ = json.Marshal(map[string]string{"key": fmt.Sprint(i % keys)})
		if i%2 == 1 { // a delayed start: promoted when due, taking its slots then
			all[i].RunAfter = soon
		}
	}
	_, err = s.CreateInstances(ctx, nil, all, storagetest.KeyPlan)
	require.NoError(t, err)

	var (
		completed atomic.Int64
		wg        sync.WaitGroup
		errs      = make(chan error, claimers)
	)
	for w := range claimers {
		wg.Go(func() {
			lease := storage.ClaimParams{WorkerID: fmt.Sprint("w", w), Limit: 2, Lease: time.Minute}
			for deadline := time.Now().Add(time.Minute); completed.Load() < instances; {
				if time.Now().After(deadline) {
					errs <- fmt.Errorf("claimer %d: %d of %d instances completed within a minute", w, completed.Load(), instances)
					return
				}
				claimed, err := s.ClaimSteps(ctx, lease)
				if err != nil {
					errs <- err
					return
				}
				var results []storage.StepResult
				for _, c := range claimed {
					// Every other step fails its first attempt: its retry
					// waits out a backoff and is promoted again.
					outcome := storage.OutcomeCompleted
					if c.Attempt == 1 && c.InstanceID[len(c.InstanceID)-1]%2 == 0 {
						outcome = storage.OutcomeRetry
					}
					results = append(results, storage.StepResult{Claim: c.Claim, Outcome: outcome, Output: []byte(`1`), Error: "again"})
				}
				if len(results) == 0 {
					continue
				}
				finished, err := s.FinishSteps(ctx, results, storagetest.KeyPlan)
				if err != nil {
					errs <- err
					return
				}
				for i, f := range finished {
					if f.Accepted && results[i].Outcome == storage.OutcomeCompleted {
						completed.Add(1)
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.EqualValues(t, instances, completed.Load())
	require.Zero(t, deadlocks.n.Load(), "statements ended as deadlocked")
}
