package sqlite

import (
	"database/sql"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
)

// TestCheckFileSeesTruncation: the store's own check notices a file cut
// below its header, without relying on SQLite reading the missing pages
// (its page cache may answer without them).
func TestCheckFileSeesTruncation(t *testing.T) {
	t.Parallel()
	s, path := openCheckpointed(t)
	require.NoError(t, os.Truncate(path, 0))
	err := s.checkFile()
	require.ErrorIs(t, err, storage.ErrDatabaseLost)
	require.ErrorContains(t, err, "was truncated")
}

// TestDeletedFileIsNeverMadeAgain: once the database file is deleted under
// a store, no connection its pools open makes a new one at the path. A new
// file there would rebuild the shared-memory index that the connections
// to the deleted file still map, and they would die of SIGBUS.
func TestDeletedFileIsNeverMadeAgain(t *testing.T) {
	t.Parallel()
	pools := map[string]func(*Store) *sql.DB{
		"reader":       func(s *Store) *sql.DB { return s.r },
		"checkpointer": func(s *Store) *sql.DB { return s.checkpoints.conn },
	}
	for name, pool := range pools {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s, path := openCheckpointed(t)
			require.NoError(t, os.Remove(path))
			// A connection the pool opens now, past the check every
			// store call makes first.
			db := pool(s)
			db.SetMaxIdleConns(0)
			var n int
			require.Error(t, db.QueryRowContext(t.Context(), `SELECT count(*) FROM instances`).Scan(&n),
				"a connection opened the deleted path")
			require.NoFileExists(t, path)

			require.ErrorIs(t, s.checkFile(), storage.ErrDatabaseLost)
			require.NoFileExists(t, path)
		})
	}
}

// openCheckpointed opens a store on a new file and checkpoints it, so that
// the file holds the whole database and the store has seen its header.
func openCheckpointed(t *testing.T) (*Store, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "dagrun.db")
	s, err := Open(t.Context(), path, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	_, err = s.w.ExecContext(t.Context(), `PRAGMA wal_checkpoint(TRUNCATE)`)
	require.NoError(t, err)
	require.NoError(t, s.checkFile())
	return s, path
}
