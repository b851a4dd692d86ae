// Package storage defines how dagrun persists workflow instances: the Store
// interface every backend implements, the row types it exchanges with the
// engine, and the sentinel errors callers check with errors.Is.
//
// The interface is shaped around atomic state transitions, not CRUD. Every
// method that changes state does so in one transaction. Where a transition
// needs workflow knowledge (which blocked steps became ready, what their
// resolved input is, whether the instance is finished), the store loads the
// instance inside the transaction and asks the engine through a PlanFunc,
// then applies the returned Plan in that same transaction. The store itself
// knows nothing about workflow definitions.
//
// Leases, run-after, ready and event times need one clock that every
// process agrees on. PostgreSQL, shared by machines whose clocks may
// disagree, takes them from the database server's clock, inside the
// statements that write them (a lease from the moment its step is taken),
// and implements Clock so that a worker can
// check its own clock against it. SQLite is shared only by processes on one
// machine, so its backend reads that machine's clock in Go. Either backend
// takes a Now func in its Config instead, which the conformance suite in
// storage/storagetest uses to drive time deterministically. Times the
// caller passes in (CreateParams.RunAfter, StepResult.RunAfter, Prune's
// cut-off) are absolute: they come from the caller's clock.
//
// It may import only the standard library.
package storage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Sentinel errors. Backends translate driver errors into these at the boundary.
var (
	// ErrNotFound reports that an instance or definition does not exist.
	ErrNotFound = errors.New("not found")
	// ErrConflict reports a transition that the current state does not allow,
	// such as retrying a completed instance or cancelling a finished one.
	ErrConflict = errors.New("conflict")
	// ErrUnavailable wraps errors that mean the database cannot be reached.
	ErrUnavailable = errors.New("storage unavailable")
	// ErrDatabaseLost wraps ErrUnavailable for a database that is gone for
	// good rather than out of reach for a while: its file was deleted,
	// replaced or corrupted while the store had it open. Retrying cannot
	// help, so a worker stops on it instead of running on.
	ErrDatabaseLost = fmt.Errorf("%w: database lost", ErrUnavailable)
)

// InstanceStatus is the lifecycle state of a workflow instance.
type InstanceStatus string

// Instance statuses.
const (
	InstancePending   InstanceStatus = "pending"
	InstanceRunning   InstanceStatus = "running"
	InstanceCompleted InstanceStatus = "completed"
	InstanceFailed    InstanceStatus = "failed"
	InstanceCancelled InstanceStatus = "cancelled"
)

// Finished reports whether the status is terminal.
func (s InstanceStatus) Finished() bool {
	return s == InstanceCompleted || s == InstanceFailed || s == InstanceCancelled
}

// StepStatus is the lifecycle state of one step of an instance.
type StepStatus string

// Step statuses.
const (
	StepBlocked   StepStatus = "blocked"
	StepPending   StepStatus = "pending"
	StepRunning   StepStatus = "running"
	StepCompleted StepStatus = "completed"
	StepFailed    StepStatus = "failed"
	StepSkipped   StepStatus = "skipped"
	StepCancelled StepStatus = "cancelled"
	// StepWaiting is a ready wait step, waiting for its signal; it holds no
	// worker and no lease, only a row (and a deadline when it has a timeout).
	StepWaiting StepStatus = "waiting"
)

// Finished reports whether the status is terminal for the current run of the
// step (a failed or cancelled step can still be re-armed by RetryInstance).
func (s StepStatus) Finished() bool {
	return s == StepCompleted || s == StepFailed || s == StepSkipped || s == StepCancelled
}

// RetryPolicy is how often and how fast a step is retried.
type RetryPolicy struct {
	// MaxAttempts counts the first try; at least 1.
	MaxAttempts int
	// Backoff is the delay before the second attempt.
	Backoff time.Duration
	// MaxBackoff caps the exponential delay.
	MaxBackoff time.Duration
}

// StepSpec describes one step row created with an instance.
type StepSpec struct {
	Name      string
	Handler   string
	Queue     string
	DependsOn []string
	Retry     RetryPolicy
	// Timeout bounds one attempt; zero means no timeout.
	Timeout time.Duration
	// ItemConcurrency caps the items of this step running at once per instance; 0 = no cap.
	ItemConcurrency int
	// ForEach marks a forEach step (its row never runs a handler itself).
	ForEach bool
	// ContinueOnError: an item's terminal failure waits for the other items (output null for it) instead of cancelling them.
	ContinueOnError bool
	// Wait, for a wait step: the signal it waits for and how long (0 = for ever).
	Wait *WaitSpec
	// OnFailure marks a step that runs only when its instance fails (see
	// Plan.Failure); the others are the main steps.
	OnFailure bool
	// ConcurrencyLimit, when positive, is how many steps of this workflow's
	// step name may hold a slot at once per key value (StepChange's
	// ConcurrencyKey); see HeldUntil.
	ConcurrencyLimit int
	// Workflow names the child workflow a workflow step starts; such a row
	// runs no handler: it is running, with no lease, while its child runs.
	Workflow string
}

// ParentRef names the step (and item, for forEach) whose child an instance is.
type ParentRef struct {
	InstanceID string
	Step       string
	// Item is the item index for a child of a forEach item, -1 otherwise.
	Item int
}

// WaitSpec is what a wait step waits for: a signal of this name sent to its
// instance, for at most Timeout (zero: for ever).
type WaitSpec struct {
	Signal  string
	Timeout time.Duration
}

// SignalParams is one signal sent to an instance, named either by
// InstanceID or, by correlation, by Workflow and Key (the instance's
// idempotency key).
type SignalParams struct {
	InstanceID    string
	Workflow, Key string
	Name          string
	// ID, when set, makes a repeat of this signal idempotent.
	ID      string
	Payload json.RawMessage
}

// SignalResult tells what became of a signal.
type SignalResult struct {
	InstanceID string
	// Delivered: it completed a waiting step now (false: stored until the
	// step waits).
	Delivered bool
	// Duplicate: a signal with the same ID was sent before; nothing changed.
	Duplicate bool
}

// CreateParams describes one instance to create.
type CreateParams struct {
	// ID is the new instance's ID, chosen by the caller (sortable by creation).
	ID       string
	Workflow string
	// DefinitionHash keys the definition snapshot; Definition is its source,
	// stored once per hash. A hash is one workflow's: every instance of a
	// hash has the same Workflow.
	DefinitionHash string
	Definition     []byte
	Input          json.RawMessage
	// Key, when set, makes the start idempotent per (Workflow, Key).
	Key      string
	Priority int
	// RunAfter delays the instance's first steps; zero means now.
	RunAfter time.Time
	// Timeout bounds the instance's run from its start (see
	// TimeoutStore); zero means none.
	Timeout time.Duration
	// ConcurrencyLimit, when positive, admits at most that many unfinished
	// instances of Workflow with this ConcurrencyKey at once; the others
	// wait pending, their ready steps held, and are admitted as admitted
	// ones finish, highest Priority first, then in creation order.
	ConcurrencyKey   string
	ConcurrencyLimit int
	// TraceParent is the W3C traceparent of the instance's span, chosen at
	// start ("" when tracing is off), and TraceCaller the span ID (16 hex
	// digits) of the caller's span it is a child of ("" for a root span).
	// Stored as given: the engine checks them.
	TraceParent string
	TraceCaller string
	// Steps in definition order. All are created blocked; the PlanFunc passed
	// to CreateInstances promotes the ready ones in the same transaction.
	// Many CreateParams may share one slice: stores must not modify it.
	Steps []StepSpec
	// Parent is set by the store for the children a plan creates (see
	// StepChange.Children); callers of CreateInstances leave it nil.
	Parent *ParentRef
	// Depth is 0 for a top-level instance, its parent's Depth+1 for a child.
	Depth int
}

// CreateResult tells what CreateInstances did for one CreateParams.
type CreateResult struct {
	ID string
	// Existed is true when an instance with the same workflow and key was
	// already there; ID is then that instance's.
	Existed bool
}

// ClaimParams selects ready steps for a worker.
type ClaimParams struct {
	// WorkerID identifies the claimer in the event history.
	WorkerID string
	// Queues restricts claims to these queues; empty means all.
	Queues []string
	// InstanceID restricts claims to one instance; empty means any.
	InstanceID string
	// Limit is the most steps to claim.
	Limit int
	// Lease is how long the claim holds without a heartbeat.
	Lease time.Duration
	// Handlers restricts claims to steps whose handler is one of these: a
	// worker passes the handlers it registered, so a step that only another
	// binary can run waits for that binary instead of failing here (mixed
	// binaries, rolling deploys). Empty means any handler, for claimers
	// that run every step; a worker never passes it empty.
	Handlers []string
	// TraceParent asks for each claimed step's ClaimedStep.TraceParent,
	// which a worker with tracing on needs; without it the claim reads
	// nothing more than it did before traces existed.
	TraceParent bool
}

// TookAll reports whether a claim with these parameters that returned
// claimed steps took every step that was ready: it asked for any queue and
// any instance and got fewer than its limit. A store that claimed eagerly
// in a transaction need then not wake this process's other claimers, which
// would only run empty claims. Handlers does not count: the claimers of one
// engine share its registry, so a step none of them can run is no reason
// to wake them. Other processes hear of it as before; a second engine with
// other handlers on the same Store value finds it at its next poll.
func (p ClaimParams) TookAll(claimed int) bool {
	return len(p.Queues) == 0 && p.InstanceID == "" && claimed < max(p.Limit, 1)
}

// Claim identifies one claimed attempt. Fence increases on every claim of a
// step, so a finish or heartbeat carrying an older fence is rejected.
type Claim struct {
	StepID     int64
	InstanceID string
	Step       string
	Fence      int64
}

// ClaimedStep is a step a worker now holds, with everything needed to run it.
type ClaimedStep struct {
	Claim
	Workflow string
	Handler  string
	Queue    string
	Input    json.RawMessage
	// Attempt is the number of this attempt, starting at 1.
	Attempt int
	Retry   RetryPolicy
	Timeout time.Duration
	// FirstStartedAt is when the step's first attempt started (stable across
	// attempts and snoozes).
	FirstStartedAt time.Time
	// ReadyAt is when the step became ready, for queue-wait metrics.
	ReadyAt    time.Time
	LeaseUntil time.Time
	// Item is the item's index for an item of a forEach step, -1 for a step.
	Item int
	// TraceParent is the instance's CreateParams.TraceParent, the parent
	// of the attempt's span, when ClaimParams.TraceParent asked for it.
	TraceParent string
}

// Outcome is how an attempt ended.
type Outcome int

// Attempt outcomes.
const (
	// OutcomeCompleted records Output and lets dependents proceed.
	OutcomeCompleted Outcome = iota + 1
	// OutcomeRetry records Error and makes the step pending again at
	// RunAfter; for a main step of a failing instance (see Plan.Failure)
	// it is the step's terminal failure instead.
	OutcomeRetry
	// OutcomeFailed records Error as the step's terminal failure.
	OutcomeFailed
	// OutcomeSnooze makes the step pending again at RunAfter without
	// counting the attempt (durable sleep).
	OutcomeSnooze
)

// StepResult is one finished attempt, reported by the worker that held Claim.
type StepResult struct {
	Claim Claim
	// Attempt is the claim's ClaimedStep.Attempt. With it, a result
	// recorded already is recognised when it comes again (see
	// FinishResult.Repeated); 0 (not known) never is.
	Attempt int
	Outcome Outcome
	Output  json.RawMessage
	Error   string
	// RunAfter is when a retried or snoozed step is due again, at the
	// earliest. Delay puts it off by that long after the store's own now,
	// so that a retry's backoff does not depend on the worker's clock; the
	// later of the two applies.
	RunAfter time.Time
	Delay    time.Duration
	// Logs are what the attempt logged that no AppendLogs stored yet, and
	// LogTrim (when its Drop is positive) the attempt's stored records
	// they push out: the store writes them as AppendLogs would, in the
	// transaction that records the result, whether or not the result is
	// accepted (they are what the attempt did). A step's last records then
	// cost no write of their own.
	Logs    []LogRecord
	LogTrim LogTrim
}

// Recorded reports whether a step found under r's claim (same step and
// fence) and no longer running, in status with attempts and errText, is
// in the state that r's own finish leaves it, which no other change under
// that claim leaves: completed on attempt r.Attempt; failed, or for a
// retry pending again or failed for good (a main step of a failing
// instance), on attempt r.Attempt with r.Error; for a snooze, pending with
// the attempt uncounted. An expired lease writes its own error and a
// cancel leaves the step cancelled, so neither is taken for r (a release
// leaves a snooze's state, but a worker never both releases a claim and
// reports a result of it); a retry
// or snooze that found its instance finished (cancelled too) is not
// recognised either. Backends use it to answer a result that comes again
// (FinishResult.Repeated). A result without its Attempt never matches.
func (r *StepResult) Recorded(status StepStatus, attempts int, errText string) bool {
	if r.Attempt < 1 {
		return false
	}
	switch r.Outcome {
	case OutcomeCompleted:
		return status == StepCompleted && attempts == r.Attempt
	case OutcomeFailed:
		return status == StepFailed && attempts == r.Attempt && errText == r.Error
	case OutcomeRetry:
		return (status == StepPending || status == StepFailed) && attempts == r.Attempt && errText == r.Error
	case OutcomeSnooze:
		return status == StepPending && attempts == r.Attempt-1
	}
	return false
}

// DropRepeatedLogs returns results without the logs of those out answers
// as Repeated: their first commit stored them. It copies results only when
// there is one.
func DropRepeatedLogs(results []StepResult, out []FinishResult) []StepResult {
	copied := false
	for i := range out {
		if !out[i].Repeated || len(results[i].Logs) == 0 && results[i].LogTrim.Drop <= 0 {
			continue
		}
		if !copied {
			results, copied = append([]StepResult(nil), results...), true
		}
		results[i].Logs, results[i].LogTrim = nil, LogTrim{}
	}
	return results
}

// ResultLogs gathers what results carry for the store to write as
// AppendLogs would (see StepResult.Logs).
func ResultLogs(results []StepResult) (trims []LogTrim, records []LogRecord) {
	for i := range results {
		if r := &results[i]; r.LogTrim.Drop > 0 {
			trims = append(trims, r.LogTrim)
		}
		records = append(records, results[i].Logs...)
	}
	return trims, records
}

// InstanceState is what a PlanFunc sees: the instance and all its steps as
// they are inside the transaction, after the triggering change was applied.
type InstanceState struct {
	ID             string
	Workflow       string
	DefinitionHash string
	Status         InstanceStatus
	Input          json.RawMessage
	// Depth is 0 for a top-level instance, its parent's Depth+1 for a child.
	Depth int
	// TraceParent is CreateParams.TraceParent: the W3C traceparent of the
	// instance's span, empty when it started without tracing. The children
	// a plan starts join that trace.
	TraceParent string
	// Steps in definition order.
	Steps []StepState
	// Failure is the instance's recorded failure while its onFailure
	// steps run (see Plan.Failure); nil otherwise.
	Failure *Failure
	// TimedOut, when non-zero, is the workflow timeout the instance ran
	// past (see TimeoutStore): the plan must fail it or record its
	// Failure.
	TimedOut time.Duration
	// Deferred tells that the instance may not start yet: it was created
	// with a delayed start (CreateParams.RunAfter) or under a workflow
	// concurrency limit, and Store.StartDeferred has not planned it since
	// (when its time came and it was admitted), or it is held. Only its
	// claims may start it, so the plan must leave blocked the ready steps
	// that would start it without one (a wait step's wait, a workflow
	// step's child) and say so with Plan.Deferred; StartDeferred plans
	// the instance again when it may start.
	Deferred bool
	// LoadDefinition reads the definition snapshot inside the same
	// transaction; the engine calls it only on a cache miss.
	LoadDefinition func() ([]byte, error)
}

// StepState is one step inside an InstanceState.
type StepState struct {
	Name string
	// DependsOn is the step's StepSpec.DependsOn, as stored on its row.
	DependsOn []string
	Status    StepStatus
	Output    json.RawMessage
	Error     string
	Attempts  int
}

// Plan is the engine's answer to an InstanceState: the further transitions
// the store must apply in the same transaction.
type Plan struct {
	Steps []StepChange
	// Instance, when non-nil, finishes the instance. Finishing it also
	// cancels its unfinished steps, running ones included (a completed
	// instance has none left): their claims become stale, so the workers
	// running them stop the handlers at their next heartbeat, and a step
	// that is not finished always belongs to an unfinished instance. (The
	// engine does not fail an instance so while a step's terminal failure
	// leaves other steps running an attempt: it records a Failure, and
	// finishes the instance once they ended.)
	Instance *InstanceChange
	// Failure, when non-nil (with Instance nil), records that the
	// instance failed while it has onFailure steps to run, or while other
	// main steps run an attempt: the store keeps the Failure on the
	// instance (which is failing: running, Instance.Failing) and, after
	// applying Steps, which may make onFailure steps ready, cancels its
	// unfinished main steps (blocked, pending, waiting, and running
	// forEach steps with their items and workflow steps with their
	// children) but for the running steps that run an attempt (neither
	// forEach nor workflow steps): in-flight work is not aborted halfway.
	// Their attempts finish and are recorded as they end: a completion
	// completes the step, a failure fails it for good (a retry's, or an
	// expired lease's, with attempts left too: nothing new starts in an
	// instance that failed), and the instance is planned again after each
	// (with its Failure set); a snooze or a release puts it back pending,
	// to run to its end as well. The instance keeps its deadline while
	// such a step runs or is pending, and has none after. When the
	// instance timed out (InstanceState.TimedOut), the running ones are
	// cancelled too (their claims go stale), and it has no deadline.
	// The instance stays running until a later plan finishes it.
	Failure *Failure
	// Deferred, for an InstanceState with Deferred set, tells that the
	// plan left ready steps blocked until the instance may start: the
	// store keeps the instance marked for Store.StartDeferred.
	Deferred bool
}

// StepChange moves a blocked step to pending (with its resolved Input),
// skipped, failed (an expression that failed to evaluate), or, for a wait
// step, waiting (with its resolved Input). A step made
// pending gets run_after = max(now, the instance's RunAfter). A step made
// waiting gets its deadline from its WaitSpec's Timeout after now, and is
// completed at once with the payload of a signal of its name already sent
// to the instance. Changing a step
// that is not blocked, or naming an unknown step, is an error that rolls the
// transaction back. The store applies a Plan once and does not call the
// PlanFunc again for the steps it changed, so a Plan must already contain
// the cascade (a skipped step unblocking its dependents).
type StepChange struct {
	Name   string
	Status StepStatus
	Input  json.RawMessage
	Error  string
	// Items, with Status running, expands the step into one pending item per
	// resolved input, in index order. A forEach step over an empty list is
	// completed directly with Output [] instead.
	//
	// An expanded step stays running, with no lease, while any item is
	// unfinished. When every item finished, the store completes it with
	// the JSON array of the item outputs in index order, or fails it when
	// an item failed ("item N failed: ..." for the first by index), the
	// array then holding null for each failed item. Without
	// ContinueOnError the first item to fail for good fails the step at
	// once and cancels its other items. Either way the instance is then
	// planned as after any step's change.
	Items []json.RawMessage
	// Output is the output of a step a plan completes directly.
	Output json.RawMessage
	// ConcurrencyKey is the key value of a step made pending whose spec has
	// a ConcurrencyLimit; empty: the step is not limited.
	ConcurrencyKey string
	// Children, with Status running, starts a workflow step: the store
	// creates one child instance per entry in the same transaction (with
	// Items set too for forEach with workflow: Children[i] belongs to item
	// i, and each item is then running with no lease, like its step). The
	// store sets each child's Parent, creates it with its steps, plans it
	// with the same PlanFunc, and records the child's ID on the step (or
	// item) row. The step (item) stays running, never claimed nor
	// lease-recovered, until its child finishes: in the transaction that
	// finishes the child, a completed child completes it with the child's
	// output; a failed or cancelled child fails it for good ("child
	// instance ID failed: ERROR", "child instance ID was cancelled"); the
	// parent instance is then planned as after any step's change.
	Children []CreateParams
}

// InstanceChange finishes an instance.
type InstanceChange struct {
	Status InstanceStatus
	Output json.RawMessage
	Error  string
	// FailedStep is, for a failed instance, the step whose failure failed
	// it ("": none did, or it was recorded with a Failure before);
	// Instance.FailedStep reads it.
	FailedStep string
}

// PlanFunc computes a Plan. It must be pure: it runs inside a write
// transaction and may be called more than once if the store retries (see
// WithAttemptHook for a caller that gathers what it answered).
type PlanFunc func(*InstanceState) (*Plan, error)

// FinishResult tells what became of one StepResult.
type FinishResult struct {
	// Accepted is true when the result is recorded: by this call, or by
	// an earlier one (Repeated). It is false when the claim no longer
	// held; nothing was written for it.
	Accepted bool
	// Repeated tells, for an accepted result, that an earlier call
	// recorded it and this one wrote nothing: the step, found under the
	// result's claim (same fence) and no longer running, is in the state
	// that result leaves (see StepResult.Recorded). A commit that
	// succeeded while its answer was lost (the connection dropped as it
	// was acknowledged) is tried again by its worker and answered so,
	// instead of as stale.
	Repeated bool
	// Cancelled tells, for a result not accepted, that the step was
	// cancelled under this very claim (its instance was cancelled or
	// failed) rather than taken over by a newer attempt: an expected end,
	// not a sign of a lost lease.
	Cancelled bool
}

// Instance is an instance with its steps and, from GetInstance, its latest
// events.
type Instance struct {
	ID             string
	Workflow       string
	DefinitionHash string
	Status         InstanceStatus
	Input          json.RawMessage
	Output         json.RawMessage
	Error          string
	Key            string
	Priority       int
	RunAfter       time.Time
	// Timeout is the workflow timeout (zero: none); Deadline is when the
	// running instance times out (nil: never, or not running).
	Timeout  time.Duration
	Deadline *time.Time
	// FailedStep is the step whose failure failed the instance ("" when
	// none did), and Failing tells that it failed but has not ended yet:
	// its running main steps finish their attempts, then its onFailure
	// steps run (see Plan.Failure).
	FailedStep string
	Failing    bool
	CreatedAt  time.Time
	StartedAt  *time.Time
	FinishedAt *time.Time
	Steps      []Step
	// Events are, from GetInstance, the latest InstanceEvents events of the
	// history in ID order; EventsTruncated tells that older ones exist.
	Events          []Event
	EventsTruncated bool
	// Definition is the snapshot source; set by GetInstance only.
	Definition []byte
	// Paused is set between Operator.PauseInstance and ResumeInstance
	// (never on a finished instance): its steps are not claimed.
	Paused bool
	// ConcurrencyKey is the value of its workflow's concurrency key ("":
	// no workflow limit applies); Held tells that the unfinished instance
	// waits for a slot of that key, all of them taken by instances
	// admitted before it (CreateParams.ConcurrencyLimit).
	ConcurrencyKey string
	Held           bool
	// TraceParent and TraceCaller are as CreateParams gave them.
	TraceParent string
	TraceCaller string
	// Parent names the step whose child this instance is; nil for a
	// top-level instance.
	Parent *ParentRef
	// Depth is 0 for a top-level instance, its parent's Depth+1 for a child.
	Depth int
}

// Step is one step row.
type Step struct {
	ID         int64
	Name       string
	Handler    string
	Queue      string
	DependsOn  []string
	Status     StepStatus
	Attempts   int
	Retry      RetryPolicy
	Timeout    time.Duration
	Input      json.RawMessage
	Output     json.RawMessage
	Error      string
	RunAfter   time.Time
	ReadyAt    *time.Time
	StartedAt  *time.Time
	FinishedAt *time.Time
	LeaseUntil *time.Time
	WorkerID   string
	// Signal is the signal a wait step waits for; Deadline is when a
	// waiting step times out (nil: never, or not waiting).
	Signal   string
	Deadline *time.Time
	// Items counts the items of an expanded forEach step; nil for any other step.
	Items *ItemCounts
	// OnFailure marks a step of the instance's onFailure steps.
	OnFailure bool
	// Workflow is the child workflow of a workflow step ("" for others).
	Workflow string
	// Children are the IDs of the step's child instances, in item order for
	// forEach (nil: none started).
	Children []string
}

// ItemCounts counts the items of a forEach step by status. An item of a
// forEach workflow step whose child instance is held by its concurrency
// limit counts as pending, as ListItems shows it: nothing of it runs yet.
type ItemCounts struct{ Total, Pending, Running, Completed, Failed, Cancelled int }

// Item is one item of a forEach step. An item is claimed, leased, retried,
// recovered and cancelled like a step (a claimed item is a ClaimedStep with
// Item set), but writes no events of its own: an instance's history shows
// its forEach step's expansion and outcome, however many items it has.
type Item struct {
	Index      int
	Status     StepStatus
	Attempts   int
	Input      json.RawMessage
	Output     json.RawMessage
	Error      string
	StartedAt  *time.Time
	FinishedAt *time.Time
	WorkerID   string
	// Child is the item's child instance ID, for an item of a forEach
	// workflow step ("" otherwise).
	Child string
}

// ItemsParams pages the items of one step, in index order.
type ItemsParams struct {
	InstanceID string
	Step       string
	Offset     int
	// Limit defaults to 100 when zero.
	Limit int
	// Status, when set, returns only the items in that status.
	Status StepStatus
}

// EventType names one kind of transition in the history.
type EventType string

// Event types.
const (
	EventInstanceCreated   EventType = "instance.created"
	EventInstanceStarted   EventType = "instance.started"
	EventInstanceCompleted EventType = "instance.completed"
	EventInstanceFailed    EventType = "instance.failed"
	EventInstanceCancelled EventType = "instance.cancelled"
	EventInstanceRetried   EventType = "instance.retried"
	EventStepReady         EventType = "step.ready"
	EventStepStarted       EventType = "step.started"
	EventStepCompleted     EventType = "step.completed"
	EventStepFailed        EventType = "step.failed"
	EventStepRetrying      EventType = "step.retrying"
	EventStepSnoozed       EventType = "step.snoozed"
	EventStepSkipped       EventType = "step.skipped"
	EventStepCancelled     EventType = "step.cancelled"
	EventStepReleased      EventType = "step.released"
	EventStepLeaseExpired  EventType = "step.lease_expired"
)

// Event is one entry of an instance's history.
type Event struct {
	ID         int64
	InstanceID string
	Step       string
	Type       EventType
	Attempt    int
	Message    string
	At         time.Time
	// Actor is who did it by hand ("cli", or the API token's name); empty
	// for what the engine did on its own.
	Actor string
}

// ListParams filters ListInstances. Results are newest first.
type ListParams struct {
	Workflow string
	// Key, with Workflow, finds the instance started with that
	// idempotency key.
	Key    string
	Status InstanceStatus
	// Limit defaults to 50 when zero.
	Limit int
	// BeforeID pages: only instances created before this one.
	BeforeID string
	// Parent, when set, returns only the children of this instance.
	Parent string
	// TopLevel returns only instances without a parent (what the CLI and
	// the API list by default).
	TopLevel bool
}

// LogRecord is one record a handler logged during an attempt.
type LogRecord struct {
	// Seq orders the records of an instance; the store assigns it, growing
	// with every record it stores.
	Seq int64
	// StepID, when set, is the Claim.StepID of the attempt: a store may
	// find the step by it rather than by InstanceID and Step, which it
	// must match.
	StepID     int64
	InstanceID string
	Step       string
	// Item is the item's index for an item of a forEach step, -1 for a step.
	Item    int
	Attempt int
	Time    time.Time
	// Level is the slog level's name: DEBUG, INFO, WARN or ERROR (with an
	// offset such as INFO+2 for the levels between).
	Level   string
	Message string
	// Attrs is a JSON object of the record's attributes, nil when it has none.
	Attrs json.RawMessage
}

// LogTrim bounds what an attempt keeps: it drops the Drop oldest stored
// records of one attempt, and the newest of those dropped is not deleted but
// becomes a marker record saying Marker (level INFO, no attributes), so the
// marker keeps its place before the records that remain.
type LogTrim struct {
	InstanceID string
	Step       string
	Item       int
	Attempt    int
	Drop       int
	Marker     string
}

// LogsParams selects log records for ListLogs.
type LogsParams struct {
	InstanceID string
	// Step, when set, selects one step's records; empty: every step's.
	Step     string
	AfterSeq int64
	// Limit defaults to 1000 when zero.
	Limit int
}

// PresenceTTL is how long a worker counts as live after it last announced
// itself: a running worker renews its announcement every third of it, so
// one missed renewal does not make it look gone.
const PresenceTTL = 30 * time.Second

// WorkerInfo is a running worker's announcement of itself (worker
// presence): which steps it can take, and when it was last heard of.
type WorkerInfo struct {
	ID string
	// Handlers are the handler names the worker registered; it claims no
	// other step. Empty: it can run nothing.
	Handlers []string
	// Queues are the queues it claims from; empty means every queue.
	Queues []string
	// StartedAt is when the store first recorded it, LastSeen when it last
	// announced itself; both from the store's clock, set by the store.
	StartedAt time.Time
	LastSeen  time.Time
}

// StatsWindow is how many of the most recently finished instances the step
// duration percentiles of Stats are computed over.
const StatsWindow = 1000

// Stats summarises the store per workflow and per queue.
type Stats struct {
	// Workflows holds one entry per workflow with instances in the store,
	// sorted by workflow name.
	Workflows []WorkflowStats
	// Queues holds one entry per queue with at least one ready or running
	// step, sorted by queue name. Queues whose steps are all blocked,
	// pending but not yet due, or finished are absent.
	Queues []QueueStats
	// Unserved holds one entry per handler with ready steps that no live
	// worker (one seen within PresenceTTL) can claim: none registered the
	// handler for the step's queue. Sorted by handler; empty when every
	// ready step has a worker. These steps wait until a binary with the
	// handler runs a worker.
	Unserved []HandlerStats
}

// HandlerStats is the summary of the ready steps of one handler.
type HandlerStats struct {
	Handler string
	// Ready counts pending steps whose run_after has passed.
	Ready int
	// OldestReady is the age of the oldest of them.
	OldestReady time.Duration
}

// QueueStats is the summary of one queue's unfinished steps, what a worker
// pool serving that queue has to do and is doing.
type QueueStats struct {
	Queue string
	// Ready counts pending steps whose run_after has passed (claimable, as
	// far as the step goes). Pending steps not yet due are not counted.
	Ready int
	// Running counts running steps (claimed), stuck ones included.
	Running int
	// Stuck counts running steps whose lease has expired, a subset of
	// Running.
	Stuck int
}

// WorkflowStats is the summary of one workflow's instances and steps.
type WorkflowStats struct {
	Workflow string
	// Instances counts instances per status.
	Instances map[InstanceStatus]int
	// RunningSteps counts running steps (claimed), stuck ones included.
	RunningSteps int
	// StuckSteps counts running steps whose lease has expired, a subset of
	// RunningSteps.
	StuckSteps int
	// ReadySteps counts pending steps whose run_after has passed.
	ReadySteps int
	// OldestReady is the age of the oldest ready step; zero when none.
	OldestReady time.Duration
	// WaitingSteps counts wait steps waiting for their signal.
	WaitingSteps int
	// StepP50 and StepP95 are completed-attempt durations (from the start of
	// the attempt that completed to its finish), nearest-rank percentiles
	// (Postgres' percentile_disc) over the completed steps of the
	// StatsWindow most recently finished instances: recent behaviour, at a
	// cost that does not grow with the history kept. Both are zero when
	// none completed.
	StepP50 time.Duration
	StepP95 time.Duration
}

// Store is the persistence every backend implements. All methods are safe
// for concurrent use by many goroutines and many processes.
type Store interface {
	ScheduleStore
	TimeoutStore
	LimitStore

	// CreateInstances creates instances with their definition snapshots and
	// step rows, all blocked, then applies plan to each in the same
	// transaction. A params with a Key already used for its workflow creates
	// nothing and reports the existing instance. tx is nil, or a transaction
	// of the caller's own (*sql.Tx for SQLite, pgx.Tx for Postgres) so the
	// start commits or rolls back with the caller's business writes; the
	// store does not commit a caller's transaction.
	CreateInstances(ctx context.Context, tx any, params []CreateParams, plan PlanFunc) ([]CreateResult, error)

	// ClaimSteps atomically claims up to p.Limit ready steps (pending,
	// run_after passed, instance not finished; of p.Handlers, p.Queues and
	// p.InstanceID when given), highest priority first, then the earliest
	// run_after; increments their attempts and fences; and takes a lease.
	// A step made ready by its dependencies (or an item of a forEach step)
	// gets its instance's run_after, the time the instance could first
	// run: it takes its instance's place, ahead of the steps of instances
	// that started later, so that started instances finish first (as
	// Airflow orders task instances by their run's date). A step due at a
	// time of its own (a retry's backoff, a snooze, a released claim) gets
	// that time.
	// The first claim of an instance's step moves it from pending to
	// running. A Limit below 1 claims one step; Lease must be positive.
	// Items of forEach steps are claimed like steps (ClaimedStep.Item is
	// their index, -1 for a step); an item of a step with ItemConcurrency
	// is taken only while fewer than that many of the step's items run,
	// however many one claim takes.
	ClaimSteps(ctx context.Context, p ClaimParams) ([]ClaimedStep, error)

	// ExtendLeases renews the leases of claims still held, to now+lease, and
	// returns the claims that are no longer held (stale fence, or the step is
	// no longer running, e.g. cancelled) so their handlers can be stopped.
	ExtendLeases(ctx context.Context, claims []Claim, lease time.Duration) (lost []Claim, err error)

	// ReleaseSteps returns held claims to pending without counting the
	// attempt (graceful shutdown).
	ReleaseSteps(ctx context.Context, claims []Claim) error

	// AdoptSteps returns the steps leased to p.WorkerID that it does not
	// know it holds: running, their lease not expired, claimed within
	// p.Within, and not among p.Held (by step and fence). A claim whose
	// commit succeeded while its answer was lost leaves such steps, which
	// no handler ran (see adopt.go). It renews their leases to now+p.Lease
	// and returns each as its claim did, with the fence and attempt it
	// holds, in claim order; nothing else changes: no event is written and
	// no attempt counted again. This is safe only while no other running
	// worker has the same ID.
	AdoptSteps(ctx context.Context, p AdoptParams) ([]ClaimedStep, error)

	// FinishSteps records finished attempts in one transaction (group
	// commit). A result whose claim is stale is not applied; one recorded
	// already by an earlier call is not applied again, and is answered as
	// accepted with Repeated set (see StepResult.Recorded). An item that
	// completes or fails for good settles its forEach step in the same
	// transaction (see StepChange.Items), which then counts as that
	// step's completion or failure. For each
	// unfinished instance touched by a completion or terminal failure, plan
	// is called once, after all of that instance's results were applied, and
	// its Plan applied. A plan that fails the instance cancels its running
	// steps too; their results are then refused with Cancelled set. (A
	// retry or snooze of a step whose instance finished, like a release or
	// a lease recovery, cancels it instead of queueing it again.)
	FinishSteps(ctx context.Context, results []StepResult, plan PlanFunc) ([]FinishResult, error)

	// ExpireWaits fails up to limit waiting steps whose deadline passed
	// ("no signal NAME within D", for good), planning their instances as a
	// terminal failure does. It returns how many it failed.
	ExpireWaits(ctx context.Context, limit int, plan PlanFunc) (int, error)

	// StartDeferred plans again up to limit instances marked as not
	// started yet (NewInstance.Deferred, Plan.Deferred) that may start
	// now: their delayed start has come, they are admitted by their
	// workflow concurrency limit (StartDeferred admits a held one whose
	// time has come if its key has room, as the promotion of its first
	// step would), not paused and not finished. A held one whose time has
	// come and whose key is full it parks, with the key's other such
	// instances (NewInstance.Parked): no later call or NextWake reads them
	// again, and only a finish of an admitted instance of the key admits
	// them, whatever time that finish reads. The plan sees them without
	// InstanceState.Deferred, so it starts the steps it left blocked
	// (a step that waits, or starts a child, starts its instance). It
	// returns how many it planned.
	StartDeferred(ctx context.Context, limit int, plan PlanFunc) (int, error)

	// NextWake returns the earliest time after now at which a step of
	// p.Queues and p.Handlers (as ClaimSteps filters them) becomes
	// claimable, a waiting step or a running instance times out, or an
	// instance kept for StartDeferred may start: what a worker with
	// nothing to do sleeps until. Zero when there is none. A store may
	// answer earlier than that, never later, when finding p's next step
	// would mean reading past many delayed steps of other queues and
	// handlers: it then answers a time before which none of p's falls
	// due, and a worker woken then finds nothing and asks again, each
	// answer later than the last.
	NextWake(ctx context.Context, p ClaimParams) (time.Time, error)

	// RecoverExpired takes back up to limit running steps whose lease ended
	// before now: each counts as a failed attempt, pending again after its
	// retry delay, or failed for good when attempts are exhausted or it is
	// a main step of a failing instance (see Plan.Failure); then plan is
	// called for the instance. It returns how many it recovered.
	RecoverExpired(ctx context.Context, limit int, plan PlanFunc) (int, error)

	// CancelInstance cancels an unfinished instance and its unfinished steps
	// and items (running ones included: their claims become stale).
	// ErrConflict if the instance is already finished, ErrNotFound if
	// absent. Its unfinished descendants (child instances, recursively)
	// are cancelled in the same transaction. plan is called for the parent
	// instance of a child cancelled this way, whose workflow step the
	// cancellation fails (see StepChange.Children).
	CancelInstance(ctx context.Context, id, reason string, plan PlanFunc) error

	// RetryInstance re-arms a failed or cancelled instance: its failed and
	// cancelled steps become blocked with attempts reset, the instance
	// running, then plan promotes the ready ones. Completed outputs stay. A
	// forEach step that expanded runs again instead: its failed and
	// cancelled items become pending with attempts reset, its completed
	// ones keep their outputs. A failed workflow step with a child runs
	// again by retrying its child the same way (recursively) instead of
	// starting a new one. A child whose parent instance is finished is
	// ErrConflict: retry the parent instead.
	RetryInstance(ctx context.Context, id string, plan PlanFunc) error

	// SendSignal stores a signal and, when its step is waiting, completes
	// the step with the payload as output and plans the instance
	// (dependents ready) in the same transaction; a signal stored before
	// its step waits is delivered when the step becomes ready. One signal
	// per (instance, name): a second one is ErrConflict unless it carries
	// the same non-empty ID (then Duplicate, nothing changes), also when
	// two senders race from different processes. ErrNotFound: no such
	// instance. ErrConflict: the instance is finished. The caller (the
	// engine) validates the name and payload first.
	SendSignal(ctx context.Context, p SignalParams, plan PlanFunc) (SignalResult, error)

	// GetInstance returns the instance with its steps, its definition and
	// the latest InstanceEvents events of its history: its cost does not
	// grow with the history's length.
	GetInstance(ctx context.Context, id string) (*Instance, error)

	// ListEvents returns a page of an instance's history: the events with
	// an ID above p.AfterID, in ID order, at most p.Limit. ErrNotFound when
	// the instance does not exist. On PostgreSQL a transaction may commit
	// after another that took greater event IDs, so an event can appear
	// behind a page already read: a follower uses FollowEvents instead.
	ListEvents(ctx context.Context, p EventsParams) ([]Event, error)

	// FollowEvents returns the events of an instance's history that a
	// follower has not seen, and the cursor of its next call. The zero
	// cursor returns the latest FollowTail events in ID order; every later
	// call the events that became visible since the call that returned its
	// cursor, in ID order, whatever their IDs: along a chain of cursors no
	// event is returned twice and none is missed, even one whose
	// transaction committed after another that took greater IDs. It reads
	// only those events, however long the history. ErrNotFound when the
	// instance does not exist.
	FollowEvents(ctx context.Context, instanceID string, cursor EventCursor) ([]Event, EventCursor, error)

	// ListInstances returns instances with their steps (no events), newest
	// first.
	ListInstances(ctx context.Context, p ListParams) ([]Instance, error)

	// ListItems returns a page of a forEach step's items in index order.
	// ErrNotFound when the instance or step does not exist.
	ListItems(ctx context.Context, p ItemsParams) ([]Item, error)

	// Stats summarises instances and steps per workflow, and unfinished
	// steps per queue, as of the store's clock.
	Stats(ctx context.Context) (*Stats, error)

	// Prune deletes finished instances that finished before olderThan, with
	// their steps, events and logs, and the definition snapshots no remaining
	// instance uses, in the same transaction; with dryRun it only counts
	// the instances. Child instances go with their top-level ancestor, and
	// only with it (they are not counted).
	Prune(ctx context.Context, olderThan time.Time, dryRun bool) (int, error)

	// AppendLogs stores step log records in one transaction: first it
	// applies trims (each drops an attempt's oldest records, see LogTrim),
	// then it appends records, giving each the next Seq in their order.
	// Records of an instance that no longer exists are dropped silently.
	AppendLogs(ctx context.Context, trims []LogTrim, records []LogRecord) error

	// ListLogs returns the log records of an instance (of one step when
	// p.Step is set, its items and attempts included) with Seq after
	// p.AfterSeq, in Seq order. ErrNotFound when the instance does not
	// exist.
	ListLogs(ctx context.Context, p LogsParams) ([]LogRecord, error)

	// AnnounceWorker records that worker w.ID is alive with w.Handlers and
	// w.Queues, as of the store's clock: the first call sets StartedAt,
	// every call LastSeen (a running worker calls it every third of
	// PresenceTTL). It also deletes the rows of workers not seen for
	// PresenceTTL, which stopped without saying so.
	AnnounceWorker(ctx context.Context, w WorkerInfo) error

	// RemoveWorker deletes a worker's announcement when it stops; an
	// unknown ID is not an error.
	RemoveWorker(ctx context.Context, id string) error

	// ListWorkers returns the live workers (seen within PresenceTTL),
	// sorted by ID, with their handlers and queues sorted.
	ListWorkers(ctx context.Context) ([]WorkerInfo, error)

	// Subscribe returns a channel that receives a value (coalesced) whenever
	// steps of queues (of any queue when queues is empty) may have become
	// ready, from this process or, where the backend can tell, from others.
	// A store may signal for steps of other queues too, when it cannot tell
	// which queues changed. Polling remains the fallback. cancel releases
	// it.
	Subscribe(queues []string) (ch <-chan struct{}, cancel func())

	// Close releases what the store opened itself (not a pool it was given).
	Close() error
}

// FinishClaimer is implemented by stores that can claim in the same
// transaction that finishes: a worker hands back its finished attempts and
// takes new steps for the slots they free with one commit instead of two.
// This is what Temporal calls eager dispatch; on a chain it also saves the
// wake-up between a step and the one it made ready.
type FinishClaimer interface {
	// FinishAndClaim is FinishSteps followed by ClaimSteps(p), atomically.
	// A store may leave the claim out, returning no steps, when the
	// transaction made nothing ready and it knows that anything the claim
	// could find will be announced to its subscribers (Subscribe): the
	// PostgreSQL store does so for a worker whose last ClaimStepsAndWake
	// found nothing to claim and nothing due later, with nothing announced
	// since. So an empty claim proves nothing about what is ready; the
	// caller claims again when its subscription signals.
	FinishAndClaim(ctx context.Context, results []StepResult, plan PlanFunc, p ClaimParams) ([]FinishResult, []ClaimedStep, error)
}

// CreateClaimer is implemented by stores that can claim in the same
// transaction that creates instances: an idle worker of the starting
// process then takes a new instance's first steps without a claim
// transaction of its own or a wake-up (Temporal's eager workflow start).
type CreateClaimer interface {
	// CreateAndClaim is CreateInstances (in the store's own transaction)
	// followed by ClaimSteps(p), atomically.
	CreateAndClaim(ctx context.Context, params []CreateParams, plan PlanFunc, p ClaimParams) ([]CreateResult, []ClaimedStep, error)
}

// WakeClaimer is implemented by stores that can answer NextWake in the
// transaction of a claim: a worker that finds too little to do learns when
// to look again in the same round trip, so that an idle worker's poll is
// one transaction, not two.
type WakeClaimer interface {
	// ClaimStepsAndWake is ClaimSteps(p) and, when the claim took fewer
	// than p.Limit steps, NextWake(p) as of the end of the claim; a claim
	// that took p.Limit steps returns the zero time, since its worker
	// claims again when a slot frees. The time may be earlier than
	// NextWake's would be just after, never later.
	ClaimStepsAndWake(ctx context.Context, p ClaimParams) ([]ClaimedStep, time.Time, error)
}

// Clock is implemented by stores whose times come from a database server's
// clock rather than the calling process's (see the package doc), so that a
// worker can warn when its own clock disagrees.
type Clock interface {
	// Now returns the current time by the clock the store stamps its rows
	// with.
	Now(ctx context.Context) (time.Time, error)
}

// Delay returns the backoff before attempt+1 after attempt failed:
// min(MaxBackoff, Backoff·2^(attempt-1)), with up to 20% jitter subtracted
// so that many failing steps do not retry in lockstep. jitter is a value in
// [0,1), normally rand.Float64(). A zero MaxBackoff means no cap of the
// policy's own, but no delay ever exceeds MaxDelay, however high the
// attempt number: doubling stops there rather than overflowing.
func (p RetryPolicy) Delay(attempt int, jitter float64) time.Duration {
	if p.Backoff <= 0 {
		return 0
	}
	limit := MaxDelay
	if p.MaxBackoff > 0 && p.MaxBackoff < limit {
		limit = p.MaxBackoff
	}
	d := min(p.Backoff, limit)
	for i := 1; i < attempt && d < limit; i++ {
		d = min(2*d, limit) // d <= MaxDelay, so 2*d cannot overflow
	}
	jitter = min(max(jitter, 0), 1)
	return d - time.Duration(float64(d)*0.2*jitter)
}

// MaxDelay bounds every retry delay: a step is never put off for more than
// a year, whatever its policy and attempt number.
const MaxDelay = 365 * 24 * time.Hour
