package dagrun_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun"
	"github.com/dagrun/dagrun/dag"
	"github.com/dagrun/dagrun/handlers"
	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/backendtest"
)

const hostileWorkflow = `
name: hostile
input:
  type: object
  properties:
    s: {type: string}
    n: {type: integer}
steps:
  - name: first
    handler: echo
    input: {text: "${{ repeat(input.s, input.n) }}"}
`

// An expression fed a huge count by the caller, or one that grows without
// bound on its own, fails its step for good with a message naming the
// expression and the limit; the process and the other instances carry on.
// Before the evaluation limits, this start allocated a gigabyte, and a
// longer s killed the process with out-of-memory.
func TestExpressionLimitsFailTheStepAndNothingElse(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		b := setup(t, open, nil, hostileWorkflow, `
name: doubling
steps:
  - {name: a, handler: echo, input: {x: 1}}
  - name: b
    handler: echo
    dependsOn: [a]
    when: "${{ len(reduce(1..40, #acc + #acc, 'x')) > 0 }}"
`, `
name: big-input
input: {type: object, properties: {s: {type: string}, n: {type: integer}}}
steps:
  - {name: a, handler: echo, input: "${{ repeat(input.s, input.n) }}"}
`, `
name: big-output
input: {type: object, properties: {s: {type: string}, n: {type: integer}}}
steps:
  - {name: a, handler: echo, input: {x: 1}}
output: ${{ repeat(input.s, input.n) }}
`, chainWorkflow)
		b.runWorker(t, nil)

		inst := b.wait(t, b.start(t, "hostile", `{"s": "`+strings.Repeat("a", 1000)+`", "n": 1000000}`))
		require.Equal(t, storage.InstanceFailed, inst.Status)
		s := step(t, inst, "first")
		require.Equal(t, storage.StepFailed, s.Status)
		require.Equal(t, 0, s.Attempts, "the handler never ran")
		require.Equal(t, `input: expression "repeat(input.s, input.n)": repeat would build 953.7 MiB of text, more than the 16 MiB one evaluation may build: simplify the expression or do this work in a handler`, s.Error)
		require.Equal(t, "step first failed: "+s.Error, inst.Error)

		inst = b.wait(t, b.start(t, "doubling", ``))
		require.Equal(t, storage.InstanceFailed, inst.Status)
		require.Equal(t, storage.StepCompleted, step(t, inst, "a").Status)
		s = step(t, inst, "b")
		require.Equal(t, storage.StepFailed, s.Status)
		require.Equal(t, `when: expression "len(reduce(1..40, #acc + #acc, 'x')) > 0": it builds more than 16 MiB of values, the limit for one evaluation: simplify the expression or do this work in a handler`, s.Error)

		// Within the evaluation limits but over the size limits.
		inst = b.wait(t, b.start(t, "big-input", `{"s": "ab", "n": 600000}`))
		require.Equal(t, storage.InstanceFailed, inst.Status)
		require.Equal(t, "input: the resolved input is 1200002 bytes, over the limit of 1048576 bytes; pass a reference to large data instead", step(t, inst, "a").Error)
		inst = b.wait(t, b.start(t, "big-output", `{"s": "ab", "n": 600000}`))
		require.Equal(t, storage.InstanceFailed, inst.Status)
		require.Equal(t, "output: the workflow output is 1200002 bytes, over the limit of 1048576 bytes; return a reference to large data instead", inst.Error)
		require.Nil(t, inst.Output)

		// Nothing else is broken: the same worker runs the next instance.
		inst = b.wait(t, b.start(t, "chain", `{"n": 1}`))
		require.Equal(t, storage.InstanceCompleted, inst.Status)
		requireJSON(t, `{"result": 4, "label": "n=1"}`, inst.Output)
	})
}

// wideWorkflow has n independent steps, each with an input expression.
func wideWorkflow(n int) string {
	var b strings.Builder
	b.WriteString("name: wide\nsteps:\n")
	for i := range n {
		fmt.Fprintf(&b, "  - {name: s%d, handler: echo, input: \"${{ workflow.id }}\"}\n", i)
	}
	return b.String()
}

// Planning an instance costs in proportion to its steps: it used to build,
// for every ready step, a map of every step of the instance.
func TestPlanningIsLinear(t *testing.T) {
	startBytes := func(n int) uint64 {
		b := setup(t, func(t *testing.T) storage.Store { return backendtest.OpenSQLite(t) }, nil, wideWorkflow(n))
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		b.start(t, "wide", ``)
		runtime.ReadMemStats(&after)
		return after.TotalAlloc - before.TotalAlloc
	}
	small, large := startBytes(1000), startBytes(4000)
	t.Logf("start allocates %d bytes for 1,000 steps, %d for 4,000", small, large)
	require.Less(t, float64(large)/float64(small), 8.0, "starting 1,000 steps allocates %d bytes, 4,000 steps %d", small, large)
}

// setupConfig is setup with a Config of the test's own.
func setupConfig(t *testing.T, open func(t *testing.T) storage.Store, config dagrun.Config, source string) *testBundle {
	t.Helper()
	w, err := dag.Parse("", []byte(source), nil)
	require.NoError(t, err)
	registry := handlers.NewRegistry()
	handlers.RegisterBuiltins(registry)
	store := open(t)
	config.Workflows = []*dag.Workflow{w}
	engine, err := dagrun.New(store, registry, &config)
	require.NoError(t, err)
	return &testBundle{engine: engine, store: store, registry: registry}
}

// fanOut is a workflow of n independent steps sharing one step body.
func fanOut(n int, body string) string {
	var src strings.Builder
	src.WriteString("name: fan\nsteps:\n")
	for i := range n {
		fmt.Fprintf(&src, "  - {name: s%d, handler: echo, %s}\n", i, body)
	}
	return src.String()
}

func stepCounts(t *testing.T, b *testBundle, id string) map[storage.StepStatus]int {
	t.Helper()
	inst, err := b.engine.Get(context.Background(), id)
	require.NoError(t, err)
	counts := map[storage.StepStatus]int{}
	for _, s := range inst.Steps {
		counts[s.Status]++
	}
	return counts
}

// A transition resolves ready steps up to MaxPlanInputBytes of inputs and
// MaxPlanExprSteps of expression work; the rest wait, blocked, for the next
// transition, and every step still runs.
func TestPlanBudgetDefersTheRest(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		for _, tc := range []struct {
			name   string
			config dagrun.Config
			body   string
			input  string
		}{
			// 3 inputs of 2,002 bytes pass 5,000 bytes.
			{"input bytes", dagrun.Config{MaxPlanInputBytes: 5000}, `input: "${{ input.s }}"`, `{"s": "` + strings.Repeat("x", 2000) + `"}`},
			// 2 conditions of about 600 steps pass 1,000 steps.
			{"expression steps", dagrun.Config{MaxPlanExprSteps: 1000}, `when: "${{ count(1..600, # > 0) > 0 }}"`, `{}`},
		} {
			b := setupConfig(t, open, tc.config, fanOut(10, tc.body))
			id := b.start(t, "fan", tc.input)
			want := map[storage.StepStatus]int{storage.StepPending: 3, storage.StepBlocked: 7}
			if tc.name == "expression steps" {
				want = map[storage.StepStatus]int{storage.StepPending: 2, storage.StepBlocked: 8}
			}
			require.Equal(t, want, stepCounts(t, b, id), tc.name)

			b.runWorker(t, nil)
			inst := b.wait(t, id)
			require.Equal(t, storage.InstanceCompleted, inst.Status, inst.Error)
			for _, s := range inst.Steps {
				require.Equal(t, storage.StepCompleted, s.Status, s.Name)
			}
		}

		// Skipped steps bring no later transition: nothing may wait for one.
		b := setupConfig(t, open, dagrun.Config{MaxPlanExprSteps: 1000}, fanOut(10, `when: "${{ count(1..600, # > 0) < 0 }}"`))
		inst, err := b.engine.Get(context.Background(), b.start(t, "fan", `{}`))
		require.NoError(t, err)
		require.Equal(t, storage.InstanceCompleted, inst.Status)
	})
}
