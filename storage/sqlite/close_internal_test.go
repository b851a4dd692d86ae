package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCallsEndTheirTransactions: a call whose context ends while its
// transaction is open has given the connection back by the time it
// returns, so that Close, which does not wait for connections in use,
// leaves none open behind it.
func TestCallsEndTheirTransactions(t *testing.T) {
	t.Parallel()
	s, err := Open(t.Context(), filepath.Join(t.TempDir(), "dagrun.db"), nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	// The race with database/sql's own rollback is lost or won at each
	// call: many calls make losing it certain.
	for range 200 {
		ctx, stop := context.WithCancel(t.Context())
		err := s.write(ctx, "write", func(t *txn) error {
			stop()
			awaitRollbackBy(t.tx)
			return ctx.Err()
		})
		require.ErrorIs(t, err, context.Canceled)
		require.Zero(t, s.w.Stats().InUse, "the writer's connection is back in its pool")

		ctx, stop = context.WithCancel(t.Context())
		err = s.read(ctx, "read", func(tx *sql.Tx) error {
			stop()
			awaitRollbackBy(tx)
			return ctx.Err()
		})
		require.ErrorIs(t, err, context.Canceled)
		require.Zero(t, s.r.Stats().InUse, "the reader's connection is back in its pool")
	}
}

// awaitRollbackBy gives database/sql, were tx bound to the context just
// ended, the time to begin rolling it back on its own: a statement then
// finds tx done. A transaction the call alone ends stays open throughout.
func awaitRollbackBy(tx querier) {
	for range 100 {
		if _, err := tx.ExecContext(context.Background(), "SELECT 1"); err != nil {
			return
		}
	}
}

// TestCloseWaitsForStoppedWatchers: a watcher its last subscriber
// stopped may still be looking at the file; Close waits for it too.
func TestCloseWaitsForStoppedWatchers(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for range 50 {
		s, err := Open(t.Context(), filepath.Join(dir, "dagrun.db"), nil)
		require.NoError(t, err)
		_, unsubscribe := s.Subscribe(nil)
		unsubscribe()
		require.NoError(t, s.Close())
		require.False(t, running(fmt.Sprintf("sqlite.(*Store).watchDataVersion(%p", s)), "a watcher of the store runs after Close")
	}
}

// running reports whether a goroutine has fn on its stack.
func running(fn string) bool {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Contains(string(buf[:n]), fn)
		}
		buf = make([]byte, 2*len(buf))
	}
}
