package app

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/dagrun/dagrun/storage"
)

// progress prints one line on stderr per step transition. The lines come
// from the instance's event history rather than from comparing snapshots,
// so a transition that comes and goes between two looks (a 10ms retry
// backoff, say) still gets its line.
type progress struct {
	w io.Writer
	// record, when set, takes each line instead of w, with the event it
	// tells of (--log-format json writes it as a record).
	record  func(inst *storage.Instance, ev storage.Event, line string)
	skip    skipMode
	first   bool
	started map[string]attemptStart // step -> its latest attempt
	now     func() time.Time        // says which wake times are today
	zone    *time.Location          // the zone wake times are written in
}

// attemptStart is when an attempt began. A snoozed attempt starts again
// under the same number when it wakes; it still began at its first start,
// as the step's startedAt says.
type attemptStart struct {
	attempt int
	at      time.Time
}

// retried forgets the attempts before a retry, whose steps start again
// from attempt 1: their first starts are not the new attempts'.
func (p *progress) retried() { clear(p.started) }

// start records a step.started event.
func (p *progress) start(ev storage.Event) {
	if prev, ok := p.started[ev.Step]; ok && prev.attempt == ev.Attempt && ev.Attempt > 0 {
		return
	}
	p.started[ev.Step] = attemptStart{attempt: ev.Attempt, at: ev.At}
}

// skipMode says which events already in the history on the first look are
// not news to the user.
type skipMode int

const (
	skipNone         skipMode = iota // a new instance: print its whole history
	skipUntilRetried                 // a retry: the history up to the retry is old news
	skipExisting                     // following an instance that was already there
)

func newProgress(w io.Writer, skip skipMode) *progress {
	return &progress{w: w, skip: skip, first: true, started: map[string]attemptStart{}, now: time.Now, zone: time.Local}
}

// observe prints the lines of events, the news since its last call
// (dagrun.Engine.Follow gives each event once; the first call gets the
// history so far).
func (p *progress) observe(inst *storage.Instance, events []storage.Event) {
	if p.first {
		p.first = false
		cut := 0
		switch p.skip {
		case skipExisting:
			cut = len(events)
		case skipUntilRetried:
			for i, ev := range events {
				if ev.Type == storage.EventInstanceRetried {
					cut = i + 1
				}
			}
		}
		for _, ev := range events[:cut] {
			switch ev.Type {
			case storage.EventStepStarted:
				p.start(ev)
			case storage.EventInstanceRetried:
				p.retried()
			}
		}
		events = events[cut:]
	}
	for _, ev := range events {
		line := p.line(inst, ev)
		switch {
		case line == "":
		case p.record != nil:
			p.record(inst, ev, line)
		default:
			fmt.Fprintln(p.w, line)
		}
	}
}

func (p *progress) line(inst *storage.Instance, ev storage.Event) string {
	name := fmt.Sprintf("%-12s", ev.Step)
	msg := oneLineString(ev.Message)
	switch ev.Type {
	case storage.EventStepReady:
		if strings.HasPrefix(msg, storage.WaitingMessage("")) {
			return name + " " + msg
		}
		return name + " ready"
	case storage.EventStepStarted:
		p.start(ev)
		if ev.Attempt == 0 { // a workflow step: its children run, no attempt of its own
			if msg != "" {
				return name + " running: " + msg
			}
			return name + " running"
		}
		return fmt.Sprintf("%s running (attempt %d)", name, ev.Attempt)
	case storage.EventStepCompleted:
		if began, ok := p.started[ev.Step]; ok && !ev.At.Before(began.at) {
			return name + " completed in " + roundDuration(ev.At.Sub(began.at))
		}
		if msg != "" { // a wait step's "signal NAME received"
			return name + " completed: " + msg
		}
		return name + " completed"
	case storage.EventStepRetrying:
		return fmt.Sprintf("%s retrying after attempt %d failed: %s", name, ev.Attempt, msg)
	case storage.EventStepSnoozed:
		if t, err := time.Parse(time.RFC3339Nano, strings.TrimPrefix(ev.Message, "until ")); err == nil {
			return name + " waiting until " + wakeTime(t.In(p.zone), p.now().In(p.zone))
		}
		return name + " waiting " + msg
	case storage.EventStepFailed:
		if ev.Attempt > 0 {
			return fmt.Sprintf("%s failed after %d attempt(s): %s", name, ev.Attempt, msg)
		}
		return name + " failed: " + msg
	case storage.EventStepSkipped:
		return name + " skipped"
	case storage.EventStepCancelled:
		return name + " cancelled"
	case storage.EventStepReleased:
		return name + " released by a stopping worker; waiting for another"
	case storage.EventStepLeaseExpired:
		line := fmt.Sprintf("%s attempt %d lost its worker (lease expired)", name, ev.Attempt)
		if msg != "" {
			line += ": " + msg
		}
		return line
	case storage.EventInstanceFailing:
		line := fmt.Sprintf("instance %s failed (%s)", inst.ID, msg)
		if why, ok := strings.CutPrefix(failingText(inst), "failed; "); ok {
			line += "; " + why
		}
		return line
	case storage.EventInstanceCompleted, storage.EventInstanceFailed, storage.EventInstanceCancelled:
		line := fmt.Sprintf("instance %s %s", inst.ID, strings.TrimPrefix(string(ev.Type), "instance."))
		if inst.FinishedAt != nil {
			line += " in " + roundDuration(inst.FinishedAt.Sub(inst.CreatedAt))
		}
		return line
	}
	if ev.Type == storage.EventInstanceRetried {
		p.retried()
	}
	return "" // instance.created, .started, .retried: no news to a follower
}

// wakeTime is a snoozed step's wake time as a progress line gives it: the
// time of day, and the date too unless it is today, with its zone, which
// status and the history (in UTC) do not share.
func wakeTime(t, now time.Time) string {
	if y, m, d := t.Date(); y == now.Year() && m == now.Month() && d == now.Day() {
		return t.Format(time.TimeOnly + " MST")
	}
	return t.Format(time.DateTime + " MST")
}

func roundDuration(d time.Duration) string {
	switch {
	case d < time.Millisecond:
		return d.Round(time.Microsecond).String()
	case d < time.Second:
		return d.Round(100 * time.Microsecond).String()
	default:
		return d.Round(time.Millisecond).String()
	}
}
