package sqlite_test

import (
	"bytes"
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/sqlite"
)

// TestFileFaults covers what happens to the database file under an open
// store: each fault must be reported as a lost database, on the next call
// and every later one, instead of writes going on into a file nobody sees.
func TestFileFaults(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		fault func(t *testing.T, path string)
		says  string
	}{
		{"Deleted", func(t *testing.T, path string) {
			require.NoError(t, os.Remove(path))
		}, "was deleted or replaced"},
		{"DeletedAndRecreated", func(t *testing.T, path string) {
			require.NoError(t, os.Remove(path))
			other, err := sqlite.Open(t.Context(), path, nil)
			require.NoError(t, err)
			require.NoError(t, other.Close())
		}, "was deleted or replaced"},
		{"ReplacedByCopy", func(t *testing.T, path string) {
			data, err := os.ReadFile(path)
			require.NoError(t, err)
			tmp := path + ".new"
			require.NoError(t, os.WriteFile(tmp, data, 0o600))
			require.NoError(t, os.Rename(tmp, path))
		}, "was deleted or replaced"},
		{"Truncated", func(t *testing.T, path string) {
			require.NoError(t, os.Truncate(path, 0))
		}, "was truncated, overwritten or corrupted"},
		{"PagesOverwritten", func(t *testing.T, path string) {
			// Damage the open did not read may be older than the
			// process: the error does not blame it.
			f, err := os.OpenFile(path, os.O_WRONLY, 0)
			require.NoError(t, err)
			_, err = f.WriteAt(bytes.Repeat([]byte{0xA5}, 64<<10), 4096)
			require.NoError(t, err)
			require.NoError(t, f.Close())
		}, "is corrupt, or was overwritten while this process had it open"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "dagrun.db")
			s, err := sqlite.Open(t.Context(), path, nil)
			require.NoError(t, err)
			t.Cleanup(func() { _ = s.Close() })
			// Some data, checkpointed into the file itself, so that
			// truncating the file loses pages SQLite needs.
			_, err = s.ListInstances(t.Context(), storage.ListParams{})
			require.NoError(t, err)
			db, err := sql.Open("sqlite3", sqlite.DSN(path))
			require.NoError(t, err)
			_, err = db.Exec(`PRAGMA wal_checkpoint(TRUNCATE)`)
			require.NoError(t, err)
			require.NoError(t, db.Close())

			c.fault(t, path)

			_, err = s.ClaimSteps(t.Context(), storage.ClaimParams{WorkerID: "w", Limit: 1, Lease: time.Second})
			require.ErrorIs(t, err, storage.ErrDatabaseLost)
			require.ErrorIs(t, err, storage.ErrUnavailable)
			require.ErrorContains(t, err, c.says)
			require.ErrorContains(t, err, path)
			_, err = s.ListInstances(t.Context(), storage.ListParams{})
			require.ErrorIs(t, err, storage.ErrDatabaseLost, "a lost database stays lost, for reads too")
		})
	}
}

// TestHeldWriteLock covers another process holding the write lock past
// the busy timeout: a write fails as unavailable, saying so, while a store
// can still be opened on the up-to-date file and read from.
func TestHeldWriteLock(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "dagrun.db")
	first, err := sqlite.Open(t.Context(), path, nil)
	require.NoError(t, err)
	require.NoError(t, first.Close())

	holder, err := sql.Open("sqlite3", sqlite.DSN(path))
	require.NoError(t, err)
	t.Cleanup(func() { _ = holder.Close() })
	tx, err := holder.Begin() // BEGIN IMMEDIATE: the write lock
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback() })

	s, err := sqlite.Open(t.Context(), path, &sqlite.Config{BusyTimeout: 50 * time.Millisecond})
	require.NoError(t, err, "opening an up-to-date file takes no write lock")
	t.Cleanup(func() { _ = s.Close() })
	_, err = s.ListInstances(t.Context(), storage.ListParams{})
	require.NoError(t, err)
	_, err = s.ClaimSteps(t.Context(), storage.ClaimParams{WorkerID: "w", Limit: 1, Lease: time.Second})
	require.ErrorIs(t, err, storage.ErrUnavailable)
	require.NotErrorIs(t, err, storage.ErrDatabaseLost, "a lock passes")
	require.ErrorContains(t, err, "is locked")
	require.NotContains(t, err.Error(), "\n")
}

// TestSignalEndsAWaitForTheLock: a write waiting for another process's
// write lock returns as soon as its context ends, instead of sleeping out
// the busy timeout in SQLite, where nothing interrupts it.
func TestSignalEndsAWaitForTheLock(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "dagrun.db")
	s, err := sqlite.Open(t.Context(), path, &sqlite.Config{BusyTimeout: time.Hour})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	holder, err := sql.Open("sqlite3", sqlite.DSN(path))
	require.NoError(t, err)
	t.Cleanup(func() { _ = holder.Close() })
	tx, err := holder.Begin()
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback() })

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		_, err := s.ClaimSteps(ctx, storage.ClaimParams{WorkerID: "w", Limit: 1, Lease: time.Second})
		done <- err
	}()
	// The claim is waiting for the lock, or about to: either way it must
	// end with the context, not with the hour of busy timeout.
	time.AfterFunc(50*time.Millisecond, cancel)
	select {
	case err := <-done:
		require.ErrorIs(t, err, context.Canceled)
	case <-time.After(30 * time.Second):
		t.Fatal("a write waiting for the lock ignores its cancelled context")
	}
}
