package dag

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestParseOrderProcessing(t *testing.T) {
	t.Parallel()
	path := filepath.Join("..", "workflows", "order-processing.yaml")
	src, err := os.ReadFile(path)
	require.NoError(t, err)
	w, err := ParseFile(path, testOptions())
	require.NoError(t, err)

	require.Equal(t, "order-processing", w.Name)
	require.Equal(t, "Validate, charge, ship and notify one order.", w.Description)
	require.Equal(t, src, w.Source)
	sum := sha256.Sum256(src)
	require.Equal(t, hex.EncodeToString(sum[:]), w.Hash)
	require.JSONEq(t, `{"type":"object","required":["orderId","items","totalAmount"],"properties":{"orderId":{"type":"string"},"items":{"type":"array","minItems":1},"totalAmount":{"type":"number","minimum":0}}}`, string(w.InputSchema))
	require.Equal(t, []string{"validate", "charge", "ship", "notify"}, names(w.Steps))

	charge := w.Step("charge")
	require.Equal(t, "orders.charge", charge.Handler)
	require.Equal(t, []string{"validate"}, charge.DependsOn)
	// Field by field: maxAttempts from the step, backoff from the defaults.
	require.Equal(t, RetryPolicy{MaxAttempts: 5, Backoff: time.Second, MaxBackoff: time.Minute}, charge.Retry)
	require.Equal(t, 10*time.Second, charge.Timeout)
	require.Equal(t, "default", charge.Queue)
	require.Equal(t, 19, charge.Line)
	require.Equal(t, 5, charge.Col)

	ship := w.Step("ship")
	require.Equal(t, RetryPolicy{MaxAttempts: 3, Backoff: time.Second, MaxBackoff: time.Minute}, ship.Retry)
	require.Equal(t, 30*time.Second, ship.Timeout)
	require.Nil(t, ship.When)

	notify := w.Step("notify")
	require.True(t, notify.ContinueOnError)
	require.Equal(t, "input.customerEmail != nil", notify.When.String())
	require.Nil(t, w.Step("nope"))

	out, err := w.Output.Eval(&Env{Steps: map[string]StepEnv{
		"charge": {Status: "completed", Output: map[string]any{"paymentId": "pay_1"}},
		"ship":   {Status: "completed", Output: map[string]any{"trackingNo": "TRK"}},
	}})
	require.NoError(t, err)
	require.Equal(t, map[string]any{"paymentId": "pay_1", "trackingNo": "TRK"}, out)
}

func TestBuiltInDefaults(t *testing.T) {
	t.Parallel()
	w := mustParse(t, "name: t\nsteps:\n  - name: a\n    handler: echo\n")
	a := w.Step("a")
	require.Equal(t, RetryPolicy{MaxAttempts: 3, Backoff: time.Second, MaxBackoff: time.Minute}, a.Retry)
	require.Zero(t, a.Timeout)
	require.Equal(t, "default", a.Queue)
	require.False(t, a.ContinueOnError)
	require.Nil(t, a.Input)
	require.Nil(t, a.When)
	require.Nil(t, w.Output)
	require.Nil(t, w.InputSchema)
	require.Empty(t, a.DependsOn)
}

func TestDefaultsInheritance(t *testing.T) {
	t.Parallel()
	w := mustParse(t, `name: t
defaults:
  retry: {maxAttempts: 4, maxBackoff: 5m}
  timeout: 1m
  queue: slow
steps:
  - name: a
    handler: echo
  - name: b
    handler: echo
    dependsOn: a
    retry: {backoff: 3s}
    timeout: 2s
    queue: fast
`)
	require.Equal(t, RetryPolicy{MaxAttempts: 4, Backoff: time.Second, MaxBackoff: 5 * time.Minute}, w.Step("a").Retry)
	require.Equal(t, time.Minute, w.Step("a").Timeout)
	require.Equal(t, "slow", w.Step("a").Queue)
	require.Equal(t, RetryPolicy{MaxAttempts: 4, Backoff: 3 * time.Second, MaxBackoff: 5 * time.Minute}, w.Step("b").Retry)
	require.Equal(t, 2*time.Second, w.Step("b").Timeout)
	require.Equal(t, "fast", w.Step("b").Queue)
	require.Equal(t, []string{"a"}, w.Step("b").DependsOn, "a single name is accepted for dependsOn")
}

// TestBackoffCheckedAfterDefaultsApply: backoff above maxBackoff is an
// error of the policy a step ends with, field by field, so defaults may
// set one bound and every step the other; a default that a step inherits
// whole and that breaks the rule is reported once, at the defaults.
func TestBackoffCheckedAfterDefaultsApply(t *testing.T) {
	t.Parallel()
	w := mustParse(t, `name: t
defaults:
  retry: {maxBackoff: 150ms}
steps:
  - name: a
    handler: echo
    retry: {backoff: 100ms}
`)
	require.Equal(t, RetryPolicy{MaxAttempts: DefaultMaxAttempts, Backoff: 100 * time.Millisecond, MaxBackoff: 150 * time.Millisecond}, w.Step("a").Retry)
	w = mustParse(t, `name: t
defaults:
  retry: {backoff: 2m}
steps:
  - name: a
    handler: echo
    retry: {maxBackoff: 5m}
  - name: w
    wait: {signal: go}
`)
	require.Equal(t, 2*time.Minute, w.Step("a").Retry.Backoff)

	_, err := Parse("t.yaml", []byte(`name: t
defaults:
  retry: {maxBackoff: 150ms}
steps:
  - name: a
    handler: echo
  - name: b
    handler: echo
`), nil)
	require.EqualError(t, err, "t.yaml:3:23: defaults: retry.backoff (1s) is longer than retry.maxBackoff (150ms), so it would never apply: lower backoff or raise maxBackoff")
}

func TestAnchorsAndMergeKeys(t *testing.T) {
	t.Parallel()
	w := mustParse(t, `name: t
steps:
  - &common
    name: a
    handler: echo
    retry: {maxAttempts: 2}
    input: &in {x: 1}
  - <<: *common
    name: b
    handler: noop
    input: *in
`)
	require.Equal(t, "echo", w.Step("a").Handler)
	require.Equal(t, "noop", w.Step("b").Handler, "explicit keys win over merged ones")
	require.Equal(t, 2, w.Step("b").Retry.MaxAttempts)
	v, err := w.Step("b").Input.Eval(nil)
	require.NoError(t, err)
	require.Equal(t, map[string]any{"x": 1}, v)
}

func TestExtensionKeysHoldSharedBlocks(t *testing.T) {
	t.Parallel()
	// A key starting with x- is the user's own, at the top level and in a
	// step: the place for a block the steps merge, as in Docker Compose.
	w := mustParse(t, `name: t
x-common: &common
  handler: echo
  retry: {maxAttempts: 3}
steps:
  - <<: *common
    name: a
    x-owner: payments
  - <<: *common
    name: b
    dependsOn: [a]
`)
	require.Equal(t, "echo", w.Step("b").Handler)
	require.Equal(t, 3, w.Step("a").Retry.MaxAttempts)

	// Any other unknown key is still an error, wherever it is.
	got := parseErrors(t, "", "name: t\ncommon: &c {handler: echo}\nsteps:\n  - <<: *c\n    name: a\n    owner: x\n")
	require.Equal(t, `2:1: unknown key "common" at the top level (valid keys: name, description, input, defaults, steps, output, schedule, timeout, onFailure, concurrency)
6:5: unknown key "owner" in step "a" (valid keys: name, handler, dependsOn, input, when, retry, timeout, queue, continueOnError, forEach, concurrency, wait, workflow)`, got)
	got = parseErrors(t, "", "name: t\ndefaults: {x-a: 1}\nsteps:\n  - name: a\n    handler: echo\n")
	require.Contains(t, got, `unknown key "x-a" in defaults`)
}

func TestHostileYAML(t *testing.T) {
	t.Parallel()
	// A self-referencing alias and an alias bomb must end in errors, fast.
	got := parseErrors(t, "", "name: t\nsteps:\n  - name: a\n    handler: echo\n    input: &x [*x]\n")
	require.Contains(t, got, "nested too deeply")

	bomb := "name: t\nsteps:\n  - name: a\n    handler: echo\n    input:\n      a: &a [x, x, x, x, x, x, x, x, x, x]\n"
	prev := "a"
	for _, n := range []string{"b", "c", "d", "e", "f", "g", "h", "i"} {
		bomb += "      " + n + ": &" + n + " [*" + prev + ", *" + prev + ", *" + prev + ", *" + prev + ", *" + prev + ", *" + prev + ", *" + prev + ", *" + prev + ", *" + prev + ", *" + prev + "]\n"
		prev = n
	}
	got = parseErrors(t, "", bomb)
	require.Contains(t, got, "too large")
}

func TestParseFileAndLoadDir(t *testing.T) {
	t.Parallel()
	_, err := ParseFile(filepath.Join(t.TempDir(), "missing.yaml"), nil)
	require.True(t, errors.Is(err, fs.ErrNotExist))

	dir := t.TempDir()
	write := func(name, src string) {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644))
	}
	write("zeta.yaml", "name: zeta\nsteps:\n  - name: a\n    handler: echo\n")
	write("alpha.yml", "name: alpha\nsteps:\n  - name: a\n    handler: echo\n")
	write("broken.yaml", "name: broken\nsteps:\n  - name: a\n")
	write("zeta.yml", "name: zeta\nsteps:\n  - name: a\n    handler: echo\n")
	write("notes.txt", "not a workflow")
	write(".swap.yaml", "garbage: [")
	require.NoError(t, os.Mkdir(filepath.Join(dir, "sub.yaml"), 0o755))

	wfs, err := LoadDir(dir, nil)
	require.Equal(t, []string{"alpha", "zeta"}, func() []string {
		var out []string
		for _, w := range wfs {
			out = append(out, w.Name)
		}
		return out
	}())
	var list ErrorList
	require.True(t, errors.As(err, &list))
	require.Equal(t, filepath.Join(dir, "broken.yaml")+`:3:5: step "a": missing required key "handler", "wait" or "workflow" (the registered handler that runs it, e.g. handler: echo, the signal it waits for, e.g. wait: {signal: approve}, or the workflow it starts, e.g. workflow: shipping)`+"\n"+
		filepath.Join(dir, "zeta.yml")+`:1:7: workflow "zeta" is already defined in `+filepath.Join(dir, "zeta.yaml")+`: keep only one of the two files`, err.Error())

	_, err = LoadDir(filepath.Join(dir, "nope"), nil)
	require.True(t, errors.Is(err, fs.ErrNotExist))
}

func TestSizeLimits(t *testing.T) {
	t.Parallel()
	_, err := Parse("chain.yaml", chainSource(MaxSteps), nil)
	require.NoError(t, err, "a workflow at the limit is valid")

	_, err = Parse("chain.yaml", chainSource(MaxSteps+1), nil)
	require.EqualError(t, err, `chain.yaml:3:3: "steps" has 10001 steps, over the limit of 10000 per workflow: split it into workflows that start one another`)

	big := append([]byte("name: big\nsteps:\n  - {name: a, handler: echo}\n# "), make([]byte, MaxFileBytes)...)
	_, err = Parse("big.yaml", big, nil)
	require.EqualError(t, err, `big.yaml:1:1: the file is larger than the limit of 4 MiB for a workflow file: split it into workflows that start one another`)

	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "big.yaml"), big, 0o600))
	_, err = ParseFile(filepath.Join(dir, "big.yaml"), nil)
	require.ErrorContains(t, err, "larger than the limit of 4 MiB")
}

// Validation is linear in the size of the workflow: four times the steps
// cost about four times the memory. It was quadratic (a copy of every name
// and of every ancestor set per step): 9 GB for a 10,000-step chain.
func TestValidationIsLinear(t *testing.T) {
	for name, source := range map[string]func(int) []byte{"chain": chainSource, "independent": independentSource} {
		small, large := source(1000), source(4000)
		var err1, err2 error
		smallBytes := allocated(func() { _, err1 = Parse("", small, nil) })
		largeBytes := allocated(func() { _, err2 = Parse("", large, nil) })
		require.NoError(t, err1)
		require.NoError(t, err2)
		ratio := float64(largeBytes) / float64(smallBytes)
		require.Less(t, ratio, 8.0, "%s: 1,000 steps allocate %d bytes, 4,000 steps %d", name, smallBytes, largeBytes)
	}
}

// A snapshot stored by an earlier version, before the bounds on sizes and
// numbers, still parses when read back as stored.
func TestStoredSnapshotSkipsTheNewBounds(t *testing.T) {
	t.Parallel()
	src := []byte(`name: old
steps:
  - name: a
    handler: echo
    timeout: 500us
    retry: {maxAttempts: 4294967297, backoff: 1ns, maxBackoff: 9000h}
`)
	_, err := Parse("", src, nil)
	require.Error(t, err)
	w, err := Parse("", src, &ParseOptions{Stored: true})
	require.NoError(t, err)
	require.Equal(t, 4294967297, w.Step("a").Retry.MaxAttempts)

	_, err = Parse("", chainSource(MaxSteps+1), &ParseOptions{Stored: true})
	require.NoError(t, err)
}

func TestParseForEach(t *testing.T) {
	t.Parallel()
	w, err := Parse("fan-out.yaml", []byte(`
name: fan-out
steps:
  - name: list
    handler: echo
  - name: resize
    dependsOn: [list]
    forEach: ${{ steps.list.output.images }}
    concurrency: 10
    handler: echo
    input: {url: "${{ item.url }}", position: "${{ index }}"}
  - name: literal
    forEach: [a, b]
    handler: echo
`), testOptions())
	require.NoError(t, err)
	resize := w.Step("resize")
	require.Equal(t, 10, resize.Concurrency)
	require.Equal(t, []string{"list"}, resize.ForEach.References())
	list, err := resize.ForEach.Eval(&Env{Steps: map[string]StepEnv{"list": {Output: map[string]any{"images": []any{"x"}}}}})
	require.NoError(t, err)
	require.Equal(t, []any{"x"}, list)
	input, err := resize.Input.Eval(&Env{Item: map[string]any{"url": "u"}, Index: 3})
	require.NoError(t, err)
	require.Equal(t, map[string]any{"url": "u", "position": 3}, input)

	literal := w.Step("literal")
	require.Zero(t, literal.Concurrency, "no cap")
	items, err := literal.ForEach.Eval(&Env{})
	require.NoError(t, err)
	require.Equal(t, []any{"a", "b"}, items)
	require.Nil(t, w.Step("list").ForEach)
}

func TestParseWait(t *testing.T) {
	t.Parallel()
	w, err := Parse("", []byte(`name: refund
steps:
  - name: approve
    wait:
      timeout: 72h
      schema: {type: object, required: [approved], properties: {approved: {type: boolean}}}
  - name: confirm
    wait: {signal: payment.confirmed}
`), testOptions())
	require.NoError(t, err)
	approve := w.Step("approve").Wait
	require.Equal(t, "approve", approve.Signal, "the signal defaults to the step's name")
	require.Equal(t, 72*time.Hour, approve.Timeout)
	require.NoError(t, approve.ValidatePayload(json.RawMessage(`{"approved": true}`)))
	err = approve.ValidatePayload(json.RawMessage(`{"approved": "yes"}`))
	require.ErrorIs(t, err, ErrInvalidPayload)
	require.Equal(t, `payload does not match the wait step's schema: at /approved: got string, want boolean`, err.Error())
	confirm := w.Step("confirm").Wait
	require.Equal(t, "payment.confirmed", confirm.Signal)
	require.Zero(t, confirm.Timeout)
	require.NoError(t, confirm.ValidatePayload(json.RawMessage(`"anything"`)))
	require.Empty(t, w.Step("approve").Handler)
}

func TestParseTimeoutAndOnFailure(t *testing.T) {
	t.Parallel()
	w, err := Parse("", []byte(`name: pay
timeout: 15m
defaults:
  retry: {maxAttempts: 2}
steps:
  - name: charge
    handler: echo
output: ${{ steps.charge.output }}
onFailure:
  - name: refund
    handler: echo
    input: {amount: "${{ steps.charge.output.amount }}", why: "${{ workflow.error }}", step: "${{ workflow.failedStep }}"}
  - name: notify
    handler: echo
    dependsOn: [refund]
    input: ${{ steps.refund.output }}
`), testOptions())
	require.NoError(t, err)
	require.Equal(t, 15*time.Minute, w.Timeout)
	require.Len(t, w.Steps, 1, "onFailure steps are not main steps")
	require.Len(t, w.OnFailure, 2)
	require.True(t, w.Step("refund").OnFailure)
	require.False(t, w.Step("charge").OnFailure)
	require.Equal(t, 2, w.Step("notify").Retry.MaxAttempts, "onFailure steps inherit the defaults")
	order := w.OnFailureOrder()
	require.Equal(t, "refund", order[0].Name)
	require.Equal(t, "notify", order[1].Name)
	require.Len(t, w.TopologicalOrder(), 1)
}

func TestParseWorkflowStep(t *testing.T) {
	t.Parallel()
	w, err := Parse("", []byte(`name: fulfil
defaults: {retry: {maxAttempts: 5}, queue: fast}
steps:
  - name: pick
    handler: echo
  - name: ship
    dependsOn: [pick]
    workflow: shipping
    input: {orderId: "${{ steps.pick.output.id }}"}
    continueOnError: true
  - name: each
    forEach: [1, 2]
    workflow: shipping
  - name: each-capped
    forEach: [1, 2, 3]
    workflow: shipping
    concurrency: 2
`), testOptions())
	require.NoError(t, err)
	ship := w.Step("ship")
	require.Equal(t, "shipping", ship.Workflow)
	require.Equal(t, [2]int{8, 15}, [2]int{ship.WorkflowLine, ship.WorkflowCol}, "where the name is written, for checks across files")
	require.Empty(t, ship.Handler)
	require.NotNil(t, ship.Input)
	require.True(t, ship.ContinueOnError)
	require.Equal(t, "shipping", w.Step("each").Workflow)
	require.NotNil(t, w.Step("each").ForEach)
	require.Zero(t, w.Step("each").Concurrency)
	require.Equal(t, 2, w.Step("each-capped").Concurrency, "caps the children running at once")
	require.Nil(t, w.Step("each-capped").KeyConcurrency)
	require.Empty(t, w.Step("pick").Workflow)
}

func TestMessagesClipLongText(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("a", 2<<20)
	tests := []struct {
		name, src, want string
	}{
		{"short text whole", "just words\n", `1:1: a workflow must be a YAML mapping with keys such as name and steps, got the text "just words"`},
		{"a file that is one long text", long + "\n", `1:1: a workflow must be a YAML mapping with keys such as name and steps, got the text "` +
			strings.Repeat("a", maxQuotedText) + `"... (2097152 characters)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, parseErrors(t, "", tt.src))
		})
	}
}

// TestLoadDirLocatesAnUnreadableFile: a file that cannot be read (here a
// link to nothing) is an error at FILE:1:1, as validate prints every
// error, beside the workflows that load.
func TestLoadDirLocatesAnUnreadableFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "alpha.yaml"), []byte("name: alpha\nsteps:\n  - name: a\n    handler: echo\n"), 0o644))
	require.NoError(t, os.Symlink(filepath.Join(dir, "gone.yaml"), filepath.Join(dir, "dangling.yaml")))
	wfs, err := LoadDir(dir, nil)
	require.Len(t, wfs, 1)
	require.ErrorContains(t, err, filepath.Join(dir, "dangling.yaml")+":1:1: cannot read the file:")
}
