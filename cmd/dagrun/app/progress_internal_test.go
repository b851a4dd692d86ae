package app

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
)

// TestProgressOfASnoozedStep: a sleep's attempt starts again under its
// number when it wakes, and its duration counts from its first start, as
// the step's startedAt does in status; a retry after a failure counts
// from its own start.
func TestProgressOfASnoozedStep(t *testing.T) {
	t.Parallel()
	berlin := time.FixedZone("CET", 3600)
	began := time.Date(2026, 12, 7, 10, 0, 0, 0, berlin)
	wake := began.Add(36 * time.Hour)
	var out bytes.Buffer
	p := newProgress(&out, skipNone)
	p.now = func() time.Time { return began }
	p.zone = berlin
	p.observe(&storage.Instance{ID: "i-1"}, []storage.Event{
		{Type: storage.EventStepStarted, Step: "nap", Attempt: 1, At: began},
		{Type: storage.EventStepSnoozed, Step: "nap", Attempt: 1, At: began, Message: "until " + wake.UTC().Format(time.RFC3339Nano)},
		{Type: storage.EventStepStarted, Step: "nap", Attempt: 1, At: wake},
		{Type: storage.EventStepCompleted, Step: "nap", Attempt: 1, At: wake.Add(3 * time.Millisecond)},
		{Type: storage.EventStepStarted, Step: "call", Attempt: 1, At: began},
		{Type: storage.EventStepRetrying, Step: "call", Attempt: 1, At: began.Add(time.Second), Message: "boom"},
		{Type: storage.EventStepStarted, Step: "call", Attempt: 2, At: began.Add(2 * time.Second)},
		{Type: storage.EventStepCompleted, Step: "call", Attempt: 2, At: began.Add(2*time.Second + 5*time.Millisecond)},
	})
	require.Equal(t, `nap          running (attempt 1)
nap          waiting until 2026-12-08 22:00:00 CET
nap          running (attempt 1)
nap          completed in 36h0m0.003s
call         running (attempt 1)
call         retrying after attempt 1 failed: boom
call         running (attempt 2)
call         completed in 5ms
`, out.String())
}

// TestProgressAfterARetry: a retry starts its steps again from attempt 1;
// their durations count from the new starts, not from the first run's.
func TestProgressAfterARetry(t *testing.T) {
	t.Parallel()
	began := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	later := began.Add(10 * time.Minute)
	history := []storage.Event{
		{Type: storage.EventStepStarted, Step: "ship", Attempt: 1, At: began},
		{Type: storage.EventStepCompleted, Step: "ship", Attempt: 1, At: began.Add(time.Second)},
		{Type: storage.EventInstanceRetried, At: later},
	}
	news := []storage.Event{
		{Type: storage.EventStepStarted, Step: "ship", Attempt: 1, At: later},
		{Type: storage.EventStepCompleted, Step: "ship", Attempt: 1, At: later.Add(3 * time.Millisecond)},
	}
	for _, mode := range []skipMode{skipUntilRetried, skipNone} {
		var out bytes.Buffer
		p := newProgress(&out, mode)
		p.observe(&storage.Instance{ID: "i-1"}, history)
		p.observe(&storage.Instance{ID: "i-1"}, news)
		require.Contains(t, out.String(), "ship         completed in 3ms\n", "mode %d", mode)
	}
}

func TestWakeTime(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 7, 15, 49, 11, 0, time.UTC)
	for _, tt := range []struct {
		wake time.Time
		want string
	}{
		{now.Add(time.Hour), "16:49:11 UTC"},
		{now.Add(12 * time.Hour), "2026-12-08 03:49:11 UTC"},
		{time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC), "2100-01-01 00:00:00 UTC"},
	} {
		require.Equal(t, tt.want, wakeTime(tt.wake, now))
	}
}

// TestStepDurationGoesOnWhileAsleep: a sleeping step (pending again, its
// start kept, its wake time ahead) shows its time so far, as a running or
// waiting one does; a step that never started shows none, nor one handed
// back by a stopping worker (pending, free to run now).
func TestStepDurationGoesOnWhileAsleep(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 7, 15, 0, 0, 0, time.UTC)
	began := now.Add(-90 * time.Second)
	done := now.Add(-time.Second)
	for _, tt := range []struct {
		step storage.Step
		want string
	}{
		{storage.Step{Status: storage.StepPending, StartedAt: &began, RunAfter: now.Add(time.Minute)}, "1m30s…"},
		{storage.Step{Status: storage.StepPending, StartedAt: &began, RunAfter: done}, "-"},
		{storage.Step{Status: storage.StepRunning, StartedAt: &began}, "1m30s…"},
		{storage.Step{Status: storage.StepCompleted, StartedAt: &began, FinishedAt: &done}, "1m29s"},
		{storage.Step{Status: storage.StepPending}, "-"},
		{storage.Step{Status: storage.StepCancelled, StartedAt: &began}, "-"},
	} {
		require.Equal(t, tt.want, stepDuration(tt.step, now), "%s", tt.step.Status)
	}
}
