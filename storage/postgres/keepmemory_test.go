package postgres

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestKeepFreedMemory: a new connection runs the pool's own AfterConnect
// first and keepFreedMemorySQL after it, and fails with the first's error
// without running the statement.
func TestKeepFreedMemory(t *testing.T) {
	t.Parallel()
	conn, err := pgx.Connect(t.Context(), testURL(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	lastQuery := func() string {
		t.Helper()
		var q string
		require.NoError(t, sharedPool(t).QueryRow(t.Context(), "SELECT query FROM pg_stat_activity WHERE pid = $1",
			int32(conn.PgConn().PID())).Scan(&q))
		return q
	}
	_, err = conn.Exec(t.Context(), "SELECT 1")
	require.NoError(t, err)

	refused := errors.New("refused")
	err = keepFreedMemory(func(context.Context, *pgx.Conn) error { return refused })(t.Context(), conn)
	require.ErrorIs(t, err, refused)
	require.Equal(t, "SELECT 1", lastQuery(), "the statement ran after the pool's AfterConnect failed")

	var ran []string
	next := func(context.Context, *pgx.Conn) error {
		ran = append(ran, lastQuery())
		return nil
	}
	require.NoError(t, keepFreedMemory(next)(t.Context(), conn))
	require.Equal(t, []string{"SELECT 1"}, ran, "the pool's AfterConnect ran after the statement")
	require.Equal(t, keepFreedMemorySQL, lastQuery())

	_, err = conn.Exec(t.Context(), "SELECT 2")
	require.NoError(t, err)
	require.NoError(t, keepFreedMemory(nil)(t.Context(), conn), "a pool with no AfterConnect of its own")
	require.Equal(t, keepFreedMemorySQL, lastQuery())
}
