package web_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/dagrun/dagrun/storage/backendtest"
)

// TestMain fails the package when a test leaves goroutines behind: servers,
// workers and stores must all be stopped by their cleanups. The tests
// change their stores' rows only through the stores, so their PostgreSQL
// schemas are reused.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(backendtest.ReusingSchemas(m))
}
