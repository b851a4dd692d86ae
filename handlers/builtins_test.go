package handlers_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/handlers"
)

// builtin returns the named built-in from a fresh registry.
func builtin(t *testing.T, name string) handlers.Handler {
	t.Helper()
	r := handlers.NewRegistry()
	handlers.RegisterBuiltins(r)
	h, ok := r.Lookup(name)
	require.True(t, ok)
	return h
}

func TestEchoAndNoop(t *testing.T) {
	t.Parallel()
	tests := []struct {
		handler string
		input   string
		want    string
	}{
		{"echo", `{"a":[1,2,{"b":null}]}`, `{"a":[1,2,{"b":null}]}`},
		{"echo", `"text"`, `"text"`},
		{"echo", `null`, `null`},
		{"echo", ``, `null`},
		{"noop", `{"a":1}`, `null`},
		{"noop", ``, `null`},
	}
	for _, tt := range tests {
		t.Run(tt.handler+"/"+tt.input, func(t *testing.T) {
			t.Parallel()
			out, err := builtin(t, tt.handler)(t.Context(), json.RawMessage(tt.input))
			require.NoError(t, err)
			require.JSONEq(t, tt.want, string(out))
		})
	}
}

func TestSleep(t *testing.T) {
	t.Parallel()
	h := builtin(t, "sleep")
	now := time.Now().UTC()
	// Whole seconds, so expected wake times need no rounding.
	firstStarted := now.Truncate(time.Second)
	past := firstStarted.Add(-time.Hour)
	future := firstStarted.Add(time.Hour)

	tests := []struct {
		name         string
		input        string
		firstStarted time.Time
		wantSnooze   time.Time // non-zero: expect a SnoozeError until this time
		wantSlept    time.Time // non-zero: expect completion at this time
	}{
		{name: "UntilPast", input: `{"until":"` + past.Format(time.RFC3339) + `"}`, wantSlept: past},
		{name: "UntilFuture", input: `{"until":"` + future.Format(time.RFC3339) + `"}`, wantSnooze: future},
		{name: "UntilOtherZone", input: `{"until":"` + future.In(time.FixedZone("X", 3600)).Format(time.RFC3339) + `"}`, wantSnooze: future},
		{name: "UntilFractionRoundsUpToAMillisecond", input: `{"until":"` + future.Add(-time.Microsecond).Format(time.RFC3339Nano) + `"}`, wantSnooze: future},
		{name: "UntilMillisecondsKept", input: `{"until":"` + future.Add(-250*time.Millisecond).Format(time.RFC3339Nano) + `"}`, wantSnooze: future.Add(-250 * time.Millisecond)},
		{
			name: "DurationElapsedSinceFirstStart", input: `{"duration":"10m"}`,
			firstStarted: past, wantSlept: past.Add(10 * time.Minute),
		},
		{
			name: "DurationFromFirstStart", input: `{"duration":"90m"}`,
			firstStarted: past, wantSnooze: past.Add(90 * time.Minute),
		},
		{
			name: "DurationFromUnroundedFirstStart", input: `{"duration":"1h"}`,
			firstStarted: firstStarted.Add(-time.Microsecond), wantSnooze: future,
		},
		{name: "ZeroDuration", input: `{"duration":"0s"}`, firstStarted: past, wantSlept: past},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			if !tt.firstStarted.IsZero() {
				ctx = handlers.WithInfo(ctx, handlers.StepInfo{Attempt: 1, FirstStartedAt: tt.firstStarted})
			}
			out, err := h(ctx, json.RawMessage(tt.input))
			if !tt.wantSnooze.IsZero() {
				se, ok := errors.AsType[*handlers.SnoozeError](err)
				require.True(t, ok, "want a snooze, got %v", err)
				require.True(t, tt.wantSnooze.Equal(se.Until), "snooze until %s, want %s", se.Until, tt.wantSnooze)
				require.False(t, handlers.IsPermanent(err))
				return
			}
			require.NoError(t, err)
			require.JSONEq(t, `{"sleptUntil":"`+tt.wantSlept.UTC().Format(time.RFC3339)+`"}`, string(out))
		})
	}

	t.Run("DurationOutsideStepCountsFromNow", func(t *testing.T) {
		t.Parallel()
		before := time.Now()
		_, err := h(t.Context(), json.RawMessage(`{"duration":"1h"}`))
		se, ok := errors.AsType[*handlers.SnoozeError](err)
		require.True(t, ok, "want a snooze, got %v", err)
		require.WithinRange(t, se.Until, before.Add(time.Hour), time.Now().Add(time.Hour+time.Second))
	})

	t.Run("BadInputPermanent", func(t *testing.T) {
		t.Parallel()
		for _, input := range []string{
			``,
			`{}`,
			`{"duration":"10m","until":"2030-01-02T15:04:05Z"}`,
			`{"duration":"ten minutes"}`,
			`{"duration":"-1m"}`,
			`{"until":"tomorrow"}`,
			`{"until":"2030-01-02 15:04:05"}`,
			`{"duration":600}`,
			`[]`,
		} {
			_, err := h(t.Context(), json.RawMessage(input))
			require.Error(t, err, input)
			require.True(t, handlers.IsPermanent(err), "input %s: %v", input, err)
		}
	})
}
