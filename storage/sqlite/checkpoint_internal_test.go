package sqlite

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/storagetest"
)

// TestCheckpointsRunOffTheWriter: the writer leaves checkpoints to the
// store's checkpointer until the log holds writerCheckpointPages, and the
// checkpointer copies a commit's pages into the database file soon after
// it, well before the writer would; an idle store runs none.
func TestCheckpointsRunOffTheWriter(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "dagrun.db")
	s, err := Open(t.Context(), path, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	var pages int
	require.NoError(t, s.w.QueryRowContext(t.Context(), "PRAGMA wal_autocheckpoint").Scan(&pages))
	require.Equal(t, writerCheckpointPages, pages)

	// Stop the checkpointer, once it finished with the migration's commits.
	require.NoError(t, s.checkpoints.close())
	before := fileSize(t, path)
	ps := make([]storage.CreateParams, 200)
	for i := range ps {
		ps[i] = storage.CreateParams{ID: fmt.Sprintf("i-%d", i), Workflow: "wf", DefinitionHash: "h1", Definition: []byte("name: wf\n"),
			Input: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i)), Steps: []storage.StepSpec{{Name: "a", Handler: "h", Queue: "default"}, {Name: "b", Handler: "h", Queue: "default", DependsOn: []string{"a"}}}}
	}
	_, err = s.CreateInstances(t.Context(), nil, ps, storagetest.Plan)
	require.NoError(t, err)
	// The writer checkpoints within its commit, so it would have by now.
	require.Equal(t, before, fileSize(t, path), "the writer checkpointed a log of a few pages")

	s.checkpoints, err = openCheckpointer(path, s.busy, s.checkFile)
	require.NoError(t, err)
	ps[0].ID = "i-last"
	_, err = s.CreateInstances(t.Context(), nil, ps[:1], storagetest.Plan)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return fileSize(t, path) > before }, 10*time.Second, 5*time.Millisecond,
		"the checkpointer did not copy the log into the database after a commit")
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	require.NoError(t, err)
	return fi.Size()
}

// TestCheckpointerLeavesATruncatedFileTruncated: a checkpoint after the
// file was truncated under the store would copy the log back into it and
// hide the truncation (the file at full size again, zeros where the pages
// not in the log were); the checkpointer stops instead, and the store
// reports the database lost.
func TestCheckpointerLeavesATruncatedFileTruncated(t *testing.T) {
	t.Parallel()
	s, path := openCheckpointed(t)

	// Commits the checkpointer has not copied yet: the log holds them.
	require.NoError(t, s.checkpoints.close())
	p := storage.CreateParams{ID: "i-1", Workflow: "wf", DefinitionHash: "h1", Definition: []byte("name: wf\n"),
		Input: json.RawMessage(`{}`), Steps: []storage.StepSpec{{Name: "a", Handler: "h", Queue: "default"}}}
	_, err := s.CreateInstances(t.Context(), nil, []storage.CreateParams{p}, storagetest.Plan)
	require.NoError(t, err)

	s.checkpoints, err = openCheckpointer(path, s.busy, s.checkFile)
	require.NoError(t, err)
	require.NoError(t, os.Truncate(path, 0))
	s.checkpoints.kick()
	select {
	case <-s.checkpoints.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the checkpointer went on after the file was truncated")
	}
	require.Zero(t, fileSize(t, path), "a checkpoint wrote into the truncated file")
	require.ErrorIs(t, s.checkFile(), storage.ErrDatabaseLost)
}
