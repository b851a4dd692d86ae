package storage

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// A schedule's state lives in one row per (workflow, index): its position
// in the workflow's schedule: list. The index is what an operator names
// (pause WORKFLOW INDEX) and what survives an edit of the cron; the
// fingerprint (a hash of cron, zone and input, computed by the engine)
// tells the store when the entry at that index now means something else.

// ScheduleSpec names one schedule of a loaded workflow.
type ScheduleSpec struct {
	Workflow string
	Index    int
	// Fingerprint identifies the schedule's cron, zone and input.
	Fingerprint string
}

// Schedule is the stored state of one schedule.
type Schedule struct {
	Workflow    string
	Index       int
	Fingerprint string
	// LastTick is the latest tick that was handled (fired, or skipped for
	// overlap), or, before the first, the moment the schedule was first
	// registered with this fingerprint: no tick at or before it fires.
	LastTick time.Time
	Paused   bool
	// LastInstanceID is the instance the schedule started last; empty
	// before the first.
	LastInstanceID string
	// LastInstanceStatus is that instance's status; empty when there is
	// none, or it was pruned.
	LastInstanceStatus InstanceStatus
	// Fired and Skipped count the ticks that started an instance and the
	// ticks skipped because the last instance was unfinished.
	Fired, Skipped int64
}

// RegisterSchedulesParams registers the schedules of the loaded workflows.
type RegisterSchedulesParams struct {
	Specs []ScheduleSpec
	// Now is the caller's clock: a schedule seen for the first time, or
	// whose fingerprint changed, fires only ticks after it.
	Now time.Time
	// OnlyNew creates the state of schedules never registered and leaves
	// every registered one as it is, whatever its fingerprint: what a
	// process does that does not run the schedules (a pause by hand from
	// a checkout whose file may differ from the schedulers').
	OnlyNew bool
}

// FireParams asks a store to start the instance of one tick.
type FireParams struct {
	Schedule ScheduleSpec
	Tick     time.Time
	// SkipIfRunning skips the tick while the schedule's last instance is
	// unfinished (overlap: skip).
	SkipIfRunning bool
	// Instance is the instance to create; its Key must be set, and unique
	// to the schedule's fingerprint and the tick.
	Instance CreateParams
}

// FireOutcome is what FireSchedule did with a tick.
type FireOutcome string

// Fire outcomes.
const (
	// FireStarted: the instance was created and the tick recorded.
	FireStarted FireOutcome = "started"
	// FireSkipped: the last instance was unfinished; the tick was recorded
	// as skipped and nothing was started.
	FireSkipped FireOutcome = "skipped"
	// FireStale: nothing was written, because the tick is not after the
	// schedule's last tick (another process handled it), the schedule is
	// paused, or its fingerprint is not the one the caller loaded (the
	// workflow file was edited since).
	FireStale FireOutcome = "stale"
)

// FireResult tells what became of one tick.
type FireResult struct {
	Outcome FireOutcome
	// InstanceID is the instance started (FireStarted) or still running
	// (FireSkipped).
	InstanceID string
}

// SetPausedParams pauses or resumes one schedule.
type SetPausedParams struct {
	Workflow string
	Index    int
	Paused   bool
	// Now is the caller's clock: resuming makes it the schedule's last
	// tick, so that the ticks of the pause are not caught up.
	Now time.Time
}

// ScheduleStore keeps the state of schedules. Every Store implements it.
type ScheduleStore interface {
	// RegisterSchedules creates the state of schedules seen for the first
	// time, with LastTick = p.Now, and renews that of schedules whose
	// fingerprint changed (LastTick = the later of LastTick and p.Now, the
	// counters kept, paused kept). A renewed or new schedule's last
	// instance is the one of the schedule that had its fingerprint before
	// (it moved in the list), or none: overlap: skip waits only for the
	// schedule's own instances. It returns the state of p.Specs, in their
	// order. Rows of schedules no longer loaded stay.
	RegisterSchedules(ctx context.Context, p RegisterSchedulesParams) ([]Schedule, error)

	// ListSchedules returns the state of every registered schedule, by
	// workflow and index.
	ListSchedules(ctx context.Context) ([]Schedule, error)

	// FireSchedule handles one tick in one transaction: if the schedule
	// is registered with p.Schedule's fingerprint, not paused, and p.Tick
	// is after its LastTick, it either records a skip (SkipIfRunning and
	// the last instance unfinished) or creates p.Instance and records it
	// as the last instance; either way LastTick becomes p.Tick. Two
	// processes firing the same tick therefore start it once. ErrNotFound
	// when the schedule was never registered.
	FireSchedule(ctx context.Context, p FireParams, plan PlanFunc) (FireResult, error)

	// SetSchedulePaused pauses or resumes a registered schedule.
	// ErrNotFound when it was never registered.
	SetSchedulePaused(ctx context.Context, p SetPausedParams) error
}

// Check reports a spec no store accepts; the backends call it at their
// boundary so both refuse the same values with the same words.
func (s ScheduleSpec) Check() error {
	switch {
	case s.Workflow == "":
		return errors.New("schedule without a workflow")
	case s.Index < 0:
		return fmt.Errorf("schedule %d of %s: the index must not be negative", s.Index, s.Workflow)
	case s.Fingerprint == "":
		return fmt.Errorf("schedule %d of %s: empty fingerprint", s.Index, s.Workflow)
	}
	return nil
}

// Check reports FireParams no store accepts.
func (p *FireParams) Check() error {
	if err := p.Schedule.Check(); err != nil {
		return err
	}
	switch {
	case p.Tick.IsZero():
		return fmt.Errorf("schedule %d of %s: zero tick", p.Schedule.Index, p.Schedule.Workflow)
	case p.Instance.Key == "":
		return fmt.Errorf("schedule %d of %s: the instance of a tick needs an idempotency key", p.Schedule.Index, p.Schedule.Workflow)
	case p.Instance.Workflow != p.Schedule.Workflow:
		return fmt.Errorf("schedule %d of %s: the instance is of workflow %q", p.Schedule.Index, p.Schedule.Workflow, p.Instance.Workflow)
	}
	return nil
}

// FireDecision is the check every backend makes on a schedule's row, read
// in FireSchedule's transaction, before it writes: FireStarted means create
// the instance; FireSkipped, record the skip; FireStale, write nothing.
func FireDecision(s *Schedule, p *FireParams) FireResult {
	switch {
	case s.Fingerprint != p.Schedule.Fingerprint, s.Paused, !p.Tick.After(s.LastTick):
		return FireResult{Outcome: FireStale}
	case p.SkipIfRunning && s.LastInstanceStatus != "" && !s.LastInstanceStatus.Finished():
		return FireResult{Outcome: FireSkipped, InstanceID: s.LastInstanceID}
	}
	return FireResult{Outcome: FireStarted}
}
