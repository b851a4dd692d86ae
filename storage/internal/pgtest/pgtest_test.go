package pgtest

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// recorder is an Execer that keeps the statements it is given.
type recorder struct{ statements []string }

func (r *recorder) Exec(_ context.Context, sql string, _ ...any) (pgconn.CommandTag, error) {
	r.statements = append(r.statements, sql)
	return pgconn.CommandTag{}, nil
}

// Every vacuumEvery-th drop of the process, and only it, vacuums the
// catalogs after dropping its schema.
func TestDropSchemaVacuumsEveryFewDrops(t *testing.T) {
	drops.Store(0)
	var r recorder
	for i := range 2 * vacuumEvery {
		require.NoError(t, DropSchema(t.Context(), &r, "s"+strings.Repeat("x", i%3)))
	}
	var vacuums []int
	for i, s := range r.statements {
		if strings.HasPrefix(s, "VACUUM") {
			vacuums = append(vacuums, i)
		}
	}
	// Drop k (1-based) is statement k-1 plus the vacuums before it.
	require.Equal(t, []int{vacuumEvery, 2*vacuumEvery + 1}, vacuums)
	require.Equal(t, `DROP SCHEMA IF EXISTS "sx" CASCADE`, r.statements[1])
}

// The vacuum runs on a real server, and the schema is gone after a drop.
func TestDropSchemaOnTheServer(t *testing.T) {
	dsn := os.Getenv("DAGRUN_TEST_POSTGRES")
	if dsn == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("DAGRUN_TEST_POSTGRES is not set; PostgreSQL tests are required under CI=true")
		}
		t.Skip("set DAGRUN_TEST_POSTGRES to run the PostgreSQL tests")
	}
	ctx := t.Context()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.WithoutCancel(ctx)) })
	schema := fmt.Sprintf("pgtest_%d", time.Now().UnixNano())
	_, err = conn.Exec(ctx, `CREATE SCHEMA `+schema+`; CREATE TABLE `+schema+`.t (x int)`)
	require.NoError(t, err)
	require.NoError(t, DropSchema(ctx, conn, schema))
	var left bool
	require.NoError(t, conn.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1)`, schema).Scan(&left))
	require.False(t, left, "the schema was dropped")
	_, err = conn.Exec(ctx, VacuumCatalogsSQL)
	require.NoError(t, err)
}
