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

// A returned schema comes back from Take with its tables empty and their
// identities restarted, but for the kept table, and DropAll drops it.
func TestReusableEmptiesAndDrops(t *testing.T) {
	if !backendtest.PostgresAvailable(t) {
		t.Skip("set DAGRUN_TEST_POSTGRES to run the PostgreSQL tests")
	}
	ctx := t.Context()
	conn, err := pgx.Connect(ctx, os.Getenv("DAGRUN_TEST_POSTGRES"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.WithoutCancel(ctx)) })
	schema := fmt.Sprintf("pgtest_%d", time.Now().UnixNano())
	t.Cleanup(func() { _ = pgtest.DropSchema(context.WithoutCancel(ctx), conn, schema) })
	_, err = conn.Exec(ctx, `CREATE SCHEMA `+schema+`;
		CREATE TABLE `+schema+`.rows (id bigint GENERATED ALWAYS AS IDENTITY, x int);
		CREATE TABLE `+schema+`.kept (x int);
		INSERT INTO `+schema+`.rows (x) VALUES (1), (2);
		INSERT INTO `+schema+`.kept VALUES (1)`)
	require.NoError(t, err)
	count := func(table string) (n int) {
		require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.`+table).Scan(&n))
		return n
	}

	var r pgtest.Reusable
	_, ok := r.Take()
	require.False(t, ok, "nothing was returned yet")
	require.NoError(t, r.Return(ctx, conn, schema, "kept"))
	got, ok := r.Take()
	require.True(t, ok)
	require.Equal(t, schema, got)
	require.Zero(t, count("rows"))
	require.Equal(t, 1, count("kept"))
	var id int
	require.NoError(t, conn.QueryRow(ctx, `INSERT INTO `+schema+`.rows (x) VALUES (3) RETURNING id`).Scan(&id))
	require.Equal(t, 1, id, "the identity restarted")
	_, ok = r.Take()
	require.False(t, ok, "a schema is taken once")

	require.NoError(t, r.Return(ctx, conn, schema, "kept"))
	require.NoError(t, r.DropAll(ctx, conn))
	var left bool
	require.NoError(t, conn.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1)`, schema).Scan(&left))
	require.False(t, left, "DropAll dropped the kept schema")
}
