package app

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
)

// A failing instance says why it still runs: its running steps finish
// their attempt first, then its onFailure steps run.
func TestStatusTextOfAFailingInstance(t *testing.T) {
	inst := &storage.Instance{Status: storage.InstanceRunning, Failing: true, Steps: []storage.Step{
		{Name: "quick", Status: storage.StepFailed},
		{Name: "slow", Status: storage.StepRunning},
		{Name: "cleanup", Status: storage.StepBlocked, OnFailure: true},
	}}
	require.Equal(t, "running (failed; its running steps finish first)", statusText(inst))
	inst.Steps[1].Status = storage.StepCompleted
	inst.Steps[2].Status = storage.StepRunning
	require.Equal(t, "running (failed; running its onFailure steps)", statusText(inst))
}
