package dag

import (
	"encoding/json"
	"errors"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// allocated returns the bytes f allocates (the whole process's count: the
// test does not run in parallel).
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// inputTemplate compiles a step input: YAML when it starts with "{", else
// one string.
func inputTemplate(t *testing.T, input string) *Template {
	t.Helper()
	if !strings.HasPrefix(input, "{") {
		quoted, err := json.Marshal(input)
		require.NoError(t, err)
		input = string(quoted)
	}
	return mustParse(t, "name: t\nsteps:\n  - name: a\n    handler: echo\n    input: "+input+"\n").Step("a").Input
}

// Hostile expressions, in the workflow or fed by the instance input, stop at
// the evaluation limits with a message naming the expression and the limit,
// having allocated a bounded amount instead of gigabytes or terabytes.
func TestHostileExpressionsStopAtTheLimit(t *testing.T) {
	big := strings.Repeat("x", 100_000)
	ints := make([]any, 5000)
	for i := range ints {
		ints[i] = i
	}
	env := &Env{Input: map[string]any{
		"s": "x", "kb": strings.Repeat("k", 1000), "big": big, "n": 1_000_000_000_000, "ints": ints,
		"obj": map[string]any{"text": big}, "pattern": "(x|y)*" + strings.Repeat("(a|b)?", 500),
	}}
	const maxAllocated = 3 * EvalMemoryLimit
	for _, tc := range []struct{ name, input, want string }{
		{"string doubling", `${{ reduce(1..24, #acc + #acc, 'x') }}`, "builds more than 16 MiB of values"},
		{"string doubling to a terabyte", `${{ reduce(1..40, #acc + #acc, 'x') }}`, "builds more than 16 MiB of values"},
		{"list doubling", `${{ reduce(1..40, concat(#acc, #acc), [1, 2]) }}`, "builds more than 16 MiB of values"},
		{"repeat", `${{ repeat(input.kb, 1000000) }}`, "repeat would build 953.7 MiB of text, more than the 16 MiB"},
		{"repeat n from the input", `${{ repeat(input.s, input.n) }}`, "repeat would build 931.3 GiB of text"},
		{"repeat in text", `say ${{ repeat(input.big, 200) }}`, "repeat would build 19.1 MiB of text"},
		{"repeat after other work", `${{ [repeat(input.big, 150), repeat(input.big, 50)] }}`, "repeat would build 4.8 MiB of text, which with the 14.3 MiB built before is more than the 16 MiB"},
		{"many expressions of one template", `{a: "${{ repeat(input.big, 80) }}", b: "${{ repeat(input.big, 80) }}", c: "${{ repeat(input.big, 80) }}"}`, "16 MiB"},
		{"join of a shared string", `${{ join(map(1..10000, input.big), ",") }}`, "builds more than 16 MiB of values"},
		{"toJSON of a shared string", `${{ toJSON(map(1..10000, input.big)) }}`, "builds more than 16 MiB of values"},
		{"string of a shared object", `${{ string(map(1..10000, input.obj)) }}`, "builds more than 16 MiB of values"},
		{"result sharing one value", `${{ map(1..10000, input.obj) }}`, "builds more than 16 MiB of values"},
		{"replace squaring", `${{ reduce(1..6, replace(#acc, "k", #acc), input.kb) }}`, "builds more than 16 MiB of values"},
		{"upper of repeated text", `${{ upper(repeat(input.big, 100)) + upper(repeat(input.big, 100)) }}`, "16 MiB"},
		{"flatten of shared lists", `${{ flatten(map(1..5000, input.ints)) }}`, "the limit for one evaluation"},
		{"nested loops", `${{ count(input.ints, count(input.ints, count(input.ints, # > 0) > 0) > 0) }}`, "steps"},
		{"search in a loop", `${{ count(1..500000, input.big contains "y") }}`, "steps"},
		{"comparison in a loop", `${{ count(1..500000, input.big == input.obj.text) }}`, "steps"},
		{"membership in a loop", `${{ count(input.ints, count(input.ints, # in input.ints) > 0) }}`, "steps"},
		{"ranges", `${{ map(1..1000, 1..1000) }}`, "builds more than 16 MiB of values"},
		{"huge range", `${{ len(1..1000000000) }}`, "builds more than 16 MiB of values"},
		{"literal pattern over long text", `${{ count(1..1000, input.big matches "^(a|b|c|d|e|f|g|h|i|j|k|l|m|n|o|p)+$") }}`, "steps"},
		{"pattern from the input", `${{ input.big matches input.pattern }}`, "steps"},
		{"uniq of distinct numbers", `${{ uniq(input.ints) }}`, "steps"},
		{"sum in a loop", `${{ count(input.ints, sum(input.ints) > 0) }}`, "steps"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tmpl := inputTemplate(t, tc.input)
			var err error
			bytes := allocated(func() { _, err = tmpl.Eval(env) })
			require.Error(t, err)
			require.ErrorIs(t, err, ErrEvalLimit)
			require.Contains(t, err.Error(), tc.want)
			require.Contains(t, err.Error(), "expression \"")
			require.NotContains(t, err.Error(), "\n")
			require.Less(t, bytes, uint64(maxAllocated), "allocated %d bytes", bytes)
			t.Logf("allocated %s: %v", fmtBytes(float64(bytes)), err)
		})
	}
}

// Expressions within the limits are not affected by the metering.
func TestLargeButReasonableExpressions(t *testing.T) {
	t.Parallel()
	items := make([]any, 50_000)
	for i := range items {
		items[i] = map[string]any{"sku": "sku-" + strings.Repeat("x", 10), "qty": i}
	}
	allowed := make([]any, 20)
	for i := range allowed {
		allowed[i] = i * 7
	}
	env := &Env{Input: map[string]any{"items": items, "allowed": allowed, "text": strings.Repeat("abc ", 200_000), "pattern": "(abc )+"}}
	for _, tc := range []struct{ name, input string }{
		{"whole input", `${{ input }}`},
		{"map over many items", `${{ map(input.items, #.sku) }}`},
		{"filter with membership", `${{ filter(input.items, #.qty in input.allowed) }}`},
		{"sum", `${{ sum(input.items, #.qty) }}`},
		{"string work", `${{ len(split(upper(input.text), " ")) }}`},
		{"repeat", `${{ repeat("ab", 1000000) }}`},
		{"repeat over a million times", `${{ len(repeat("x", 1048576)) }}`},
		{"join", `${{ join(map(input.items, #.sku), ",") }}`},
		{"pattern", `${{ all(input.items, #.sku matches "^sku-x+$") }}`},
		{"pattern from the input", `${{ input.text matches input.pattern }}`},
		{"uniq", `${{ [uniq(map(input.items, #.sku)), uniq([1, 1.0, "1", nil, nil, true, true, [1], [1]])] }}`},
		{"membership in a long range", `${{ len(input.items) in 1..100000000 }}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tmpl := inputTemplate(t, tc.input)
			_, err := tmpl.Eval(env)
			require.NoError(t, err)
		})
	}
}

func TestConditionStopsAtTheLimit(t *testing.T) {
	t.Parallel()
	w := mustParse(t, "name: t\nsteps:\n  - name: a\n    handler: echo\n    when: ${{ len(repeat(input.s, input.n)) > 0 }}\n")
	_, err := w.Step("a").When.Bool(&Env{Input: map[string]any{"s": "ab", "n": 1 << 40}})
	require.True(t, errors.Is(err, ErrEvalLimit), "got %v", err)
	require.EqualError(t, err, `expression "len(repeat(input.s, input.n)) > 0": repeat would build 2 TiB of text, more than the 16 MiB one evaluation may build: simplify the expression or do this work in a handler`)
}

// The metered uniq keeps expr's results: the first of each equal group, in
// order, numbers equal across int and float.
func TestMeteredUniqKeepsExprResults(t *testing.T) {
	t.Parallel()
	got, err := inputTemplate(t, `${{ [uniq([1, 1.0, "1", nil, nil, true, true, [1], [1], "a", "b", "a"]), uniq([])] }}`).Eval(nil)
	require.NoError(t, err)
	require.Equal(t, `[[1,"1",null,true,[1],"a","b"],[]]`, jsonOf(t, got))
}

// Env.Usage adds up what each evaluation cost, failed ones included.
func TestUsageAddsUpEvaluations(t *testing.T) {
	t.Parallel()
	w := mustParse(t, "name: t\nsteps:\n  - name: a\n    handler: echo\n    when: \"${{ count(1..100, # > 0) > 0 }}\"\n    input: \"${{ repeat('ab', 1000) }}\"\n")
	usage := &Usage{}
	env := &Env{Usage: usage}
	_, err := w.Step("a").When.Bool(env)
	require.NoError(t, err)
	require.GreaterOrEqual(t, usage.Steps, int64(100), "a step per element of the range")
	_, err = w.Step("a").Input.Eval(env)
	require.NoError(t, err)
	require.Greater(t, usage.Memory, int64(2000), "the repeated text, then its copy")

	env.Input = map[string]any{"n": 1 << 40}
	before := usage.Memory
	_, err = inputTemplate(t, `${{ reduce(1..40, #acc + #acc, 'x') }}`).Eval(env)
	require.ErrorIs(t, err, ErrEvalLimit)
	require.Greater(t, usage.Memory-before, int64(EvalMemoryLimit))
}
