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
