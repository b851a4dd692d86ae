package dagruntest

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
)

// TestResetEmptiesEveryTable: after a case, a store kept for the next one
// holds no row in any table but the schema's version, though rows of
// tables that reference others (steps, events, instances) were there.
func TestResetEmptiesEveryTable(t *testing.T) {
	t.Parallel()
	m, err := openMemStore()
	require.NoError(t, err)
	t.Cleanup(m.close)
	for range 2 { // the second reset reuses the statements of the first
		_, err = m.db.Exec(`INSERT INTO workers (id, handlers, queues, started_at, last_seen) VALUES ('w', '[]', '[]', 1, 1)`)
		require.NoError(t, err)
		_, err = m.store.CreateInstances(t.Context(), nil, []storage.CreateParams{{
			ID: "i1", Workflow: "wf", DefinitionHash: "h", Definition: []byte("x"),
			Steps: []storage.StepSpec{{Name: "a"}},
		}}, func(*storage.InstanceState) (*storage.Plan, error) {
			return &storage.Plan{Steps: []storage.StepChange{{Name: "a", Status: storage.StepPending}}}, nil
		})
		require.NoError(t, err)
		require.NoError(t, m.reset(t.Context()))
		rows, err := m.db.Query(`SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite%'`)
		require.NoError(t, err)
		var tables []string
		for rows.Next() {
			var name string
			require.NoError(t, rows.Scan(&name))
			tables = append(tables, name)
		}
		require.NoError(t, rows.Close())
		require.Greater(t, len(tables), 5)
		for _, table := range tables {
			var n int
			require.NoError(t, m.db.QueryRow(`SELECT count(*) FROM "`+table+`"`).Scan(&n))
			if table == "schema_migrations" {
				require.Positive(t, n)
			} else {
				require.Zero(t, n, table)
			}
		}
		var fk bool
		require.NoError(t, m.db.QueryRow(`PRAGMA foreign_keys`).Scan(&fk))
		require.True(t, fk, "foreign keys are on again")
	}
}
