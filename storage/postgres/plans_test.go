package postgres

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
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

func TestMainVerb(t *testing.T) {
	for _, tc := range []struct{ sql, verb string }{
		{"SELECT 1", "SELECT"},
		{"\n\tselect * FROM t WHERE a = $1", "SELECT"},
		{"UPDATE t SET a = 'WITH (' WHERE b = $1", "UPDATE"},
		{"INSERT INTO t (a) VALUES ($1)", "INSERT"},
		{"-- DELETE the rows\nDELETE FROM t WHERE a = ANY($1)", "DELETE"},
		{"WITH a AS (UPDATE t SET b = 1 RETURNING id) SELECT * FROM a", "SELECT"},
		{"WITH a AS (SELECT 1), b(x) AS (DELETE FROM t RETURNING 1) INSERT INTO u SELECT * FROM a", "INSERT"},
		{"WITH RECURSIVE r AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) UPDATE t SET n = (SELECT max(n) FROM r)", "UPDATE"},
		{"WITH a AS MATERIALIZED (SELECT 1), b AS NOT MATERIALIZED (SELECT 2) DELETE FROM t", "DELETE"},
		{`WITH "update" AS (SELECT ')' AS x) SELECT * FROM "update"`, "SELECT"},
		{"WITH a AS (SELECT 'it''s (' AS x) -- a comment (\nINSERT INTO t SELECT x FROM a", "INSERT"},
		{"BEGIN ISOLATION LEVEL READ COMMITTED", ""},
		{"SET LOCAL statement_timeout = 5", ""},
		{"LOCK TABLE t", ""},
		{"UPDATE t SET a = 1; UPDATE u SET b = 2", ""},
		{"UPDATE t SET a = ';'", "UPDATE"},
		{"DO $$ BEGIN END $$", ""},
		{"WITH a AS (SELECT $$x$$) SELECT * FROM a", ""},
		{"WITH a AS (SELECT 'unterminated) SELECT 1", ""},
		{"/* SELECT */ SELECT 1", ""},
		{"", ""},
	} {
		require.Equal(t, tc.verb, mainVerb(tc.sql), "%q", tc.sql)
	}
}

// planFunctionsStore opens a store with pgbouncer=true on a server reached
// directly (what its sessions keep is what PgBouncer would pass on), with
// its log in the returned buffer.
func planFunctionsStore(t *testing.T, schema string) (*Store, *syncBuffer) {
	t.Helper()
	return planFunctionsStoreOf(t, schema, 4)
}

// planFunctionsStoreOf is planFunctionsStore with a pool of conns.
func planFunctionsStoreOf(t *testing.T, schema string, conns int32) (*Store, *syncBuffer) {
	t.Helper()
	logs := &syncBuffer{}
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	s := openURL(t, withQuery(t, testURL(t), SchemaParam, schema, PgBouncerParam, "true"), &Config{MaxConns: conns, Logger: logger})
	require.NotNil(t, s.plans)
	return s, logs
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// planFunctionsIn counts the statement functions of a schema.
func planFunctionsIn(t *testing.T, schema string) int {
	t.Helper()
	var n int
	require.NoError(t, sharedPool(t).QueryRow(t.Context(), `SELECT count(*) FROM pg_proc
		WHERE pronamespace = $1::regnamespace AND proname LIKE 'dagrun\_plan\_%'`, pgx.Identifier{schema}.Sanitize()).Scan(&n))
	return n
}

// TestPgBouncerStatementsBecomeFunctions: behind PgBouncer, a statement of
// each kind, once used, is called through a function of the store's schema
// that returns the same rows, or changes the same rows and reports the same
// count, as the statement.
func TestPgBouncerStatementsBecomeFunctions(t *testing.T) {
	t.Parallel()
	schema := newSchema(t)
	s, logs := planFunctionsStore(t, schema)
	_, err := s.pool.Exec(t.Context(), s.markers.Replace(`CREATE TABLE {s}plan_probe (id int PRIMARY KEY, n int NOT NULL, tag text NOT NULL)`))
	require.NoError(t, err)
	reset := func() {
		t.Helper()
		_, err := s.pool.Exec(t.Context(), s.markers.Replace(`TRUNCATE {s}plan_probe; INSERT INTO {s}plan_probe VALUES (1, 10, 'a'), (2, 20, 'b'), (3, 30, 'a')`))
		require.NoError(t, err)
	}
	// A change that returns no rows is called so that it returns as many
	// rows of no columns as it changed: what the caller reads is the count.
	cases := []struct {
		name, sql string
		args      []any
		rowless   bool
	}{
		{"a query", `SELECT id, n, tag FROM {s}plan_probe WHERE tag = $1 ORDER BY id`, []any{"a"}, false},
		{"a change", `UPDATE {s}plan_probe SET n = n + $1 WHERE id = ANY($2)`, []any{1, []int32{1, 2}}, true},
		{"a change that returns rows", `UPDATE {s}plan_probe SET n = n * 2 WHERE tag = $1 RETURNING id, n`, []any{"a"}, false},
		{"a change after a WITH clause", `WITH d AS (DELETE FROM {s}plan_probe WHERE id = $1 RETURNING id, n)
			INSERT INTO {s}plan_probe (id, n, tag) SELECT id + 10, n, 'moved' FROM d -- moved
			`, []any{3}, true},
		{"a change that changes nothing", `DELETE FROM {s}plan_probe WHERE id = $1`, []any{99}, true},
		{"a change without parameters", `UPDATE {s}plan_probe SET n = n + 1`, nil, true},
	}
	type result struct {
		rows     [][]any
		affected int64
		table    [][]any
	}
	run := func(sql string, args []any) result {
		t.Helper()
		reset()
		rows, err := s.db.Query(t.Context(), sql, args...)
		require.NoError(t, err)
		values, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([]any, error) { return r.Values() })
		require.NoError(t, err)
		table, err := s.pool.Query(t.Context(), s.markers.Replace(`SELECT id, n, tag FROM {s}plan_probe ORDER BY id`))
		require.NoError(t, err)
		after, err := pgx.CollectRows(table, func(r pgx.CollectableRow) ([]any, error) { return r.Values() })
		require.NoError(t, err)
		return result{values, rows.CommandTag().RowsAffected(), after}
	}
	for _, tc := range cases {
		raw := run(s.q(tc.sql), tc.args) // the first use queues the function
		s.plans.wait()
		call := s.q(tc.sql)
		require.Contains(t, call, planFuncPrefix, "%s: not routed through a function", tc.name)
		called := run(call, tc.args)
		if tc.rowless {
			require.Empty(t, raw.rows)
			require.Len(t, called.rows, int(raw.affected), tc.name)
			for _, row := range called.rows {
				require.Empty(t, row, tc.name)
			}
			called.rows = raw.rows
		}
		require.Equal(t, raw, called, "%s: the function differs from the statement", tc.name)
	}
	require.Equal(t, len(cases), planFunctionsIn(t, schema))
	require.NotContains(t, logs.String(), "level=WARN")

	// Statements of other kinds stay as they are, and so do queries of
	// no columns or of a pseudo-type.
	for _, sql := range []string{`LOCK TABLE {s}plan_probe`, `SELECT FROM {s}plan_probe`, `SELECT pg_sleep($1)`} {
		s.q(sql)
		s.plans.wait()
		require.Equal(t, s.markers.Replace(sql), s.q(sql))
	}

	// The store's own statements go through functions too, and work.
	ctx := t.Context()
	_, err = s.CreateInstances(ctx, nil, []storage.CreateParams{params(spec("a"), spec("b", "a"))}, storagetest.Plan)
	require.NoError(t, err)
	claim := storage.ClaimParams{WorkerID: "w", Limit: 2, Lease: time.Minute}
	claimed, err := s.ClaimSteps(ctx, claim)
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	s.plans.wait()
	require.Contains(t, s.q(claimQueries.of(claimShape{snapshots: true})), planFuncPrefix)
	_, err = s.CreateInstances(ctx, nil, []storage.CreateParams{params(spec("a"))}, storagetest.Plan)
	require.NoError(t, err)
	again, err := s.ClaimSteps(ctx, claim)
	require.NoError(t, err)
	require.Len(t, again, 1, "a claim through its function")
	require.NotEqual(t, claimed[0].InstanceID, again[0].InstanceID)
	require.NotContains(t, logs.String(), "level=WARN")
}

// TestPgBouncerStoresMakeAFunctionOnce: processes that start together and
// use the same statement at once make its function once, without errors.
func TestPgBouncerStoresMakeAFunctionOnce(t *testing.T) {
	t.Parallel()
	schema := newSchema(t)
	const stores = 4
	var (
		all  []*Store
		logs []*syncBuffer
	)
	for range stores {
		s, l := planFunctionsStore(t, schema)
		all, logs = append(all, s), append(logs, l)
	}
	const sql = `SELECT count(*) FROM {s}instances WHERE status = $1`
	var wg sync.WaitGroup
	for _, s := range all {
		wg.Go(func() { s.q(sql) })
	}
	wg.Wait()
	for i, s := range all {
		s.plans.wait()
		require.Contains(t, s.q(sql), planFuncPrefix)
		require.NotContains(t, logs[i].String(), "level=WARN")
	}
	require.Equal(t, 1, planFunctionsIn(t, schema))
}

// TestPgBouncerRoutesAFunctionAnotherMadeAtFirstUse: a store that opens
// on a schema whose functions another process made calls them from each
// statement's first use, without a read of its own: a fleet that starts
// together otherwise plans its hottest statements for seconds.
func TestPgBouncerRoutesAFunctionAnotherMadeAtFirstUse(t *testing.T) {
	t.Parallel()
	schema := newSchema(t)
	maker, _ := planFunctionsStore(t, schema)
	const sql = `SELECT count(*) FROM {s}instances WHERE status = $1`
	maker.q(sql)
	maker.plans.wait()
	call := maker.q(sql)
	require.Contains(t, call, planFuncPrefix)

	later, logs := planFunctionsStore(t, schema)
	later.plans.wait() // its first look
	require.Equal(t, call, later.q(sql), "the first use goes through the function")
	var n int
	require.NoError(t, later.pool.QueryRow(t.Context(), later.q(sql), "pending").Scan(&n))
	require.Equal(t, 1, planFunctionsIn(t, schema))
	require.NotContains(t, logs.String(), "level=WARN")
}

// TestPgBouncerMakesQueuedFunctionsTogether: the statements queued while
// the store makes a function are made next, in one transaction, and one
// whose function cannot be made leaves the others made.
func TestPgBouncerMakesQueuedFunctionsTogether(t *testing.T) {
	t.Parallel()
	schema := newSchema(t)
	s, _ := planFunctionsStore(t, schema)
	s.plans.wait()
	s.plans.retryPause = time.Hour // the broken statement's next try
	making, release := make(chan struct{}), make(chan struct{})
	var (
		once     sync.Once
		attempts atomic.Int32 // each one transaction
	)
	s.plans.beforeMake = func() error {
		attempts.Add(1)
		once.Do(func() { close(making); <-release })
		return nil
	}
	const (
		first  = `SELECT count(*) FROM {s}instances WHERE status = $1`
		broken = `SELECT count(*) FROM {s}no_such_table WHERE id = $1`
	)
	together := []string{
		`SELECT count(*) FROM {s}instances WHERE workflow = $1`,
		broken,
		`SELECT count(*) FROM {s}steps WHERE status = $1`,
		`UPDATE {s}steps SET attempts = attempts WHERE id = $1`,
	}
	s.q(first)
	<-making
	for _, sql := range together {
		s.q(sql)
	}
	close(release)
	s.plans.wait()

	for _, sql := range append([]string{first}, together...) {
		require.Equal(t, sql != broken, strings.Contains(s.q(sql), planFuncPrefix), sql)
	}
	require.Equal(t, len(together), planFunctionsIn(t, schema))
	require.EqualValues(t, 2, attempts.Load(), "attempts: the first statement's, then the rest's together")
}

// TestPgBouncerCloseEndsTheFunctionsBeingMade: closing a store lets the
// functions it is making be made, or rolled back, before it returns, so
// that it leaves no transaction on the server: one cut off behind
// PgBouncer went on holding its locks, and a DROP SCHEMA right after the
// close deadlocked with it.
func TestPgBouncerCloseEndsTheFunctionsBeingMade(t *testing.T) {
	t.Parallel()
	schema := newSchema(t)
	s, _ := planFunctionsStoreOf(t, schema, 2)
	s.plans.wait()
	making := make(chan struct{})
	s.plans.beforeMake = func() error {
		close(making)
		<-s.plans.ctx.Done() // the store is closing
		return nil
	}
	s.q(`SELECT count(*) FROM {s}instances WHERE status = $1`)
	<-making
	require.NoError(t, s.Close())
	require.Equal(t, 1, planFunctionsIn(t, schema), "the attempt under way at the close")

	err := pgx.BeginFunc(t.Context(), sharedPool(t), func(tx pgx.Tx) error {
		if _, err := tx.Exec(t.Context(), `SET LOCAL lock_timeout = '5s'`); err != nil {
			return err
		}
		_, err := tx.Exec(t.Context(), "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
		return err
	})
	require.NoError(t, err, "nothing of the store's holds the schema")
}

// TestPgBouncerWaitsForAFunctionWithoutAConnection: a store that finds
// another session making a statement's function waits for it with no
// connection of its pool, which behind PgBouncer is one of the few the
// whole fleet shares, makes and routes the other statements meanwhile (a
// fleet that starts together makes different functions at once instead of
// each waiting on every function in turn), and calls the function once it
// is made.
func TestPgBouncerWaitsForAFunctionWithoutAConnection(t *testing.T) {
	t.Parallel()
	schema := newSchema(t)
	s, logs := planFunctionsStoreOf(t, schema, 1)
	busy := make(chan struct{}, 1)
	s.plans.onBusy = func() {
		select {
		case busy <- struct{}{}:
		default:
		}
	}
	const sql = `SELECT count(*) FROM {s}instances WHERE status = $1`
	name := planFunctionName(s.prefix, s.markers.Replace(sql))

	// Another session makes the function: it holds the lock on its name.
	ctx := t.Context()
	other := holdFunctionLock(t, s, name)

	require.NotContains(t, s.q(sql), planFuncPrefix, "no function yet")
	select {
	case <-busy:
	case <-time.After(10 * time.Second):
		t.Fatal("the store never found the function being made")
	}
	// The pool's one connection is free for the store's own work.
	stmtCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var n int
	require.NoError(t, s.pool.QueryRow(stmtCtx, s.q(sql), "pending").Scan(&n), "a statement while the function is being made")
	const free = `SELECT count(*) FROM {s}instances WHERE workflow = $1`
	s.q(free)
	require.Eventually(t, func() bool { return strings.Contains(s.q(free), planFuncPrefix) },
		10*time.Second, 5*time.Millisecond, "a statement waits on another's function")
	require.NotContains(t, s.q(sql), planFuncPrefix, "made under another session's lock")

	require.NoError(t, other.Rollback(ctx)) // the other session gave up: this one makes it
	s.plans.wait()
	require.Contains(t, s.q(sql), planFuncPrefix)
	require.Equal(t, 2, planFunctionsIn(t, schema))
	require.NotContains(t, logs.String(), "level=WARN")
}

// TestPgBouncerNamesALockHeldTooLong: when another session holds the lock
// on a function's name past the bound of an attempt, the log says so, not
// only that a deadline passed. The bound leaves a loaded machine's first
// look time to reach the lock: at 100 ms, three attempts could each run
// out before it (CI, 2026-12-03), and the store gave up unnamed.
func TestPgBouncerNamesALockHeldTooLong(t *testing.T) {
	t.Parallel()
	schema := newSchema(t)
	s, logs := planFunctionsStore(t, schema)
	s.plans.wait()
	s.plans.makeWithin = time.Second
	const sql = `SELECT count(*) FROM {s}instances WHERE status = $1 AND workflow = $2`
	name := planFunctionName(s.prefix, s.markers.Replace(sql))
	holdFunctionLock(t, s, name)

	require.NotContains(t, s.q(sql), planFuncPrefix)
	require.Eventually(t, func() bool {
		return strings.Contains(logs.String(), "another session held the lock on function "+name)
	}, 10*time.Second, 10*time.Millisecond, "the log names the lock; it says:\n%s", logs.String())
}

// holdFunctionLock takes, in a transaction of another session, the lock
// a store takes to make the function name, as a session making it would.
func holdFunctionLock(t *testing.T, s *Store, name string) pgx.Tx {
	t.Helper()
	ctx := t.Context()
	other, err := sharedPool(t).Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = other.Rollback(context.WithoutCancel(ctx)) })
	_, err = other.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, s.prefix+name)
	require.NoError(t, err)
	return other
}

// TestMigrationDropsStalePlanFunctions: a migration drops the statement
// functions of the schema's previous version, which no process of the new
// one calls; a process of the old one still running makes its own again.
func TestMigrationDropsStalePlanFunctions(t *testing.T) {
	t.Parallel()
	schema := newSchema(t)
	old, logs := planFunctionsStore(t, schema)
	claim := func() {
		t.Helper()
		_, err := old.ClaimSteps(t.Context(), storage.ClaimParams{Limit: 1, Lease: time.Minute})
		require.NoError(t, err)
		old.plans.wait()
	}
	claim()
	require.Positive(t, planFunctionsIn(t, schema))

	undoLastMigration(t, schema)
	openURL(t, withQuery(t, testURL(t), SchemaParam, schema), nil)
	require.Zero(t, planFunctionsIn(t, schema), "functions left by the previous version")

	claim()
	require.Positive(t, planFunctionsIn(t, schema), "the old version's store makes its functions again")
	require.Equal(t, 1, strings.Count(logs.String(), "vanished"), logs.String())
}

// undoLastMigration puts a schema back as the version before the last
// migration left it.
func undoLastMigration(t *testing.T, schema string) {
	t.Helper()
	ms, err := migrate.Read(migrationFS, "migrations")
	require.NoError(t, err)
	last := ms[len(ms)-1]
	var undo string
	switch last.Version {
	case 33:
		undo = replacingFunction(t, ms, 29, "limits_instance_release")
	case 32:
		undo = replacingFunction(t, ms, 24, "respace_queue") + "; " + replacingFunction(t, ms, 28, "promote_due") +
			"; ALTER TABLE queue_limits DROP COLUMN respaced_at"
	case 31:
		undo = "ALTER TABLE events ALTER COLUMN actor SET DEFAULT ''"
	case 30:
		undo = "DROP INDEX steps_ready_handler"
	case 29:
		undo = "DROP TRIGGER instances_unpark ON instances; DROP FUNCTION instances_unpark(); " +
			replacingFunction(t, ms, 18, "limits_admit_due") + "; " + replacingFunction(t, ms, 26, "limits_instance_release") +
			"; DROP INDEX instances_deferred; ALTER TABLE instances DROP COLUMN parked" +
			"; CREATE INDEX instances_deferred ON instances (run_after) WHERE deferred AND finished_at IS NULL"
	default:
		t.Fatalf("undoLastMigration does not know how to undo %s", last.Name)
	}
	err = pgx.BeginFunc(t.Context(), sharedPool(t), func(tx pgx.Tx) error {
		if _, err := tx.Exec(t.Context(), "SET LOCAL search_path TO "+pgx.Identifier{schema}.Sanitize()); err != nil {
			return err
		}
		if _, err := tx.Exec(t.Context(), undo); err != nil {
			return err
		}
		_, err := tx.Exec(t.Context(), "DELETE FROM schema_migrations WHERE version = $1", last.Version)
		return err
	})
	require.NoError(t, err, "undo %s", last.Name)
}

// replacingFunction returns migration version's definition of function
// name as a statement that replaces the function's current one.
func replacingFunction(t *testing.T, ms []migrate.Migration, version int, name string) string {
	t.Helper()
	i := slices.IndexFunc(ms, func(m migrate.Migration) bool { return m.Version == version })
	require.GreaterOrEqual(t, i, 0, "no migration %d", version)
	_, body, ok := strings.Cut(ms[i].SQL, "FUNCTION "+name+"(")
	require.True(t, ok, "%s creates no function %s", ms[i].Name, name)
	// The body runs from AS $$ to the next $$.
	head, rest, ok := strings.Cut(body, "$$")
	require.True(t, ok, "%s: function %s has no body", ms[i].Name, name)
	rest, _, ok = strings.Cut(rest, "$$")
	require.True(t, ok, "%s: function %s has no end", ms[i].Name, name)
	return "CREATE OR REPLACE FUNCTION " + name + "(" + head + "$$" + rest + "$$"
}

// TestPgBouncerWithoutCreateOnTheSchema: a role that may not create
// functions in the schema runs every statement as it is, and the log says
// why once.
func TestPgBouncerWithoutCreateOnTheSchema(t *testing.T) {
	t.Parallel()
	schema := newSchema(t)
	owner, _ := planFunctionsStore(t, schema) // migrates the schema
	role := "dagrun_test_" + strings.TrimPrefix(schema, "dagrun_test_")
	admin := sharedPool(t)
	ident := pgx.Identifier{schema}.Sanitize()
	for _, stmt := range []string{
		fmt.Sprintf("CREATE ROLE %s LOGIN", role),
		fmt.Sprintf("GRANT USAGE ON SCHEMA %s TO %s", ident, role),
		fmt.Sprintf("GRANT ALL ON ALL TABLES IN SCHEMA %s TO %s", ident, role),
		fmt.Sprintf("GRANT ALL ON ALL SEQUENCES IN SCHEMA %s TO %s", ident, role),
	} {
		_, err := admin.Exec(t.Context(), stmt)
		require.NoError(t, err, stmt)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), 30*time.Second)
		defer cancel()
		_, err := admin.Exec(ctx, fmt.Sprintf("DROP OWNED BY %s; DROP ROLE %s", role, role))
		require.NoError(t, err)
	})
	u, err := url.Parse(withQuery(t, testURL(t), SchemaParam, schema, PgBouncerParam, "true"))
	require.NoError(t, err)
	u.User = url.User(role)
	logs := &syncBuffer{}
	s := openURL(t, u.String(), &Config{MaxConns: 2, Logger: slog.New(slog.NewTextHandler(logs, nil))})

	ctx := t.Context()
	for range 2 {
		_, err := s.CreateInstances(ctx, nil, []storage.CreateParams{params(spec("a"))}, storagetest.Plan)
		require.NoError(t, err)
		claimed, err := s.ClaimSteps(ctx, storage.ClaimParams{WorkerID: "w", Limit: 1, Lease: time.Minute})
		require.NoError(t, err)
		require.Len(t, claimed, 1)
		s.plans.wait()
	}
	require.NotContains(t, s.q(claimQueries.of(claimShape{snapshots: true})), planFuncPrefix)
	require.Zero(t, planFunctionsIn(t, schema))
	require.Equal(t, 1, strings.Count(logs.String(), "may not create functions"), logs.String())
	require.NotNil(t, owner)
}

// dropPlanFunctions drops every statement function of a schema, as a DBA
// or a restore that leaves them out would.
func dropPlanFunctions(t *testing.T, schema string) {
	t.Helper()
	_, err := sharedPool(t).Exec(t.Context(), `DO $$
DECLARE f regprocedure;
BEGIN
	FOR f IN SELECT oid::regprocedure FROM pg_proc
		WHERE pronamespace = '`+pgx.Identifier{schema}.Sanitize()+`'::regnamespace AND proname LIKE 'dagrun\_plan\_%'
	LOOP
		EXECUTE 'DROP FUNCTION ' || f;
	END LOOP;
END $$`)
	require.NoError(t, err)
	require.Zero(t, planFunctionsIn(t, schema))
}

// TestPgBouncerStatementsOutliveTheirFunctions: statement functions dropped
// under a running store cost no operation: the first statement that finds
// its function gone runs again as it is, every statement goes back to its
// own text, and the functions are made again.
func TestPgBouncerStatementsOutliveTheirFunctions(t *testing.T) {
	t.Parallel()
	schema := newSchema(t)
	s, logs := planFunctionsStore(t, schema)
	ctx := t.Context()
	// run takes an instance of one step from creation to completion
	// through the statements a worker uses; meanwhile runs after the
	// creation, before the claim, which goes first so that it is the
	// statement that finds its function gone.
	run := func(meanwhile func()) {
		t.Helper()
		created, err := s.CreateInstances(ctx, nil, []storage.CreateParams{params(spec("a"))}, storagetest.Plan)
		require.NoError(t, err)
		meanwhile()
		claimed, err := s.ClaimSteps(ctx, storage.ClaimParams{WorkerID: "w", Limit: 1, Lease: time.Minute})
		require.NoError(t, err)
		require.Len(t, claimed, 1)
		_, err = s.FinishSteps(ctx, []storage.StepResult{completed(claimed[0])}, storagetest.Plan)
		require.NoError(t, err)
		in, err := s.GetInstance(ctx, created[0].ID)
		require.NoError(t, err)
		require.Equal(t, storage.InstanceCompleted, in.Status)
	}
	claimSQL := claimQueries.of(claimShape{snapshots: true})

	run(func() {})
	s.plans.wait()
	require.Contains(t, s.q(claimSQL), planFuncPrefix)
	made := planFunctionsIn(t, schema)
	require.Positive(t, made)

	run(func() { dropPlanFunctions(t, schema) })
	require.Equal(t, 1, strings.Count(logs.String(), "vanished"), logs.String())
	s.plans.wait()
	require.Equal(t, made, planFunctionsIn(t, schema), "the functions are made again")
	require.Contains(t, s.q(claimSQL), planFuncPrefix)
	run(func() {})
	require.Equal(t, 1, strings.Count(logs.String(), "level=WARN"), logs.String())
}

// TestPgBouncerReadsOutliveTheirFunctions: what is not a worker's
// transaction (the reads of the CLI and the API, a worker's goodbye, a
// schedule's pause) also runs again as it is when it is the first to find
// its function gone, rather than failing once.
func TestPgBouncerReadsOutliveTheirFunctions(t *testing.T) {
	t.Parallel()
	cases := map[string]func(ctx context.Context, s *Store, id string) error{
		"GetInstance": func(ctx context.Context, s *Store, id string) error {
			_, err := s.GetInstance(ctx, id)
			return err
		},
		"ListInstances": func(ctx context.Context, s *Store, _ string) error {
			_, err := s.ListInstances(ctx, storage.ListParams{Limit: 10})
			return err
		},
		"ListEvents": func(ctx context.Context, s *Store, id string) error {
			_, err := s.ListEvents(ctx, storage.EventsParams{InstanceID: id})
			return err
		},
		"Queues": func(ctx context.Context, s *Store, _ string) error {
			_, err := s.Queues(ctx)
			return err
		},
		"ListWorkers": func(ctx context.Context, s *Store, _ string) error {
			_, err := s.ListWorkers(ctx)
			return err
		},
		"RemoveWorker": func(ctx context.Context, s *Store, _ string) error {
			return s.RemoveWorker(ctx, "w")
		},
		"ListSchedules": func(ctx context.Context, s *Store, _ string) error {
			_, err := s.ListSchedules(ctx)
			return err
		},
	}
	for name, op := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			schema := newSchema(t)
			s, logs := planFunctionsStore(t, schema)
			ctx := t.Context()
			created, err := s.CreateInstances(ctx, nil, []storage.CreateParams{params(spec("a"))}, storagetest.Plan)
			require.NoError(t, err)
			id := created[0].ID
			require.NoError(t, op(ctx, s, id))
			s.plans.wait()
			require.Positive(t, planFunctionsIn(t, schema))
			dropPlanFunctions(t, schema)
			require.NoError(t, op(ctx, s, id), "the first call after the functions vanished")
			require.Equal(t, 1, strings.Count(logs.String(), "vanished"), logs.String())
		})
	}
}

// TestPgBouncerTriesAFailedFunctionAgain: a function that could not be
// made for a passing reason is made at a later try; one that fails every
// try leaves its statement as it is, with one warning.
func TestPgBouncerTriesAFailedFunctionAgain(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		failures int
		err      error
		routed   bool
		attempts int // made in all
	}{
		{"a passing failure", 1, errors.New("connection lost"), true, 2},
		{"a lasting failure", planAttempts, errors.New("connection lost"), false, planAttempts},
		// An outage is no attempt, however long it lasts.
		{"an outage", planAttempts + 2, &pgconn.PgError{Code: "08P01", Message: "server login has been failing, try again later (server_login_retry)"}, true, planAttempts + 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, logs := planFunctionsStore(t, newSchema(t))
			var attempts atomic.Int32
			s.plans.retryPause = time.Millisecond
			s.plans.beforeMake = func() error {
				if int(attempts.Add(1)) <= tc.failures {
					return tc.err
				}
				return nil
			}
			const sql = `SELECT count(*) FROM {s}instances WHERE status = $1`
			s.q(sql)
			require.Eventually(t, func() bool { return int(attempts.Load()) >= tc.attempts },
				10*time.Second, time.Millisecond)
			s.plans.wait()
			require.Equal(t, tc.routed, strings.Contains(s.q(sql), planFuncPrefix), logs.String())
			require.Equal(t, tc.attempts, int(attempts.Load()), "attempts")
			warnings := 0
			if !tc.routed {
				warnings = 1
			}
			require.Equal(t, warnings, strings.Count(logs.String(), "level=WARN"), logs.String())
		})
	}
}
