package app

import (
	"fmt"
	"io"
	"time"

	"github.com/dagrun/dagrun/storage"
)

// progress prints one line on stderr per step transition it observes.
type progress struct {
	w        io.Writer
	seen     map[string]stepMark
	instance storage.InstanceStatus
}

type stepMark struct {
	status   storage.StepStatus
	attempts int
}

func newProgress(w io.Writer) *progress {
	return &progress{w: w, seen: map[string]stepMark{}}
}

func (p *progress) observe(inst *storage.Instance) {
	for _, s := range inst.Steps {
		mark := stepMark{status: s.Status, attempts: s.Attempts}
		prev, known := p.seen[s.Name]
		if known && prev == mark {
			continue
		}
		p.seen[s.Name] = mark
		if !known && s.Status == storage.StepBlocked {
			continue
		}
		fmt.Fprintln(p.w, stepLine(s))
	}
	if inst.Status != p.instance && inst.Status.Finished() {
		line := fmt.Sprintf("instance %s %s", inst.ID, inst.Status)
		if inst.FinishedAt != nil {
			line += " in " + roundDuration(inst.FinishedAt.Sub(inst.CreatedAt))
		}
		fmt.Fprintln(p.w, line)
	}
	p.instance = inst.Status
}

func stepLine(s storage.Step) string {
	switch s.Status {
	case storage.StepRunning:
		return fmt.Sprintf("%-12s running (attempt %d)", s.Name, s.Attempts)
	case storage.StepCompleted:
		return fmt.Sprintf("%-12s completed%s", s.Name, durationSuffix(s))
	case storage.StepPending:
		if s.Error != "" {
			return fmt.Sprintf("%-12s retrying at %s after attempt %d failed: %s", s.Name, s.RunAfter.Local().Format(time.TimeOnly), s.Attempts, oneLineString(s.Error))
		}
		return fmt.Sprintf("%-12s ready", s.Name)
	case storage.StepFailed:
		return fmt.Sprintf("%-12s failed after %d attempt(s): %s", s.Name, s.Attempts, oneLineString(s.Error))
	default:
		return fmt.Sprintf("%-12s %s", s.Name, s.Status)
	}
}

func durationSuffix(s storage.Step) string {
	if s.StartedAt == nil || s.FinishedAt == nil {
		return ""
	}
	return " in " + roundDuration(s.FinishedAt.Sub(*s.StartedAt))
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
