package web_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"path/filepath"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/postgres"
	"github.com/dagrun/dagrun/storage/sqlite"
)

// backend opens a fresh, empty store of one kind for one test.
type backend struct {
	name string
	open func(t *testing.T) storage.Store
}

// backends lists the stores the API tests run on: SQLite always, PostgreSQL
// when DAGRUN_TEST_POSTGRES names a server. Under CI=true a missing
// DAGRUN_TEST_POSTGRES fails instead of quietly testing less.
func backends(t *testing.T) []backend {
	t.Helper()
	list := []backend{{name: "sqlite", open: openSQLite}}
	switch {
	case os.Getenv("DAGRUN_TEST_POSTGRES") != "":
		list = append(list, backend{name: "postgres", open: openPostgres})
	case os.Getenv("CI") == "true":
		t.Fatal("DAGRUN_TEST_POSTGRES is not set; Postgres tests are required under CI=true")
	default:
		t.Log("DAGRUN_TEST_POSTGRES is not set: testing SQLite only")
	}
	return list
}

func openSQLite(t *testing.T) storage.Store {
	t.Helper()
	store, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "dagrun.db"), nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	return store
}

// openPostgres creates a database of its own for the test and drops it
// afterwards, so parallel tests never see each other's rows.
func openPostgres(t *testing.T) storage.Store {
	t.Helper()
	dsn := os.Getenv("DAGRUN_TEST_POSTGRES")
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	suffix := make([]byte, 6)
	_, _ = rand.Read(suffix)
	name := "dagrun_web_" + hex.EncodeToString(suffix)
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
	store, err := postgres.Open(ctx, u.String(), nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	return store
}

// forEachBackend runs test once per backend as parallel subtests.
func forEachBackend(t *testing.T, test func(t *testing.T, open func(t *testing.T) storage.Store)) {
	t.Helper()
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			test(t, b.open)
		})
	}
}
