package storage

import (
	"context"
	"fmt"
	"time"
)

// Failure is what failed an instance that has onFailure steps, or whose
// other main steps were running an attempt when a step failed for good.
// The store keeps it on the instance, which stays running (failing) while
// those attempts finish and then while the onFailure steps run, and the
// instance then fails with Error, whatever they did.
type Failure struct {
	Error string
	// Step is the step whose failure failed the instance; "" when no
	// step did (a workflow timeout, an output that failed to evaluate).
	Step string
}

// EventInstanceFailing records that an instance failed and, before it
// ends failed, lets its running main steps finish their attempts and runs
// its onFailure steps.
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
	// WorkflowTimeoutError. A failing instance (its Failure recorded)
	// keeps its deadline only while main steps still run an attempt (see
	// Plan.Failure): when it passes, the store cancels those steps (their
	// claims go stale; their events say WorkflowTimeoutError), clears the
	// deadline, and plans the instance with TimedOut set and its Failure
	// kept, so that its onFailure steps run or it fails with its
	// Failure's error. It returns how many instances it expired.
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
