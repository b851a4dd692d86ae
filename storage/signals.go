package storage

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// EventSignalReceived records a signal stored before its step waits; the
// step's completion records its delivery.
const EventSignalReceived EventType = "signal.received"

// CheckWait checks a StepChange that makes a step waiting: only a wait
// step can wait.
func CheckWait(instanceID string, isWait bool, step string) error {
	if !isWait {
		return fmt.Errorf("plan for instance %s makes step %q waiting, but it is not a wait step", instanceID, step)
	}
	return nil
}

// WaitingMessage is the message of a wait step's step.ready event.
func WaitingMessage(signal string) string { return "waiting for signal " + signal }

// DeliveredMessage is the message of the step.completed event of a wait
// step completed by its signal.
func DeliveredMessage(signal string) string { return "signal " + signal + " received" }

// IsDeliveredMessage reports whether message is a DeliveredMessage.
func IsDeliveredMessage(message string) bool {
	return strings.HasPrefix(message, "signal ") && strings.HasSuffix(message, " received")
}

// WaitTimeoutError is the error of a wait step whose deadline passed.
func WaitTimeoutError(signal string, timeout time.Duration) string {
	return fmt.Sprintf("no signal %s within %s", signal, FormatDuration(timeout))
}

// FormatDuration writes d the way workflow files do, without trailing
// zero units: 72h rather than 72h0m0s.
func FormatDuration(d time.Duration) string {
	s := d.String()
	for _, zero := range []string{"0s", "0m"} {
		if t := strings.TrimSuffix(s, zero); t != s && len(t) > 1 && !strings.HasSuffix(t, ".") && strings.ContainsAny(t[len(t)-1:], "hm") {
			s = t
		}
	}
	return s
}

// MaxSignalIDBytes bounds a signal's ID.
const MaxSignalIDBytes = 512

// CheckSignalParams checks what a store needs of a signal: a name, and an
// instance named by ID or by workflow and key.
func CheckSignalParams(p SignalParams) error {
	switch {
	case p.Name == "":
		return errors.New("signal: empty name")
	case p.InstanceID == "" && (p.Workflow == "" || p.Key == ""):
		return errors.New("signal: name the instance by its ID, or by its workflow and key")
	}
	return nil
}

// SignalConflictError is a signal an instance refuses: it is finished, or
// it took a signal of this name before. It matches ErrConflict.
type SignalConflictError struct{ Reason string }

func (e *SignalConflictError) Error() string        { return e.Reason }
func (e *SignalConflictError) Is(target error) bool { return target == ErrConflict }

// SignalConflict is the error of a signal sent again (with another ID, or
// none) after it was delivered or stored.
func SignalConflict(instanceID, name string, delivered bool) error {
	what := "stored until its step waits"
	if delivered {
		what = "delivered"
	}
	return &SignalConflictError{Reason: fmt.Sprintf("signal %s was already sent to instance %s and %s (a repeat carrying the first one's signal ID changes nothing)", name, instanceID, what)}
}

// WaitFinishedConflict is the error of a signal whose wait step finished
// (timed out, was skipped or cancelled, or was completed by hand) while its
// instance runs on: stored, it would never be delivered.
func WaitFinishedConflict(instanceID, step, signal string, status StepStatus) error {
	return &SignalConflictError{Reason: fmt.Sprintf("step %s of instance %s, which waited for signal %s, is already %s and takes no more signals", step, instanceID, signal, status)}
}

// FinishedConflict is the error of a signal sent to a finished instance.
func FinishedConflict(instanceID string, status InstanceStatus) error {
	return &SignalConflictError{Reason: fmt.Sprintf("instance %s is already %s and takes no more signals", instanceID, status)}
}
