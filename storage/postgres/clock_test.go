package postgres

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/storagetest"
)

// argsTracer records the arguments of every statement a pool runs, in
// batches too.
type argsTracer struct {
	mu   sync.Mutex
	args [][]any
	sql  []string
}

func (a *argsTracer) record(sql string, args []any) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.sql = append(a.sql, sql)
	a.args = append(a.args, args)
}

func (a *argsTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	a.record(d.SQL, d.Args)
	return ctx
}
func (a *argsTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (a *argsTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}
func (a *argsTracer) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	a.record(d.SQL, d.Args)
}
func (a *argsTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// TestNoTimeFromTheProcess: with Config.Now unset, as in production, no
// statement carries a time read from this process's clock, so a worker
// whose clock runs far ahead cannot judge a healthy lease expired (or a
// lease or delay too short): every lease, run-after, ready and event time
// is the server's, and its recovery pass leaves another worker's healthy
// leases alone whatever its own clock says.
func TestNoTimeFromTheProcess(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	schema := newSchema(t)
	tracer := &argsTracer{}
	pcfg, err := pgxpool.ParseConfig(testURL(t))
	require.NoError(t, err)
	pcfg.MaxConns = 2
	pcfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	s, err := New(ctx, pool, &Config{Schema: schema})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })

	// Every statement of the store that reads or writes a time.
	lease := storage.ClaimParams{WorkerID: "w", Limit: 1, Lease: time.Minute}
	res, claimed, err := s.CreateAndClaim(ctx, []storage.CreateParams{params(spec("a"), spec("b", "a")), params(spec("a"))}, storagetest.Plan, lease)
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	lost, err := s.ExtendLeases(ctx, []storage.Claim{claimed[0].Claim}, time.Minute)
	require.NoError(t, err)
	require.Empty(t, lost)
	_, next, err := s.FinishAndClaim(ctx, []storage.StepResult{{Claim: claimed[0].Claim, Outcome: storage.OutcomeRetry, Error: "again"}}, storagetest.Plan, lease)
	require.NoError(t, err)
	require.Len(t, next, 1)
	_, err = s.FinishSteps(ctx, []storage.StepResult{{Claim: next[0].Claim, Outcome: storage.OutcomeSnooze}}, storagetest.Plan)
	require.NoError(t, err)
	cs, err := s.ClaimSteps(ctx, storage.ClaimParams{WorkerID: "w", Limit: 10, Lease: time.Minute})
	require.NoError(t, err)
	require.NotEmpty(t, cs)
	require.NoError(t, s.ReleaseSteps(ctx, []storage.Claim{cs[0].Claim}))
	_, err = s.RecoverExpired(ctx, 0, storagetest.Plan)
	require.NoError(t, err)
	require.NoError(t, s.CancelInstance(ctx, res[1].ID, "stop", storagetest.Plan))
	require.NoError(t, s.RetryInstance(ctx, res[1].ID, storagetest.Plan))
	_, err = s.Stats(ctx)
	require.NoError(t, err)

	tracer.mu.Lock()
	for i, args := range tracer.args {
		for _, a := range args {
			switch v := a.(type) {
			case time.Time:
				t.Errorf("statement carries the time %v from the process:\n%s", v, tracer.sql[i])
			case *time.Time:
				if v != nil {
					t.Errorf("statement carries the time %v from the process:\n%s", *v, tracer.sql[i])
				}
			case []time.Time:
				t.Errorf("statement carries times %v from the process:\n%s", v, tracer.sql[i])
			case []*time.Time:
				for _, e := range v {
					if e != nil {
						t.Errorf("statement carries the time %v from the process:\n%s", *e, tracer.sql[i])
					}
				}
			}
		}
	}
	tracer.mu.Unlock()

	// Another worker's healthy leases, and this one's, survive its
	// recovery pass: by the server's clock, the only one consulted, they
	// have not ended.
	other := openInSchema(t, schema, nil)
	_, err = other.CreateInstances(ctx, nil, []storage.CreateParams{params(spec("a"))}, storagetest.Plan)
	require.NoError(t, err)
	held, err := other.ClaimSteps(ctx, storage.ClaimParams{WorkerID: "other", Limit: 10, Lease: time.Minute})
	require.NoError(t, err)
	require.NotEmpty(t, held)
	n, err := s.RecoverExpired(ctx, 0, storagetest.Plan)
	require.NoError(t, err)
	require.Zero(t, n)
	lost, err = other.ExtendLeases(ctx, claimsOf(held), time.Minute)
	require.NoError(t, err)
	require.Empty(t, lost, "the other worker's leases held")
}

func claimsOf(cs []storage.ClaimedStep) []storage.Claim {
	out := make([]storage.Claim, len(cs))
	for i, c := range cs {
		out[i] = c.Claim
	}
	return out
}

// TestEagerClaimLeaseAfterLockWait: a finish that waits for another
// transaction's lock on its instance, then claims, gets a lease counted
// from when it took the step, not from when its transaction began.
func TestEagerClaimLeaseAfterLockWait(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := openTestStore(t, nil)
	res, err := s.CreateInstances(ctx, nil, []storage.CreateParams{params(spec("a"), spec("b"))}, storagetest.Plan)
	require.NoError(t, err)
	id := res[0].ID
	first := storage.ClaimParams{WorkerID: "w", Limit: 1, Lease: time.Minute, InstanceID: id}
	cs, err := s.ClaimSteps(ctx, first)
	require.NoError(t, err)
	require.Len(t, cs, 1)

	holder, err := sharedPool(t).Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(context.WithoutCancel(ctx)) }()
	_, err = holder.Exec(ctx, s.q(`SELECT 1 FROM {s}instances WHERE id = $1 FOR NO KEY UPDATE`), id)
	require.NoError(t, err)

	var (
		claimed []storage.ClaimedStep
		finErr  error
		done    = make(chan struct{})
	)
	go func() {
		defer close(done)
		_, claimed, finErr = s.FinishAndClaim(ctx, []storage.StepResult{{Claim: cs[0].Claim, Outcome: storage.OutcomeCompleted}}, storagetest.Plan, first)
	}()
	holderPID := holder.Conn().PgConn().PID()
	require.Eventually(t, func() bool {
		var waiting bool
		err := sharedPool(t).QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid)))`,
			int32(holderPID)).Scan(&waiting)
		return err == nil && waiting
	}, 10*time.Second, 5*time.Millisecond, "the finish never waited for the instance's lock")
	var released time.Time
	require.NoError(t, holder.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&released))
	require.NoError(t, holder.Commit(ctx))
	<-done
	require.NoError(t, finErr)
	require.Len(t, claimed, 1)
	require.False(t, claimed[0].LeaseUntil.Before(released.Add(time.Minute)),
		"lease until %v, but the step was taken after %v", claimed[0].LeaseUntil, released)
}

// TestStoreNow: Store.Now reads the server's clock, or Config.Now when set.
func TestStoreNow(t *testing.T) {
	t.Parallel()
	s := openTestStore(t, nil)
	before := time.Now()
	got, err := s.Now(t.Context())
	require.NoError(t, err)
	require.Equal(t, time.UTC, got.Location())
	// Server and test share this machine's clock.
	require.WithinDuration(t, before, got, time.Minute)

	fixed := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	s = openTestStore(t, &Config{Now: func() time.Time { return fixed }})
	got, err = s.Now(t.Context())
	require.NoError(t, err)
	require.Equal(t, fixed, got)
}

// TestSnoozeMessage: a snooze's event names the time its step is pending
// again as SQLite's does (time.RFC3339Nano in UTC), computed by the
// statement, which alone knows the time.
func TestSnoozeMessage(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 2, 15, 4, 5, 0, time.UTC)
	s := openTestStore(t, &Config{Now: func() time.Time { return now }})
	for _, until := range []time.Time{
		now.Add(500 * time.Millisecond),
		now.Add(time.Hour),
		now.Add(123456 * time.Microsecond),
		now.Add(10 * time.Microsecond),
		now.Add(-time.Hour), // in the past: pending now
		{},
	} {
		ctx := t.Context()
		res, err := s.CreateInstances(ctx, nil, []storage.CreateParams{params(spec("a"))}, storagetest.Plan)
		require.NoError(t, err)
		cs, err := s.ClaimSteps(ctx, storage.ClaimParams{Limit: 1, Lease: time.Minute, InstanceID: res[0].ID})
		require.NoError(t, err)
		_, err = s.FinishSteps(ctx, []storage.StepResult{{Claim: cs[0].Claim, Outcome: storage.OutcomeSnooze, RunAfter: until}}, storagetest.Plan)
		require.NoError(t, err)
		in, err := s.GetInstance(ctx, res[0].ID)
		require.NoError(t, err)
		want := now
		if until.After(now) {
			want = until
		}
		last := in.Events[len(in.Events)-1]
		require.Equal(t, storage.EventStepSnoozed, last.Type)
		require.Equal(t, "until "+want.Format(time.RFC3339Nano), last.Message)
	}
}
