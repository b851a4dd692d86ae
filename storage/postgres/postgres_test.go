package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/internal/pgtest"
	"github.com/dagrun/dagrun/storage/storagetest"
)

// Tests run against the server named by DAGRUN_TEST_POSTGRES, e.g.
// postgres://postgres@127.0.0.1:5432/test?sslmode=disable. Each test gets a
// schema of its own in that database (Config.Schema), dropped in its
// cleanup, so tests run in parallel and leave nothing behind. Without the
// variable the tests are skipped, except under CI=true, where they fail.
const envURL = "DAGRUN_TEST_POSTGRES"

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.pool != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		if err := reusable.DropAll(ctx, shared.pool); err != nil {
			fmt.Fprintf(os.Stderr, "dropping the reusable schemas: %v\n", err)
			code = 1
		}
		cancel()
	}
	closeSharedPool()
	if code == 0 {
		// Every store, listener and pool a test opened must be gone.
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

func testURL(t testing.TB) string {
	t.Helper()
	url := os.Getenv(envURL)
	if url == "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s must be set when CI=true (e.g. postgres://postgres@127.0.0.1:5432/test?sslmode=disable)", envURL)
		}
		t.Skipf("set %s to a PostgreSQL URL to run the postgres tests", envURL)
	}
	return url
}

var shared struct {
	once sync.Once
	pool *pgxpool.Pool
	err  error
}

// sharedPool is one pool for all the suite's stores: the stores qualify
// every table with their schema, so they share connections as an
// application's stores would.
func sharedPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	url := testURL(t)
	shared.once.Do(func() {
		cfg, err := pgxpool.ParseConfig(url)
		if err != nil {
			shared.err = err
			return
		}
		cfg.MaxConns = 16
		cfg.ConnConfig.RuntimeParams["application_name"] = "dagrun-test"
		shared.pool, shared.err = pgxpool.NewWithConfig(context.Background(), cfg)
	})
	require.NoError(t, shared.err)
	return shared.pool
}

func closeSharedPool() {
	if shared.pool != nil {
		shared.pool.Close()
	}
}

// newSchema returns a fresh schema name, dropped (with everything in it) in
// the test's cleanup.
func newSchema(t testing.TB) string {
	t.Helper()
	pool := sharedPool(t)
	schema := schemaName()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), 30*time.Second)
		defer cancel()
		require.NoError(t, pgtest.DropSchema(ctx, pool, schema))
	})
	return schema
}

// schemaName returns a schema name no other test has.
func schemaName() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return "dagrun_test_" + hex.EncodeToString(b)
}

// reusable keeps the conformance suite's schemas between its tests, which
// change rows only through the store.
var reusable pgtest.Reusable

// reusedSchema returns an empty migrated schema that an earlier test of
// the process is done with, or a fresh name when there is none, and keeps
// it for a later test once the test and its store are done (see
// pgtest.Reusable). A test that changes more than rows must use newSchema.
func reusedSchema(t testing.TB) string {
	t.Helper()
	pool := sharedPool(t)
	schema, ok := reusable.Take()
	if !ok {
		schema = schemaName()
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), 30*time.Second)
		defer cancel()
		require.NoError(t, reusable.Return(ctx, pool, schema, "schema_migrations"))
	})
	return schema
}

// openTestStore returns a migrated store in a fresh schema on the shared pool,
// closed in the test's cleanup.
func openTestStore(t testing.TB, cfg *Config) *Store {
	t.Helper()
	return openStoreIn(t, newSchema(t), cfg)
}

// openStoreIn opens a store on the shared pool in schema, migrating it if
// it is not, and closes it in the test's cleanup.
func openStoreIn(t testing.TB, schema string, cfg *Config) *Store {
	t.Helper()
	pool := sharedPool(t)
	c := Config{}
	if cfg != nil {
		c = *cfg
	}
	c.Schema = schema
	s, err := New(t.Context(), pool, &c)
	require.NoError(t, err)
	t.Cleanup(func() {
		requireCountsExact(t, s)
		require.NoError(t, s.Close())
	})
	return s
}

// requireCountsExact checks, at the end of every test of a store, that
// the instance counts the store keeps as instances change (see Stats) are
// what counting the instances gives: whatever the test did, no statement
// that creates, deletes or changes the status of instances may miss them.
func requireCountsExact(t testing.TB, s *Store) {
	t.Helper()
	ctx := context.WithoutCancel(t.Context())
	counts := func(sql string) map[string]int64 {
		rows, err := s.pool.Query(ctx, s.q(sql))
		require.NoError(t, err)
		got := map[string]int64{}
		var (
			workflow, status string
			n                int64
		)
		_, err = pgx.ForEachRow(rows, []any{&workflow, &status, &n}, func() error {
			got[workflow+" "+status] = n
			return nil
		})
		require.NoError(t, err)
		return got
	}
	kept := counts(`SELECT workflow, status, sum(n)::bigint FROM {s}instance_counts GROUP BY workflow, status HAVING sum(n) <> 0`)
	counted := counts(`SELECT workflow, status, count(*) FROM {s}instances GROUP BY workflow, status`)
	require.Equal(t, counted, kept, "instance counts kept by the store against the instances")
}

func TestConformance(t *testing.T) {
	t.Parallel()
	sharedPool(t) // skips without DAGRUN_TEST_POSTGRES
	storagetest.Run(t, storagetest.Harness{
		NewStore: func(t *testing.T, now func() time.Time) storage.Store {
			return openStoreIn(t, reusedSchema(t), &Config{Now: now})
		},
		BeginTx: beginCallerTx,
		Settle:  settleListener,
		AppendEventTx: func(t *testing.T, st storage.Store, id string, typ storage.EventType) func() error {
			s := st.(*Store)
			ctx := context.WithoutCancel(t.Context())
			tx, err := s.Pool().Begin(ctx)
			require.NoError(t, err)
			t.Cleanup(func() { _ = tx.Rollback(ctx) })
			_, err = tx.Exec(ctx, s.q(`INSERT INTO {s}events (instance_id, type, at) VALUES ($1, $2, now())`), id, string(typ))
			require.NoError(t, err)
			return func() error { return tx.Commit(ctx) }
		},
	})
}

// settleListener is the suite's Settle: once a claimer of the store waits,
// it waits for the listener to LISTEN, which it does after signalling the
// store's subscribers.
func settleListener(t *testing.T, st storage.Store) {
	s := st.(*Store)
	if s.claimers.needed() {
		awaitListener(t, s, 0)
	}
}

// beginCallerTx is the suite's BeginTx: a transaction of the caller's own
// on the store's pool.
func beginCallerTx(t *testing.T, s storage.Store) (tx any, commit, rollback func() error) {
	ctx := context.WithoutCancel(t.Context())
	ptx, err := s.(*Store).Pool().Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = ptx.Rollback(ctx) })
	return ptx, func() error { return ptx.Commit(ctx) }, func() error { return ptx.Rollback(ctx) }
}
