package app

import (
	"io"
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
	inst.Steps[2].Status = storage.StepPending
	inst.Paused = true
	require.Equal(t, "running (failed; its onFailure steps run once resumed) (paused)", statusText(inst))
}

// Read after its failure, an instance may have nothing left to run: its
// other steps finished meanwhile and it has no onFailure step. Then it
// says only that it failed. One with onFailure steps says they run, even
// when they ran already by the time it is read.
func TestFailingTextWithNothingLeftToRun(t *testing.T) {
	inst := &storage.Instance{ID: "i-1", Status: storage.InstanceFailed, Steps: []storage.Step{
		{Name: "a", Status: storage.StepFailed},
		{Name: "b", Status: storage.StepFailed},
	}}
	require.Equal(t, "failed", failingText(inst))
	p := newProgress(io.Discard, skipNone)
	ev := storage.Event{Type: storage.EventInstanceFailing, Message: "step a failed: 404"}
	require.Equal(t, "instance i-1 failed (step a failed: 404)", p.line(inst, ev))

	inst.Steps = append(inst.Steps, storage.Step{Name: "cleanup", Status: storage.StepCompleted, OnFailure: true})
	require.Equal(t, "instance i-1 failed (step a failed: 404); running its onFailure steps", p.line(inst, ev),
		"its onFailure step ran by the time the follower read it")
}
