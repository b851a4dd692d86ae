package sqlite

import (
	"database/sql"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/storagetest"
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

// createOne creates instance id, of one step, in s.
func createOne(t *testing.T, s *Store, id string) {
	t.Helper()
	_, err := s.CreateInstances(t.Context(), nil, []storage.CreateParams{{ID: id, Workflow: "wf", DefinitionHash: "h1",
		Definition: []byte("name: wf\n"), Steps: []storage.StepSpec{{Name: "a", Handler: "h", Queue: "default"}}}}, storagetest.Plan)
	require.NoError(t, err)
}

// TestReplacedFileLeavesNoWALBehind: a store whose file was replaced (a
// backup restored over it) removes, as it closes, the -wal and -shm it
// opened with the lost file, which the next process would otherwise
// replay into the restored one; a -wal another process made for the new
// file stays.
func TestReplacedFileLeavesNoWALBehind(t *testing.T) {
	t.Parallel()
	for _, theirs := range []bool{false, true} {
		dir := t.TempDir()
		backup := filepath.Join(dir, "backup.db")
		b, err := Open(t.Context(), backup, nil)
		require.NoError(t, err)
		createOne(t, b, "i-backup")
		require.NoError(t, b.Close())

		path := filepath.Join(dir, "dagrun.db")
		s, err := Open(t.Context(), path, nil)
		require.NoError(t, err)
		createOne(t, s, "i-lost")
		require.FileExists(t, path+"-wal", "the lost database's WAL holds its last writes")

		data, err := os.ReadFile(backup)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(path+".new", data, 0o600))
		require.NoError(t, os.Rename(path+".new", path))
		if theirs {
			// Another process's WAL for the new file, in its place.
			require.NoError(t, os.Remove(path+"-wal"))
			require.NoError(t, os.WriteFile(path+"-wal", nil, 0o600))
		}
		require.ErrorIs(t, s.checkFile(), storage.ErrDatabaseLost)
		require.NoError(t, s.Close())
		if theirs {
			require.FileExists(t, path+"-wal", "another file's WAL")
			continue
		}
		require.NoFileExists(t, path+"-wal")
		require.NoFileExists(t, path+"-shm")

		restored, err := Open(t.Context(), path, nil)
		require.NoError(t, err)
		_, err = restored.GetInstance(t.Context(), "i-backup")
		require.NoError(t, err, "the restored file is the backup")
		_, err = restored.GetInstance(t.Context(), "i-lost")
		require.ErrorIs(t, err, storage.ErrNotFound)
		require.NoError(t, restored.Close())
	}
}
