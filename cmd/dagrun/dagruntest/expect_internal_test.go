package dagruntest

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
)

// exact is a Match of a value written in JSON, as a test file's is read.
func exact(t *testing.T, src string) *Match {
	t.Helper()
	v, err := decodeExact([]byte(src))
	require.NoError(t, err)
	return &Match{Value: v}
}

func TestCheckValue(t *testing.T) {
	t.Parallel()
	obj := map[string]any{"a": 1.0, "b": map[string]any{"c": "x", "d": []any{1.0, 2.0}}}
	tests := []struct {
		name string
		want *Match
		got  string
		ok   bool
	}{
		{name: "ExactEqual", want: &Match{Value: obj}, got: `{"b": {"d": [1, 2.0], "c": "x"}, "a": 1}`, ok: true},
		{name: "ExactExtraKey", want: &Match{Value: obj}, got: `{"a": 1, "b": {"c": "x", "d": [1, 2]}, "e": 0}`},
		{name: "PartialExtraKeys", want: &Match{Value: map[string]any{"b": map[string]any{"c": "x"}}, Partial: true}, got: `{"a": 1, "b": {"c": "x", "d": [1]}}`, ok: true},
		{name: "PartialWrongValue", want: &Match{Value: map[string]any{"a": 2.0}, Partial: true}, got: `{"a": 1, "z": 0}`},
		{name: "PartialMissingKey", want: &Match{Value: map[string]any{"q": nil}, Partial: true}, got: `{"a": 1}`},
		{name: "PartialListsElementWise", want: &Match{Value: []any{map[string]any{"k": 1.0}}, Partial: true}, got: `[{"k": 1, "other": 2}]`, ok: true},
		{name: "PartialListsOfOtherLength", want: &Match{Value: []any{map[string]any{"k": 1.0}}, Partial: true}, got: `[{"k": 1}, {"k": 2}]`},
		{name: "NullMatchesNothingStored", want: &Match{Value: nil}, got: ``, ok: true},
		{name: "BigWholeNumbersDiffer", want: exact(t, `{"v": 9007199254740992, "u": 18446744073709551614}`), got: `{"v": 9007199254740993, "u": 18446744073709551615}`},
		{name: "BigWholeNumberOnlyDiffers", want: exact(t, `{"v": 9007199254740992}`), got: `{"v": 9007199254740993}`},
		{name: "BigWholeNumbersByValue", want: exact(t, `{"v": 9007199254740993, "f": 0.5}`), got: `{"v": 9007199254740993.0, "f": 5e-1}`, ok: true},
		{name: "Unchecked", want: nil, got: `{"anything": true}`, ok: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			failures := checkValue("output", tt.want, []byte(tt.got))
			if tt.ok {
				require.Empty(t, failures)
				return
			}
			require.Len(t, failures, 1)
			require.Contains(t, failures[0], "differs (- want, + got):")
			require.NotContains(t, failures[0], "\u00a0")
		})
	}
}

func TestCheckEvents(t *testing.T) {
	t.Parallel()
	events := []storage.Event{
		{Type: storage.EventInstanceCreated},
		{Step: "charge", Type: storage.EventStepStarted},
		{Step: "charge", Type: storage.EventStepRetrying},
		{Step: "charge", Type: storage.EventStepStarted},
		{Step: "charge", Type: storage.EventStepCompleted},
		{Type: storage.EventInstanceCompleted},
	}
	require.Empty(t, checkEvents([]string{"charge.started", "charge.retrying", "charge.completed", "instance.completed"}, events))
	require.Empty(t, checkEvents([]string{"charge.started", "charge.started"}, events), "an event may be expected as often as it happened")
	failures := checkEvents([]string{"charge.completed", "charge.retrying"}, events)
	require.Len(t, failures, 1)
	require.Contains(t, failures[0], "no charge.retrying after charge.completed")
	require.NotEmpty(t, checkEvents([]string{"charge.started", "charge.started", "charge.started"}, events))
}

func TestCheckStepErrorsAndStatuses(t *testing.T) {
	t.Parallel()
	status, attempts, errText := "completed", 2, "declined"
	se := &StepExpect{Name: "charge", Status: &status, Attempts: &attempts, Error: &errText}
	require.Empty(t, checkStep(se, &storage.Step{Status: storage.StepCompleted, Attempts: 2, Error: "card declined"}))
	failures := checkStep(se, &storage.Step{Status: storage.StepFailed, Attempts: 5, Error: "timeout"})
	require.Equal(t, []string{
		`steps.charge.status: want completed, got failed (error: timeout)`,
		`steps.charge.attempts: want 2, got 5`,
		`steps.charge.error: want an error containing "declined", got "timeout"`,
	}, failures)
}
