package dag

import (
	"encoding/json"
	"slices"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// Workflow is a parsed, validated workflow definition. Values returned by
// Parse are safe for concurrent use; do not modify them.
type Workflow struct {
	Name, Description string
	InputSchema       json.RawMessage // the input JSON Schema as JSON; nil when absent
	Steps             []*Step         // definition order
	Output            *Template       // nil when absent
	Schedules         []*Schedule     // the schedule: list, in order
	// Timeout bounds an instance's run, from its start; 0 means none.
	Timeout time.Duration
	// OnFailure are the steps run when an instance fails, in definition
	// order; they are not in Steps.
	OnFailure []*Step
	// Concurrency, when set, limits the running instances per key value;
	// its key may read input and workflow.
	Concurrency *Concurrency
	Source      []byte // the exact file bytes
	Hash        string // hex sha256 of Source

	schema            *jsonschema.Schema // compiled InputSchema
	byName            map[string]*Step
	order             []*Step // topological order, computed once at parse
	failureOrder      []*Step // the same for OnFailure
	nameLine, nameCol int     // position of the name, for LoadDir's duplicate check
	file              string  // the file name given to Parse, for CheckCalls' positions
	partial           bool    // read from a file with errors: never run, never called (ParseFilePartial)
}

// RetryPolicy says how often and how fast a failed step is tried again:
// delay = min(MaxBackoff, Backoff·2^(attempt-1)), with jitter.
type RetryPolicy struct {
	MaxAttempts         int // ≥ 1, counts the first try; default 3
	Backoff, MaxBackoff time.Duration
}

// Built-in defaults, used when neither the step nor the workflow's defaults
// set a field. Steps retry by default, as River and Temporal jobs do: a
// worker that dies mid-step costs its step an attempt (the lease expires),
// so with a single attempt a crash would fail the instance instead of
// moving the step to a live worker. Set maxAttempts: 1 for a step that must
// never run twice.
const (
	DefaultMaxAttempts = 3
	DefaultBackoff     = time.Second
	DefaultMaxBackoff  = time.Minute
	DefaultQueue       = "default"
)

// Bounds on the numbers of a workflow file, so that every value means the
// same on both backends: PostgreSQL counts attempts in 32-bit integers and
// stores durations in whole microseconds (a 500ns timeout would be stored as
// 0, which means no timeout).
const (
	MaxAttemptsLimit = 10_000
	MinDuration      = time.Millisecond
	MaxDuration      = 365 * 24 * time.Hour
)

// Bounds on the size of a workflow, so that validating a file, and planning
// each of its instances, stays quick and small. Both are far above what a
// workflow written by hand needs; a larger process is better split into
// workflows that start one another.
const (
	MaxSteps     = 10_000
	MaxFileBytes = 4 << 20
)

// Step is one node of the workflow. Retry, Timeout and Queue already include
// the values inherited from the workflow's defaults.
type Step struct {
	Name, Handler, Queue string
	DependsOn            []string
	Input                *Template // nil when absent
	When                 *Expr     // nil when absent
	Retry                RetryPolicy
	Timeout              time.Duration // per attempt; 0 means no timeout
	ContinueOnError      bool
	// ForEach, when set, makes the step a forEach step: it runs once per
	// element of the list ForEach gives (an expression or a literal list),
	// with item and index in its input. Concurrency caps its items running
	// at once per instance; 0 means no cap.
	ForEach     *Template
	Concurrency int
	// KeyConcurrency, from concurrency written as {key, limit}, limits the
	// running steps of this name across instances per key value; its key
	// is evaluated when the step becomes ready, like its input.
	KeyConcurrency *Concurrency
	// Wait, when set, makes the step a wait step: instead of running a
	// handler it waits for a signal sent to its instance.
	Wait *Wait
	// OnFailure marks a step of the workflow's onFailure: list.
	OnFailure bool
	// Workflow, when set, makes the step a workflow step: instead of
	// running a handler it starts an instance of the workflow of that
	// name (its child), with Input as the child's input, and completes
	// with the child's output. WorkflowLine and WorkflowCol are where the
	// name is written, for checks across files.
	Workflow                  string
	WorkflowLine, WorkflowCol int
	Line, Col                 int // position of the step in the file
}

// Wait is a wait step's wait: for a signal named Signal (default: the
// step's name), for at most Timeout (0: for ever), with a payload
// satisfying Schema when one is given.
type Wait struct {
	Signal  string
	Timeout time.Duration
	Schema  json.RawMessage // the payload's JSON Schema as JSON; nil when absent

	schema *jsonschema.Schema
}

// AllSteps returns the main steps, then the onFailure steps, in
// definition order: the order of an instance's step rows.
func (w *Workflow) AllSteps() []*Step {
	return slices.Concat(w.Steps, w.OnFailure)
}

// Step returns the step with that name, or nil.
func (w *Workflow) Step(name string) *Step {
	if w.byName != nil {
		return w.byName[name]
	}
	for _, s := range w.Steps {
		if s.Name == name {
			return s
		}
	}
	for _, s := range w.OnFailure {
		if s.Name == name {
			return s
		}
	}
	return nil
}
