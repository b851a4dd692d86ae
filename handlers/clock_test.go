package handlers_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/handlers"
)

func TestNowReadsTheClockOfTheContext(t *testing.T) {
	t.Parallel()
	fake := time.Date(2031, 5, 6, 7, 8, 9, 0, time.UTC)
	require.Equal(t, fake, handlers.Now(handlers.WithClock(t.Context(), func() time.Time { return fake })))
	require.WithinDuration(t, time.Now(), handlers.Now(t.Context()), time.Minute)
}

// TestSleepFollowsTheClockOfTheContext: under a fake clock (workflow tests)
// a sleep snoozes until its wake time by that clock, and completes once
// that clock reaches it, however little real time passed.
func TestSleepFollowsTheClockOfTheContext(t *testing.T) {
	t.Parallel()
	h, ok := registryWithBuiltins().Lookup("sleep")
	require.True(t, ok)
	started := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	ctx := handlers.WithInfo(t.Context(), handlers.StepInfo{Attempt: 1, FirstStartedAt: started})

	before := handlers.WithClock(ctx, func() time.Time { return started.Add(time.Hour) })
	_, err := h(before, json.RawMessage(`{"duration":"24h"}`))
	se, isSnooze := errors.AsType[*handlers.SnoozeError](err)
	require.True(t, isSnooze, "want a snooze, got %v", err)
	require.Equal(t, started.Add(24*time.Hour), se.Until)

	after := handlers.WithClock(ctx, func() time.Time { return started.Add(24 * time.Hour) })
	out, err := h(after, json.RawMessage(`{"duration":"24h"}`))
	require.NoError(t, err)
	require.JSONEq(t, `{"sleptUntil":"2030-01-02T00:00:00Z"}`, string(out))
}

func registryWithBuiltins() *handlers.Registry {
	r := handlers.NewRegistry()
	handlers.RegisterBuiltins(r)
	return r
}
