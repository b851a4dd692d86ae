package dagruntest_test

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"

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

// TestEveryShippedWorkflowHasTests keeps the rule that a workflow in
// workflows/ comes with its cases in workflows/tests/.
func TestEveryShippedWorkflowHasTests(t *testing.T) {
	t.Parallel()
	workflows, err := dagruntest.LoadWorkflows("../../../workflows")
	require.NoError(t, err)
	require.NotEmpty(t, workflows)
	for _, w := range workflows {
		_, err := os.Stat(filepath.Join("../../../workflows/tests", w.Name+"_test.yaml"))
		require.NoError(t, err, "workflow %s has no workflows/tests/%s_test.yaml", w.Name, w.Name)
	}
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

// TestBackoffIsExact: a retry waits its whole backoff, without jitter, so
// that a case timed against it runs the same every time.
func TestBackoffIsExact(t *testing.T) {
	t.Parallel()
	registry := handlers.NewRegistry()
	handlers.RegisterBuiltins(registry)
	for range 5 {
		dagruntest.Run(t, registry, "testdata/backoff")
	}
}

// TestNowIsTheTestsClock: now() in expressions reads the fake clock, as
// the sleep built-in does, so a case that stamps a time passes every run.
func TestNowIsTheTestsClock(t *testing.T) {
	t.Parallel()
	registry := handlers.NewRegistry()
	handlers.RegisterBuiltins(registry)
	dagruntest.Run(t, registry, "testdata/clock")
}

// TestLongHistory: a case's expected events are looked for in the whole
// history, also where it is longer than the latest events Get returns.
func TestLongHistory(t *testing.T) {
	t.Parallel()
	registry := handlers.NewRegistry()
	handlers.RegisterBuiltins(registry)
	dagruntest.Run(t, registry, "testdata/history")
}

// TestDocumentedExamplesPass runs the complete test files the READMEs show
// (the yaml blocks that start with workflow:), so the documentation cannot
// drift from the format.
func TestDocumentedExamplesPass(t *testing.T) {
	t.Parallel()
	workflows, err := dagruntest.LoadWorkflows("../../../workflows")
	require.NoError(t, err)
	registry := handlers.NewRegistry()
	handlers.RegisterBuiltins(registry)
	orders.Register(registry)
	runner, err := dagruntest.NewRunner(registry, workflows)
	require.NoError(t, err)
	t.Cleanup(runner.Close)
	block := regexp.MustCompile("(?s)```yaml\n(workflow: .*?)```")
	found := 0
	for _, doc := range []string{"../../../README.md", "../../../workflows/README.md"} {
		src, err := os.ReadFile(doc)
		require.NoError(t, err)
		for _, m := range block.FindAllSubmatch(src, -1) {
			found++
			f, err := dagruntest.Parse(doc, m[1], workflows)
			require.NoError(t, err, "%s:\n%s", doc, m[1])
			for _, r := range runner.RunFile(t.Context(), f, nil) {
				require.True(t, r.Passed(), "%s: %s: %v", doc, r.Name(), r.Failures)
			}
		}
	}
	require.GreaterOrEqual(t, found, 2)
}
