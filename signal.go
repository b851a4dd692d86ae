package dagrun

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/dagrun/dagrun/dag"
	"github.com/dagrun/dagrun/storage"
)

// SignalRequest is one signal to send to an instance, named either by
// InstanceID or by its Workflow and idempotency Key.
type SignalRequest struct {
	InstanceID    string
	Workflow, Key string
	// Name is the signal's name, one of the instance's wait steps' signals.
	Name string
	// ID, when set, makes a repeat of the signal idempotent: the same ID
	// sent again changes nothing and is reported as a duplicate.
	ID string
	// Data is the payload, the waiting step's output; empty means null.
	Data json.RawMessage
}

// SignalResult tells what became of a signal.
type SignalResult = storage.SignalResult

// UnknownSignalError reports a signal name none of the instance's wait
// steps waits for. Nothing was written.
type UnknownSignalError struct {
	InstanceID string
	Name       string
	// Signals are the names the instance's wait steps wait for, sorted.
	Signals []string
	// WaitSteps are the names of the steps waiting for them: WaitSteps[i]
	// waits for Signals[i].
	WaitSteps []string
}

func (e *UnknownSignalError) Error() string {
	name := nameStart(e.Name)
	if len(e.Signals) == 0 {
		return fmt.Sprintf("instance %s has no wait steps, so it takes no signal %q", e.InstanceID, name)
	}
	waits := make([]string, len(e.Signals))
	for i, signal := range e.Signals {
		waits[i] = fmt.Sprintf("step %s waits for %s", e.WaitSteps[i], signal)
	}
	return fmt.Sprintf("instance %s waits for no signal %q (its wait steps: %s)", e.InstanceID, name, strings.Join(waits, ", "))
}

// SignalDataError reports a signal payload that is malformed, too large, or
// does not satisfy the wait step's schema. Nothing was written.
type SignalDataError struct {
	Name string
	Err  error
}

func (e *SignalDataError) Error() string { return fmt.Sprintf("signal %s: %v", e.Name, e.Err) }
func (e *SignalDataError) Unwrap() error { return e.Err }

// SignalConflictError reports a signal the instance cannot take: it is
// finished, or took a signal of this name before (with another ID, or
// none). It matches storage.ErrConflict. Nothing was written.
type SignalConflictError struct{ Err error }

func (e *SignalConflictError) Error() string {
	var reason *storage.SignalConflictError
	if errors.As(e.Err, &reason) {
		return reason.Error() // without the store's prefix
	}
	return e.Err.Error()
}
func (e *SignalConflictError) Unwrap() error { return e.Err }

// Signal sends a signal to an instance: it completes the instance's wait
// step waiting for it, with Data as the step's output, or is stored until
// that step waits. Errors: *UnknownSignalError and *SignalDataError (bad
// request, nothing written), storage.ErrNotFound (no such instance),
// *SignalConflictError matching storage.ErrConflict (the instance is
// finished, or the signal was sent before with another ID).
func (e *Engine) Signal(ctx context.Context, req SignalRequest) (SignalResult, error) {
	if err := checkSignalRequest(req); err != nil {
		return SignalResult{}, err
	}
	inst, err := e.signalTarget(ctx, req)
	if err != nil {
		return SignalResult{}, err
	}
	payload := bytes.TrimSpace(req.Data)
	if len(payload) == 0 {
		payload = json.RawMessage("null")
	}
	if inst.Status.Finished() {
		// Refused whatever its name or payload, unless it repeats a signal
		// the instance took (same ID), which the store answers as a
		// duplicate: a sender retrying after the instance ended succeeds.
		if req.ID == "" || storage.CheckText(req.Name, storage.MaxIDBytes) != nil || req.Name == "" {
			return SignalResult{}, &SignalConflictError{Err: storage.FinishedConflict(inst.ID, inst.Status)}
		}
		payload = json.RawMessage("null") // never stored
	} else {
		w, err := e.Definition(inst)
		if err != nil {
			return SignalResult{}, err
		}
		wait := waitFor(w, req.Name)
		if wait == nil {
			unknown := &UnknownSignalError{InstanceID: inst.ID, Name: req.Name}
			unknown.Signals, unknown.WaitSteps = waitSignals(w)
			return SignalResult{}, unknown
		}
		payload, err = checkJSON(payload, "payload", e.config.MaxOutputBytes)
		if err == nil {
			err = wait.ValidatePayload(payload)
		}
		if err != nil {
			if !tookSignal(inst, req.Name) {
				return SignalResult{}, &SignalDataError{Name: req.Name, Err: err}
			}
			// A repeat of a signal the instance took is the store's to
			// answer, whatever its payload: a duplicate (the same signal
			// ID) or a conflict. It stores no payload either way.
			payload = json.RawMessage("null")
		}
	}
	if !inst.Status.Finished() {
		if err := e.settleOverdue(ctx, inst, req.Name); err != nil {
			return SignalResult{}, err
		}
	}
	rec := e.newFinishRecorder()
	res, err := e.store.SendSignal(rec.attach(ctx), storage.SignalParams{
		InstanceID: inst.ID,
		Name:       req.Name,
		ID:         req.ID,
		Payload:    payload,
	}, rec.plan)
	if errors.Is(err, storage.ErrConflict) {
		return SignalResult{}, &SignalConflictError{Err: err}
	}
	if err != nil {
		return SignalResult{}, err
	}
	res.InstanceID = inst.ID // found by key, the caller learns which
	rec.report()
	if res.Delivered {
		e.notifyChanged()
	}
	return res, nil
}

// settleOverdue times out what of inst is past its deadline before a signal
// to it is sent: its workflow timeout, or the wait for the signal named.
// A worker's sweep does that soon after the deadline, but with no worker
// running a late signal would complete a wait that had already run out,
// or an instance whose time was up. Then the store refuses the signal as
// it refuses one to a failed step or a finished instance. The deadlines
// are the database's times, read against its clock where it keeps one.
func (e *Engine) settleOverdue(ctx context.Context, inst *storage.Instance, signal string) error {
	var waitDeadline *time.Time
	for _, st := range inst.Steps {
		if st.Signal == signal && st.Status == storage.StepWaiting {
			waitDeadline = st.Deadline
		}
	}
	if inst.Deadline == nil && waitDeadline == nil {
		return nil
	}
	now := time.Now()
	if clock, ok := e.store.(storage.Clock); ok {
		var err error
		if now, err = clock.Now(ctx); err != nil {
			return err
		}
	}
	for _, due := range []struct {
		deadline *time.Time
		expire   func(context.Context) (int, error)
	}{
		{inst.Deadline, e.expireInstances},
		{waitDeadline, e.expireWaits},
	} {
		if due.deadline == nil || due.deadline.After(now) {
			continue
		}
		// A sweep takes the earliest deadlines first, a batch at a time:
		// all that are overdue, so this one too.
		for {
			n, err := due.expire(ctx)
			if err != nil {
				return err
			}
			if n < sweepBatch {
				break
			}
		}
	}
	return nil
}

// checkSignalRequest checks the texts of a request at the edge, as a start
// checks its key.
func checkSignalRequest(req SignalRequest) error {
	if req.InstanceID == "" && (req.Workflow == "" || req.Key == "") {
		return &ArgumentError{Name: "signal target", Reason: "name the instance by its ID, or by its workflow and key"}
	}
	if err := storage.CheckText(req.ID, storage.MaxSignalIDBytes); err != nil {
		return &ArgumentError{Name: "signal ID", Reason: "it " + err.Error()}
	}
	if err := storage.CheckText(req.Key, storage.MaxKeyBytes); err != nil {
		return fmt.Errorf("key %s: %w", err, storage.ErrNotFound)
	}
	// The name is checked against the instance's wait steps, so that an
	// empty or malformed one is answered with the names it takes.
	return nil
}

// signalTarget loads the instance a request names.
func (e *Engine) signalTarget(ctx context.Context, req SignalRequest) (*storage.Instance, error) {
	if req.InstanceID != "" {
		return e.Get(ctx, req.InstanceID)
	}
	found, err := e.store.ListInstances(ctx, storage.ListParams{Workflow: req.Workflow, Key: req.Key, Limit: 1})
	if err != nil {
		return nil, err
	}
	if len(found) == 0 {
		if _, known := e.Workflow(req.Workflow); !known {
			// Instances outlive their file, so only now is the name wrong.
			return nil, e.UnknownWorkflow(req.Workflow)
		}
		return nil, storage.Refuse(storage.ErrNotFound, "no instance of workflow %s with key %q", req.Workflow, req.Key)
	}
	return e.store.GetInstance(ctx, found[0].ID)
}

// tookSignal reports whether inst took signal already, as far as the
// instance object tells: its wait step finished, or the signal was stored
// before the step waited (a signal.received event among the latest).
func tookSignal(inst *storage.Instance, signal string) bool {
	for _, s := range inst.Steps {
		if s.Signal == signal && s.Status != storage.StepBlocked && s.Status != storage.StepPending && s.Status != storage.StepWaiting {
			return true
		}
	}
	return slices.ContainsFunc(inst.Events, func(e storage.Event) bool {
		return e.Type == storage.EventSignalReceived && e.Message == signal
	})
}

// waitFor returns the wait of w's step waiting for signal, or nil.
func waitFor(w *dag.Workflow, signal string) *dag.Wait {
	for _, s := range w.AllSteps() {
		if s.Wait != nil && s.Wait.Signal == signal {
			return s.Wait
		}
	}
	return nil
}

// waitSignals returns the signals w's wait steps wait for, sorted, and
// the steps waiting for each.
func waitSignals(w *dag.Workflow) (signals, steps []string) {
	var waits []*dag.Step
	for _, s := range w.AllSteps() {
		if s.Wait != nil {
			waits = append(waits, s)
		}
	}
	sort.SliceStable(waits, func(i, j int) bool { return waits[i].Wait.Signal < waits[j].Wait.Signal })
	for _, s := range waits {
		signals, steps = append(signals, s.Wait.Signal), append(steps, s.Name)
	}
	return signals, steps
}
