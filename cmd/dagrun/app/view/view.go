// Package view holds what dagrun shows users in both the CLI and the HTTP
// API: the instance object and the pages of a forEach step's items, of the
// CLI's --json output and of the API, one definition (and one way to read
// them) for both; and the quoting of a caller's value in an error message.
package view

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"

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
	// Events are the latest storage.InstanceEvents events of the history,
	// oldest first; EventsTruncated, present and true, tells that older
	// ones exist, which the API's events route pages. Lists carry no
	// events.
	Events          []Event `json:"events,omitempty"`
	EventsTruncated bool    `json:"eventsTruncated,omitempty"`
	// Paused is true while the instance is paused (dagrun pause): its
	// steps are not claimed; absent otherwise.
	Paused bool `json:"paused,omitempty"`
	// Held is true while the instance waits for a slot of its workflow's
	// concurrency limit, whose key ConcurrencyKey gives (absent without a
	// limit): it starts when an instance of that key finishes.
	Held           bool   `json:"held,omitempty"`
	ConcurrencyKey string `json:"concurrencyKey,omitempty"`
	// RunAfter is, for a pending instance started with a delay, when it
	// starts: its first steps may be blocked until then (a wait, forEach
	// or workflow step starts only with its instance), with no runAfter
	// of their own.
	RunAfter *string `json:"runAfter,omitempty"`
	// Timeout is the workflow timeout ("10m"), Deadline when the running
	// instance times out; both absent without a timeout. FailedStep is
	// the step whose failure failed the instance (absent when none did,
	// e.g. a timeout); Failing, while its running steps finish their
	// attempt or its onFailure steps run (its status still running),
	// tells that it failed already.
	Timeout    string  `json:"timeout,omitempty"`
	Deadline   *string `json:"deadline,omitempty"`
	FailedStep *string `json:"failedStep,omitempty"`
	Failing    bool    `json:"failing,omitempty"`
	// Parent names the workflow step that started this instance; absent
	// for an instance started from outside.
	Parent *Parent `json:"parent,omitempty"`
}

// Parent is the step (and, for a forEach step, the item) whose child an
// instance is.
type Parent struct {
	ID   string `json:"id"`
	Step string `json:"step"`
	Item *int   `json:"item,omitempty"`
}

// delayed reports whether inst is a pending instance started with a
// delay, which starts at its RunAfter.
func delayed(inst *storage.Instance) bool {
	return inst.Status == storage.InstancePending && inst.RunAfter.After(inst.CreatedAt)
}

// NewParent converts a stored parent reference; nil stays nil.
func NewParent(p *storage.ParentRef) *Parent {
	if p == nil {
		return nil
	}
	out := &Parent{ID: p.InstanceID, Step: p.Step}
	if p.Item >= 0 {
		item := p.Item
		out.Item = &item
	}
	return out
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
	// Items counts the items of a forEach step; absent for any other step.
	// The items themselves are paged (ItemPage), never inlined. Such a
	// step's output, the list of its items' outputs, is inlined only up to
	// MaxInlineItemsOutput bytes; past that Output is null and
	// OutputOmitted tells why, so the instance object stays small whatever
	// the number of items. (Expressions always read the whole list as
	// steps.NAME.output.)
	Items         *ItemCounts `json:"items,omitempty"`
	OutputOmitted bool        `json:"outputOmitted,omitempty"`
	// Signal is the signal a wait step waits for; Deadline, while it
	// waits, when it times out (absent: never). RunAfter is, for a pending
	// step, when it may run (a durable sleep, a retry's backoff, a delayed
	// start; a past time for a step that is due). All are absent when they
	// do not apply.
	Signal   string  `json:"signal,omitempty"`
	Deadline *string `json:"deadline,omitempty"`
	RunAfter *string `json:"runAfter,omitempty"`
	// OnFailure marks a step of the workflow's onFailure steps, which
	// come after the others and run only when the instance fails.
	OnFailure bool `json:"onFailure,omitempty"`
	// Held is true for a pending step a concurrency limit holds back until
	// a slot frees (it then has no runAfter).
	Held bool `json:"held,omitempty"`
	// Workflow is the workflow a workflow step starts as its child;
	// Children the IDs of the instances it started, in item order for a
	// forEach step. Both are absent for other steps, Children also before
	// the step starts.
	Workflow string   `json:"workflow,omitempty"`
	Children []string `json:"children,omitempty"`
	// ChildrenOmitted is set, and Children absent, for a forEach step
	// with more than MaxInlineChildren children, as OutputOmitted for its
	// output: the item pages name each item's child.
	ChildrenOmitted bool `json:"childrenOmitted,omitempty"`
}

// MaxInlineChildren bounds the child IDs of a forEach workflow step that
// the instance object inlines (about 38 KB of them): 10,000 would make it
// 400 KB.
const MaxInlineChildren = 1000

// MaxInlineItemsOutput bounds the output of a forEach step that the
// instance object inlines: the outputs of thousands of small items are
// shown in full, while 10,000 larger ones are read a page at a time.
const MaxInlineItemsOutput = 256 << 10

// ItemCounts counts a forEach step's items by status.
type ItemCounts struct {
	Total     int `json:"total"`
	Pending   int `json:"pending"`
	Running   int `json:"running"`
	Completed int `json:"completed"`
	Failed    int `json:"failed"`
	Cancelled int `json:"cancelled"`
}

// NewItemCounts converts stored counts; nil stays nil.
func NewItemCounts(c *storage.ItemCounts) *ItemCounts {
	if c == nil {
		return nil
	}
	return &ItemCounts{Total: c.Total, Pending: c.Pending, Running: c.Running, Completed: c.Completed, Failed: c.Failed, Cancelled: c.Cancelled}
}

// Of returns the number of items in status, or all of them for "".
func (c *ItemCounts) Of(status storage.StepStatus) int {
	if c == nil {
		return 0
	}
	switch status {
	case "":
		return c.Total
	case storage.StepPending:
		return c.Pending
	case storage.StepRunning:
		return c.Running
	case storage.StepCompleted:
		return c.Completed
	case storage.StepFailed:
		return c.Failed
	case storage.StepCancelled:
		return c.Cancelled
	}
	return 0
}

// Item is one item of a forEach step.
type Item struct {
	Index      int             `json:"index"`
	Status     string          `json:"status"`
	Attempts   int             `json:"attempts"`
	Input      json.RawMessage `json:"input"`
	Output     json.RawMessage `json:"output"`
	Error      *string         `json:"error"`
	StartedAt  *string         `json:"startedAt"`
	FinishedAt *string         `json:"finishedAt"`
	WorkerID   *string         `json:"workerId"`
	// Child is the instance an item of a forEach workflow step started;
	// absent for other items.
	Child string `json:"child,omitempty"`
}

// ItemPage is one page of a step's items, in index order: the CLI's
// `status --step --json` output and the HTTP API's items route. Total is
// the number of items the page is taken from (those in the asked status,
// when filtered).
type ItemPage struct {
	Items  []Item `json:"items"`
	Offset int    `json:"offset"`
	Limit  int    `json:"limit"`
	Total  int    `json:"total"`
}

// NewItemPage converts a page of stored items.
func NewItemPage(items []storage.Item, offset, limit, total int) ItemPage {
	out := ItemPage{Items: make([]Item, len(items)), Offset: offset, Limit: limit, Total: total}
	for i, it := range items {
		out.Items[i] = Item{
			Index:      it.Index,
			Status:     string(it.Status),
			Attempts:   it.Attempts,
			Input:      RawOrNull(it.Input),
			Output:     RawOrNull(it.Output),
			Error:      optString(it.Error),
			StartedAt:  optTime(it.StartedAt),
			FinishedAt: optTime(it.FinishedAt),
			WorkerID:   optString(it.WorkerID),
			Child:      it.Child,
		}
	}
	return out
}

// Event is one entry of an instance's history.
type Event struct {
	At      string `json:"at"`
	Type    string `json:"type"`
	Step    string `json:"step,omitempty"`
	Attempt int    `json:"attempt,omitempty"`
	Message string `json:"message,omitempty"`
	// Actor is who did it by hand: "cli", or the API token's name.
	Actor string `json:"actor,omitempty"`
}

// NewInstance converts a stored instance to its public JSON shape.
func NewInstance(inst *storage.Instance) Instance {
	out := Instance{
		ID:             inst.ID,
		Workflow:       inst.Workflow,
		Status:         string(inst.Status),
		Input:          RawOrNull(inst.Input),
		Output:         RawOrNull(inst.Output),
		Error:          optString(inst.Error),
		Key:            optString(inst.Key),
		Priority:       inst.Priority,
		Paused:         inst.Paused,
		Held:           inst.Held,
		ConcurrencyKey: inst.ConcurrencyKey,
		CreatedAt:      Time(inst.CreatedAt),
		StartedAt:      optTime(inst.StartedAt),
		FinishedAt:     optTime(inst.FinishedAt),
		Steps:          make([]Step, len(inst.Steps)),
		Deadline:       optTime(inst.Deadline),
		FailedStep:     optString(inst.FailedStep),
		Failing:        inst.Failing,
		Parent:         NewParent(inst.Parent),
	}
	if inst.Timeout > 0 {
		out.Timeout = storage.FormatDuration(inst.Timeout)
	}
	if delayed(inst) {
		out.RunAfter = optTime(&inst.RunAfter)
	}
	for i, s := range inst.Steps {
		deps := s.DependsOn
		if deps == nil {
			deps = []string{}
		}
		output, omitted := s.Output, false
		if s.Items != nil && len(output) > MaxInlineItemsOutput {
			output, omitted = nil, true
		}
		out.Steps[i] = Step{
			Name:       s.Name,
			Handler:    s.Handler,
			Queue:      s.Queue,
			DependsOn:  deps,
			Status:     string(s.Status),
			Attempts:   s.Attempts,
			Input:      RawOrNull(s.Input),
			Output:     RawOrNull(output),
			Error:      optString(s.Error),
			StartedAt:  optTime(s.StartedAt),
			FinishedAt: optTime(s.FinishedAt),
			Items:      NewItemCounts(s.Items),

			OutputOmitted: omitted,
			Signal:        s.Signal,
			OnFailure:     s.OnFailure,
			Workflow:      s.Workflow,
			Children:      s.Children,
		}
		if s.Items != nil && len(s.Children) > MaxInlineChildren {
			out.Steps[i].Children, out.Steps[i].ChildrenOmitted = nil, true
		}
		if s.Status == storage.StepWaiting {
			out.Steps[i].Deadline = optTime(s.Deadline)
		}
		if s.Held() {
			out.Steps[i].Held = true
		} else if s.Status == storage.StepPending && !s.RunAfter.IsZero() {
			out.Steps[i].RunAfter = optTime(&s.RunAfter)
		}
	}
	for _, ev := range inst.Events {
		out.Events = append(out.Events, NewEvent(ev))
	}
	out.EventsTruncated = inst.EventsTruncated
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

// Count writes n things: "1 step", "3 steps".
func Count(n int, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	return strconv.Itoa(n) + " " + thing + "s"
}

// QuoteShort quotes s for an error message, Go-escaped so that invalid
// UTF-8 and control bytes stay visible on one line, and cut after
// maxQuoted bytes so that a 10 KB value does not flood the message.
func QuoteShort(s string) string {
	if len(s) <= maxQuoted {
		return strconv.Quote(s)
	}
	cut := maxQuoted
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut-- // not inside a character
	}
	return strconv.Quote(s[:cut]) + fmt.Sprintf("… (%d bytes)", len(s))
}
