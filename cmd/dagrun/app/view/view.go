// Package view holds what dagrun shows users in both the CLI and the HTTP
// API: the instance object of the CLI's --json output and of the API, and
// the quoting of a caller's value in an error message.
package view

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/dagrun/dagrun/storage"
)

// Instance is the instance object of the CLI's --json output and the
// HTTP API. Field names and shapes are part of the public contract.
type Instance struct {
	ID         string          `json:"id"`
	Workflow   string          `json:"workflow"`
	Status     string          `json:"status"`
	Input      json.RawMessage `json:"input"`
	Output     json.RawMessage `json:"output"`
	Error      *string         `json:"error"`
	Key        *string         `json:"key"`
	Priority   int             `json:"priority"`
	CreatedAt  string          `json:"createdAt"`
	StartedAt  *string         `json:"startedAt"`
	FinishedAt *string         `json:"finishedAt"`
	Steps      []Step          `json:"steps"`
	Events     []Event         `json:"events,omitempty"`
}

// Step is one step of an Instance, in definition order.
type Step struct {
	Name       string          `json:"name"`
	Handler    string          `json:"handler"`
	Queue      string          `json:"queue"`
	DependsOn  []string        `json:"dependsOn"`
	Status     string          `json:"status"`
	Attempts   int             `json:"attempts"`
	Input      json.RawMessage `json:"input"`
	Output     json.RawMessage `json:"output"`
	Error      *string         `json:"error"`
	StartedAt  *string         `json:"startedAt"`
	FinishedAt *string         `json:"finishedAt"`
}

// Event is one entry of an instance's history.
type Event struct {
	At      string `json:"at"`
	Type    string `json:"type"`
	Step    string `json:"step,omitempty"`
	Attempt int    `json:"attempt,omitempty"`
	Message string `json:"message,omitempty"`
}

// NewInstance converts a stored instance to its public JSON shape.
func NewInstance(inst *storage.Instance) Instance {
	out := Instance{
		ID:         inst.ID,
		Workflow:   inst.Workflow,
		Status:     string(inst.Status),
		Input:      RawOrNull(inst.Input),
		Output:     RawOrNull(inst.Output),
		Error:      optString(inst.Error),
		Key:        optString(inst.Key),
		Priority:   inst.Priority,
		CreatedAt:  Time(inst.CreatedAt),
		StartedAt:  optTime(inst.StartedAt),
		FinishedAt: optTime(inst.FinishedAt),
		Steps:      make([]Step, len(inst.Steps)),
	}
	for i, s := range inst.Steps {
		deps := s.DependsOn
		if deps == nil {
			deps = []string{}
		}
		out.Steps[i] = Step{
			Name:       s.Name,
			Handler:    s.Handler,
			Queue:      s.Queue,
			DependsOn:  deps,
			Status:     string(s.Status),
			Attempts:   s.Attempts,
			Input:      RawOrNull(s.Input),
			Output:     RawOrNull(s.Output),
			Error:      optString(s.Error),
			StartedAt:  optTime(s.StartedAt),
			FinishedAt: optTime(s.FinishedAt),
		}
	}
	for _, ev := range inst.Events {
		out.Events = append(out.Events, Event{At: Time(ev.At), Type: string(ev.Type), Step: ev.Step, Attempt: ev.Attempt, Message: ev.Message})
	}
	return out
}

// RawOrNull returns raw, or JSON null when it is empty.
func RawOrNull(raw json.RawMessage) json.RawMessage {
	if len(raw) == 0 {
		return json.RawMessage("null")
	}
	return raw
}

func optString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// Time formats a time as RFC 3339 in UTC.
func Time(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

func optTime(t *time.Time) *string {
	if t == nil || t.IsZero() {
		return nil
	}
	s := Time(*t)
	return &s
}

// maxQuoted bounds how much of a caller's value an error message repeats.
const maxQuoted = 64

// QuoteShort quotes s for an error message, Go-escaped so that invalid
// UTF-8 and control bytes stay visible on one line, and cut after
// maxQuoted bytes so that a 10 KB value does not flood the message.
func QuoteShort(s string) string {
	if len(s) <= maxQuoted {
		return strconv.Quote(s)
	}
	return strconv.Quote(s[:maxQuoted]) + fmt.Sprintf("… (%d bytes)", len(s))
}
