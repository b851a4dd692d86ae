// Package handlers owns what a workflow step runs: the [Handler] function
// type, the [Registry] that maps handler names used in workflow files to
// handlers, the [Typed] adapter that turns a plain typed Go function into a
// handler, the control-flow errors a handler returns to steer the engine
// ([Permanent] and [Snooze]), the per-attempt [StepInfo] the engine puts in a
// handler's context, and the built-in handlers (echo, noop, http, sleep).
//
// Besides the standard library it imports only what the http handler needs
// (x/net's header checks, OpenTelemetry's trace propagation), so that any
// package (the engine, the CLI, a user's own binary, an example) can depend
// on it without pulling in storage, workflow parsing or a database driver.
//
// # Contract
//
// A handler gets the step's resolved input as JSON and returns its output as
// JSON. It runs outside any database transaction and may run more than once
// for the same step (after a crash or a lost lease), so effects must be
// idempotent; [StepInfo.IdempotencyKey] is a key stable across attempts for
// exactly that. The context is cancelled when the step's timeout elapses, the
// instance is cancelled or the worker shuts down.
//
// A returned error is retried with backoff until the step's maxAttempts,
// unless it wraps an error made by [Permanent]. An error made by [Snooze]
// is not a failure: the step goes back to pending until the given time,
// without counting an attempt and without holding a worker.
package handlers
