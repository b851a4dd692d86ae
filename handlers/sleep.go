package handlers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// SleepInput is the input of the built-in sleep handler: exactly one of
// Duration and Until.
type SleepInput struct {
	// Duration is a Go duration ("10m", "36h") counted from when the step
	// first started, so retries and restarts do not extend the sleep.
	Duration string `json:"duration,omitempty"`
	// Until is an RFC 3339 time ("2030-01-02T15:04:05Z") to wake at.
	Until string `json:"until,omitempty"`
}

// SleepOutput is the output of the built-in sleep handler.
type SleepOutput struct {
	// SleptUntil is the wake time, RFC 3339 in UTC, to the millisecond.
	SleptUntil string `json:"sleptUntil"`
}

// sleep is durable: rather than block a worker, it computes its wake time
// from durable facts and snoozes the step until then; when the step runs
// again at or after the wake time it completes. A process restart in
// between changes nothing.
func sleep(ctx context.Context, in SleepInput) (SleepOutput, error) {
	now := Now(ctx)
	wake, err := wakeTime(Info(ctx).FirstStartedAt, now, in)
	if err != nil {
		return SleepOutput{}, Permanent(fmt.Errorf("sleep: %w", err))
	}
	if now.Before(wake) {
		Logger(ctx).Info("sleeping", slog.String("until", wake.UTC().Format(time.RFC3339Nano)))
		return SleepOutput{}, Snooze(wake)
	}
	Logger(ctx).Info("woke up", slog.String("slept_until", wake.UTC().Format(time.RFC3339Nano)))
	return SleepOutput{SleptUntil: wake.UTC().Format(time.RFC3339Nano)}, nil
}

// wakeTime resolves in to a wake time. A duration counts from firstStarted,
// or from now outside a step (no StepInfo), where there is no durable start.
//
// The result is rounded up to a whole millisecond. A store that keeps
// timestamps to the millisecond could otherwise make the step ready a hair
// before the wake time, and it would snooze once more; rounding up keeps
// "at least this long" exact. A whole second would be late by up to a
// second: a 1s sleep would take nearly 2s.
func wakeTime(firstStarted, now time.Time, in SleepInput) (time.Time, error) {
	var wake time.Time
	switch {
	case in.Duration != "" && in.Until != "":
		return time.Time{}, errors.New(`give either "duration" or "until", not both`)
	case in.Duration != "":
		d, err := time.ParseDuration(in.Duration)
		if err != nil {
			return time.Time{}, fmt.Errorf("invalid duration: %w", err)
		}
		if d < 0 {
			return time.Time{}, fmt.Errorf("duration must not be negative, got %q", in.Duration)
		}
		if firstStarted.IsZero() {
			firstStarted = now
		}
		wake = firstStarted.Add(d)
	case in.Until != "":
		t, err := time.Parse(time.RFC3339, in.Until)
		if err != nil {
			return time.Time{}, fmt.Errorf("invalid until (want RFC 3339, like 2030-01-02T15:04:05Z): %w", err)
		}
		wake = t
	default:
		return time.Time{}, errors.New(`input needs "duration" (like "10m") or "until" (an RFC 3339 time)`)
	}
	if t := wake.Truncate(time.Millisecond); !t.Equal(wake) {
		wake = t.Add(time.Millisecond)
	}
	return wake, nil
}
