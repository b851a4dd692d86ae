package dagrun

import (
	"context"
	"time"

	"github.com/dagrun/dagrun/dag"
	"github.com/dagrun/dagrun/storage"
)

// This file is the engine side of workflow timeouts and onFailure steps.
// An instance that fails (a step failed for good, its workflow timeout
// passed, its output failed to evaluate) while its workflow has onFailure
// steps, or while other main steps run an attempt, does not end at once:
// the plan records the failure, the store cancels the unfinished main
// steps but for the running attempts when a step failed (in-flight work is
// not aborted halfway; a timeout or a cancel still stops it), and the
// instance stays running, failing. Once no main step runs any more (their
// attempts recorded as they end, without retries), its onFailure steps
// run; when none of them is left to run, whatever they did, it fails with
// the original error.

// settle finishes a plan of the main steps: a failure of an instance with
// onFailure steps, or of one whose other main steps still run an attempt,
// becomes a recorded Failure (the instance is failing), and a completion
// skips the onFailure steps.
func (p *planner) settle(plan *storage.Plan) *storage.Plan {
	ic := plan.Instance
	switch {
	case ic == nil:
		return plan
	case ic.Status == storage.InstanceFailed && (len(p.w.OnFailure) > 0 || p.failedStep != "" && p.inFlight()):
		plan.Instance = nil
		return p.fail(plan, &storage.Failure{Error: ic.Error, Step: p.failedStep})
	case ic.Status == storage.InstanceFailed:
		ic.FailedStep = p.failedStep
		p.dropStarts(plan)
		return plan
	case ic.Status == storage.InstanceCompleted && len(p.w.OnFailure) > 0:
		// Shown as skipped, not cancelled: nothing went wrong.
		for _, s := range p.w.OnFailure {
			if p.status[s.Name] == storage.StepBlocked {
				plan.Steps = append(plan.Steps, storage.StepChange{Name: s.Name, Status: storage.StepSkipped})
			}
		}
	}
	return plan
}

// runsAttempt reports whether step, when running, runs an attempt of a
// handler on some worker: neither a forEach step (its items run) nor a
// workflow step (its child runs).
func runsAttempt(step *dag.Step) bool {
	return step.ForEach == nil && step.Workflow == ""
}

// inFlight reports whether a main step of the failing instance still has
// an attempt in flight, which it finishes before the onFailure steps run
// and the instance ends: a running step that runs a handler, or a pending
// one (put back by a snooze or a worker's shutdown while the instance was
// failing: it runs to its end as well).
func (p *planner) inFlight() bool {
	for _, s := range p.w.Steps {
		switch p.status[s.Name] {
		case storage.StepRunning:
			if runsAttempt(s) {
				return true
			}
		case storage.StepPending:
			if p.failure != nil || p.state.Failure != nil {
				return true
			}
		}
	}
	return false
}

// runFailure plans an instance that timed out, or whose onFailure steps
// run.
func (p *planner) runFailure() *storage.Plan {
	plan := &storage.Plan{}
	if p.state.Failure == nil { // timed out
		f := &storage.Failure{Error: storage.WorkflowTimeoutError(p.state.TimedOut)}
		if len(p.w.OnFailure) == 0 {
			plan.Instance = &storage.InstanceChange{Status: storage.InstanceFailed, Error: f.Error}
			return plan
		}
		return p.fail(plan, f)
	}
	p.failure = p.state.Failure
	if p.inFlight() {
		// The main steps still running finish first (a timeout cancelled
		// them before this plan: see storage.TimeoutStore).
		return plan
	}
	p.promote(plan, p.w.OnFailureOrder())
	p.finishFailure(plan)
	return plan
}

// fail records the failure f in plan and makes the onFailure steps that
// can run ready, or, while main steps still run an attempt, leaves them
// blocked until those attempts end.
func (p *planner) fail(plan *storage.Plan, f *storage.Failure) *storage.Plan {
	p.dropStarts(plan)
	// The store cancels the unfinished main steps with the failure, but
	// for the running attempts of a step's failure, which finish (a
	// timeout stops them too); the onFailure steps' expressions see them
	// so.
	stop := p.state.TimedOut > 0
	for _, s := range p.w.Steps {
		st := p.status[s.Name]
		if st.Finished() || !stop && st == storage.StepRunning && runsAttempt(s) {
			continue
		}
		p.status[s.Name] = storage.StepCancelled
	}
	plan.Failure = f
	p.failure = f
	if p.inFlight() {
		return plan
	}
	p.promote(plan, p.w.OnFailureOrder())
	p.finishFailure(plan)
	return plan
}

// finishFailure fails the instance with its recorded error once no
// onFailure step is left to run: a blocked one whose dependencies failed
// never will, and is cancelled with the instance.
func (p *planner) finishFailure(plan *storage.Plan) {
	for _, s := range p.w.OnFailure {
		switch p.status[s.Name] {
		case storage.StepPending, storage.StepRunning, storage.StepWaiting:
			return
		}
	}
	plan.Instance = &storage.InstanceChange{Status: storage.InstanceFailed, Error: p.failure.Error}
	plan.Failure = nil
}

// dropStarts removes from a plan that fails the instance the main steps
// it made ready: they would only be cancelled.
func (p *planner) dropStarts(plan *storage.Plan) {
	kept := plan.Steps[:0]
	for _, c := range plan.Steps {
		switch c.Status {
		case storage.StepPending, storage.StepWaiting, storage.StepRunning:
			if !p.w.Step(c.Name).OnFailure {
				p.status[c.Name] = storage.StepBlocked
				continue
			}
		}
		kept = append(kept, c)
	}
	plan.Steps = kept
}

// workflowEnv is what expressions see as workflow.
func (p *planner) workflowEnv() dag.WorkflowEnv {
	env := dag.WorkflowEnv{ID: p.state.ID, Name: p.state.Workflow}
	if p.failure != nil {
		env.Error, env.FailedStep = p.failure.Error, p.failure.Step
	}
	return env
}

// recordFailing remembers that a plan recorded the failure of state's
// instance, or that a failing instance timed out, with the main steps
// whose handlers report must stop: the ones the store cancelled (a
// forEach step's items), not the attempts of running steps, which finish,
// unless the instance timed out.
func (r *finishRecorder) recordFailing(state *storage.InstanceState) {
	w, err := r.engine.definition(state.DefinitionHash, state.LoadDefinition)
	if err != nil {
		return // the plan just read it; the heartbeat stops them anyway
	}
	main := make(map[string]bool, len(w.Steps))
	orphaned := false
	for i, s := range w.Steps {
		if state.TimedOut == 0 && runsAttempt(s) {
			continue
		}
		main[s.Name] = true
		orphaned = orphaned || s.Workflow != "" && i < len(state.Steps) && state.Steps[i].Status == storage.StepRunning
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failing == nil {
		r.failing = map[string]map[string]bool{}
	}
	r.failing[state.ID] = main
	if orphaned {
		if r.orphaned == nil {
			r.orphaned = map[string]bool{}
		}
		r.orphaned[state.ID] = true
	}
}

// stopFailing stops this process's handlers of the main steps the
// committed plans cancelled with a recorded failure, rather than at their
// next heartbeat; the onFailure steps run on. The caller holds r.mu.
func (r *finishRecorder) stopFailing() {
	for id, main := range r.failing {
		r.engine.local.mu.Lock()
		workers := append([]*Worker(nil), r.engine.local.list...)
		r.engine.local.mu.Unlock()
		for _, w := range workers {
			w.stopSteps(id, main)
		}
		if r.orphaned[id] {
			r.engine.stopCancelledChildren(context.Background(), id)
		}
	}
	r.failing, r.orphaned = nil, nil
}

// stopCancelledChildren stops this process's handlers of the children of
// a failing instance that its recorded failure cancelled with their
// workflow steps, and of their descendants; the children of its onFailure
// steps run on.
func (e *Engine) stopCancelledChildren(ctx context.Context, id string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	before := ""
	for {
		page, err := e.store.ListInstances(ctx, storage.ListParams{Parent: id, BeforeID: before, Limit: MaxListLimit})
		if err != nil {
			e.logger.Warn("dagrun: list child instances to stop their handlers", "instance", id, "error", err)
			return
		}
		for _, in := range page {
			if in.Status.Finished() {
				e.stopLocalTree(ctx, in.ID)
			}
		}
		if len(page) < MaxListLimit {
			return
		}
		before = page[len(page)-1].ID
	}
}

// stopSteps stops the running handlers of the named steps of an instance.
func (w *Worker) stopSteps(instanceID string, names map[string]bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, a := range w.attempts {
		if a.step.InstanceID == instanceID && names[a.step.Step] {
			w.stopLocked(a, errCancelled)
		}
	}
}

// expireInstances fails the running instances past their workflow
// timeout, by the store's clock, so that a timeout holds whichever process
// runs and whether or not a handler of the instance runs; the local
// handlers of the instances it failed stop at once.
func (e *Engine) expireInstances(ctx context.Context) (int, error) {
	return e.sweep(ctx, e.store.ExpireInstances)
}

// wakeWhileBusy arms idle for the next timeout (a wait's, a workflow's)
// while every slot is taken, so that a timeout of an instance whose
// handler holds the worker's last slot is enforced at its time rather than
// at the next lease recovery; at most once per poll interval, so that a
// busy worker's loop does not read the store at every wake-up. A timeout
// already due is enforced at once: re-arming the timer for it at every
// look would put it off for ever. It returns when it last looked.
func (w *Worker) wakeWhileBusy(ctx context.Context, idle *idleTimer, last time.Time) time.Time {
	now := time.Now()
	if now.Sub(last) < w.config.Poll {
		return last
	}
	next, err := w.engine.store.NextWake(ctx, w.claimParams(0))
	switch {
	case err != nil || next.IsZero():
	case !next.After(now):
		w.sweepDue(ctx)
	default:
		idle.set(next.Sub(now) + time.Millisecond) // the store compares deadline <= now
	}
	return now
}
