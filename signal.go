package dagrun

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

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
}

func (e *UnknownSignalError) Error() string {
	name := e.Name
	if len(name) > 64 {
		name = name[:64] + "…"
	}
	if len(e.Signals) == 0 {
		return fmt.Sprintf("instance %s has no wait steps, so it takes no signal %q", e.InstanceID, name)
	}
	return fmt.Sprintf("instance %s waits for no signal %q (its wait steps wait for: %s)", e.InstanceID, name, strings.Join(e.Signals, ", "))
}

// SignalDataError reports a signal payload that is malformed, too large, or
// does not satisfy the wait step's schema. Nothing was written.
type SignalDataError struct {
	Name string
	Err  error
}

func (e *SignalDataError) Error() string { return fmt.Sprintf("signal %s: %v", e.Name, e.Err) }
func (e *SignalDataError) Unwrap() error { return e.Err }

// Signal sends a signal to an instance: it completes the instance's wait
// step waiting for it, with Data as the step's output, or is stored until
// that step waits. Errors: *UnknownSignalError and *SignalDataError (bad
// request, nothing written), storage.ErrNotFound (no such instance),
// storage.ErrConflict (the instance is finished, or the signal was sent
// before with another ID).
func (e *Engine) Signal(ctx context.Context, req SignalRequest) (SignalResult, error) {
	return SignalResult{}, errors.New("not implemented")
}

var _ = sort.Strings
