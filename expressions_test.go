package dagrun_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
)

// A step whose name holds "-" is read as steps["echo-it"], the form the
// validation error for steps.echo-it recommends.
func TestBracketStepReferenceRuns(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		b := setup(t, open, nil, `
name: dashed
steps:
  - {name: echo-it, handler: echo, input: {text: hi}}
  - name: shout
    handler: echo
    dependsOn: [echo-it]
    when: ${{ steps["echo-it"].status == "completed" }}
    input: {text: '${{ upper(steps["echo-it"].output.text) }}!'}
output: ${{ steps["shout"].output.text }}
`)
		b.runWorker(t, nil)
		inst := b.wait(t, b.start(t, "dashed", ``))
		require.Equal(t, storage.InstanceCompleted, inst.Status, inst.Error)
		requireJSON(t, `"HI!"`, inst.Output)
	})
}

// TestResolvedValuesKeepHTMLCharacters: <, > and & in resolved inputs,
// items and the workflow output are stored as written, one byte each,
// not as encoding/json's six-byte escapes for HTML, which also counted
// six bytes each against the size limits.
func TestResolvedValuesKeepHTMLCharacters(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		b := setup(t, open, nil, `
name: html
steps:
  - {name: one, handler: echo, input: "${{ input.s }}"}
  - {name: each, handler: echo, forEach: "${{ [input.s] }}", input: {s: "${{ item }}"}}
output: "${{ input.s }}"
`)
		b.runWorker(t, nil)
		inst := b.wait(t, b.start(t, "html", `{"s": "<a & b>"}`))
		require.Equal(t, storage.InstanceCompleted, inst.Status, inst.Error)
		require.Equal(t, `"<a & b>"`, string(step(t, inst, "one").Input))
		require.Equal(t, `"<a & b>"`, string(inst.Output))
		require.JSONEq(t, `[{"s": "<a & b>"}]`, string(step(t, inst, "each").Output))
		require.Contains(t, string(step(t, inst, "each").Output), "<a & b>", "the item's input as written")
	})
}
