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

// deadlockLoad is a store on a pool of its own whose deadlocked
// statements are counted, and claimers that drain it.
type deadlockLoad struct {
	t         *testing.T
	s         *Store
	deadlocks *deadlockCounter
	completed atomic.Int64
	wg        sync.WaitGroup
	errs      chan error
}

func newDeadlockLoad(t *testing.T, conns int32) *deadlockLoad {
	t.Helper()
	l := &deadlockLoad{t: t, deadlocks: &deadlockCounter{}, errs: make(chan error, 2*conns)}
	pcfg, err := pgxpool.ParseConfig(testURL(t))
	require.NoError(t, err)
	pcfg.MaxConns = conns
	pcfg.ConnConfig.Tracer = l.deadlocks
	pool, err := pgxpool.NewWithConfig(t.Context(), pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	l.s, err = New(t.Context(), pool, &Config{Schema: newSchema(t)})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, l.s.Close()) })
	_, err = l.s.SetQueueLimit(t.Context(), storage.SetAll(storage.QueueLimit{Queue: "q.work", Concurrency: 4}))
	require.NoError(t, err)
	return l
}

// goClaim starts claimer w, which claims two steps at a time and finishes
// each as outcome says, until want instances completed. As a worker, it
// waits for news of ready steps when a claim comes back empty, or for its
// poll (delayed steps fall due without news): claimers that spun on empty
// claims took the CPU the package's other tests run on.
func (l *deadlockLoad) goClaim(w, want int, plan storage.PlanFunc, outcome func(storage.ClaimedStep) storage.Outcome) {
	ready, unsubscribe := l.s.Subscribe(nil)
	l.wg.Go(func() {
		defer unsubscribe()
		ctx := l.t.Context()
		lease := storage.ClaimParams{WorkerID: fmt.Sprint("w", w), Limit: 2, Lease: time.Minute}
		poll := time.NewTicker(5 * time.Millisecond)
		defer poll.Stop()
		for deadline := time.Now().Add(time.Minute); l.completed.Load() < int64(want); {
			if time.Now().After(deadline) {
				l.errs <- fmt.Errorf("claimer %d: %d of %d instances completed within a minute", w, l.completed.Load(), want)
				return
			}
			claimed, err := l.s.ClaimSteps(ctx, lease)
			if err != nil {
				l.errs <- err
				return
			}
			var results []storage.StepResult
			for _, c := range claimed {
				results = append(results, storage.StepResult{Claim: c.Claim, Outcome: outcome(c), Output: []byte(`1`), Error: "again"})
			}
			if len(results) == 0 {
				select {
				case <-ready:
				case <-poll.C:
				}
				continue
			}
			finished, err := l.s.FinishSteps(ctx, results, plan)
			if err != nil {
				l.errs <- err
				return
			}
			for i, f := range finished {
				if f.Accepted && results[i].Outcome == storage.OutcomeCompleted {
					l.completed.Add(1)
				}
			}
		}
	})
}

// check waits for every goroutine of the load and requires that want
// instances completed without an error and without a deadlock.
func (l *deadlockLoad) check(want int) {
	l.t.Helper()
	l.wg.Wait()
	close(l.errs)
	for err := range l.errs {
		require.NoError(l.t, err)
	}
	require.EqualValues(l.t, want, l.completed.Load())
	require.Zero(l.t, l.deadlocks.n.Load(), "statements ended as deadlocked")
}

// TestLimitsDueWorkNoDeadlock: claimers promoting delayed steps under a
// step key and a queue limit, and finishing them (a slot freed releases
// held steps of the key and of the queue), never deadlock one another.
// Before the limits' locks had one order (migration 22), this load
// deadlocked until a deadlock outlived the store's retries.
func TestLimitsDueWorkNoDeadlock(t *testing.T) {
	t.Parallel()
	const (
		claimers  = 12
		instances = 360
		keys      = 6
	)
	l := newDeadlockLoad(t, claimers+2)
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
	_, err := l.s.CreateInstances(t.Context(), nil, all, storagetest.KeyPlan)
	require.NoError(t, err)
	for w := range claimers {
		l.goClaim(w, instances, storagetest.KeyPlan, func(c storage.ClaimedStep) storage.Outcome {
			// Every other step fails its first attempt: its retry waits
			// out a backoff and is promoted again.
			if c.Attempt == 1 && c.InstanceID[len(c.InstanceID)-1]%2 == 0 {
				return storage.OutcomeRetry
			}
			return storage.OutcomeCompleted
		})
	}
	l.check(instances)
}

// TestLimitsStartsAndFinishesNoDeadlock: starting instances under a
// workflow-level key (the key's lock, then the limits of their first
// steps) while claimers finish the steps of others (the limits of the
// step, then the key as the instance finishes) never deadlock. Before
// locking a finish's instances took their workflow keys too
// (lockInstancesSQL), the two took the locks in opposite orders and
// deadlocked until a deadlock outlived the store's retries. (A finish of
// instances under two keys: TestFinishTakesWorkflowKeysFirst.)
func TestLimitsStartsAndFinishesNoDeadlock(t *testing.T) {
	t.Parallel()
	const (
		workers   = 6
		instances = 120
		keys      = 3
	)
	l := newDeadlockLoad(t, 2*workers+2)
	all := make([]storage.CreateParams, instances)
	for i := range all {
		all[i] = params(storage.StepSpec{Name: "work", Handler: "h", Queue: "q.work", Retry: storage.RetryPolicy{MaxAttempts: 1}})
		all[i].ConcurrencyKey, all[i].ConcurrencyLimit = fmt.Sprint("k", i%keys), 2
	}
	for w := range workers {
		l.wg.Go(func() { // a starter
			for i := w; i < instances; i += workers {
				if _, err := l.s.CreateInstances(t.Context(), nil, all[i:i+1], storagetest.Plan); err != nil {
					l.errs <- err
					return
				}
			}
		})
		l.goClaim(w, instances, storagetest.Plan, func(storage.ClaimedStep) storage.Outcome { return storage.OutcomeCompleted })
	}
	l.check(instances)
}

// TestFinishTakesWorkflowKeysFirst: a finish of steps of instances under
// two workflow keys takes both keys before any queue's lock. Another
// session holds the second key, as a start under it would while it
// counts the key's instances; while the finish waits for that key, the
// session can still take the queue's lock, which the start's steps need
// next. A finish that took the queue first (and the second key only as it
// reached that instance's step) would have the two wait for each other.
func TestFinishTakesWorkflowKeysFirst(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := openTestStore(t, nil)
	_, err := s.SetQueueLimit(ctx, storage.SetAll(storage.QueueLimit{Queue: "q.work", Concurrency: 4}))
	require.NoError(t, err)
	var ps []storage.CreateParams
	for _, key := range []string{"a", "b"} {
		p := params(storage.StepSpec{Name: "work", Handler: "h", Queue: "q.work", Retry: storage.RetryPolicy{MaxAttempts: 1}})
		p.ConcurrencyKey, p.ConcurrencyLimit = key, 2
		ps = append(ps, p)
	}
	_, err = s.CreateInstances(ctx, nil, ps, storagetest.Plan)
	require.NoError(t, err)
	claimed, err := s.ClaimSteps(ctx, storage.ClaimParams{WorkerID: "w", Limit: 2, Lease: time.Minute})
	require.NoError(t, err)
	require.Len(t, claimed, 2)

	start, err := sharedPool(t).Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = start.Rollback(context.WithoutCancel(ctx)) })
	_, err = start.Exec(ctx, s.q(`SELECT {s}limits_lock('i', 'wf', 'b', '')`))
	require.NoError(t, err)

	finished := make(chan error, 1)
	go func() {
		results := []storage.StepResult{
			{Claim: claimed[0].Claim, Outcome: storage.OutcomeCompleted, Output: []byte(`1`)},
			{Claim: claimed[1].Claim, Outcome: storage.OutcomeCompleted, Output: []byte(`1`)},
		}
		_, err := s.FinishSteps(ctx, results, storagetest.Plan)
		finished <- err
	}()
	require.Eventually(t, func() bool {
		var waiting bool
		err := sharedPool(t).QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND wait_event = 'advisory' AND strpos(query, $1) > 0)`, s.cfg.Schema).Scan(&waiting)
		return err == nil && waiting
	}, 10*time.Second, 5*time.Millisecond, "the finish does not wait for the workflow key another session holds")

	var queueFree bool
	require.NoError(t, start.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock(hashtextextended(
		$1 || chr(31) || 'q' || chr(31) || 'q.work' || chr(31) || '' || chr(31) || '', 0))`, s.cfg.Schema).Scan(&queueFree))
	require.True(t, queueFree, "the finish holds the queue's lock while it waits for a workflow key")
	require.NoError(t, start.Rollback(ctx))
	require.NoError(t, <-finished)
}
