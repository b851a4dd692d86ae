package dagrun_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun"
	"github.com/dagrun/dagrun/handlers"
	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/sqlite"
)

// TestWorkerStopsWhenItsDatabaseIsLost deletes the SQLite file under a
// running worker: Run returns ErrDatabaseLost instead of running on,
// writing to a file no other process sees.
func TestWorkerStopsWhenItsDatabaseIsLost(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "dagrun.db")
	store, err := sqlite.Open(context.Background(), path, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	registry := handlers.NewRegistry()
	handlers.RegisterBuiltins(registry)
	engine, err := dagrun.New(store, registry, nil)
	require.NoError(t, err)
	worker, err := engine.NewWorker(&dagrun.WorkerConfig{Poll: 5 * time.Millisecond})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- worker.Run(context.Background()) }()

	require.NoError(t, os.Remove(path))
	select {
	case err := <-done:
		require.ErrorIs(t, err, storage.ErrDatabaseLost)
	case <-time.After(30 * time.Second):
		t.Fatal("the worker runs on after its database file was deleted")
	}
}
