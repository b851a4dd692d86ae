package handlers

import (
	"context"
	"time"
)

// StepInfo describes the step attempt a handler is running. The engine puts
// it in the handler's context with [WithInfo]; handlers read it with [Info].
type StepInfo struct {
	InstanceID string
	Workflow   string
	Step       string
	// Attempt is the number of this attempt, starting at 1. Snoozes do not
	// count as attempts.
	Attempt int
	// IdempotencyKey is "<instance>/<step>", or "<instance>/<step>/<index>"
	// for an item of a forEach step: the same on every attempt of the step
	// or item, and different for every other, so handlers can pass it to
	// external systems to make their effects happen once.
	IdempotencyKey string
	// FirstStartedAt is when the step's first attempt started. It is stable
	// across attempts and snoozes, which is what a durable timer needs.
	FirstStartedAt time.Time
	// Item is the index of the item being run for an item of a forEach
	// step, -1 for a step.
	Item int
}

// infoKey is the context key for StepInfo; an unexported type keeps other
// packages from colliding with it.
type infoKey struct{}

// WithInfo returns a copy of ctx carrying info. The engine calls it before
// running a handler; tests call it to run a handler as if inside a step.
func WithInfo(ctx context.Context, info StepInfo) context.Context {
	return context.WithValue(ctx, infoKey{}, info)
}

// Info returns the StepInfo in ctx, or the zero StepInfo when the handler
// runs outside a step (for example when called directly from a test).
func Info(ctx context.Context) StepInfo {
	info, _ := ctx.Value(infoKey{}).(StepInfo)
	return info
}
