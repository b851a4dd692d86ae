package handlers

import (
	"errors"
	"time"
)

// Permanent marks err as not worth retrying: the engine fails the step at
// once instead of retrying it up to maxAttempts. Use it for errors that
// another attempt with the same input cannot fix, such as invalid input or a
// rejected request.
//
// The result reads exactly as err and unwraps to it, so errors.Is and
// errors.As see through it, and it stays permanent when wrapped further
// (fmt.Errorf("charge: %w", Permanent(err))). Permanent(nil) is nil, so
// `return out, Permanent(err)` is safe on the success path.
func Permanent(err error) error {
	if err == nil || IsPermanent(err) {
		return err
	}
	return &permanentError{err: err}
}

// IsPermanent reports whether err, or any error it wraps, was made by
// [Permanent].
func IsPermanent(err error) bool {
	_, ok := errors.AsType[*permanentError](err)
	return ok
}

// permanentError is unexported: callers only ever need to make one
// ([Permanent]) or test for one ([IsPermanent]), and keeping the type private
// leaves room to change its shape.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Snooze returns an error that tells the engine to put the step back to
// pending until the given time, without counting an attempt and without
// holding a worker or a connection while it waits: a durable sleep that
// survives restarts. The handler runs again from the start at or after until,
// so it must decide from durable facts (such as [StepInfo.FirstStartedAt])
// whether to snooze again. A time in the past makes the step ready at once.
//
// The error is a *SnoozeError, found with errors.As even when wrapped.
func Snooze(until time.Time) error {
	return &SnoozeError{Until: until}
}

// SnoozeError is the error returned by [Snooze]. The engine checks for it
// (errors.As with a *SnoozeError target) before treating an error as a
// failure.
type SnoozeError struct {
	// Until is when the step becomes ready again.
	Until time.Time
}

func (e *SnoozeError) Error() string {
	return "snoozed until " + e.Until.Format(time.RFC3339Nano)
}
