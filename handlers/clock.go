package handlers

import (
	"context"
	"time"
)

// clockKey is the context key of the clock a handler reads with [Now].
type clockKey struct{}

// WithClock returns a copy of ctx whose [Now] reads now instead of the
// process's clock. Workflow tests run steps under a fake clock this way,
// so that a durable sleep of a day takes no time at all.
func WithClock(ctx context.Context, now func() time.Time) context.Context {
	return context.WithValue(ctx, clockKey{}, now)
}

// Now returns the current time by the clock in ctx, or time.Now when ctx
// carries none. Handlers that compare durable times (such as
// [StepInfo.FirstStartedAt]) with the present read it here, so that they
// follow the clock the engine runs them under.
func Now(ctx context.Context) time.Time {
	if now, ok := ctx.Value(clockKey{}).(func() time.Time); ok {
		return now()
	}
	return time.Now()
}
