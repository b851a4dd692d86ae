package dagruntest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/cmd/dagrun/dagruntest"
	"github.com/dagrun/dagrun/dag"
	"github.com/dagrun/dagrun/handlers"
)

// benchSteps is the size of the benchmark's workflow: a chain of steps,
// each reading the one before.
const benchSteps = 10

// BenchmarkHundredCases runs 100 cases of a 10-step workflow, each case on
// a store of its own, as `dagrun test` runs them: one op is the 100 cases.
//
//	go test -run '^$' -bench HundredCases ./cmd/dagrun/dagruntest
func BenchmarkHundredCases(b *testing.B) {
	var wf strings.Builder
	wf.WriteString("name: chain\nsteps:\n")
	for i := range benchSteps {
		fmt.Fprintf(&wf, "  - name: s%d\n    handler: work\n", i)
		if i > 0 {
			fmt.Fprintf(&wf, "    dependsOn: [s%d]\n    input: {prev: \"${{ steps.s%d.output.n }}\"}\n", i-1, i-1)
		}
	}
	w, err := dag.Parse("", []byte(wf.String()), nil)
	require.NoError(b, err)
	var tests strings.Builder
	tests.WriteString("workflow: chain\nsteps:\n")
	for i := range benchSteps {
		fmt.Fprintf(&tests, "  s%d: {real: true}\n", i)
	}
	tests.WriteString("cases:\n")
	for i := range 100 {
		fmt.Fprintf(&tests, "  - name: case %d\n    steps:\n      s0: [{error: flaky}, {output: {n: %d}}]\n      s1: {output: {n: 1}}\n", i, i)
		tests.WriteString("    expect: {status: completed, steps: {s0: {attempts: 2}}}\n")
	}
	f, err := dagruntest.Parse("chain_test.yaml", []byte(tests.String()), []*dag.Workflow{w})
	require.NoError(b, err)
	registry := handlers.NewRegistry()
	registry.Register("work", func(context.Context, json.RawMessage) (json.RawMessage, error) {
		return json.RawMessage(`{"n": 2}`), nil
	})
	runner, err := dagruntest.NewRunner(registry, []*dag.Workflow{w})
	require.NoError(b, err)
	b.Cleanup(runner.Close)
	// The machine may be shared: CPU time per op tells the cost apart
	// from time spent waiting for a core.
	cpu := func() time.Duration {
		var u syscall.Rusage
		require.NoError(b, syscall.Getrusage(syscall.RUSAGE_SELF, &u))
		return time.Duration(u.Utime.Nano() + u.Stime.Nano())
	}
	began := cpu()
	for b.Loop() {
		for _, r := range runner.RunFile(context.Background(), f, nil) {
			if !r.Passed() {
				b.Fatalf("%s: %v", r.Name(), r.Failures)
			}
		}
	}
	b.ReportMetric((cpu()-began).Seconds()/float64(b.N), "cpu-s/op")
}
