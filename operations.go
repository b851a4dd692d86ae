package dagrun

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/dagrun/dagrun/storage"
)

// Operations on instances by hand: re-run part of one, complete a step in
// its place, hold its steps back, and cancel or retry many at once. Each
// records in the instance's history who did it: the actor that
// storage.WithActor put in the context ("cli", or an API token's name).

// ErrNoOperations reports a store that does not implement
// storage.Operator, which these operations need.
var ErrNoOperations = errors.New("dagrun: this store does not support operations on instances (retry --from, skip, pause, bulk)")

func (e *Engine) operator() (storage.Operator, error) {
	op, ok := e.store.(storage.Operator)
	if !ok {
		return nil, ErrNoOperations
	}
	return op, nil
}

// checkStepName refuses a step name no instance can have, as not found.
func checkStepName(id, step string) error {
	if err := storage.CheckText(step, storage.MaxIDBytes); err != nil || step == "" {
		return &storage.RefusalError{Reason: fmt.Sprintf("instance %s has no step %q", id, step), Err: storage.ErrNotFound}
	}
	return nil
}

// RetryFrom re-runs step and everything downstream of it, with fresh
// attempts, in a failed, cancelled or completed instance; every other step
// keeps its output (failed and cancelled ones run again). ErrConflict for
// an unfinished instance; ErrNotFound for an unknown instance or step (the
// error names the instance's steps).
func (e *Engine) RetryFrom(ctx context.Context, id, step string) error {
	if err := checkID(id); err != nil {
		return err
	}
	if err := checkStepName(id, step); err != nil {
		return err
	}
	op, err := e.operator()
	if err != nil {
		return err
	}
	rec := e.newFinishRecorder()
	if err := op.RetryFrom(rec.attach(ctx), id, step, rec.plan); err != nil {
		return err
	}
	rec.report()
	e.notifyChanged()
	return nil
}

// Skip completes a blocked, pending, waiting, failed or cancelled step by
// hand with output (JSON null when empty), so that its dependents proceed;
// on a failed instance the steps its failure stopped run again.
// ErrConflict for a running, completed or skipped step, or a completed or
// cancelled instance; an *ArgumentError for output that is not JSON.
func (e *Engine) Skip(ctx context.Context, id, step string, output json.RawMessage) error {
	if err := checkID(id); err != nil {
		return err
	}
	if err := checkStepName(id, step); err != nil {
		return err
	}
	output = bytes.TrimSpace(output)
	given := len(output) > 0
	if !given {
		output = json.RawMessage("null")
	}
	output, err := checkJSON(output, "the output", e.config.MaxOutputBytes)
	if err != nil {
		return &ArgumentError{Name: "output", Reason: err.Error(), Err: err}
	}
	if given {
		if err := e.checkSignalShape(ctx, id, step, output); err != nil {
			return err
		}
	}
	op, err := e.operator()
	if err != nil {
		return err
	}
	rec := e.newFinishRecorder()
	if err := op.SkipStep(rec.attach(ctx), id, step, output, rec.plan); err != nil {
		return err
	}
	rec.report()
	e.notifyChanged()
	return nil
}

// checkSignalShape refuses an output given to a skipped wait step that its
// signal's schema refuses: the steps after it read the output as the
// signal's payload, which no sender could have delivered. What the check
// cannot read (no such instance or step) is left to the skip to answer.
func (e *Engine) checkSignalShape(ctx context.Context, id, step string, output json.RawMessage) error {
	inst, err := e.Get(ctx, id)
	if err != nil {
		return nil
	}
	w, err := e.Definition(inst)
	if err != nil {
		return nil
	}
	s := w.Step(step)
	if s == nil || s.Wait == nil {
		return nil
	}
	if err := s.Wait.ValidatePayload(output); err != nil {
		return &ArgumentError{Name: "output", Err: err,
			Reason: fmt.Sprintf("step %s waits for signal %s: %v", step, s.Wait.Signal, err)}
	}
	return nil
}

// Pause holds back the steps of an unfinished instance: none is claimed
// until Resume; running ones finish. ErrConflict when it is finished or
// already paused.
func (e *Engine) Pause(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	op, err := e.operator()
	if err != nil {
		return err
	}
	return op.PauseInstance(ctx, id)
}

// Resume lets a paused instance's steps be claimed again. ErrConflict when
// it is not paused.
func (e *Engine) Resume(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	op, err := e.operator()
	if err != nil {
		return err
	}
	if err := op.ResumeInstance(ctx, id); err != nil {
		return err
	}
	e.notifyChanged()
	return nil
}

// Selection picks instances for a bulk operation: of Workflow, in Status,
// created more than OlderThan ago. At least Workflow or Status is needed,
// so that no slip acts on every instance.
type Selection struct {
	Workflow  string
	Status    storage.InstanceStatus
	OlderThan time.Duration
	// Children picks child instances (started by workflow steps) too. By
	// default a selection picks what `dagrun list` shows: top-level
	// instances, whose children are cancelled and retried with them.
	// Cancelling a child by itself fails its parent's step.
	Children bool
}

// Validate checks the selection.
func (s Selection) Validate() error {
	if s.Workflow == "" && s.Status == "" {
		return &ArgumentError{Name: "selection", Reason: "name a workflow, a status or both"}
	}
	if err := storage.CheckText(s.Workflow, storage.MaxIDBytes); err != nil {
		return &ArgumentError{Name: "workflow", Reason: "it " + err.Error()}
	}
	switch s.Status {
	case "", storage.InstancePending, storage.InstanceRunning, storage.InstanceCompleted, storage.InstanceFailed, storage.InstanceCancelled:
	default:
		return &ArgumentError{Name: "status", Reason: fmt.Sprintf("%q is not a status: use pending, running, completed, failed or cancelled", s.Status)}
	}
	if s.OlderThan < 0 {
		return &ArgumentError{Name: "older-than", Reason: "use a positive duration such as 30d or 12h"}
	}
	return nil
}

// bulkPage is how many instances a bulk operation reads at a time.
const bulkPage = 500

// eachSelected calls fn with the ID of every instance sel picks, oldest
// first, and returns how many fn acted on: a conflict or a not found (an
// instance that changed meanwhile, or that a prune deleted) is passed
// over, any other error stops.
func (e *Engine) eachSelected(ctx context.Context, sel Selection, fn func(id string) error) (int, error) {
	if err := sel.Validate(); err != nil {
		return 0, err
	}
	op, err := e.operator()
	if err != nil {
		return 0, err
	}
	f := storage.InstanceFilter{Workflow: sel.Workflow, Status: sel.Status, TopLevel: !sel.Children, Limit: bulkPage}
	if sel.OlderThan > 0 {
		f.CreatedBefore = time.Now().Add(-sel.OlderThan)
	}
	n := 0
	for {
		ids, err := op.MatchInstances(ctx, f)
		if err != nil {
			return n, err
		}
		if len(ids) == 0 && f.AfterID == "" && sel.Workflow != "" {
			if err := e.checkSelectedWorkflow(ctx, op, sel.Workflow); err != nil {
				return 0, err
			}
		}
		for _, id := range ids {
			switch err := fn(id); {
			case err == nil:
				n++
			case !errors.Is(err, storage.ErrConflict) && !errors.Is(err, storage.ErrNotFound):
				return n, err
			}
		}
		if len(ids) < bulkPage {
			return n, nil
		}
		f.AfterID = ids[len(ids)-1]
	}
}

// checkSelectedWorkflow is called when a selection of workflow name
// matched nothing. A workflow that no file defines and no instance ran is
// most likely a typo, which "0 instances" would hide. One whose file is
// gone is still known by its instances, as list shows them, whatever the
// selection's status and age.
func (e *Engine) checkSelectedWorkflow(ctx context.Context, op storage.Operator, name string) error {
	if _, ok := e.Workflow(name); ok {
		return nil
	}
	ids, err := op.MatchInstances(ctx, storage.InstanceFilter{Workflow: name, Limit: 1})
	if err != nil {
		return err
	}
	if len(ids) > 0 {
		return nil
	}
	return e.UnknownWorkflow(name)
}

// CancelSelected cancels the unfinished instances sel picks and returns
// how many it cancelled.
func (e *Engine) CancelSelected(ctx context.Context, sel Selection) (int, error) {
	return e.eachSelected(ctx, sel, func(id string) error { return e.Cancel(ctx, id) })
}

// RetrySelected retries the failed and cancelled instances sel picks and
// returns how many it retried.
func (e *Engine) RetrySelected(ctx context.Context, sel Selection) (int, error) {
	return e.eachSelected(ctx, sel, func(id string) error { return e.Retry(ctx, id) })
}
