package e2e

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestWorkflowTests runs dagrun test as a user would in a folder holding
// the shipped workflows and their tests: every case passes, no database is
// written (the cases run in memory), and a wrong expectation or a broken
// test file give exit codes 1 and 2.
func TestWorkflowTests(t *testing.T) {
	t.Parallel()
	db := filepath.Join(t.TempDir(), "dagrun.db")
	e := newEnv(t, db, nil)
	tests := filepath.Join(e.workflows, "tests")
	require.NoError(t, os.MkdirAll(tests, 0o755))
	shipped, err := filepath.Glob("../workflows/tests/*_test.yaml")
	require.NoError(t, err)
	require.NotEmpty(t, shipped)
	for _, path := range shipped {
		data, err := os.ReadFile(path)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(tests, filepath.Base(path)), data, 0o644))
	}

	res := e.mustRun(t, "test")
	require.Contains(t, res.stdout, "ok   refund-approval/an approved refund is paid (")
	require.Regexp(t, `(?m)^PASS: \d+ cases \(`, res.stdout)
	require.NoFileExists(t, db, "dagrun test runs on an in-memory database")

	wrong := filepath.Join(e.dir, "wrong_test.yaml")
	require.NoError(t, os.WriteFile(wrong, []byte(`workflow: refund-approval
cases:
  - name: expects the wrong outcome
    input: {orderId: R-9, amount: 3}
    signals: [{name: approve, data: {approved: false}}]
    expect: {status: completed, output: {approved: true, refunded: 3}}
`), 0o644))
	res = e.run(t, "test", "wrong_test.yaml")
	require.Equal(t, 1, res.code, res.stdout+res.stderr)
	require.Contains(t, res.stdout, "FAIL refund-approval/expects the wrong outcome (")
	require.Contains(t, res.stdout, "output differs (- want, + got):")
	require.Contains(t, res.stdout, "FAIL: 1 of 1 case failed")

	broken := filepath.Join(e.dir, "broken_test.yaml")
	require.NoError(t, os.WriteFile(broken, []byte("workflow: refund-approval\ncases:\n  - name: x\n    expect: {status: done}\n"), 0o644))
	res = e.run(t, "test", "broken_test.yaml")
	require.Equal(t, 2, res.code, res.stdout+res.stderr)
	require.Equal(t, "broken_test.yaml:4:22: expect.status: unknown status \"done\" (one of pending, running, completed, failed, cancelled)\n", res.stderr)
	require.Empty(t, res.stdout)
}
