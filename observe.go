package dagrun

import (
	"context"
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
	// waitTimeout is the shortest timeout of the wait steps the plans made
	// waiting (see deadlines.go), when waits is set.
	waitTimeout time.Duration
	waits       bool
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
	r.ended, r.failing, r.orphaned = nil, nil, nil
	r.waitTimeout, r.waits = 0, false
}

func (r *finishRecorder) plan(state *storage.InstanceState) (*storage.Plan, error) {
	p, err := r.engine.plan(state)
	if err == nil && (p.Failure != nil || state.Failure != nil && state.TimedOut > 0) {
		// A recorded failure, or the timeout of a failing instance, which
		// cancelled the steps still running.
		r.recordFailing(state)
	}
	if err == nil {
		r.recordWaits(state, p)
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
	if r.waits {
		r.engine.wakeLocalWorkersBy(time.Now().Add(r.waitTimeout))
		r.waitTimeout, r.waits = 0, false
	}
}

// recordWaits keeps the shortest timeout of the wait steps p makes
// waiting, for report to tell the claim loops of their deadline.
func (r *finishRecorder) recordWaits(state *storage.InstanceState, p *storage.Plan) {
	for _, ch := range p.Steps {
		if ch.Status != storage.StepWaiting {
			continue
		}
		// The plan just loaded the definition: this is a cache hit.
		w, err := r.engine.definition(state.DefinitionHash, state.LoadDefinition)
		if err != nil {
			return
		}
		timeout, ok := waitsTimeOutIn(w, p)
		if !ok {
			return
		}
		r.mu.Lock()
		if !r.waits || timeout < r.waitTimeout {
			r.waitTimeout, r.waits = timeout, true
		}
		r.mu.Unlock()
		return
	}
}
