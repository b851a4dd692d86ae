package sqlite_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/sqlite"
	"github.com/dagrun/dagrun/storage/storagetest"
)

// TestSubscribeHearsOtherProcesses: a store's subscriber learns of a commit
// made through another store on the same file (as another process would
// make it) within the watcher's period, not at a poll; after cancel it
// hears nothing more, and Close leaves no goroutine behind (TestMain).
func TestSubscribeHearsOtherProcesses(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "dagrun.db")
	open := func() *sqlite.Store {
		s, err := sqlite.Open(t.Context(), path, nil)
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, s.Close()) })
		return s
	}
	idle, starter := open(), open()
	ch, cancel := idle.Subscribe(nil)
	start := func() {
		t.Helper()
		p := storage.CreateParams{ID: "i-" + time.Now().Format("150405.000000000"), Workflow: "wf", DefinitionHash: "h",
			Definition: []byte("x"), Steps: []storage.StepSpec{{Name: "a", Handler: "h", Queue: "q"}}}
		_, err := starter.CreateInstances(t.Context(), nil, []storage.CreateParams{p}, storagetest.Plan)
		require.NoError(t, err)
	}
	for range 3 {
		start()
		select {
		case <-ch:
		case <-time.After(500 * time.Millisecond):
			t.Fatal("a commit of another store on the file did not reach the subscriber within 500ms")
		}
	}
	cancel()
	start()
	select {
	case <-ch:
		t.Fatal("a cancelled subscription was signalled")
	case <-time.After(50 * time.Millisecond):
	}
}
