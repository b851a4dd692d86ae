package dagrun_test

import (
	"testing"

	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/backendtest"
)

// forEachBackend runs an engine test once per backend (SQLite, and
// PostgreSQL when DAGRUN_TEST_POSTGRES is set) as parallel subtests.
func forEachBackend(t *testing.T, test func(t *testing.T, open func(t *testing.T) storage.Store)) {
	t.Helper()
	backendtest.Each(t, func(t *testing.T, open func(testing.TB) storage.Store) {
		test(t, func(t *testing.T) storage.Store { return open(t) })
	})
}
