package pgtest

import (
	"context"
	"strings"
	"testing"

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
