package dagruntest_test

import (
	"testing"

	"github.com/dagrun/dagrun/cmd/dagrun/dagruntest"
	"github.com/dagrun/dagrun/examples/orders"
	"github.com/dagrun/dagrun/handlers"
)

// TestShippedWorkflows runs the tests of every workflow shipped in the
// workflows folder, with the handlers the dagrun binary registers.
func TestShippedWorkflows(t *testing.T) {
	t.Parallel()
	registry := handlers.NewRegistry()
	handlers.RegisterBuiltins(registry)
	orders.Register(registry)
	dagruntest.Run(t, registry, "../../../workflows")
}

// TestScheduledCases: a scheduled case starts its instance through the
// workflow's schedule, at its first tick by the fake clock (zones and
// daylight saving included), with the schedule's input.
func TestScheduledCases(t *testing.T) {
	t.Parallel()
	registry := handlers.NewRegistry()
	handlers.RegisterBuiltins(registry)
	dagruntest.Run(t, registry, "testdata/scheduled")
}
