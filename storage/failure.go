package storage

import (
	"context"
	"fmt"
	"time"
)

// Failure is what failed an instance that has onFailure steps. The store
// keeps it on the instance, which stays running while those steps run,
// and the instance then fails with Error, whatever they did.
type Failure struct {
	Error string
	// Step is the step whose failure failed the instance; "" when no
	// step did (a workflow timeout, an output that failed to evaluate).
	Step string
}

// EventInstanceFailing records that an instance failed and runs its
// onFailure steps before it ends failed.
const EventInstanceFailing EventType = "instance.failing"

// WorkflowTimeoutError is the error of an instance that ran longer than
// its workflow timeout.
func WorkflowTimeoutError(timeout time.Duration) string {
	return "workflow timed out after " + FormatDuration(timeout)
}

// TimeoutStore is the part of Store that enforces workflow timeouts. An
// instance created with CreateParams.Timeout gets a deadline when it
// starts (its first step claimed, or its first wait begun), the timeout
// after that; RetryInstance gives it a new one from the retry.
type TimeoutStore interface {
	// ExpireInstances fails up to limit running instances whose deadline
	// passed: each is planned with InstanceState.TimedOut set (to its
	// timeout), so that
	// the plan fails it or records its Failure (cancelling its unfinished
	// steps, running ones included: their claims go stale); a plan that
	// does neither is overruled, the instance failed with
	// WorkflowTimeoutError. An instance whose Failure is recorded has no
	// deadline any more. It returns how many instances it expired.
	// NextWake counts these deadlines too.
	ExpireInstances(ctx context.Context, limit int, plan PlanFunc) (int, error)
}

// CheckFailure checks a Plan's Failure against the instance it is for.
func CheckFailure(id string, p *Plan, state *InstanceState) error {
	switch {
	case p.Failure == nil:
		return nil
	case p.Instance != nil:
		return fmt.Errorf("plan for instance %s both finishes it and records a failure: only one is allowed", id)
	case state.Failure != nil:
		return fmt.Errorf("plan for instance %s records a failure, but it failed already (%s)", id, state.Failure.Error)
	case p.Failure.Error == "":
		return fmt.Errorf("plan for instance %s records a failure without an error", id)
	}
	return nil
}
