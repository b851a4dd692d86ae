package app_test

import (
	"path/filepath"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/examples/orders"
)

// maskCaseDuration hides the durations of dagrun test's lines, which vary.
var maskCaseDuration = regexp.MustCompile(`\(\d+(\.\d+)?(µs|ms|s)\)`)

// wftestBundle runs dagrun test over the shipped workflows folder, with the
// handlers the dagrun binary registers.
func wftestBundle(t *testing.T) *testBundle {
	t.Helper()
	b := setup(t)
	orders.Register(b.registry)
	workflows, err := filepath.Abs("../../../workflows")
	require.NoError(t, err)
	b.env["DAGRUN_WORKFLOWS"] = workflows
	return b
}

// TestTestRunsTheShippedWorkflowTests: dagrun test with no file runs the
// workflows folder's tests/*_test.yaml, one line per case, and every case
// the project ships passes.
func TestTestRunsTheShippedWorkflowTests(t *testing.T) {
	t.Parallel()
	b := wftestBundle(t)
	res := b.run(t, "", "test")
	require.Equal(t, 0, res.code, "stdout:\n%s\nstderr:\n%s", res.stdout, res.stderr)
	require.Empty(t, res.stderr)
	require.Contains(t, res.stdout, "ok   order-processing/charge retries then succeeds (")
	require.Contains(t, res.stdout, "ok   refund-approval/no answer within 72h refuses the refund (")
	require.Contains(t, res.stdout, "ok   greet-everyone/greets every name in order (")
	require.Regexp(t, `(?m)^PASS: \d+ cases \(`, res.stdout)
}

func TestTestExitCodes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		args     []string
		wantCode int
		golden   string // compares stdout and stderr, durations masked
	}{
		{name: "FailedCasePrintsADiffAndExits1", args: []string{"test", "testdata/wftest/fail_test.yaml"}, wantCode: 1, golden: "wftest-fail"},
		{name: "InvalidFileExits2WithPositions", args: []string{"test", "testdata/wftest/invalid_test.yaml", "testdata/wftest/fail_test.yaml"}, wantCode: 2, golden: "wftest-invalid"},
		{name: "RunFilterSelectsCases", args: []string{"test", "--run", "^order-processing/charge"}, wantCode: 0, golden: "wftest-run"},
		{name: "RunFilterMatchingNothingExits2", args: []string{"test", "--run", "no such case"}, wantCode: 2},
		{name: "BadRunFilterExits2", args: []string{"test", "--run", "("}, wantCode: 2},
		{name: "MissingFileExits2", args: []string{"test", "testdata/wftest/missing_test.yaml"}, wantCode: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			res := wftestBundle(t).run(t, "", tt.args...)
			require.Equal(t, tt.wantCode, res.code, "stdout:\n%s\nstderr:\n%s", res.stdout, res.stderr)
			if tt.golden != "" {
				golden(t, tt.golden, "stdout:\n"+maskCaseDuration.ReplaceAllString(res.stdout, "(T)")+"stderr:\n"+res.stderr)
			} else {
				require.Regexp(t, `^[^\n]+\n$`, res.stderr, "one line on stderr")
			}
		})
	}
}
