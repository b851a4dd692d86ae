package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/sqlite"
	"github.com/dagrun/dagrun/storage/storagetest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// harness opens a fresh file per test; BeginTx opens a second pool on the
// same file, as an application with its own *sql.DB would.
func harness() storagetest.Harness {
	var paths sync.Map // storage.Store -> file path
	return storagetest.Harness{
		NewStore: func(t *testing.T, now func() time.Time) storage.Store {
			path := filepath.Join(t.TempDir(), "dagrun.db")
			s, err := sqlite.Open(t.Context(), path, &sqlite.Config{Now: now})
			require.NoError(t, err)
			t.Cleanup(func() { require.NoError(t, s.Close()) })
			paths.Store(s, path)
			return s
		},
		BeginTx: func(t *testing.T, s storage.Store) (any, func() error, func() error) {
			path, ok := paths.Load(s)
			require.True(t, ok)
			db, err := sql.Open("sqlite3", sqlite.DSN(path.(string)))
			require.NoError(t, err)
			t.Cleanup(func() { require.NoError(t, db.Close()) })
			tx, err := db.BeginTx(t.Context(), nil)
			require.NoError(t, err)
			return tx, tx.Commit, tx.Rollback
		},
	}
}

func TestConformance(t *testing.T) {
	t.Parallel()
	storagetest.Run(t, harness())
}

// TestConformanceNew runs the suite on a Store built by New on one
// caller-owned pool, reads and writes alike.
func TestConformanceNew(t *testing.T) {
	t.Parallel()
	h := harness()
	h.NewStore = func(t *testing.T, now func() time.Time) storage.Store {
		db, err := sql.Open("sqlite3", sqlite.DSN(filepath.Join(t.TempDir(), "dagrun.db")))
		require.NoError(t, err)
		db.SetMaxOpenConns(1)
		t.Cleanup(func() { require.NoError(t, db.Close()) })
		s, err := sqlite.New(db, &sqlite.Config{Now: now})
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, s.Close()) })
		return s
	}
	h.BeginTx = nil // covered by TestConformance
	storagetest.Run(t, h)
}

func TestOpenErrors(t *testing.T) {
	t.Parallel()
	ctx := t.Context()

	t.Run("MissingFolder", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "no", "such", "dir", "dagrun.db")
		_, err := sqlite.Open(ctx, path, nil)
		require.ErrorIs(t, err, storage.ErrUnavailable)
		require.Contains(t, err.Error(), path)
		require.NotContains(t, err.Error(), "\n")
	})

	t.Run("NotADatabase", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "notes.txt")
		require.NoError(t, os.WriteFile(path, []byte(strings.Repeat("not a database\n", 100)), 0o600))
		_, err := sqlite.Open(ctx, path, nil)
		require.ErrorIs(t, err, storage.ErrUnavailable)
		require.Contains(t, err.Error(), "is not a SQLite database")
	})

	t.Run("BadConfig", func(t *testing.T) {
		t.Parallel()
		_, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "x.db"), &sqlite.Config{ReadConns: -1})
		require.Error(t, err)
		_, err = sqlite.New(nil, nil)
		require.Error(t, err)
	})
}

// TestNewRefusesPoolWithoutForeignKeys: prune relies on foreign keys to
// delete an instance's steps and events, so New refuses a pool opened
// without them instead of letting prune leave orphans.
func TestNewRefusesPoolWithoutForeignKeys(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "dagrun.db")
	for _, dsn := range []string{path, path + "?_foreign_keys=off"} {
		db, err := sql.Open("sqlite3", dsn)
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, db.Close()) })
		_, err = sqlite.New(db, nil)
		require.ErrorContains(t, err, "foreign keys off", dsn)
		require.ErrorContains(t, err, "sqlite.DSN", dsn)
	}
	db, err := sql.Open("sqlite3", sqlite.DSN(path))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, db.Close()) })
	_, err = sqlite.New(db, nil)
	require.NoError(t, err)
}

func TestMigrate(t *testing.T) {
	t.Parallel()

	t.Run("Idempotent", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "dagrun.db")
		for range 3 {
			s, err := sqlite.Open(t.Context(), path, nil)
			require.NoError(t, err)
			require.NoError(t, s.Close())
		}
		db, err := sql.Open("sqlite3", sqlite.DSN(path))
		require.NoError(t, err)
		defer db.Close()
		var n, max int
		require.NoError(t, db.QueryRow(`SELECT count(*), max(version) FROM schema_migrations`).Scan(&n, &max))
		require.Equal(t, max, n, "each version applied once")
	})

	t.Run("ConcurrentOpenOfNewFile", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "dagrun.db")
		var (
			wg   sync.WaitGroup
			mu   sync.Mutex
			errs []error
		)
		for range 6 {
			wg.Go(func() {
				s, err := sqlite.Open(context.Background(), path, nil)
				if err == nil {
					err = s.Close()
				}
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			})
		}
		wg.Wait()
		require.NoError(t, errors.Join(errs...))
	})

	t.Run("NewerSchema", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "dagrun.db")
		s, err := sqlite.Open(t.Context(), path, nil)
		require.NoError(t, err)
		require.NoError(t, s.Close())
		db, err := sql.Open("sqlite3", sqlite.DSN(path))
		require.NoError(t, err)
		defer db.Close()
		_, err = db.Exec(`INSERT INTO schema_migrations (version, name, applied_at) VALUES (999, '0999_future.sql', 0)`)
		require.NoError(t, err)
		_, err = sqlite.Open(t.Context(), path, nil)
		require.ErrorContains(t, err, "upgrade dagrun")
	})
}
