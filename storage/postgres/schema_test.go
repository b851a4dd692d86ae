package postgres

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/internal/migrate"
	"github.com/dagrun/dagrun/storage/storagetest"
)

// newDatabase creates an empty database, dropped in the test's cleanup, and
// returns its URL: the tests of where dagrun puts its tables need a public
// schema of their own.
func newDatabase(t *testing.T) string {
	t.Helper()
	admin := sharedPool(t)
	db := strings.ReplaceAll(newSchema(t), "dagrun_test_", "dagrun_testdb_")
	_, err := admin.Exec(t.Context(), "CREATE DATABASE "+db)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), 30*time.Second)
		defer cancel()
		_, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+db+" WITH (FORCE)")
		require.NoError(t, err)
	})
	u, err := url.Parse(testURL(t))
	require.NoError(t, err)
	u.Path = "/" + db
	return u.String()
}

// withQuery returns rawURL with the query parameters keyValues (name,
// value, name, value...) set.
func withQuery(t testing.TB, rawURL string, keyValues ...string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	require.NoError(t, err)
	q := u.Query()
	for i := 0; i+1 < len(keyValues); i += 2 {
		q.Set(keyValues[i], keyValues[i+1])
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// openURL opens a store and closes it in the test's cleanup.
func openURL(t *testing.T, rawURL string, cfg *Config) *Store {
	t.Helper()
	s, err := Open(t.Context(), rawURL, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	return s
}

// tablesIn lists the ordinary tables of a schema.
func tablesIn(t *testing.T, s *Store, schema string) []string {
	t.Helper()
	rows, err := s.pool.Query(t.Context(), `SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relkind = 'r' ORDER BY c.relname`, schema)
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return names
}

var dagrunTables = []string{"definitions", "events", "instance_counts", "instances", "queue_limits", "schedules", "schema_migrations", "signals", "step_logs", "steps", "workers"}

// runOneStep creates a two-step chain, claims and completes its first step,
// and returns the instance's ID.
func runOneStep(t *testing.T, s *Store) string {
	t.Helper()
	ctx := t.Context()
	res, err := s.CreateInstances(ctx, nil, []storage.CreateParams{params(spec("a"), spec("b", "a"))}, storagetest.Plan)
	require.NoError(t, err)
	cs, err := s.ClaimSteps(ctx, storage.ClaimParams{Limit: 1, Lease: time.Minute, InstanceID: res[0].ID})
	require.NoError(t, err)
	require.Len(t, cs, 1)
	fr, err := s.FinishSteps(ctx, []storage.StepResult{{Claim: cs[0].Claim, Outcome: storage.OutcomeCompleted}}, storagetest.Plan)
	require.NoError(t, err)
	require.True(t, fr[0].Accepted)
	in, err := s.GetInstance(ctx, res[0].ID)
	require.NoError(t, err)
	require.Equal(t, storage.StepPending, in.Steps[1].Status)
	return res[0].ID
}

// TestDefaultSchema: with a zero Config the tables live in the schema
// "dagrun", whatever the connection's search_path, and public stays empty.
func TestDefaultSchema(t *testing.T) {
	t.Parallel()
	dbURL := newDatabase(t)
	s := openURL(t, dbURL, nil)
	var app string
	require.NoError(t, s.pool.QueryRow(t.Context(), "SHOW application_name").Scan(&app))
	require.Equal(t, "dagrun", app)
	require.EqualValues(t, DefaultMaxConns, s.pool.Config().MaxConns)
	require.Equal(t, "dagrun_ready.dagrun", s.channel)

	runOneStep(t, s)
	require.Equal(t, dagrunTables, tablesIn(t, s, "dagrun"))
	require.Empty(t, tablesIn(t, s, "public"))

	// Migrating again is a no-op.
	s2, err := Open(t.Context(), dbURL, &Config{MaxConns: 1})
	require.NoError(t, err)
	require.NoError(t, s2.Close())
}

// TestSchemaFromURL: the URL's dagrun_schema names the schema, never
// reaches the server (which would refuse an unknown parameter), and
// Config.Schema wins over it; invalid names are refused before anything is
// written.
func TestSchemaFromURL(t *testing.T) {
	t.Parallel()
	dbURL := newDatabase(t)
	cases := []struct {
		name, param, config, want string
	}{
		{"url", "tenant_a", "", "tenant_a"},
		{"config over url", "tenant_a", "tenant_b", "tenant_b"},
		{"quoted name", `Tenant-"C"`, "", `Tenant-"C"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := openURL(t, withQuery(t, dbURL, SchemaParam, c.param), &Config{Schema: c.config, MaxConns: 2})
			require.Equal(t, c.want, s.cfg.Schema)
			runOneStep(t, s)
			require.Equal(t, dagrunTables, tablesIn(t, s, c.want))
		})
	}
	for _, bad := range []string{"pg_dagrun", strings.Repeat("x", 64)} {
		_, err := Open(t.Context(), withQuery(t, dbURL, SchemaParam, bad), nil)
		require.ErrorContains(t, err, "invalid schema name")
	}
	s := openURL(t, dbURL, &Config{MaxConns: 1})
	require.Empty(t, tablesIn(t, s, "pg_dagrun"))
}

// TestApplicationTablesInPublic: an application's own events table and a
// golang-migrate schema_migrations in public neither stop dagrun nor are
// touched by it.
func TestApplicationTablesInPublic(t *testing.T) {
	t.Parallel()
	dbURL := newDatabase(t)
	ctx := t.Context()
	app, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer app.Close(context.WithoutCancel(ctx))
	_, err = app.Exec(ctx, `
		CREATE TABLE public.events (id bigserial PRIMARY KEY, kind text NOT NULL, payload jsonb);
		INSERT INTO public.events (kind, payload) VALUES ('signup', '{"user": 1}');
		CREATE TABLE public.schema_migrations (version bigint PRIMARY KEY, dirty boolean NOT NULL);
		INSERT INTO public.schema_migrations VALUES (20240101120000, false);`)
	require.NoError(t, err)

	s := openURL(t, dbURL, nil)
	runOneStep(t, s)
	require.Equal(t, dagrunTables, tablesIn(t, s, "dagrun"))
	require.Equal(t, []string{"events", "schema_migrations"}, tablesIn(t, s, "public"))
	var (
		kind    string
		version int64
		dirty   bool
	)
	require.NoError(t, app.QueryRow(ctx, "SELECT kind FROM public.events").Scan(&kind))
	require.Equal(t, "signup", kind)
	require.NoError(t, app.QueryRow(ctx, "SELECT version, dirty FROM public.schema_migrations").Scan(&version, &dirty))
	require.EqualValues(t, 20240101120000, version)
	require.False(t, dirty)
}

// legacyLayout lays dbURL's schema public out as the dagrun versions
// before schemas of their own left it: migrations 1 to lastLegacyVersion
// applied there, with a two-step instance whose first step completed (a
// and b, as runOneStep leaves one), and returns the instance's ID.
func legacyLayout(t *testing.T, dbURL string) string {
	t.Helper()
	ctx := t.Context()
	ms, err := migrate.Read(migrationFS, "migrations")
	require.NoError(t, err)
	conn, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer conn.Close(context.WithoutCancel(ctx))
	const id = "01a25100-0000-7000-8000-000000000001"
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		statements := []string{"SET LOCAL search_path TO public", `CREATE TABLE schema_migrations (
			version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`}
		for _, m := range ms[:lastLegacyVersion] {
			statements = append(statements, m.SQL, fmt.Sprintf("INSERT INTO schema_migrations (version, name) VALUES (%d, '%s')", m.Version, m.Name))
		}
		statements = append(statements,
			`INSERT INTO definitions (hash, workflow, source) VALUES ('h1', 'wf', 'name: wf')`,
			`INSERT INTO instances (id, workflow, definition_hash, status, input, run_after, created_at, started_at)
				VALUES ('`+id+`', 'wf', 'h1', 'running', '{}', now(), now(), now())`,
			`INSERT INTO steps (instance_id, position, name, handler, queue, workflow, status, attempts, output, run_after, ready_at, started_at, finished_at)
				VALUES ('`+id+`', 0, 'a', 'h', 'default', 'wf', 'completed', 1, '1', now(), now(), now(), now())`,
			`INSERT INTO steps (instance_id, position, name, handler, queue, workflow, depends_on, status, input, run_after, ready_at)
				VALUES ('`+id+`', 1, 'b', 'h', 'default', 'wf', '{a}', 'pending', '1', now(), now())`,
			`INSERT INTO events (instance_id, step, type, attempt, at) VALUES ('`+id+`', 'a', 'step.completed', 1, now())`,
		)
		for _, q := range statements {
			if _, err := tx.Exec(ctx, q); err != nil {
				return fmt.Errorf("%s: %w", q, err)
			}
		}
		return nil
	})
	require.NoError(t, err)
	return id
}

// TestLegacyLayoutMoved: a database laid out by an older dagrun, its tables
// in public, is moved into the dagrun schema with its instances intact, by
// whichever of several processes opening at once gets there first, and
// migrated there; its pending step runs.
func TestLegacyLayoutMoved(t *testing.T) {
	t.Parallel()
	dbURL := newDatabase(t)
	ctx := t.Context()
	id := legacyLayout(t, dbURL)

	const n = 4
	stores := make([]*Store, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { stores[i], errs[i] = Open(ctx, dbURL, &Config{MaxConns: 2}) })
	}
	wg.Wait()
	for i := range n {
		require.NoError(t, errs[i])
		t.Cleanup(func() { require.NoError(t, stores[i].Close()) })
	}
	s := stores[0]
	require.Empty(t, tablesIn(t, s, "public"))
	require.Equal(t, dagrunTables, tablesIn(t, s, "dagrun"))

	in, err := s.GetInstance(ctx, id)
	require.NoError(t, err)
	require.Equal(t, storage.InstanceRunning, in.Status)
	require.Equal(t, storage.StepCompleted, in.Steps[0].Status)
	require.Equal(t, storage.StepPending, in.Steps[1].Status)
	cs, err := stores[1].ClaimSteps(ctx, storage.ClaimParams{Limit: 1, Lease: time.Minute, InstanceID: id})
	require.NoError(t, err)
	require.Len(t, cs, 1, "the moved instance's pending step")
	fr, err := s.FinishSteps(ctx, []storage.StepResult{{Claim: cs[0].Claim, Outcome: storage.OutcomeCompleted}}, storagetest.Plan)
	require.NoError(t, err)
	require.True(t, fr[0].Accepted)
	in, err = s.GetInstance(ctx, id)
	require.NoError(t, err)
	require.Equal(t, storage.InstanceCompleted, in.Status)
	// New rows continue the identity sequences that moved with the tables.
	runOneStep(t, s)

	// The migrations after the move made every function, and they work.
	fresh := openTestStore(t, nil)
	require.Equal(t, functionsIn(t, fresh, fresh.cfg.Schema), functionsIn(t, s, "dagrun"))
	require.Empty(t, functionsIn(t, s, "public"))
	runKeyedPair(t, s)
}

// TestStoreInPublicIsNotMoved: tables in public laid out by this version,
// a store run with schema public, are that store's: opening another
// schema leaves them, with or without a live worker of theirs, and gets
// tables of its own; a warning says how to use them.
func TestStoreInPublicIsNotMoved(t *testing.T) {
	t.Parallel()
	dbURL := newDatabase(t)
	ctx := t.Context()
	public, err := Open(ctx, dbURL, &Config{Schema: "public", MaxConns: 2})
	require.NoError(t, err)
	t.Cleanup(func() { _ = public.Close() })
	done := runOneStep(t, public)

	var logs syncBuffer
	tenant, err := Open(ctx, dbURL, &Config{Schema: "tenant", MaxConns: 2, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	require.NoError(t, err)
	t.Cleanup(func() { _ = tenant.Close() })
	require.Equal(t, dagrunTables, tablesIn(t, public, "public"), "nothing moved")
	require.Equal(t, dagrunTables, tablesIn(t, public, "tenant"))
	_, err = public.GetInstance(ctx, done)
	require.NoError(t, err, "the store in public keeps its instances")
	_, err = tenant.GetInstance(ctx, done)
	require.ErrorIs(t, err, storage.ErrNotFound)
	require.Contains(t, logs.String(), "to_use_them=\"--db-schema public\"")
}

// functionsIn lists the functions of a schema other than the statement
// functions (plans.go), which each version makes for itself.
func functionsIn(t *testing.T, s *Store, schema string) []string {
	t.Helper()
	rows, err := s.pool.Query(t.Context(), `SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		WHERE n.nspname = $1 AND p.proname NOT LIKE 'dagrun\_plan\_%' ORDER BY p.proname`, schema)
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return names
}

// runKeyedPair starts two one-step instances under one concurrency key
// of limit 1: the second runs only once the first has finished, which
// takes every function of the limits.
func runKeyedPair(t *testing.T, s *Store) {
	t.Helper()
	ctx := t.Context()
	key := fmt.Sprintf("k%d", idSeq.Add(1))
	var ids [2]string
	for i := range ids {
		p := params(spec("a"))
		p.ConcurrencyKey, p.ConcurrencyLimit = key, 1
		res, err := s.CreateInstances(ctx, nil, []storage.CreateParams{p}, storagetest.Plan)
		require.NoError(t, err)
		ids[i] = res[0].ID
	}
	claim := func(id string) []storage.ClaimedStep {
		t.Helper()
		cs, err := s.ClaimSteps(ctx, storage.ClaimParams{Limit: 10, Lease: time.Minute, InstanceID: id})
		require.NoError(t, err)
		return cs
	}
	require.Empty(t, claim(ids[1]), "held while the first instance of the key runs")
	for _, id := range ids {
		cs := claim(id)
		require.Len(t, cs, 1)
		fr, err := s.FinishSteps(ctx, []storage.StepResult{{Claim: cs[0].Claim, Outcome: storage.OutcomeCompleted}}, storagetest.Plan)
		require.NoError(t, err)
		require.True(t, fr[0].Accepted)
	}
}

// TestSchemasIsolated: two schemas in one database share neither instances
// nor notifications.
func TestSchemasIsolated(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	a := openTestStore(t, nil)
	b := openTestStore(t, nil)
	bOther := openInSchema(t, b.cfg.Schema, nil)
	require.NotEqual(t, a.channel, b.channel)

	// Notifications reach listeners in commit order: if a's reached b's
	// channel, it would come before the one b's other store sends next.
	conn, err := pgx.Connect(ctx, testURL(t))
	require.NoError(t, err)
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, "LISTEN "+pgx.Identifier{b.channel}.Sanitize())
	require.NoError(t, err)

	id := runOneStep(t, a)
	_, err = bOther.CreateInstances(ctx, nil, []storage.CreateParams{params(spec("a"))}, storagetest.Plan)
	require.NoError(t, err)
	note, err := conn.WaitForNotification(ctx)
	require.NoError(t, err)
	require.Equal(t, bOther.origin+":default", note.Payload, "the first notification on b's channel")

	_, err = b.GetInstance(ctx, id)
	require.ErrorIs(t, err, storage.ErrNotFound)
	list, err := b.ListInstances(ctx, storage.ListParams{})
	require.NoError(t, err)
	require.Len(t, list, 1)
	cs, err := b.ClaimSteps(ctx, storage.ClaimParams{Limit: 10, Lease: time.Minute})
	require.NoError(t, err)
	require.Len(t, cs, 1)
	require.Equal(t, list[0].ID, cs[0].InstanceID)
}

// TestLegacyMoveLeavesApplicationFunctions: a function of the legacy
// schema named as one of dagrun's, which no legacy version made, is the
// application's: it stays, and the store opens.
func TestLegacyMoveLeavesApplicationFunctions(t *testing.T) {
	t.Parallel()
	dbURL := newDatabase(t)
	ctx := t.Context()
	legacyLayout(t, dbURL)
	app, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	_, err = app.Exec(ctx, `CREATE FUNCTION public.promote_due(at timestamptz) RETURNS integer LANGUAGE sql AS 'SELECT 42'`)
	require.NoError(t, err)
	require.NoError(t, app.Close(ctx))

	s := openURL(t, dbURL, &Config{MaxConns: 2})
	runOneStep(t, s)
	var answer int
	require.NoError(t, s.pool.QueryRow(ctx, "SELECT public.promote_due(now())").Scan(&answer))
	require.Equal(t, 42, answer, "the application's function")
}

// TestMigrationFreesTheSlotsOfWorkflowSteps: a schema that an earlier
// version left with a running workflow step in the only slot of its queue
// and a step held behind it (a child's, waiting for ever on its parent)
// comes out of migration 27 with the step released.
func TestMigrationFreesTheSlotsOfWorkflowSteps(t *testing.T) {
	t.Parallel()
	schema := newSchema(t)
	url := withQuery(t, testURL(t), SchemaParam, schema)
	s := openURL(t, url, nil)
	ctx := t.Context()
	_, err := s.CreateInstances(ctx, nil, []storage.CreateParams{{ID: "i-1", Workflow: "wf", DefinitionHash: "h1",
		Definition: []byte("name: wf\n"), Steps: []storage.StepSpec{
			{Name: "call", Handler: "h", Queue: "default"},
			{Name: "work", Handler: "h", Queue: "default"},
		}}}, storagetest.Plan)
	require.NoError(t, err)
	_, err = s.SetQueueLimit(ctx, storage.SetAll(storage.QueueLimit{Queue: "default", Concurrency: 1}))
	require.NoError(t, err)

	// As the earlier version left it: call is a running workflow step,
	// marked as holding a slot, and work is held.
	err = pgx.BeginFunc(ctx, sharedPool(t), func(tx pgx.Tx) error {
		for _, q := range []string{
			"SET LOCAL search_path TO " + pgx.Identifier{schema}.Sanitize(),
			`UPDATE steps SET child_workflow = 'child', status = 'running', started_at = now(), lease_until = NULL,
				run_after = now(), queue_limited = true WHERE name = 'call'`,
			`UPDATE steps SET run_after = '9999-01-01 00:00:00+00', queue_limited = true WHERE name = 'work'`,
			`DELETE FROM schema_migrations WHERE version = 27`,
		} {
			if _, err := tx.Exec(ctx, q); err != nil {
				return err
			}
		}
		return nil
	})
	require.NoError(t, err)
	inst, err := s.GetInstance(ctx, "i-1")
	require.NoError(t, err)
	for _, st := range inst.Steps {
		require.Equal(t, st.Name == "work", st.Held(), "step %s held", st.Name)
	}

	s = openURL(t, url, nil)
	got, err := s.ClaimSteps(ctx, storage.ClaimParams{WorkerID: "w", Limit: 10, Lease: time.Minute})
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.Equal(t, "work", got[0].Step)
}

// TestNewerSchemaIsRefused: a schema a newer dagrun migrated past this
// build's last migration is refused, as the SQLite store refuses such a
// file, on the fast path that finds every known migration applied and on
// the locked one that applies what is missing.
func TestNewerSchemaIsRefused(t *testing.T) {
	t.Parallel()
	schema := newSchema(t)
	s := openStoreIn(t, schema, nil)
	ctx := t.Context()
	_, err := s.pool.Exec(ctx, s.q(`INSERT INTO {s}schema_migrations (version, name) VALUES (999, '0999_future.sql')`))
	require.NoError(t, err)
	for _, tc := range []struct {
		name  string
		setup string // what the newer version did besides, if anything
	}{
		{"EveryKnownMigrationApplied", ""},
		{"AKnownMigrationMissing", `DELETE FROM {s}schema_migrations WHERE version = 33`},
	} {
		if tc.setup != "" {
			_, err := s.pool.Exec(ctx, s.q(tc.setup))
			require.NoError(t, err)
		}
		_, err = New(ctx, sharedPool(t), &Config{Schema: schema})
		require.ErrorIs(t, err, storage.ErrUnavailable, tc.name)
		require.ErrorContains(t, err, fmt.Sprintf(`PostgreSQL schema %q has dagrun's schema version 999, newer than this build of dagrun supports`, schema), tc.name)
		require.ErrorContains(t, err, "upgrade dagrun", tc.name)
	}
}
