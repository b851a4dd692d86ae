package app_test

import (
	"encoding/json"
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

// TestTestJSON: --json prints one object with a result per case, the
// failures of a failed one included, and keeps the exit code.
func TestTestJSON(t *testing.T) {
	t.Parallel()
	b := wftestBundle(t)
	res := b.run(t, "", "test", "--json", "testdata/wftest/fail_test.yaml", "../../../workflows/tests/order-processing_test.yaml")
	require.Equal(t, 1, res.code, res.stderr)
	require.Empty(t, res.stderr)
	var out struct {
		Passed, Failed int
		Cases          []struct {
			Name, File string
			Line       int
			Passed     bool
			Failures   []string
		}
	}
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &out))
	require.Equal(t, 1, out.Failed)
	require.Equal(t, len(out.Cases)-1, out.Passed)
	first := out.Cases[0]
	require.Equal(t, "order-processing/wrong expectations", first.Name)
	require.Equal(t, "testdata/wftest/fail_test.yaml", first.File)
	require.Equal(t, 3, first.Line)
	require.False(t, first.Passed)
	require.Contains(t, first.Failures, "steps.charge.attempts: want 2, got 1")
	require.True(t, out.Cases[1].Passed)
	require.Empty(t, out.Cases[1].Failures)
}

// TestTestBesideABrokenWorkflow: an invalid workflow file is reported and
// the cases of the valid workflows still run; a run of named files passes
// on them, a run of the whole folder exits 2 for the broken file.
func TestTestBesideABrokenWorkflow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	dir, err := filepath.Abs("testdata/wftest-broken")
	require.NoError(t, err)
	b.env["DAGRUN_WORKFLOWS"] = dir

	res := b.run(t, "", "test", filepath.Join(dir, "tests", "good_test.yaml"))
	require.Equal(t, 0, res.code, "stdout:\n%s\nstderr:\n%s", res.stdout, res.stderr)
	require.Contains(t, res.stdout, "ok   good/says hi")
	require.Contains(t, res.stderr, `broken.yaml:5:17: step "a" depends on unknown step "nowhere"`)

	// The broken workflow's test file cannot name it: that file's error
	// stops only its own cases.
	res = b.run(t, "", "test")
	require.Equal(t, 2, res.code, "stdout:\n%s\nstderr:\n%s", res.stdout, res.stderr)
	require.Contains(t, res.stdout, "ok   good/says hi", "the valid workflow's cases ran")
	require.Contains(t, res.stderr, "broken.yaml:5:17")
	require.Contains(t, res.stderr, `broken_test.yaml:1:11: unknown workflow "broken"`)

	res = b.run(t, "", "test", "--json")
	require.Equal(t, 2, res.code, "stdout:\n%s\nstderr:\n%s", res.stdout, res.stderr)
	var out struct {
		Passed int      `json:"passed"`
		Errors []string `json:"errors"`
	}
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &out), res.stdout)
	require.Equal(t, 1, out.Passed)
	require.Len(t, out.Errors, 2, "the broken workflow's error and its test file's")
}
