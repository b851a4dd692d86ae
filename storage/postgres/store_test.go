package postgres

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/internal/migrate"
	"github.com/dagrun/dagrun/storage/storagetest"
)

// openInSchema opens a store with a pool of its own (as another process
// would) on an existing schema, closed in cleanup.
func openInSchema(t *testing.T, schema string, cfg *Config) *Store {
	t.Helper()
	c := Config{}
	if cfg != nil {
		c = *cfg
	}
	c.Schema = schema
	c.MaxConns = cmpOr(c.MaxConns, 4)
	s, err := Open(t.Context(), testURL(t), &c)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	return s
}

func cmpOr(a, b int32) int32 {
	if a != 0 {
		return a
	}
	return b
}

func spec(name string, deps ...string) storage.StepSpec {
	return storage.StepSpec{Name: name, Handler: "h", Queue: "default", DependsOn: deps, Retry: storage.RetryPolicy{MaxAttempts: 3}}
}

var idSeq atomic.Int64

func params(steps ...storage.StepSpec) storage.CreateParams {
	return storage.CreateParams{
		ID:             fmt.Sprintf("pg-%012d", idSeq.Add(1)),
		Workflow:       "wf",
		DefinitionHash: "h1",
		Definition:     []byte("name: wf\n"),
		Input:          []byte(`{}`),
		Steps:          steps,
	}
}

func awaitSignal(t *testing.T, ch <-chan struct{}, within time.Duration, what string) time.Duration {
	t.Helper()
	start := time.Now()
	select {
	case <-ch:
		return time.Since(start)
	case <-time.After(within):
		require.FailNow(t, "no signal within "+within.String()+" after "+what)
		return 0
	}
}

func drain(ch <-chan struct{}) {
	for {
		select {
		case <-ch:
		default:
			return
		}
	}
}

func awaitListener(t *testing.T, s *Store, not uint32) uint32 {
	t.Helper()
	var pid uint32
	require.Eventually(t, func() bool {
		pid = s.listenerPID()
		return pid != 0 && pid != not
	}, 10*time.Second, 5*time.Millisecond, "listener did not connect")
	return pid
}

// subscribeIdle subscribes to s as an idle worker does: its claim finds
// nothing, which makes the store listen. It returns once the listener
// LISTENs, with its backend PID and nothing pending.
func subscribeIdle(t *testing.T, s *Store) (<-chan struct{}, uint32) {
	t.Helper()
	ch, cancel := s.Subscribe(nil)
	t.Cleanup(cancel)
	none, err := s.ClaimSteps(t.Context(), storage.ClaimParams{WorkerID: "idle", Handlers: []string{"no such handler"}, Limit: 1, Lease: time.Minute})
	require.NoError(t, err)
	require.Empty(t, none)
	pid := awaitListener(t, s, 0)
	drain(ch)
	return ch, pid
}

// listenedTo opens a store and another one on its schema, as a second
// process would, and returns the first with the signals of a subscriber
// of the second, listening and with nothing pending.
func listenedTo(t *testing.T) (*Store, <-chan struct{}) {
	t.Helper()
	a := openTestStore(t, nil)
	b := openInSchema(t, a.cfg.Schema, nil)
	ch, _ := subscribeIdle(t, b)
	return a, ch
}

// TestNotifyWakesOtherStore: a commit in one store (one process) wakes a
// subscriber of another store with its own pool, through LISTEN/NOTIFY.
func TestNotifyWakesOtherStore(t *testing.T) {
	t.Parallel()
	a, ch := listenedTo(t)

	_, err := a.CreateInstances(t.Context(), nil, []storage.CreateParams{params(spec("a"))}, storagetest.Plan)
	require.NoError(t, err)
	took := awaitSignal(t, ch, 2*time.Second, "a create in another store")
	t.Logf("NOTIFY reached the other store's subscriber in %v", took)

	// A caller's transaction notifies at its commit, not before.
	tx, err := a.Pool().Begin(t.Context())
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.WithoutCancel(t.Context())) }()
	_, err = a.CreateInstances(t.Context(), tx, []storage.CreateParams{params(spec("a"))}, storagetest.Plan)
	require.NoError(t, err)
	select {
	case <-ch:
		require.FailNow(t, "signalled before the caller committed")
	case <-time.After(100 * time.Millisecond):
	}
	require.NoError(t, tx.Commit(t.Context()))
	awaitSignal(t, ch, 2*time.Second, "the caller's commit")
}

// TestNotifyWakesTheSubscribersOfItsQueues: another process's commit
// wakes the subscribers of the queues it made ready and those of every
// queue, not those of other queues; a NOTIFY that names no queue (steps a
// claim promoted, whose queues it does not know) and a wait's deadline
// wake them all. After each commit the test sends a NOTIFY of a queue of
// its own and awaits its subscriber: notifications arrive in the order
// they were sent, so every signal of the commit has been given once the
// store has signalled that subscriber and let go of its subscribers.
func TestNotifyWakesTheSubscribersOfItsQueues(t *testing.T) {
	t.Parallel()
	a := openTestStore(t, nil)
	b := openInSchema(t, a.cfg.Schema, nil)
	subscribe := func(queues ...string) <-chan struct{} {
		ch, cancel := b.Subscribe(queues)
		t.Cleanup(cancel)
		return ch
	}
	subs := map[string]<-chan struct{}{"q.a": subscribe("q.a"), "q.b": subscribe("q.b"), "q.a and q.b": subscribe("q.a", "q.b")}
	subs["every queue"], _ = subscribeIdle(t, b)
	inQueue := func(queue string) storage.CreateParams {
		step := spec("a")
		step.Queue = queue
		return params(step)
	}
	cases := []struct {
		name   string
		commit func(t *testing.T)
		woken  []string
	}{
		{"a create of a q.a step", func(t *testing.T) {
			_, err := a.CreateInstances(t.Context(), nil, []storage.CreateParams{inQueue("q.a")}, storagetest.Plan)
			require.NoError(t, err)
		}, []string{"q.a", "q.a and q.b", "every queue"}},
		{"a caller's commit of a q.b step", func(t *testing.T) {
			tx, err := a.Pool().Begin(t.Context())
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(context.WithoutCancel(t.Context())) }()
			_, err = a.CreateInstances(t.Context(), tx, []storage.CreateParams{inQueue("q.b")}, storagetest.Plan)
			require.NoError(t, err)
			require.NoError(t, tx.Commit(t.Context()))
		}, []string{"q.b", "q.a and q.b", "every queue"}},
		{"a NOTIFY that names no queue", func(t *testing.T) {
			_, err := a.Pool().Exec(t.Context(), "SELECT pg_notify($1, $2)", a.channel, payload(a.origin, nil))
			require.NoError(t, err)
		}, []string{"q.a", "q.b", "q.a and q.b", "every queue"}},
		{"a create of a wait with a deadline in q.a", func(t *testing.T) {
			// Any worker times out a wait: its deadline is news for every
			// queue. (storagetest.Plan makes a step whose name begins with
			// "await" wait.)
			wait := spec("await-approval")
			wait.Handler, wait.Queue, wait.Wait = "", "q.a", &storage.WaitSpec{Signal: "approval", Timeout: time.Hour}
			_, err := a.CreateInstances(t.Context(), nil, []storage.CreateParams{params(wait)}, storagetest.Plan)
			require.NoError(t, err)
		}, []string{"q.a", "q.b", "q.a and q.b", "every queue"}},
	}
	for i, c := range cases {
		for _, ch := range subs {
			drain(ch)
		}
		// A marker of the case's own: an earlier case's marker may still
		// be on its way. A NOTIFY that names no queue signals it too, with
		// every other subscriber at once.
		markerQueue := fmt.Sprintf("q.marker.%d", i)
		marker := subscribe(markerQueue)
		c.commit(t)
		a.notifier.idle.Wait() // the commit's NOTIFY is sent
		_, err := a.Pool().Exec(t.Context(), "SELECT pg_notify($1, $2)", a.channel, payload(a.origin, queueSet(markerQueue)))
		require.NoError(t, err)
		awaitSignal(t, marker, 2*time.Second, "the marker after "+c.name)
		// The broadcaster signals every subscriber under subsMu: once the
		// marker's signal arrived, taking the lock waits out that round,
		// so the signal that reached the marker has reached all.
		b.subsMu.Lock()
		//lint:ignore SA2001 an empty critical section is the barrier
		b.subsMu.Unlock()
		for name, ch := range subs {
			select {
			case <-ch:
				require.Contains(t, c.woken, name, "the subscriber of %s was signalled by %s", name, c.name)
			default:
				require.NotContains(t, c.woken, name, "the subscriber of %s was not signalled by %s", name, c.name)
			}
		}
	}
}

// TestNotifyTellsOfADeadline: an instance that starts only waiting makes
// no step ready, but its workflow timeout is a time another process's
// idle worker must wake at: the create notifies.
func TestNotifyTellsOfADeadline(t *testing.T) {
	t.Parallel()
	a, ch := listenedTo(t)

	// storagetest.Plan makes a step whose name begins with "await" wait.
	wait := spec("await-approval")
	wait.Handler, wait.Wait = "", &storage.WaitSpec{Signal: "approval"}
	p := params(wait)
	p.Timeout = time.Hour
	_, err := a.CreateInstances(t.Context(), nil, []storage.CreateParams{p}, storagetest.Plan)
	require.NoError(t, err)
	awaitSignal(t, ch, 2*time.Second, "a create with a workflow timeout")
	in, err := a.GetInstance(t.Context(), p.ID)
	require.NoError(t, err)
	require.Equal(t, storage.StepWaiting, in.Steps[0].Status, "the instance started only waiting")
}

// TestNotifyDebounced: one transaction making many steps ready sends one
// NOTIFY.
func TestNotifyDebounced(t *testing.T) {
	t.Parallel()
	s := openTestStore(t, nil)
	conn, err := pgx.Connect(t.Context(), testURL(t))
	require.NoError(t, err)
	defer conn.Close(context.WithoutCancel(t.Context()))
	_, err = conn.Exec(t.Context(), "LISTEN "+pgx.Identifier{s.channel}.Sanitize())
	require.NoError(t, err)

	ps := make([]storage.CreateParams, 50)
	for i := range ps {
		ps[i] = params(spec("a"), spec("b"), spec("c", "a", "b"))
	}
	_, err = s.CreateInstances(t.Context(), nil, ps, storagetest.Plan)
	require.NoError(t, err)

	n, err := conn.WaitForNotification(t.Context())
	require.NoError(t, err)
	require.Equal(t, s.channel, n.Channel)
	require.Equal(t, s.origin+":default", n.Payload)
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	_, err = conn.WaitForNotification(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded, "a second notification for one transaction")
}

// TestNotifySkippedForWhatItsClaimTook: a finish whose eager claim took
// every step its plan made ready tells no other process; one that left a
// step ready does.
func TestNotifySkippedForWhatItsClaimTook(t *testing.T) {
	t.Parallel()
	s := openTestStore(t, nil)
	ctx := t.Context()
	conn, err := pgx.Connect(ctx, testURL(t))
	require.NoError(t, err)
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, "LISTEN "+pgx.Identifier{s.channel}.Sanitize())
	require.NoError(t, err)
	notified := func() bool {
		t.Helper()
		wait, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		_, err := conn.WaitForNotification(wait)
		if errors.Is(err, context.DeadlineExceeded) {
			return false
		}
		require.NoError(t, err)
		return true
	}
	claim := storage.ClaimParams{WorkerID: "w", Limit: 1, Lease: time.Minute}
	finishAndClaim := func(c storage.ClaimedStep) []storage.ClaimedStep {
		t.Helper()
		_, next, err := s.FinishAndClaim(ctx, []storage.StepResult{{Claim: c.Claim, Outcome: storage.OutcomeCompleted,
			Output: []byte(`1`)}}, storagetest.Plan, claim)
		require.NoError(t, err)
		return next
	}

	chain := params(spec("a"), spec("b", "a"))
	_, err = s.CreateInstances(ctx, nil, []storage.CreateParams{chain}, storagetest.Plan)
	require.NoError(t, err)
	require.True(t, notified(), "the create made a ready")
	a, err := s.ClaimSteps(ctx, claim)
	require.NoError(t, err)
	require.Len(t, a, 1)
	require.Len(t, finishAndClaim(a[0]), 1, "b claimed with a's finish")
	require.False(t, notified(), "b was taken by the finish that made it ready")

	fan := params(spec("a"), spec("b", "a"), spec("c", "a"))
	_, err = s.CreateInstances(ctx, nil, []storage.CreateParams{fan}, storagetest.Plan)
	require.NoError(t, err)
	require.True(t, notified())
	a, err = s.ClaimSteps(ctx, storage.ClaimParams{WorkerID: "w", Limit: 1, Lease: time.Minute, InstanceID: fan.ID})
	require.NoError(t, err)
	require.Len(t, a, 1)
	require.Len(t, finishAndClaim(a[0]), 1, "one of b and c claimed")
	require.True(t, notified(), "the other is left for other processes")

	// A start whose claim takes its first step, as a start in a process
	// with an idle worker does (Engine's eager start).
	// Its claim is bound to the new instance: one of b and c is still
	// ready, and an unbound claim would take that first.
	claimIn := func(p storage.CreateParams) storage.ClaimParams {
		c := claim
		c.InstanceID = p.ID
		return c
	}
	started := params(spec("a"), spec("b", "a"))
	_, took, err := s.CreateAndClaim(ctx, []storage.CreateParams{started}, storagetest.Plan, claimIn(started))
	require.NoError(t, err)
	require.Len(t, took, 1)
	require.False(t, notified(), "a was taken by the start that made it ready")
	one, other := params(spec("a")), params(spec("a"))
	_, took, err = s.CreateAndClaim(ctx, []storage.CreateParams{one, other}, storagetest.Plan, claimIn(one))
	require.NoError(t, err)
	require.Len(t, took, 1)
	require.True(t, notified(), "the other start's a is left for other processes")
}

// TestListenerReconnects: when the listener's connection is killed, it
// reconnects, signals subscribers once (notifications may have been lost),
// and relays notifications again.
func TestListenerReconnects(t *testing.T) {
	t.Parallel()
	s := openTestStore(t, &Config{ListenerRetryMin: 10 * time.Millisecond, ListenerRetryMax: 100 * time.Millisecond})
	other := openInSchema(t, s.cfg.Schema, nil)
	ch, pid := subscribeIdle(t, s)

	var killed bool
	require.NoError(t, sharedPool(t).QueryRow(t.Context(), "SELECT pg_terminate_backend($1)", int32(pid)).Scan(&killed))
	require.True(t, killed)
	awaitSignal(t, ch, 10*time.Second, "a reconnect")
	awaitListener(t, s, pid)
	drain(ch)

	_, err := other.CreateInstances(t.Context(), nil, []storage.CreateParams{params(spec("a"))}, storagetest.Plan)
	require.NoError(t, err)
	awaitSignal(t, ch, 2*time.Second, "a create in another store after the reconnect")
}

// TestConcurrentMigration: stores opened at once by several pools on a new
// schema all succeed, and each migration is applied once.
func TestConcurrentMigration(t *testing.T) {
	t.Parallel()
	schema := newSchema(t)
	const n = 6
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			s, err := Open(t.Context(), testURL(t), &Config{Schema: schema, MaxConns: 2})
			if err == nil {
				err = s.Close()
			}
			errs[i] = err
		})
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))

	ms, err := migrate.Read(migrationFS, "migrations")
	require.NoError(t, err)
	rows, err := sharedPool(t).Query(t.Context(), "SELECT version FROM "+pgx.Identifier{schema, "schema_migrations"}.Sanitize()+" ORDER BY version")
	require.NoError(t, err)
	versions, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	require.NoError(t, err)
	require.Len(t, versions, len(ms))
	for i, m := range ms {
		require.EqualValues(t, m.Version, versions[i])
	}
}

// TestMigratedSchemaOpensWithoutTheLock: a store opened on a schema that
// has every migration already does not wait for the migration lock, which
// a fleet of workers starting at once would otherwise queue for one by
// one; a schema that lacks one still waits for it.
func TestMigratedSchemaOpensWithoutTheLock(t *testing.T) {
	t.Parallel()
	migrated := openTestStore(t, nil).cfg.Schema
	fresh := newSchema(t)
	ctx := t.Context()
	holder, err := sharedPool(t).Acquire(ctx)
	require.NoError(t, err)
	defer holder.Release()
	for _, schema := range []string{migrated, fresh} {
		_, err := holder.Exec(ctx, "SELECT pg_advisory_lock($1, hashtext($2))", migrateLockClass, "dagrun:"+schema)
		require.NoError(t, err)
		defer func() {
			_, err := holder.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1, hashtext($2))", migrateLockClass, "dagrun:"+schema)
			require.NoError(t, err)
		}()
	}

	openCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	s, err := Open(openCtx, testURL(t), &Config{Schema: migrated, MaxConns: 1})
	require.NoError(t, err, "a migrated schema waited for the migration lock")
	require.NoError(t, s.Close())

	waitCtx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	_, err = Open(waitCtx, testURL(t), &Config{Schema: fresh, MaxConns: 1})
	require.Error(t, err, "a schema to migrate did not wait for the lock")
}

// TestClaimUsesPartialIndex: with many finished steps and few pending ones,
// every claim shape reads a partial index of pending steps, for the
// planner's custom and generic plans alike (pgx prepares statements, so the
// generic plan is what a busy worker ends up running).
func TestClaimUsesPartialIndex(t *testing.T) {
	t.Parallel()
	s := openTestStore(t, nil)
	ctx := t.Context()
	_, err := s.CreateInstances(ctx, nil, []storage.CreateParams{params(spec("a"))}, storagetest.Plan)
	require.NoError(t, err)
	fillFinishedHistory(t, s, 5000, false)

	cases := []struct {
		shape claimShape
		args  []any
		index string
	}{
		{claimShape{}, nil, "steps_ready"},
		{claimShape{queues: 1}, []any{"default"}, "steps_ready_queue"},
		{claimShape{queues: 2}, []any{[]string{"default", "other"}}, "steps_ready"},
		{claimShape{queues: 1, byInstance: true}, []any{"default", "x"}, "steps_"},
		{claimShape{byHandler: true}, []any{[]string{"h", "other"}}, "steps_ready"},
		{claimShape{queues: 1, byHandler: true}, []any{"default", []string{"h"}}, "steps_ready_queue"},
		{claimShape{queues: 2, byHandler: true}, []any{[]string{"default", "other"}, []string{"h"}}, "steps_ready"},
		{claimShape{queues: 1, byInstance: true, byHandler: true}, []any{"default", "x", []string{"h"}}, "steps_"},
		{claimShape{byHandler: true, heads: true}, []any{[]string{"h", "other"}}, "steps_ready_handler"},
		{claimShape{queues: 1, byHandler: true, heads: true}, []any{"default", []string{"h"}}, "steps_ready_handler"},
	}
	for _, c := range cases {
		args := append([]any{nil, time.Minute.Microseconds(), "w", 10}, c.args...)
		for mode, plan := range explainPlans(t, s, claimQueries.of(c.shape), args...) {
			require.Contains(t, plan, "Index Scan using "+c.index, "%s %v:\n%s", mode, c.shape, plan)
			require.NotContains(t, plan, "Seq Scan on steps", "%s %v:\n%s", mode, c.shape, plan)
		}
	}
}

// explainPlans returns the plan of query for the planner's custom and
// generic plans, by plan_cache_mode: the custom one for args, and the
// generic one as genericPlan finds it.
func explainPlans(t *testing.T, s *Store, query string, args ...any) map[string]string {
	t.Helper()
	var custom string
	err := pgx.BeginFunc(t.Context(), s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(t.Context(), "SET LOCAL plan_cache_mode = force_custom_plan"); err != nil {
			return err
		}
		rows, err := tx.Query(t.Context(), "EXPLAIN "+s.q(query), args...)
		if err != nil {
			return err
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		custom = strings.Join(lines, "\n")
		return err
	})
	require.NoError(t, err)
	return map[string]string{"force_custom_plan": custom, "force_generic_plan": genericPlan(t, s, query)}
}

// fillFinishedHistory inserts n finished instances of workflow wf with 4
// completed steps each (and, with events, a step.completed event per
// step), then analyzes the tables: the history a busy store's statements
// must not walk.
func fillFinishedHistory(t testing.TB, s *Store, n int, events bool) {
	t.Helper()
	statements := []string{`
		INSERT INTO {s}instances (id, workflow, definition_hash, status, run_after, created_at, finished_at)
		SELECT 'old-' || lpad(g::text, 8, '0'), 'wf', 'h1', 'completed', now(), now(), now()
		FROM generate_series(1, $1::int) g`, `
		INSERT INTO {s}steps (instance_id, position, name, handler, queue, workflow, status, run_after, finished_at)
		SELECT 'old-' || lpad(g::text, 8, '0'), p, 's' || p, 'h', 'default', 'wf', 'completed', now(), now()
		FROM generate_series(1, $1::int) g, generate_series(0, 3) p`}
	if events {
		statements = append(statements, `
		INSERT INTO {s}events (instance_id, type, at)
		SELECT 'old-' || lpad(g::text, 8, '0'), 'step.completed', now() FROM generate_series(1, $1::int) g, generate_series(0, 3) p`)
	}
	for _, stmt := range statements {
		_, err := s.pool.Exec(t.Context(), s.q(stmt), n)
		require.NoError(t, err)
	}
	_, err := s.pool.Exec(t.Context(), s.q(`ANALYZE {s}instances; ANALYZE {s}steps; ANALYZE {s}events`))
	require.NoError(t, err)
}

// TestEventReadsNameTheInstance: every read of an instance's events, custom
// or generic plan, looks up that instance's rows in events_pkey, however
// many events other instances have. A plan keyed on the event ID alone
// would walk other instances' later events to fill a page.
func TestEventReadsNameTheInstance(t *testing.T) {
	t.Parallel()
	s := openTestStore(t, nil)
	ctx := t.Context()
	_, err := s.pool.Exec(ctx, s.q(`
		INSERT INTO {s}instances (id, workflow, definition_hash, status, run_after, created_at, finished_at)
		SELECT 'i-' || g, 'wf', 'h', 'completed', now(), now(), now() FROM generate_series(1, 10) g;
		INSERT INTO {s}events (instance_id, type, at)
		SELECT 'i-' || (g % 10 + 1), 'step.completed', now() FROM generate_series(1, 40000) g;
		ANALYZE {s}instances; ANALYZE {s}events;`))
	require.NoError(t, err)
	snapshot := ""
	require.NoError(t, s.pool.QueryRow(ctx, "SELECT pg_current_snapshot()::text").Scan(&snapshot))
	reads := []struct {
		name  string
		query string
		args  []any
	}{
		{"page after an ID", eventsAfterSQL, []any{"i-7", int64(100), 100}},
		{"latest", latestEventsSQL, []any{"i-7", 100}},
		{"unseen by a snapshot", unseenEventsSQL, []any{"i-7", snapshot}},
	}
	for _, r := range reads {
		for mode, plan := range explainPlans(t, s, instanceEventsSQL(r.query), r.args...) {
			require.Regexp(t, `(Index (Only )?Scan( Backward)? using|Bitmap Index Scan on) events_\w+[\s\S]*?Index Cond: \(\(?instance_id = `, plan,
				"%s, %s:\n%s", r.name, mode, plan)
			require.NotContains(t, plan, "Seq Scan on events", "%s, %s:\n%s", r.name, mode, plan)
		}
	}
}

// TestPromoteGuardIsTheProbe: the condition promoteSQL checks before it
// calls promote_due is the function's own first probe, so a claim skips
// the call exactly when the function would have found nothing due.
func TestPromoteGuardIsTheProbe(t *testing.T) {
	t.Parallel()
	s := openTestStore(t, nil)
	var body string
	require.NoError(t, s.pool.QueryRow(t.Context(), `SELECT prosrc FROM pg_proc WHERE oid = to_regprocedure($1)`,
		s.prefix+"promote_due(timestamptz)").Scan(&body))
	probe, _, ok := strings.Cut(body, "ORDER BY")
	require.True(t, ok, "promote_due has no first probe: %s", body)
	require.Contains(t, probe, "WHERE "+dueSQL+"at\n", "promote_due's first probe is not promoteSQL's guard")
}

// TestPromoteReadsDelayedIndex: moving due steps into the claim indexes
// reads the index of delayed steps, and then its batch by key, for custom
// and generic plans, never the table however many steps it holds.
func TestPromoteReadsDelayedIndex(t *testing.T) {
	t.Parallel()
	s := openTestStore(t, nil)
	ctx := t.Context()
	fillFinishedHistory(t, s, 5000, false)
	// promoteSQL calls promote_due, whose plans EXPLAIN does not show: the
	// queries it reads, as the server stores them.
	var body string
	require.NoError(t, s.pool.QueryRow(ctx, `SELECT prosrc FROM pg_proc WHERE oid = to_regprocedure($1)`,
		s.prefix+"promote_due(timestamptz)").Scan(&body))
	between := func(from, to string) string {
		t.Helper()
		_, rest, ok := strings.Cut(body, from)
		require.True(t, ok, "promote_due has no %q:\n%s", from, body)
		query, _, ok := strings.Cut(rest, to)
		require.True(t, ok, "promote_due has no %q after %q:\n%s", to, from, body)
		return strings.NewReplacer("<= at", "<= {now}", "ANY (batch)", "ANY ('{1,2,3}'::bigint[])",
			"FROM steps", "FROM {s}steps", "JOIN instances", "JOIN {s}instances").Replace(query)
	}
	for _, c := range []struct {
		query string
		index []string
	}{
		{between("batch := ARRAY(", ");"), []string{"steps_delayed_limited"}},
		{between("FOR l IN", "LOOP"), []string{"steps_pkey", "instances_pkey"}},
		// Both bound the read: the batch's keys, or the (due) delayed steps.
		{between("FOR due IN", "LOOP"), []string{"(steps_pkey|steps_delayed)"}},
		{between("WITH free AS (", "\n    )"), []string{"steps_delayed"}},
	} {
		var args []any
		if strings.Contains(c.query, "{now}") {
			args = append(args, nil)
		}
		for mode, plan := range explainPlans(t, s, c.query, args...) {
			for _, index := range c.index {
				require.Regexp(t, "Index Scan using "+index+" ", plan, "%s:\n%s", mode, plan)
			}
			require.NotContains(t, plan, "Seq Scan", "%s:\n%s", mode, plan)
		}
	}
}

// TestReadyStepsReadIndexes: the figures' ready counts (Stats, unserved
// handlers) read the partial indexes of pending steps, never the table
// (which, with sequential scans discouraged, also cost a JIT compile).
func TestReadyStepsReadIndexes(t *testing.T) {
	t.Parallel()
	s := openTestStore(t, nil)
	for mode, plan := range explainPlans(t, s, `SELECT workflow, queue, count(*) FROM `+readySteps+` GROUP BY workflow, queue`, nil) {
		require.NotContains(t, plan, "Seq Scan on steps", "%s:\n%s", mode, plan)
		require.Contains(t, plan, "steps_delayed", "%s:\n%s", mode, plan)
	}
}

// insertDelayed inserts the pending instances due-NNNNNNNN, first to last,
// of one step each, made ready now and delayed for an hour: due to a
// claim whose clock is later.
func insertDelayed(t *testing.T, s *Store, first, last int) {
	t.Helper()
	for _, stmt := range []string{`
		INSERT INTO {s}instances (id, workflow, definition_hash, status, run_after, created_at)
		SELECT 'due-' || lpad(g::text, 8, '0'), 'wf', 'h1', 'pending', now() + interval '1 hour', now()
		FROM generate_series($1::int, $2::int) g`, `
		INSERT INTO {s}steps (instance_id, position, name, handler, queue, workflow, status, ready_at, run_after)
		SELECT 'due-' || lpad(g::text, 8, '0'), 0, 's', 'h', 'default', 'wf', 'pending', now(), now() + interval '1 hour'
		FROM generate_series($1::int, $2::int) g`} {
		_, err := s.pool.Exec(t.Context(), s.q(stmt), first, last)
		require.NoError(t, err)
	}
}

// TestConcurrentPromotionsTakeDifferentSteps: two claims promoting the
// due steps at once, as a fleet's claims do when many fall due together,
// promote different ones. Each read the same batch of the earliest 1,000
// and skipped the rows the other held: the second promoted nothing, and a
// fleet of 40 walked every due step about 40 times.
func TestConcurrentPromotionsTakeDifferentSteps(t *testing.T) {
	t.Parallel()
	s := openTestStore(t, nil)
	ctx := t.Context()
	insertDelayed(t, s, 1, 1500)
	at := time.Now().Add(2 * time.Hour)
	promote := func() int {
		t.Helper()
		tx, err := s.pool.Begin(ctx)
		require.NoError(t, err)
		t.Cleanup(func() { _ = tx.Rollback(context.WithoutCancel(ctx)) })
		var n int
		require.NoError(t, tx.QueryRow(ctx, s.q(`SELECT {s}promote_due($1)`), at).Scan(&n))
		return n
	}
	require.Equal(t, 1000, promote(), "the first claim's batch")
	require.Equal(t, 500, promote(), "a second claim while the first's promotion is not committed")
}

// TestPromotionTellsOtherStores: a claim that promotes the steps falling
// due and takes fewer of them than it promoted tells the other processes,
// whose claims at that moment found every due step being promoted and
// nothing yet promoted: without the NOTIFY they would wait for their poll
// while the steps waited for them. So does a finish whose eager claim
// promotes them, though it made no step ready itself. A claim that
// promotes nothing, or takes every step it promoted, tells no one.
func TestPromotionTellsOtherStores(t *testing.T) {
	t.Parallel()
	for _, via := range []string{"claim", "finish and claim"} {
		t.Run(via, func(t *testing.T) {
			t.Parallel()
			later := time.Now().Add(2 * time.Hour)
			a := openTestStore(t, &Config{Now: func() time.Time { return later }})
			b := openInSchema(t, a.cfg.Schema, nil)
			ctx := t.Context()
			claim := func(limit int) storage.ClaimParams {
				return storage.ClaimParams{WorkerID: "a", Handlers: []string{"h"}, Limit: limit, Lease: time.Minute}
			}
			var running []storage.ClaimedStep
			if via == "finish and claim" {
				_, err := a.CreateInstances(ctx, nil, []storage.CreateParams{params(spec("only"))}, storagetest.Plan)
				require.NoError(t, err)
				running, err = a.ClaimSteps(ctx, claim(1))
				require.NoError(t, err)
				require.Len(t, running, 1)
			}
			ch, _ := subscribeIdle(t, b)
			quiet := func(what string) {
				t.Helper()
				select {
				case <-ch:
					require.FailNow(t, "signalled by "+what)
				case <-time.After(200 * time.Millisecond):
				}
			}

			insertDelayed(t, a, 1, 5) // due by a's clock
			var took []storage.ClaimedStep
			var err error
			if via == "claim" {
				took, err = a.ClaimSteps(ctx, claim(1))
			} else {
				_, took, err = a.FinishAndClaim(ctx, []storage.StepResult{completed(running[0])}, storagetest.Plan, claim(1))
			}
			require.NoError(t, err)
			require.Len(t, took, 1, "the claim takes one of the steps it promoted")
			require.True(t, strings.HasPrefix(took[0].InstanceID, "due-"), "took %s", took[0].InstanceID)
			awaitSignal(t, ch, 5*time.Second, "a "+via+" that promoted 5 steps and took 1")

			drain(ch)
			took, err = a.ClaimSteps(ctx, claim(10))
			require.NoError(t, err)
			require.Len(t, took, 4, "the steps promoted before")
			quiet("a claim that promoted nothing")

			insertDelayed(t, a, 6, 6)
			took, err = a.ClaimSteps(ctx, claim(2))
			require.NoError(t, err)
			require.Len(t, took, 1, "the one step that fell due")
			quiet("a claim that took the one step it promoted")
		})
	}
}

// TestPromotionWaitsForALimitHoldingNoRow: a promotion whose batch holds
// steps under a limit waits for that limit's lock before it locks any
// due row, free ones included. A transaction holding the limit (a finish
// that frees its slot) may then write a free due step without waiting on
// the promotion; were the free rows locked first, the two would deadlock.
func TestPromotionWaitsForALimitHoldingNoRow(t *testing.T) {
	t.Parallel()
	s := openTestStore(t, nil)
	ctx := t.Context()
	for _, stmt := range []string{`
		INSERT INTO {s}instances (id, workflow, definition_hash, status, run_after, created_at)
		VALUES ('free', 'wf', 'h1', 'pending', now(), now()), ('limited', 'wf', 'h1', 'pending', now(), now())`, `
		INSERT INTO {s}steps (instance_id, position, name, handler, queue, workflow, status, ready_at, run_after,
			queue_limited, slots_due)
		VALUES ('free', 0, 's', 'h', 'default', 'wf', 'pending', now(), now() + interval '1 hour', false, true),
			('limited', 0, 's', 'h', 'lim', 'wf', 'pending', now(), now() + interval '1 hour', true, true)`} {
		_, err := s.pool.Exec(ctx, s.q(stmt))
		require.NoError(t, err)
	}

	holder, err := s.pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = holder.Rollback(context.WithoutCancel(ctx)) })
	_, err = holder.Exec(ctx, s.q(`SELECT {s}limits_lock('q', 'lim', '', '')`))
	require.NoError(t, err)

	promoter, err := s.pool.Acquire(ctx)
	require.NoError(t, err)
	t.Cleanup(promoter.Release)
	var promoterPID int
	require.NoError(t, promoter.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&promoterPID))
	promoted := make(chan error, 1)
	var n int
	go func() {
		promoted <- promoter.QueryRow(ctx, s.q(`SELECT {s}promote_due($1)`), time.Now().Add(2*time.Hour)).Scan(&n)
	}()
	require.Eventually(t, func() bool {
		var waiting bool
		err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND pid = $1)`,
			promoterPID).Scan(&waiting)
		return err == nil && waiting
	}, 10*time.Second, 5*time.Millisecond, "the promotion waits for the limit")

	// The free due step is not locked by the waiting promotion.
	_, err = holder.Exec(ctx, `SET LOCAL lock_timeout = '5s'`)
	require.NoError(t, err)
	_, err = holder.Exec(ctx, s.q(`UPDATE {s}steps SET priority = 1 WHERE instance_id = 'free'`))
	require.NoError(t, err, "the limit's holder waited on a free row the promotion held")
	require.NoError(t, holder.Commit(ctx))
	require.NoError(t, <-promoted)
	require.Equal(t, 2, n, "both due steps promoted once the limit was free")
}

// TestScheduledStepsReadDelayedIndex: Queues' count of the steps not due
// yet reads the index of delayed steps, never the table's finished history.
func TestScheduledStepsReadDelayedIndex(t *testing.T) {
	t.Parallel()
	s := openTestStore(t, nil)
	fillFinishedHistory(t, s, 5000, false)
	for mode, plan := range explainPlans(t, s, scheduledSQL, nil) {
		require.Regexp(t, `Index (Only )?Scan using steps_delayed `, plan, "%s:\n%s", mode, plan)
		require.NotContains(t, plan, "Seq Scan", "%s:\n%s", mode, plan)
	}
}

// TestQueuesReadIndexes: Queues' counts of ready, held and running steps
// read the partial indexes of unfinished steps, for custom and generic
// plans, never the table's finished history. An index of every step (the
// primary key, steps_instance) read whole is a scan of the history too;
// the items' indexes serve only the lookup of a capped step's running
// items by parent_id.
func TestQueuesReadIndexes(t *testing.T) {
	t.Parallel()
	s := openTestStore(t, nil)
	fillFinishedHistory(t, s, 5000, false)
	scan := regexp.MustCompile(`(Seq Scan on \w+|Index (?:Only )?Scan(?: Backward)? using (\w+) on steps|Bitmap Index Scan on (\w+))`)
	unfinished := map[string]bool{"steps_ready": true, "steps_ready_queue": true, "steps_ready_capped": true,
		"steps_delayed": true, "steps_running_lease": true}
	for mode, plan := range explainPlans(t, s, queueLoadsSQL, nil) {
		lines := strings.Split(plan, "\n")
		for i, l := range lines {
			m := scan.FindStringSubmatch(l)
			if m == nil {
				continue
			}
			index := m[2] + m[3]
			require.NotEmpty(t, index, "%s reads a table whole:\n%s", mode, plan)
			if unfinished[index] {
				continue
			}
			require.Regexp(t, `^steps_items`, index, "%s reads %s, an index of finished steps too:\n%s", mode, index, plan)
			require.Less(t, i+1, len(lines), "%s:\n%s", mode, plan)
			require.Contains(t, lines[i+1], "Index Cond: ((parent_id = ", "%s reads %s beyond one step's items:\n%s", mode, index, plan)
		}
		for _, index := range []string{"steps_delayed", "steps_ready_capped", "steps_running_lease"} {
			require.Contains(t, plan, index, "%s:\n%s", mode, plan)
		}
	}
}

// TestCrossStoreFanIn: workers on two stores with pools of their own run
// fan-in workflows concurrently; every step runs once and every join is
// promoted exactly once, with no deadlock surfacing as an error.
func TestCrossStoreFanIn(t *testing.T) {
	t.Parallel()
	a := openTestStore(t, nil)
	b := openInSchema(t, a.cfg.Schema, &Config{MaxConns: 8})
	ctx := t.Context()
	const n = 40
	ps := make([]storage.CreateParams, n)
	for i := range ps {
		ps[i] = params(spec("a"), spec("b", "a"), spec("c", "a"), spec("d", "a"), spec("join", "b", "c", "d"))
	}
	_, err := a.CreateInstances(ctx, nil, ps, storagetest.Plan)
	require.NoError(t, err)

	var (
		wg   sync.WaitGroup
		runs sync.Map
		errs = make(chan error, 16)
	)
	worker := func(s *Store, id string) {
		idle := 0
		for idle < 20 {
			cs, err := s.ClaimSteps(ctx, storage.ClaimParams{WorkerID: id, Limit: 3, Lease: time.Minute})
			if err != nil {
				errs <- err
				return
			}
			if len(cs) == 0 {
				idle++
				time.Sleep(5 * time.Millisecond)
				continue
			}
			idle = 0
			rs := make([]storage.StepResult, len(cs))
			for i, c := range cs {
				if _, dup := runs.LoadOrStore(c.InstanceID+"/"+c.Step, id); dup {
					errs <- fmt.Errorf("%s/%s ran twice", c.InstanceID, c.Step)
				}
				rs[i] = storage.StepResult{Claim: c.Claim, Outcome: storage.OutcomeCompleted, Output: []byte(`1`)}
			}
			if _, err := s.FinishSteps(ctx, rs, storagetest.Plan); err != nil {
				errs <- err
				return
			}
		}
	}
	for i := range 4 {
		wg.Go(func() { worker(a, fmt.Sprintf("a%d", i)) })
		wg.Go(func() { worker(b, fmt.Sprintf("b%d", i)) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	list, err := a.ListInstances(ctx, storage.ListParams{Limit: n})
	require.NoError(t, err)
	require.Len(t, list, n)
	for _, in := range list {
		require.Equal(t, storage.InstanceCompleted, in.Status, in.ID)
		for _, st := range in.Steps {
			require.Equal(t, storage.StepCompleted, st.Status)
			require.Equal(t, 1, st.Attempts)
		}
	}
}

// TestOpenUnavailable: an unreachable server, an unknown host or database
// give one line wrapping storage.ErrUnavailable that names the server and
// never the password.
func TestOpenUnavailable(t *testing.T) {
	t.Parallel()
	good, err := url.Parse(testURL(t))
	require.NoError(t, err)
	with := func(host, db string) string {
		u := *good
		u.User = url.UserPassword(good.User.Username(), "s3cret-pw")
		if host != "" {
			u.Host = host
		}
		if db != "" {
			u.Path = "/" + db
		}
		q := u.Query()
		q.Set("connect_timeout", "5")
		u.RawQuery = q.Encode()
		return u.String()
	}
	cases := map[string]struct {
		url  string
		want string
	}{
		"refused":          {with("127.0.0.1:1", ""), "127.0.0.1:1"},
		"unknown host":     {with("no-such-host.invalid:5432", ""), "no-such-host.invalid"},
		"unknown database": {with("", "dagrun_no_such_db"), "dagrun_no_such_db"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s, err := Open(t.Context(), c.url, nil)
			require.Nil(t, s)
			require.ErrorIs(t, err, storage.ErrUnavailable)
			msg := err.Error()
			t.Log(msg)
			require.NotContains(t, msg, "\n")
			require.NotContains(t, msg, "s3cret-pw")
			require.Contains(t, msg, c.want)
		})
	}

	t.Run("malformed", func(t *testing.T) {
		t.Parallel()
		_, err := Open(t.Context(), "postgres://u:s3cret-pw@127.0.0.1:notaport/db", nil)
		require.Error(t, err)
		require.NotErrorIs(t, err, storage.ErrUnavailable, "a malformed URL is a usage error")
		require.NotContains(t, err.Error(), "s3cret-pw")
	})
}

// TestCallerTxType: a caller's transaction must be a pgx.Tx.
func TestCallerTxType(t *testing.T) {
	t.Parallel()
	s := openTestStore(t, nil)
	_, err := s.CreateInstances(t.Context(), "not a tx", []storage.CreateParams{params(spec("a"))}, storagetest.Plan)
	require.EqualError(t, err, "postgres: create instances: the caller's transaction must be a pgx.Tx, got string")
}

func TestIsRetryable(t *testing.T) {
	require.True(t, isRetryable(fmt.Errorf("x: %w", &pgconn.PgError{Code: "40001"})))
	require.True(t, isRetryable(&pgconn.PgError{Code: "40P01"}))
	require.False(t, isRetryable(&pgconn.PgError{Code: "23505"}))
	require.False(t, isRetryable(errors.New("x")))
}

func TestConfigDefaults(t *testing.T) {
	c := (*Config)(nil).withDefaults()
	require.NoError(t, c.validate())
	require.EqualValues(t, 10, c.MaxConns)
	require.Equal(t, "dagrun", c.ApplicationName)
	require.Equal(t, 30*time.Second, c.StatementTimeout)
	require.Equal(t, "dagrun", c.Schema)
	require.Nil(t, c.Now, "the server's clock")
	require.NotNil(t, c.Logger)
	require.Error(t, (&Config{MaxConns: -1}).withDefaults().validate())
}

// TestPruneTakesStepsAndEvents: with no foreign keys to cascade (migration
// 2), prune itself must delete a pruned instance's steps and events.
func TestPruneTakesStepsAndEvents(t *testing.T) {
	t.Parallel()
	s := openTestStore(t, nil)
	ctx := t.Context()
	res, err := s.CreateInstances(ctx, nil, []storage.CreateParams{params(spec("a"), spec("b", "a")), params(spec("a"))}, storagetest.Plan)
	require.NoError(t, err)
	require.NoError(t, s.CancelInstance(ctx, res[0].ID, "done with it", storagetest.Plan))

	n, err := s.Prune(ctx, time.Now().Add(time.Minute), false)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	var steps, events, kept int
	require.NoError(t, s.pool.QueryRow(ctx, s.q(`SELECT
		(SELECT count(*) FROM {s}steps WHERE instance_id = $1),
		(SELECT count(*) FROM {s}events WHERE instance_id = $1),
		(SELECT count(*) FROM {s}steps WHERE instance_id = $2)`), res[0].ID, res[1].ID).Scan(&steps, &events, &kept))
	require.Zero(t, steps, "steps of the pruned instance")
	require.Zero(t, events, "events of the pruned instance")
	require.Equal(t, 1, kept, "the unfinished instance keeps its step")
}

// TestPruneKeepsDefinitionOfUncommittedStart: a start that uses a
// definition and has not committed yet makes a prune that would delete the
// definition wait for it, and then see its instance: the definition stays.
func TestPruneKeepsDefinitionOfUncommittedStart(t *testing.T) {
	t.Parallel()
	s := openTestStore(t, nil)
	ctx := t.Context()
	old := params(spec("a"))
	old.DefinitionHash = "h-" + s.cfg.Schema
	_, err := s.CreateInstances(ctx, nil, []storage.CreateParams{old}, storagetest.Plan)
	require.NoError(t, err)
	require.NoError(t, s.CancelInstance(ctx, old.ID, "done with it", storagetest.Plan))

	tx, err := s.pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	start := params(spec("a"))
	start.DefinitionHash = old.DefinitionHash
	_, err = s.CreateInstances(ctx, tx, []storage.CreateParams{start}, storagetest.Plan)
	require.NoError(t, err)

	pruned := make(chan error, 1)
	go func() {
		_, err := s.Prune(ctx, time.Now().Add(time.Minute), false)
		pruned <- err
	}()
	require.Eventually(t, func() bool {
		var waiting bool
		err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
			AND classid = $1 AND objid::bigint = hashtext($2)::bigint & 4294967295)`, definitionLockClass, old.DefinitionHash).Scan(&waiting)
		return err == nil && waiting
	}, 10*time.Second, 5*time.Millisecond, "prune waits for the start")
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, <-pruned)

	_, err = s.GetInstance(ctx, old.ID)
	require.ErrorIs(t, err, storage.ErrNotFound)
	in, err := s.GetInstance(ctx, start.ID)
	require.NoError(t, err)
	require.Equal(t, "name: wf\n", string(in.Definition))
}

// TestArrayLiteral: dependsOn names travel as text[] literals; any name
// must come back as it went in.
func TestArrayLiteral(t *testing.T) {
	t.Parallel()
	pool := sharedPool(t)
	for _, names := range [][]string{
		nil,
		{"a"},
		{"fetch-user", "b.c_d"},
		{`quote"d`, `back\slash`, "comma,brace}{", "", "NULL", " spaced "},
	} {
		var got []string
		require.NoError(t, pool.QueryRow(t.Context(), "SELECT $1::text::text[]", arrayLiteral(names)).Scan(&got))
		if len(names) == 0 {
			require.Empty(t, got)
			continue
		}
		require.Equal(t, names, got)
	}
}

// TestOwnNotificationsNotRelayed: a store signals its own subscribers
// directly after a commit; its listener skips the NOTIFY the same commit
// sent, which would only wake an idle worker for an empty claim.
func TestOwnNotificationsNotRelayed(t *testing.T) {
	t.Parallel()
	s := openTestStore(t, nil)
	ch, _ := subscribeIdle(t, s)

	_, err := s.CreateInstances(t.Context(), nil, []storage.CreateParams{params(spec("a"))}, storagetest.Plan)
	require.NoError(t, err)
	awaitSignal(t, ch, 2*time.Second, "the store's own create")
	select {
	case <-ch:
		require.FailNow(t, "signalled again: the listener relayed the store's own NOTIFY")
	case <-time.After(300 * time.Millisecond):
	}
}

// TestInstanceCountsFoldGoneProcesses: the count rows of server processes
// that are gone are folded into shard 0 without changing any count.
func TestInstanceCountsFoldGoneProcesses(t *testing.T) {
	t.Parallel()
	s := openTestStore(t, nil)
	ctx := t.Context()
	gone, err := Open(ctx, testURL(t), &Config{Schema: s.cfg.Schema, MaxConns: 2})
	require.NoError(t, err)
	ps := []storage.CreateParams{params(spec("a")), params(spec("a")), params(spec("a"))}
	_, err = gone.CreateInstances(ctx, nil, ps, storagetest.Plan)
	require.NoError(t, err)
	require.NoError(t, gone.CancelInstance(ctx, ps[0].ID, "x", storagetest.Plan))
	require.NoError(t, gone.Close())

	goneRows := func() int {
		var n int
		require.NoError(t, s.pool.QueryRow(ctx, s.q(`SELECT count(*) FROM {s}instance_counts
			WHERE shard <> 0 AND shard NOT IN (SELECT pid FROM pg_stat_activity)`)).Scan(&n))
		return n
	}
	// Every row but shard 0 is the closed pool's: wait for all of its
	// server processes to end, not the first, or one that ends after the
	// fold leaves a row behind.
	var shards int
	require.NoError(t, s.pool.QueryRow(ctx, s.q(`SELECT count(*) FROM {s}instance_counts WHERE shard <> 0`)).Scan(&shards))
	require.Positive(t, shards)
	require.Eventually(t, func() bool { return goneRows() == shards }, 10*time.Second, 10*time.Millisecond,
		"the closed pool's server processes end")
	_, err = s.pool.Exec(ctx, s.q(compactCountsSQL))
	require.NoError(t, err)
	require.Zero(t, goneRows())
	st, err := s.Stats(ctx)
	require.NoError(t, err)
	require.Len(t, st.Workflows, 1)
	require.Equal(t, map[storage.InstanceStatus]int{storage.InstancePending: 2, storage.InstanceCancelled: 1}, st.Workflows[0].Instances)
}

// TestGenericPlansUseIndexes: the store's connections plan its statements
// generically (plan_cache_mode), so each statement's generic plan must
// reach the big tables (steps, events, instances, step logs, signals)
// through an index, never by scanning them, with a history of 5,000
// finished instances in place. promoteSQL is not among them: it only calls
// promote_due, and TestPromoteReadsDelayedIndex checks the query its loop
// reads.
func TestGenericPlansUseIndexes(t *testing.T) {
	t.Parallel()
	s := openTestStore(t, nil)
	fillFinishedHistory(t, s, 5000, true)
	scan := regexp.MustCompile(`Seq Scan on (steps|events|instances|step_logs|signals)\b`)
	for name, sql := range hotStatements() {
		plan := genericPlan(t, s, sql)
		require.NotRegexp(t, scan, plan, "%s:\n%s", name, plan)
	}
}

// hotStatements names the statements of the store's hot paths: claims,
// hand-offs, finishes, creation, signals, step logs and event reads.
func hotStatements() map[string]string {
	statements := map[string]string{
		"extend": extendSQL, "release": releaseSQL, "finish": finishSQL,
		"expired leases": expiredSQL, "recover": recoverSQL, "create": createSQL, "claiming create": claimingCreateSQL, "existing": existingSQL,
		"lock instances": lockInstancesSQL, "load steps": loadStepStatesSQL, "load signals": loadSignalsSQL,
		"apply step changes": applyStepChangesSQL, "apply ready": applyReadySQL, "finish instances": finishInstancesSQL,
		"finish one": finishOneSQL, "lock instance": lockInstanceSQL, "load step states": loadStepStateSQL,
		"load signal": loadSignalSQL, "apply ready one": applyReadyOneSQL, "apply step change": applyStepChangeSQL,
		"finish instance": finishInstanceSQL, "expand": expandSQL, "settle items": settleSQL, "item counts": itemCountsSQL,
		"capped pending": cappedPendingSQL, "capped parents": cappedParentsSQL,
		"trim logs": trimLogsSQL, "append logs": appendLogsSQL,
		"record failures": recordFailuresSQL, "expired instances": expiredInstancesSQL,
		"expired waits": expiredWaitsSQL, "expire waits": expireWaitsSQL, "next wake": nextWakeSQL,
		"deliver": deliverSQL, "start workflow step": startWorkflowStepSQL, "settle child": settleChildSQL,
		"latest events": instanceEventsSQL(latestEventsSQL), "events after": instanceEventsSQL(eventsAfterSQL),
		"unseen events":   instanceEventsSQL(unseenEventsSQL),
		"verified finish": verifiedFinishSQL, "verified finish one": verifiedFinishOneSQL,
		"insert claimed": insertClaimedQueries[0], "insert claimed, traced": insertClaimedQueries[1],
	}
	for _, shape := range claimShapes() {
		statements[fmt.Sprintf("claim %+v", shape)] = claimQueries.of(shape)
	}
	addHandoffStatements(statements)
	return statements
}

// TestGenericPlansOfAYoungDatabaseReachRowsByKey: the store's sessions plan
// each statement once per connection and keep the plan until the tables
// are analyzed again, which without autovacuum is never. A database not
// yet analyzed gives the planner only the tables' sizes when the
// connection first ran the statement, and a plan made while instances held
// a few rows appended every flush of step logs through a hash join that
// read every instance, for the connection's life: 1.9 ms a flush at 16,000
// instances, a third of the server's time in TestSoak's workload. So with a
// few rows, unanalyzed, and the sessions' settings, every statement's
// generic plan reaches a big table's rows by an index condition, or reads
// a partial index of rows in flight, which does not grow with history.
func TestGenericPlansOfAYoungDatabaseReachRowsByKey(t *testing.T) {
	t.Parallel()
	for _, rows := range []int{0, 10, 100, 1000} {
		t.Run(fmt.Sprint(rows, " rows"), func(t *testing.T) {
			t.Parallel()
			s := openTestStore(t, nil)
			fillUnanalyzed(t, s, rows)
			for name, sql := range hotStatements() {
				plan := genericPlan(t, s, sql, "enable_seqscan = off")
				require.Empty(t, unkeyedScans(plan), "%s:\n%s", name, plan)
			}
		})
	}
}

// fillUnanalyzed inserts n finished instances, each with 4 steps, 4 events
// and a step log record, without analyzing the tables.
func fillUnanalyzed(t *testing.T, s *Store, n int) {
	t.Helper()
	for _, stmt := range []string{`
		INSERT INTO {s}instances (id, workflow, definition_hash, status, run_after, created_at, finished_at, idempotency_key)
		SELECT 'old-' || lpad(g::text, 8, '0'), 'wf', 'h1', 'completed', now(), now(), now(), 'k' || g
		FROM generate_series(1, $1::int) g`, `
		INSERT INTO {s}steps (instance_id, position, name, handler, queue, workflow, status, run_after, finished_at)
		SELECT 'old-' || lpad(g::text, 8, '0'), p, 's' || p, 'h', 'default', 'wf', 'completed', now(), now()
		FROM generate_series(1, $1::int) g, generate_series(0, 3) p`, `
		INSERT INTO {s}events (instance_id, type, at)
		SELECT 'old-' || lpad(g::text, 8, '0'), 'step.completed', now() FROM generate_series(1, $1::int) g, generate_series(0, 3) p`, `
		INSERT INTO {s}step_logs (instance_id, step, item, attempt, at, level, message)
		SELECT 'old-' || lpad(g::text, 8, '0'), 's0', 0, 1, now(), 'INFO', 'm' FROM generate_series(1, $1::int) g`,
	} {
		_, err := s.pool.Exec(t.Context(), s.q(stmt), n)
		require.NoError(t, err)
	}
}

// inFlightIndexes are the partial indexes of rows in flight (running,
// waiting or capped pending steps, unfinished instances, deferred starts
// not yet finished): reading one whole costs what is in flight, not the
// history.
var inFlightIndexes = regexp.MustCompile(`^(steps_running_lease|steps_waiting_deadline|steps_ready_capped|instances_unfinished|instances_deadline|instances_deferred)$`)

// unkeyedScans returns the scans of plan (EXPLAIN's text) that read a big
// table (steps, events, instances, step logs, signals) with no index
// condition, other than through a partial index of rows in flight.
func unkeyedScans(plan string) []string {
	scan := regexp.MustCompile(`(Seq Scan|Bitmap Heap Scan|Index Scan using (\w+)|Index Only Scan using (\w+)) on (steps|events|instances|step_logs|signals)\b`)
	bitmapIndex := regexp.MustCompile(`Bitmap Index Scan on (\w+)`)
	indent := func(line string) int { return len(line) - len(strings.TrimLeft(line, " ")) }
	lines := strings.Split(plan, "\n")
	var unkeyed []string
	for i, line := range lines {
		m := scan.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		index, keyed := m[2]+m[3], false
		for _, below := range lines[i+1:] {
			if indent(below) <= indent(line) {
				break
			}
			keyed = keyed || strings.Contains(below, "Index Cond:")
			if b := bitmapIndex.FindStringSubmatch(below); b != nil {
				index = b[1]
			}
		}
		if !keyed && !inFlightIndexes.MatchString(index) {
			unkeyed = append(unkeyed, strings.TrimSpace(line))
		}
	}
	return unkeyed
}

// TestKeyedWritesSkipInFlightIndexes: the statements that find their rows
// by key (a step's ID, an instance's) reach them through that key, never
// through the partial indexes of in-flight rows (running steps, unfinished
// instances, waiting steps). Statistics gathered while little was in
// flight (a new database, a quiet night) make those indexes look nearly
// empty, and a generic plan made then reads every entry of one at each
// finish, heartbeat or signal until the table is analyzed again: with 2
// workers on a backlog of 4,000 instances, the statement that finishes
// instances took 2.1 ms a call, and 0.49 ms reaching them by key.
func TestKeyedWritesSkipInFlightIndexes(t *testing.T) {
	t.Parallel()
	s := openTestStore(t, nil)
	fillFinishedHistory(t, s, 5000, true) // analyzed with nothing in flight
	statements := map[string]string{
		"finish": finishSQL, "finish one": finishOneSQL, "extend": extendSQL, "release": releaseSQL,
		"finish instances": finishInstancesSQL, "finish instance": finishInstanceSQL,
		"record failures": recordFailuresSQL, "settle items": settleSQL, "settle child": settleChildSQL,
		"deliver": deliverSQL, "verified finish": verifiedFinishSQL, "verified finish one": verifiedFinishOneSQL,
	}
	addHandoffStatements(statements)
	inFlight := regexp.MustCompile(`\b(steps_running_lease|instances_unfinished|steps_waiting_deadline)\b`)
	for name, sql := range statements {
		plan := genericPlan(t, s, sql)
		require.NotRegexp(t, inFlight, plan, "%s:\n%s", name, plan)
	}
}

// genericPlan returns the generic plan of query: the plan a prepared
// statement runs for any values (EXPLAIN EXECUTE with NULLs), with each
// of settings (such as "enable_seqscan = off") set for it.
func genericPlan(t *testing.T, s *Store, query string, settings ...string) string {
	t.Helper()
	var plan string
	err := pgx.BeginFunc(t.Context(), s.pool, func(tx pgx.Tx) error {
		for _, setting := range append([]string{"plan_cache_mode = force_generic_plan"}, settings...) {
			if _, err := tx.Exec(t.Context(), "SET LOCAL "+setting); err != nil {
				return err
			}
		}
		if _, err := tx.Exec(t.Context(), "PREPARE dagrun_generic AS "+s.q(query)); err != nil {
			return err
		}
		var params int
		if err := tx.QueryRow(t.Context(), "SELECT cardinality(parameter_types) FROM pg_prepared_statements WHERE name = 'dagrun_generic'").Scan(&params); err != nil {
			return err
		}
		explain := "EXPLAIN EXECUTE dagrun_generic"
		if params > 0 {
			explain += "(" + strings.TrimSuffix(strings.Repeat("NULL, ", params), ", ") + ")"
		}
		rows, err := tx.Query(t.Context(), explain)
		if err != nil {
			return err
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		plan = strings.Join(lines, "\n")
		if err != nil {
			return err
		}
		_, err = tx.Exec(t.Context(), "DEALLOCATE dagrun_generic")
		return err
	})
	require.NoError(t, err)
	return plan
}

// addHandoffStatements adds the hand-off statements of every shape that
// hands off (an uncapped one) to statements, by name.
func addHandoffStatements(statements map[string]string) {
	for _, shape := range claimShapes() {
		if shape.capped {
			continue
		}
		statements[fmt.Sprintf("hand-off %+v", shape)] = handoffQueries.of(shape)
		statements[fmt.Sprintf("hand-off one %+v", shape)] = handoffOneQueries.of(shape)
		statements[fmt.Sprintf("settled hand-off %+v", shape)] = settledHandoffQueries.of(shape)
		statements[fmt.Sprintf("settled hand-off one %+v", shape)] = settledHandoffOneQueries.of(shape)
	}
}

// claimShapes lists every claim shape, for the tests that check each
// shape's statements.
func claimShapes() []claimShape {
	var shapes []claimShape
	for q := 0; q <= 2; q++ {
		for _, i := range []bool{false, true} {
			for _, h := range []bool{false, true} {
				for _, capped := range []bool{false, true} {
					for _, tr := range []bool{false, true} {
						shapes = append(shapes, claimShape{queues: q, byInstance: i, byHandler: h, capped: capped, trace: tr})
					}
				}
			}
		}
	}
	return shapes
}

// TestCallerTxOnAnotherDatabaseIsRefused: a caller's transaction on another
// database of the server than the store's is refused instead of taking an
// instance that none of the engine's workers sees.
func TestCallerTxOnAnotherDatabaseIsRefused(t *testing.T) {
	t.Parallel()
	s := openTestStore(t, nil)
	other, err := pgx.Connect(t.Context(), newDatabase(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = other.Close(context.WithoutCancel(t.Context())) })
	tx, err := other.Begin(t.Context())
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.WithoutCancel(t.Context())) }()
	_, err = s.CreateInstances(t.Context(), tx, []storage.CreateParams{params(spec("a"))}, storagetest.Plan)
	require.ErrorContains(t, err, "the caller's transaction is on database")
	require.ErrorContains(t, err, "not on the store's")
}
