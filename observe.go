package dagrun

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/dagrun/dagrun/storage"
)

// Observer receives what the engine does, for metrics. Methods are called
// after the transition is committed, from engine goroutines; they must be
// fast and must not block.
type Observer interface {
	InstanceStarted(workflow string)
	InstanceFinished(workflow string, status storage.InstanceStatus)
	AttemptFinished(report AttemptReport)
}

// AttemptReport describes one finished step attempt.
type AttemptReport struct {
	Workflow string
	Step     string
	Handler  string
	Queue    string
	// Outcome is "completed", "retry", "failed" or "snoozed".
	Outcome string
	// Duration is how long the handler ran.
	Duration time.Duration
	// QueueWait is how long the step waited between ready and claimed.
	QueueWait time.Duration
}

type nopObserver struct{}

func (nopObserver) InstanceStarted(string)                          {}
func (nopObserver) InstanceFinished(string, storage.InstanceStatus) {}
func (nopObserver) AttemptFinished(AttemptReport)                   {}

// outcomeName names an outcome in metrics.
func outcomeName(o storage.Outcome) string {
	switch o {
	case storage.OutcomeCompleted:
		return "completed"
	case storage.OutcomeRetry:
		return "retry"
	case storage.OutcomeFailed:
		return "failed"
	case storage.OutcomeSnooze:
		return "snoozed"
	}
	return "unknown"
}

// finishRecorder wraps the plan function for one store call and remembers
// which instances the committed plans finished. A store may run a plan more
// than once when it retries a transaction: the store call takes attach's
// context, and what an attempt that rolled back planned is forgotten when
// the next starts; outcomes are read only after the commit.
type finishRecorder struct {
	engine *Engine
	mu     sync.Mutex
	ended  map[string]finishedInstance
	// failing holds, per instance whose failure a plan recorded, the
	// names of its main steps, whose handlers are to stop.
	failing map[string]map[string]bool
	// orphaned are the instances among failing that had a workflow step
	// running, whose children the failure cancelled.
	orphaned map[string]bool
	// untilDeadline is the shortest time from the plans to a deadline
	// they started (see deadlines.go), when deadlines is set.
	untilDeadline time.Duration
	deadlines     bool
	// children are the workflows of the child instances the plans
	// started, one entry each, counted as started as Engine.Start counts
	// its own.
	children []string
}

type finishedInstance struct {
	workflow string
	status   storage.InstanceStatus
}

func (e *Engine) newFinishRecorder() *finishRecorder {
	return &finishRecorder{engine: e}
}

// attach returns ctx for the store call that uses r.plan: the store tells
// r through it when an attempt of its transaction starts, so that what an
// attempt that rolled back planned is forgotten (storage.WithAttemptHook).
func (r *finishRecorder) attach(ctx context.Context) context.Context {
	return storage.WithAttemptHook(ctx, r.reset)
}

// reset forgets what the plans of an earlier attempt answered.
func (r *finishRecorder) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ended, r.failing, r.orphaned, r.children = nil, nil, nil, nil
	r.untilDeadline, r.deadlines = 0, false
}

func (r *finishRecorder) plan(state *storage.InstanceState) (*storage.Plan, error) {
	p, err := r.engine.plan(state)
	if err == nil && (p.Failure != nil || state.Failure != nil && state.TimedOut > 0) {
		// A recorded failure, or the timeout of a failing instance, which
		// cancelled the steps still running.
		r.recordFailing(state)
	}
	if err == nil {
		r.recordDeadlines(state, p)
		r.recordChildren(p)
	}
	if err != nil || p.Instance == nil {
		return p, err
	}
	r.mu.Lock()
	if r.ended == nil {
		r.ended = map[string]finishedInstance{}
	}
	r.ended[state.ID] = finishedInstance{workflow: state.Workflow, status: p.Instance.Status}
	r.mu.Unlock()
	return p, nil
}

// report tells the observer about the instances finished by the committed
// transaction, and stops this process's handlers of the ones that failed.
func (r *finishRecorder) report() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.engine.tracing != nil && len(r.ended) > 0 {
		// Before the caller goes on, so that a process exiting once its
		// instance finished (a following start) has sent its span.
		ids := make([]string, 0, len(r.ended))
		for id := range r.ended {
			ids = append(ids, id)
		}
		r.engine.endInstances(ids)
	}
	for _, workflow := range r.children {
		r.engine.observer.InstanceStarted(workflow)
	}
	r.children = nil
	for id, f := range r.ended {
		r.engine.observer.InstanceFinished(f.workflow, f.status)
		if f.status != storage.InstanceCompleted {
			// Its running steps and its descendants were cancelled with
			// it: stop this process's handlers now rather than at their
			// next heartbeat.
			r.engine.stopLocalTree(context.Background(), id)
		}
	}
	r.ended = nil
	r.stopFailing()
	if r.deadlines {
		r.engine.wakeLocalWorkersBy(time.Now().Add(r.untilDeadline))
		r.untilDeadline, r.deadlines = 0, false
	}
}

// recordChildren keeps the workflows of the child instances p starts.
func (r *finishRecorder) recordChildren(p *storage.Plan) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ch := range p.Steps {
		for _, child := range ch.Children {
			r.children = append(r.children, child.Workflow)
		}
	}
}

// recordDeadlines keeps the shortest time from now to a deadline p
// starts, for report to tell the claim loops of it (see deadlines.go).
func (r *finishRecorder) recordDeadlines(state *storage.InstanceState, p *storage.Plan) {
	if state.Status != storage.InstancePending && !slices.ContainsFunc(p.Steps, func(ch storage.StepChange) bool {
		return ch.Status == storage.StepWaiting
	}) {
		return
	}
	// Only then may it start one; the plan loaded the definition (this is
	// a cache hit), but not for a finished instance.
	w, err := r.engine.definition(state.DefinitionHash, state.LoadDefinition)
	if err != nil {
		return
	}
	timeout, ok := deadlinesIn(w, state, p)
	if !ok {
		return
	}
	r.mu.Lock()
	if !r.deadlines || timeout < r.untilDeadline {
		r.untilDeadline, r.deadlines = timeout, true
	}
	r.mu.Unlock()
}
