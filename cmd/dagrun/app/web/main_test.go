package web_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a test leaves goroutines behind: servers,
// workers and stores must all be stopped by their cleanups.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
