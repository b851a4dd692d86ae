// Package backendtest opens fresh stores of every backend for tests that
// run above the storage layer (the engine's, the HTTP API's, the examples'),
// so each of them tests one behaviour on SQLite and PostgreSQL alike.
//
// SQLite always runs, on a file in the test's temporary folder. PostgreSQL
// runs when DAGRUN_TEST_POSTGRES names a server (a URL such as
// postgres://postgres@127.0.0.1:5432/test?sslmode=disable); each store's
// test gets a schema of its own in that database, and each test that asks
// for a URL a database of its own, both dropped when the test ends. Under
// CI=true a missing DAGRUN_TEST_POSTGRES fails the test instead of quietly
// testing less.
//
// A schema, not a database, because of what a database costs the server:
// DROP DATABASE forces a checkpoint, and the server's CPU for a database
// made, migrated and dropped (about 0.4 s on a 2-core VM) was most of what
// the engine's tests cost.
//
// It is a test helper: it imports both backends, which only the CLI and
// test code may do.
package backendtest

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/internal/pgtest"
	"github.com/dagrun/dagrun/storage/postgres"
	"github.com/dagrun/dagrun/storage/sqlite"
)

// Backend opens a fresh, empty store of one kind; the store is closed when
// the test ends. Shared makes a fresh, empty database and returns what
// opens a store on it, each call another store with connections of its
// own, as another process would have.
type Backend struct {
	Name   string
	Open   func(t testing.TB) storage.Store
	Shared func(t testing.TB) func() (storage.Store, error)
}

// All returns SQLite, and PostgreSQL when DAGRUN_TEST_POSTGRES is set.
func All(t testing.TB) []Backend {
	t.Helper()
	list := []Backend{{Name: "sqlite", Open: OpenSQLite, Shared: sharedSQLite}}
	if PostgresAvailable(t) {
		list = append(list, Backend{Name: "postgres", Open: OpenPostgres, Shared: sharedPostgres})
	}
	return list
}

// EachShared runs test once per backend, as parallel subtests; each call
// of connect opens another store on the subtest's one database (see
// Backend.Shared), closed when the test ends.
func EachShared(t *testing.T, test func(t *testing.T, connect func() storage.Store)) {
	t.Helper()
	for _, b := range All(t) {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			open := b.Shared(t)
			test(t, func() storage.Store {
				store, err := open()
				require.NoError(t, err)
				t.Cleanup(func() { _ = store.Close() })
				return store
			})
		})
	}
}

func sharedSQLite(t testing.TB) func() (storage.Store, error) {
	path := filepath.Join(t.TempDir(), "dagrun.db")
	return func() (storage.Store, error) { return sqlite.Open(context.Background(), path, nil) }
}

func sharedPostgres(t testing.TB) func() (storage.Store, error) {
	url := postgresSchemaURL(t)
	return func() (storage.Store, error) { return postgres.Open(context.Background(), url, nil) }
}

// Each runs test once per backend, as parallel subtests.
func Each(t *testing.T, test func(t *testing.T, open func(testing.TB) storage.Store)) {
	t.Helper()
	for _, b := range All(t) {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			test(t, b.Open)
		})
	}
}

// PostgresAvailable reports whether DAGRUN_TEST_POSTGRES is set, failing
// the test under CI=true when it is not.
func PostgresAvailable(t testing.TB) bool {
	t.Helper()
	if os.Getenv("DAGRUN_TEST_POSTGRES") != "" {
		return true
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("DAGRUN_TEST_POSTGRES is not set; PostgreSQL tests are required under CI=true")
	}
	return false
}

// OpenSQLite opens a store on a new file in the test's temporary folder.
func OpenSQLite(t testing.TB) storage.Store {
	t.Helper()
	store, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "dagrun.db"), nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	return store
}

// OpenPostgres opens a store on a schema of the test's own: an emptied
// one that an earlier test of the process is done with, under
// ReusingSchemas.
func OpenPostgres(t testing.TB) storage.Store {
	t.Helper()
	open := postgresSchemaURL
	if reusing.Load() {
		open = reusedSchemaURL
	}
	url := open(t)
	store, err := postgres.Open(context.Background(), url, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	return store
}

var seq atomic.Int64

// serverDSN is DAGRUN_TEST_POSTGRES, which the test requires.
func serverDSN(t testing.TB) string {
	t.Helper()
	dsn := os.Getenv("DAGRUN_TEST_POSTGRES")
	if dsn == "" {
		t.Fatal("backendtest: DAGRUN_TEST_POSTGRES is not set")
	}
	return dsn
}

// newName is a name no other test's database or schema has.
func newName() string {
	return fmt.Sprintf("dagrun_test_%d_%d", time.Now().UnixNano(), seq.Add(1))
}

var (
	reusing  atomic.Bool
	reusable pgtest.Reusable
)

// ReusingSchemas makes OpenPostgres reuse the schemas of the tests that
// m runs (see pgtest.Reusable), which suits tests that change a store's
// rows only through the store, and drops them once m's tests are done. A
// package's TestMain runs its tests through it:
//
//	goleak.VerifyTestMain(backendtest.ReusingSchemas(m))
func ReusingSchemas(m interface{ Run() int }) interface{ Run() int } {
	reusing.Store(true)
	return reusingM{m}
}

type reusingM struct{ m interface{ Run() int } }

func (r reusingM) Run() int {
	code := r.m.Run()
	dsn := os.Getenv("DAGRUN_TEST_POSTGRES")
	if dsn == "" {
		return code
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := withAdmin(ctx, dsn, func(ctx context.Context, admin *pgx.Conn) error {
		return reusable.DropAll(ctx, admin)
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "backendtest: dropping the reused schemas: %v\n", err)
		return max(code, 1)
	}
	return code
}

// reusedSchemaURL is postgresSchemaURL for a schema from reusable, or a
// new one, returned to reusable when the test ends.
func reusedSchemaURL(t testing.TB) string {
	t.Helper()
	dsn := serverDSN(t)
	schema, ok := reusable.Take()
	if !ok {
		schema = newName()
	}
	t.Cleanup(func() {
		err := withAdmin(context.Background(), dsn, func(ctx context.Context, admin *pgx.Conn) error {
			return reusable.Return(ctx, admin, schema, "schema_migrations")
		})
		if err != nil {
			t.Errorf("backendtest: %v", err)
		}
	})
	return schemaURL(t, dsn, schema)
}

// postgresSchemaURL returns the URL of DAGRUN_TEST_POSTGRES with a new
// schema for dagrun's tables (postgres.SchemaParam), which the store
// creates when it migrates and the test's cleanup drops.
func postgresSchemaURL(t testing.TB) string {
	t.Helper()
	dsn := serverDSN(t)
	schema := newName()
	t.Cleanup(func() {
		err := withAdmin(context.Background(), dsn, func(ctx context.Context, admin *pgx.Conn) error {
			return pgtest.DropSchema(ctx, admin, schema)
		})
		if err != nil {
			t.Errorf("backendtest: %v", err)
		}
	})
	return schemaURL(t, dsn, schema)
}

// withAdmin runs do on a connection of its own to dsn, closed after.
func withAdmin(ctx context.Context, dsn string, do func(context.Context, *pgx.Conn) error) error {
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return fmt.Errorf("connecting to the test server: %w", err)
	}
	defer admin.Close(ctx)
	return do(ctx, admin)
}

// schemaURL is dsn with schema for dagrun's tables (postgres.SchemaParam).
func schemaURL(t testing.TB, dsn, schema string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	q := u.Query()
	q.Set(postgres.SchemaParam, schema)
	u.RawQuery = q.Encode()
	return u.String()
}

// PostgresURL creates an empty database for the test on the server of
// DAGRUN_TEST_POSTGRES, drops it when the test ends, and returns its URL.
func PostgresURL(t testing.TB) string {
	t.Helper()
	dsn := serverDSN(t)
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	name := newName()
	_, err = admin.Exec(ctx, "CREATE DATABASE "+name)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx := context.WithoutCancel(ctx)
		_, _ = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
		_ = admin.Close(ctx)
	})
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	u.Path = "/" + name
	return u.String()
}
