package storage

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// Operator is implemented by stores that let an operator repair instances
// by hand: re-run part of a finished instance, complete a step in its
// place, hold an instance's steps back, and find instances in bulk. Each
// method changes one instance in one transaction and records the actor of
// its context (see WithActor) on the events it writes.
type Operator interface {
	// RetryFrom re-runs step and every step that depends on it, directly
	// or not, of a failed, cancelled or completed instance: they become
	// blocked with attempts, input, output and error cleared (a forEach
	// step loses its items, a wait step the signal it received), failed
	// and cancelled steps elsewhere are re-armed the same way, every
	// other step keeps its output, and the instance runs again (output,
	// error and finish cleared, no longer paused); then plan promotes the
	// ready steps. ErrConflict when the instance is pending or running,
	// ErrNotFound (naming the steps) when it has no such step.
	RetryFrom(ctx context.Context, id, step string, plan PlanFunc) error

	// SkipStep completes a blocked, pending, waiting, failed or cancelled
	// step by hand with output (JSON null when empty), with a
	// step.completed event saying so; a forEach step loses its items. On
	// a failed instance the steps its failure failed or cancelled are
	// re-armed (blocked) and the instance runs again, so the skip repairs
	// it. Then plan lets its dependents proceed. ErrConflict when the
	// step is running, completed or skipped, or the instance is completed
	// or cancelled; ErrNotFound for an unknown instance or step.
	SkipStep(ctx context.Context, id, step string, output json.RawMessage, plan PlanFunc) error

	// PauseInstance stops the claims of an unfinished instance's steps:
	// its pending steps, and every step that becomes pending while it is
	// paused, wait until ResumeInstance. Running steps finish; wait steps
	// still receive signals. ErrConflict when the instance is finished or
	// already paused.
	PauseInstance(ctx context.Context, id string) error

	// ResumeInstance makes a paused instance's pending steps claimable
	// again, each at the time it was due. ErrConflict when the instance
	// is not paused (or finished).
	ResumeInstance(ctx context.Context, id string) error

	// MatchInstances returns the IDs of the instances f selects, oldest
	// first, at most f.Limit (1000 when zero).
	MatchInstances(ctx context.Context, f InstanceFilter) ([]string, error)
}

// InstanceFilter selects instances for a bulk operation. Empty fields
// select everything.
type InstanceFilter struct {
	Workflow string
	Status   InstanceStatus
	// CreatedBefore, when set, selects instances created before it.
	CreatedBefore time.Time
	// TopLevel leaves out child instances (those a workflow step
	// started): a bulk operation acts on what `list` shows, and a child is
	// cancelled and retried with its parent.
	TopLevel bool
	// AfterID pages: only instances created after this one.
	AfterID string
	Limit   int
}

// PauseShiftMicros is how far a paused instance's pending steps are put
// off: their run_after is moved this much (ten thousand years, in
// microseconds) into the future, and back on resume. A claim then skips
// them with the run_after test it makes anyway, so pausing costs the
// claim path nothing. No real run_after comes near it (delays are capped
// at MaxDelay), so a step is paused exactly when its run_after is more
// than half of it ahead.
const PauseShiftMicros = 87_658_200 * 3600 * 1_000_000 // 87,658,200 hours

type actorKey struct{}

// WithActor returns a context whose operations are recorded as done by
// actor (a token's name, or "cli") in the events they write.
func WithActor(ctx context.Context, actor string) context.Context {
	return context.WithValue(ctx, actorKey{}, actor)
}

// ActorOf returns the actor WithActor stored in ctx, or "".
func ActorOf(ctx context.Context) string {
	a, _ := ctx.Value(actorKey{}).(string)
	return a
}

// pausedAfter is the run_after beyond which a step is held back by a
// pause: PauseShiftMicros after the Unix epoch, a time no real run_after
// reaches.
var pausedAfter = time.UnixMicro(PauseShiftMicros)

// Unpaused returns the time a step is due, given its stored run_after,
// which a pause moved PauseShiftMicros ahead: stores show this, not the
// held-back time.
func Unpaused(runAfter time.Time) time.Time {
	if runAfter.After(pausedAfter) {
		return time.UnixMicro(runAfter.UnixMicro() - PauseShiftMicros).In(runAfter.Location())
	}
	return runAfter
}

// Events of operations on instances.
const (
	EventInstancePaused  EventType = "instance.paused"
	EventInstanceResumed EventType = "instance.resumed"
)

// SkippedByHand is the message of the step.completed event of a step that
// SkipStep completed.
const SkippedByHand = "completed by hand"

// Downstream returns the names of from and of every step that depends on
// it, directly or through other steps, given the steps of an instance.
func Downstream(steps []StepState, from string) map[string]bool {
	out := map[string]bool{from: true}
	for grew := true; grew; {
		grew = false
		for _, s := range steps {
			if out[s.Name] {
				continue
			}
			for _, d := range s.DependsOn {
				if out[d] {
					out[s.Name], grew = true, true
					break
				}
			}
		}
	}
	return out
}

// UnknownStepError is the error of an operation naming a step its
// instance does not have; it lists the steps it has.
func UnknownStepError(id, step string, steps []StepState) error {
	names := make([]string, len(steps))
	for i, s := range steps {
		names[i] = s.Name
	}
	return Refuse(ErrNotFound, "instance %s has no step %q (its steps: %s)", id, step, strings.Join(names, ", "))
}

// Skippable reports whether SkipStep may complete a step in this status.
func Skippable(s StepStatus) bool {
	switch s {
	case StepBlocked, StepPending, StepWaiting, StepFailed, StepCancelled:
		return true
	}
	return false
}

// SkipRefusal is the conflict error of SkipStep for a step it may not
// complete, or an instance whose steps it may not change.
func SkipRefusal(id, step string, instance InstanceStatus, status StepStatus) error {
	if instance == InstanceCompleted || instance == InstanceCancelled {
		if instance == InstanceCompleted {
			return Refuse(ErrConflict, "instance %s is completed; to run a step again, retry it from that step (dagrun retry %s --from STEP)", id, id)
		}
		return Refuse(ErrConflict, "instance %s is %s; retry it before skipping a step", id, instance)
	}
	return Refuse(ErrConflict, "step %s of instance %s is %s; only a blocked, pending, waiting, failed or cancelled step can be skipped", step, id, status)
}

// SkipWhileFailingRefusal is the conflict error of SkipStep of a main step
// of a failing instance (Instance.Failing): it failed and has not ended,
// its running steps finishing their attempts and its onFailure steps to
// run. A step completed by hand then would leave its cancelled dependents
// and the recorded failure as they are; once the instance has failed, a
// skip repairs it. Its onFailure steps, which run now, may be skipped.
func SkipWhileFailingRefusal(id string) error {
	return Refuse(ErrConflict, "instance %s is failing: its running steps finish and its onFailure steps run first; skip the step once the instance has failed (an onFailure step may be skipped now)", id)
}

// RetryFromRefusal is the conflict error of RetryFrom on an unfinished
// instance.
func RetryFromRefusal(id string, status InstanceStatus) error {
	return Refuse(ErrConflict, "instance %s is %s; cancel it first or wait", id, status)
}

// PauseRefusal is the conflict error of PauseInstance.
func PauseRefusal(id string, status InstanceStatus) error {
	if status.Finished() {
		return Refuse(ErrConflict, "instance %s is already %s; only a pending or running instance can be paused", id, status)
	}
	return Refuse(ErrConflict, "instance %s is already paused", id)
}

// ResumeRefusal is the conflict error of ResumeInstance.
func ResumeRefusal(id string, status InstanceStatus) error {
	if status.Finished() {
		return Refuse(ErrConflict, "instance %s is %s, not paused", id, status)
	}
	return Refuse(ErrConflict, "instance %s is not paused", id)
}

// Indexes returns the indexes of the steps named in names, in order.
func Indexes(steps []StepState, names map[string]bool) []int {
	var out []int
	for i, s := range steps {
		if names[s.Name] {
			out = append(out, i)
		}
	}
	return out
}

// Rerun returns the indexes of the steps an operation runs again: the
// failed and cancelled ones, except the step at skip (-1: none), and those
// also wants.
func Rerun(steps []StepState, skip int, also map[string]bool) []int {
	var out []int
	for i, s := range steps {
		if i != skip && (also[s.Name] || s.Status == StepFailed || s.Status == StepCancelled) {
			out = append(out, i)
		}
	}
	return out
}

// RefusalError is an operation's refusal: Reason says, in one line, why
// and what to do instead; Err is ErrConflict or ErrNotFound.
type RefusalError struct {
	Reason string
	Err    error
}

func (e *RefusalError) Error() string { return e.Reason + ": " + e.Err.Error() }

// Unwrap returns the sentinel.
func (e *RefusalError) Unwrap() error { return e.Err }

// Refuse returns a RefusalError of sentinel (ErrConflict, ErrNotFound)
// whose reason is the formatted line.
func Refuse(sentinel error, format string, args ...any) error {
	return &RefusalError{Reason: fmt.Sprintf(format, args...), Err: sentinel}
}
