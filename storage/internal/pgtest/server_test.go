package pgtest_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage/backendtest"
	"github.com/dagrun/dagrun/storage/internal/pgtest"
)

// The vacuum runs on a real server, and the schema is gone after a drop.
func TestDropSchemaOnTheServer(t *testing.T) {
	if !backendtest.PostgresAvailable(t) {
		t.Skip("set DAGRUN_TEST_POSTGRES to run the PostgreSQL tests")
	}
	dsn := os.Getenv("DAGRUN_TEST_POSTGRES")
	ctx := t.Context()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.WithoutCancel(ctx)) })
	schema := fmt.Sprintf("pgtest_%d", time.Now().UnixNano())
	_, err = conn.Exec(ctx, `CREATE SCHEMA `+schema+`; CREATE TABLE `+schema+`.t (x int)`)
	require.NoError(t, err)
	require.NoError(t, pgtest.DropSchema(ctx, conn, schema))
	var left bool
	require.NoError(t, conn.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1)`, schema).Scan(&left))
	require.False(t, left, "the schema was dropped")
	_, err = conn.Exec(ctx, pgtest.VacuumCatalogsSQL)
	require.NoError(t, err)
}
