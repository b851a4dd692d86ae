package handlers_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/handlers"
)

func TestPermanent(t *testing.T) {
	t.Parallel()
	base := &fs.PathError{Op: "open", Path: "/x", Err: fs.ErrNotExist}

	tests := []struct {
		name      string
		err       error
		permanent bool
	}{
		{"Nil", nil, false},
		{"Plain", base, false},
		{"Permanent", handlers.Permanent(base), true},
		{"WrappedOnce", fmt.Errorf("charge: %w", handlers.Permanent(base)), true},
		{"WrappedTwice", fmt.Errorf("step: %w", fmt.Errorf("charge: %w", handlers.Permanent(base))), true},
		{"Joined", errors.Join(errors.New("other"), handlers.Permanent(base)), true},
		{"PermanentOfWrapped", handlers.Permanent(fmt.Errorf("ctx: %w", base)), true},
		{"WrappedWithV", fmt.Errorf("lost: %v", handlers.Permanent(base)), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tt.permanent, handlers.IsPermanent(tt.err))
			if tt.permanent {
				require.ErrorIs(t, tt.err, fs.ErrNotExist)
				pe, ok := errors.AsType[*fs.PathError](tt.err)
				require.True(t, ok)
				require.Equal(t, "/x", pe.Path)
			}
		})
	}

	t.Run("NilStaysNil", func(t *testing.T) {
		t.Parallel()
		require.NoError(t, handlers.Permanent(nil))
	})

	t.Run("MessageUnchanged", func(t *testing.T) {
		t.Parallel()
		require.EqualError(t, handlers.Permanent(errors.New("order 7 has no items")), "order 7 has no items")
	})

	t.Run("Idempotent", func(t *testing.T) {
		t.Parallel()
		err := handlers.Permanent(base)
		require.Same(t, err, handlers.Permanent(err))
	})
}

func TestSnooze(t *testing.T) {
	t.Parallel()
	until := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

	err := handlers.Snooze(until)
	require.EqualError(t, err, "snoozed until 2030-01-02T03:04:05Z")
	require.False(t, handlers.IsPermanent(err), "a snooze is not a failure")

	wrapped := fmt.Errorf("sleep: %w", err)
	se, ok := errors.AsType[*handlers.SnoozeError](wrapped)
	require.True(t, ok)
	require.True(t, se.Until.Equal(until))
}

func TestInfo(t *testing.T) {
	t.Parallel()

	require.Equal(t, handlers.StepInfo{}, handlers.Info(t.Context()), "zero value outside a step")

	info := handlers.StepInfo{
		InstanceID:     "inst-1",
		Workflow:       "order-processing",
		Step:           "charge",
		Attempt:        2,
		IdempotencyKey: "inst-1/charge",
		FirstStartedAt: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC),
	}
	ctx := handlers.WithInfo(t.Context(), info)
	require.Equal(t, info, handlers.Info(ctx))

	// Survives derived contexts, as the engine adds timeouts after WithInfo.
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	require.Equal(t, info, handlers.Info(ctx))
}
