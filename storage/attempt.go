package storage

import "context"

// A store may run a transaction more than once (PostgreSQL does after a
// serialization failure, a deadlock, or a finish planned from a snapshot
// that turned out stale), calling the PlanFunc again in each attempt; only
// the last attempt commits, and it need not plan the instances an earlier
// one did. A caller that gathers what its PlanFunc answered, to act on it
// once the transaction committed (the instances the plans finished, say),
// passes a hook with WithAttemptHook and starts over when it is called: a
// store calls it through AttemptStarted at the start of every attempt of a
// transaction in which it may call the PlanFunc, before the first call.

type attemptHookKey struct{}

// WithAttemptHook returns a copy of ctx that carries hook (see above).
func WithAttemptHook(ctx context.Context, hook func()) context.Context {
	return context.WithValue(ctx, attemptHookKey{}, hook)
}

// AttemptStarted calls the hook ctx carries, if any: a store calls it at
// the start of every attempt of a transaction that may plan.
func AttemptStarted(ctx context.Context) {
	if hook, ok := ctx.Value(attemptHookKey{}).(func()); ok {
		hook()
	}
}
