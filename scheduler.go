package dagrun

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"time"

	"github.com/google/uuid"

	"github.com/dagrun/dagrun/dag"
	"github.com/dagrun/dagrun/storage"
)

// Defaults for SchedulerConfig fields left zero.
const (
	// DefaultSchedulerPoll is how often a scheduler with nothing due reads
	// the stored state again, to see pauses and resumes made elsewhere.
	DefaultSchedulerPoll = 10 * time.Second
	// DefaultLateTolerance is how late a running scheduler may be for a
	// tick and still start it though the schedule has no catchup: a slow
	// database or a busy machine delays a tick, it does not miss it.
	DefaultLateTolerance = time.Minute
	// maxFiresPerPass bounds the ticks one pass starts per schedule, so
	// that a long catchup window is worked off over several passes rather
	// than in one loop the others wait for.
	maxFiresPerPass = 1000
)

// SchedulerConfig configures a Scheduler. The zero value is usable.
type SchedulerConfig struct {
	// Now is the scheduler's clock: which ticks are due, and where a new
	// schedule starts. Default: time.Now. Tests inject a fake clock.
	Now func() time.Time
	// Poll bounds how long the scheduler sleeps before reading the stored
	// state again. Default: DefaultSchedulerPoll (10s).
	Poll time.Duration
	// LateTolerance: a tick that fell due while this scheduler ran is
	// started up to this late even without catchup. Default:
	// DefaultLateTolerance (1m).
	LateTolerance time.Duration
	// Workflows, when set, limits the scheduler to these workflows'
	// schedules (a workflow test runs only the tested one's).
	Workflows []string
}

// ScheduleObserver is implemented by an Observer that also wants to know
// what the scheduler does; the engine finds it by type assertion.
type ScheduleObserver interface {
	// TickFired reports a tick that started an instance, lag after the
	// tick's time.
	TickFired(workflow string, lag time.Duration)
	// TickSkipped reports a tick that started nothing because the
	// schedule's last instance was unfinished (overlap: skip).
	TickSkipped(workflow string)
}

// Scheduler starts the instances of the loaded workflows' schedules. Any
// number of schedulers, in any number of processes, may run against one
// database: each tick starts one instance, because the store records the
// tick in the transaction that creates it (storage.ScheduleStore).
type Scheduler struct {
	engine   *Engine
	config   *SchedulerConfig
	logger   *slog.Logger
	observer ScheduleObserver
	started  time.Time
	loaded   []*dag.Schedule
	owner    map[*dag.Schedule]*dag.Workflow
}

// NewScheduler returns a scheduler of the engine's workflows' schedules.
func (e *Engine) NewScheduler(config *SchedulerConfig) (*Scheduler, error) {
	if config == nil {
		config = &SchedulerConfig{}
	}
	c := *config
	if c.Now == nil {
		c.Now = time.Now
	}
	c.Poll = cmp.Or(c.Poll, DefaultSchedulerPoll)
	c.LateTolerance = cmp.Or(c.LateTolerance, DefaultLateTolerance)
	if c.Poll < 0 || c.LateTolerance < 0 {
		return nil, errors.New("dagrun: SchedulerConfig.Poll and LateTolerance must not be negative")
	}
	s := &Scheduler{engine: e, config: &c, logger: e.logger.With(slog.String("component", "scheduler")),
		owner: map[*dag.Schedule]*dag.Workflow{}}
	s.observer, _ = e.observer.(ScheduleObserver)
	for _, w := range e.Workflows() {
		if len(c.Workflows) > 0 && !slices.Contains(c.Workflows, w.Name) {
			continue
		}
		for _, sch := range w.Schedules {
			s.loaded = append(s.loaded, sch)
			s.owner[sch] = w
		}
	}
	return s, nil
}

func scheduleSpec(w *dag.Workflow, sch *dag.Schedule) storage.ScheduleSpec {
	return storage.ScheduleSpec{Workflow: w.Name, Index: sch.Index, Fingerprint: sch.Fingerprint()}
}

// Register records the loaded schedules in the store: a new schedule, or
// one whose cron, zone or input changed since the store last saw it,
// fires only ticks after now. Run calls it first; it is exported for
// tests that drive a scheduler pass by pass.
func (s *Scheduler) Register(ctx context.Context) error {
	s.started = s.config.Now()
	if len(s.loaded) == 0 {
		return nil
	}
	specs := make([]storage.ScheduleSpec, len(s.loaded))
	for i, sch := range s.loaded {
		specs[i] = scheduleSpec(s.owner[sch], sch)
	}
	_, err := s.engine.store.RegisterSchedules(ctx, storage.RegisterSchedulesParams{Specs: specs, Now: s.started})
	return err
}

// Run registers the schedules, then starts their due ticks until ctx
// ends, and returns nil then. A failing store is logged and tried again
// after Poll, the registration as much as a tick: the database may come
// up after the process.
func (s *Scheduler) Run(ctx context.Context) error {
	if len(s.loaded) == 0 {
		<-ctx.Done()
		return nil
	}
	for {
		err := s.Register(ctx)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		s.logger.Warn("scheduler: could not register the schedules; trying again", slog.Any("error", err))
		if !sleep(ctx, s.config.Poll) {
			return nil
		}
	}
	s.logger.Info("scheduler started", slog.Int("schedules", len(s.loaded)))
	for {
		next, err := s.FireDue(ctx)
		if ctx.Err() != nil {
			return nil
		}
		wait := s.config.Poll
		if err != nil {
			s.logger.Warn("scheduler: could not start due ticks; trying again", slog.Any("error", err))
		} else if d := next.Sub(s.config.Now()); !next.IsZero() && d < wait {
			wait = max(d, 0)
		}
		if !sleep(ctx, wait) {
			return nil
		}
	}
}

// sleep waits for d, or less when ctx ends first: it then returns false.
func sleep(ctx context.Context, d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}

// FireDue starts every tick that is due now and returns the earliest tick
// still to come (zero when none is). A tick is due when it is after the
// schedule's last handled tick, not after now, and either no older than
// the schedule's catchup or one that fell due while this scheduler ran
// (within LateTolerance). Run calls it in a loop.
func (s *Scheduler) FireDue(ctx context.Context) (time.Time, error) {
	states, err := s.engine.store.ListSchedules(ctx)
	if err != nil {
		return time.Time{}, err
	}
	byKey := make(map[scheduleKey]storage.Schedule, len(states))
	for _, st := range states {
		byKey[scheduleKey{st.Workflow, st.Index}] = st
	}
	var (
		next time.Time
		errs []error
	)
	for _, sch := range s.loaded {
		w := s.owner[sch]
		st, ok := byKey[scheduleKey{w.Name, sch.Index}]
		switch {
		case !ok:
			// Registered after this scheduler started (the row was
			// deleted by hand, say): register it now.
			got, err := s.engine.store.RegisterSchedules(ctx, storage.RegisterSchedulesParams{
				Specs: []storage.ScheduleSpec{scheduleSpec(w, sch)}, Now: s.config.Now()})
			if err != nil {
				errs = append(errs, err)
				continue
			}
			st = got[0]
		case st.Fingerprint != sch.Fingerprint():
			// A process started since with another version of the file
			// registered its own schedule at this index: the last process
			// to start decides, and this one fires nothing there.
			continue
		}
		n, err := s.fireSchedule(ctx, w, sch, st)
		if err != nil {
			errs = append(errs, fmt.Errorf("schedule %d of %s: %w", sch.Index, w.Name, err))
		}
		if !n.IsZero() && (next.IsZero() || n.Before(next)) {
			next = n
		}
	}
	return next, errors.Join(errs...)
}

type scheduleKey struct {
	workflow string
	index    int
}

// fireSchedule starts the due ticks of one schedule and returns its next
// tick.
func (s *Scheduler) fireSchedule(ctx context.Context, w *dag.Workflow, sch *dag.Schedule, st storage.Schedule) (time.Time, error) {
	now := s.config.Now()
	if st.Paused {
		return sch.Next(later(st.LastTick, now)), nil
	}
	oldest := now.Add(-sch.Catchup)
	if late := now.Add(-s.config.LateTolerance); s.started.Before(late) {
		oldest = earliest(oldest, late)
	} else {
		oldest = earliest(oldest, s.started)
	}
	from := later(st.LastTick, oldest.Add(-time.Nanosecond))
	tick := sch.Next(from)
	caughtUp := false
	for fired := 0; !tick.IsZero() && !tick.After(now) && fired < maxFiresPerPass; fired++ {
		// Catchup starts every missed tick of the downtime: the first one
		// minds overlap: skip as any tick does (an instance from before
		// the downtime may still run), the later ones do not find the
		// instances this catch-up started and skip. Ticks that come while
		// a scheduler runs, late ones included, mind it always.
		missed := tick.Before(s.started)
		skipIfRunning := sch.Overlap == dag.OverlapSkip && !(missed && caughtUp)
		res, err := s.fire(ctx, w, sch, tick, skipIfRunning)
		if err != nil {
			return tick, err
		}
		if res.Outcome == storage.FireStale {
			// Another process handled this tick, or the schedule was
			// paused or edited meanwhile: read the state again next pass.
			return sch.Next(tick), nil
		}
		caughtUp = caughtUp || missed && res.Outcome == storage.FireStarted
		tick = sch.Next(tick)
	}
	return tick, nil
}

// fire starts one tick's instance, or with skipIfRunning none while the
// schedule's last instance is unfinished.
func (s *Scheduler) fire(ctx context.Context, w *dag.Workflow, sch *dag.Schedule, tick time.Time, skipIfRunning bool) (storage.FireResult, error) {
	input, err := s.engine.decodeInput(w, sch.Input)
	if err != nil {
		return storage.FireResult{}, err
	}
	id, err := uuid.NewV7()
	if err != nil {
		return storage.FireResult{}, fmt.Errorf("new instance id: %w", err)
	}
	p := storage.FireParams{
		Schedule:      scheduleSpec(w, sch),
		Tick:          tick,
		SkipIfRunning: skipIfRunning,
		Instance: storage.CreateParams{
			ID:             id.String(),
			Workflow:       w.Name,
			DefinitionHash: w.Hash,
			Definition:     w.Source,
			Input:          input,
			Key:            TickKey(sch, tick),
			Timeout:        w.Timeout,
			Steps:          s.engine.stepSpecs(w),
		},
	}
	if err := limitInstance(w, &p.Instance); err != nil {
		return storage.FireResult{}, err
	}
	if s.engine.tracing != nil {
		// Each tick's instance is a trace of its own: nobody called it, and
		// whatever span the scheduler's context carries is not its cause.
		p.Instance.TraceParent, p.Instance.TraceCaller = instanceTrace(context.Background())
	}
	rec := s.engine.newFinishRecorder()
	res, err := s.engine.store.FireSchedule(rec.attach(ctx), p, rec.plan)
	if err != nil {
		return res, err
	}
	rec.report()
	switch res.Outcome {
	case storage.FireStarted:
		lag := s.config.Now().Sub(tick)
		s.engine.observer.InstanceStarted(w.Name)
		if s.observer != nil {
			s.observer.TickFired(w.Name, lag)
		}
		s.engine.notifyChanged()
		s.logger.Info("scheduled instance started", slog.String("workflow", w.Name), slog.Int("schedule", sch.Index),
			slog.Time("tick", tick), slog.String("instance", res.InstanceID), slog.Duration("lag", lag))
	case storage.FireSkipped:
		if s.observer != nil {
			s.observer.TickSkipped(w.Name)
		}
		s.logger.Info("scheduled tick skipped: the last instance is unfinished (overlap: skip)", slog.String("workflow", w.Name),
			slog.Int("schedule", sch.Index), slog.Time("tick", tick), slog.String("running", res.InstanceID))
	}
	return res, nil
}

// TickKey is the idempotency key of the instance a schedule starts at a
// tick: the schedule's fingerprint, not its index, so that the same
// schedule moved to another position by an edit does not start a tick
// twice while processes with the old and the new file both run.
func TickKey(sch *dag.Schedule, tick time.Time) string {
	return "schedule:" + sch.Fingerprint() + ":" + tick.UTC().Format(time.RFC3339)
}

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// ScheduleInfo is one loaded schedule with its stored state.
type ScheduleInfo struct {
	Workflow string
	Index    int
	Cron     string
	Timezone string
	Overlap  dag.Overlap
	Catchup  time.Duration
	// Next are the next fire times; a paused schedule lists them too, as
	// the times it would fire.
	Next   []time.Time
	Paused bool
	// LastInstanceID and LastInstanceStatus are the instance the schedule
	// started last; empty before the first.
	LastInstanceID     string
	LastInstanceStatus storage.InstanceStatus
	Fired, Skipped     int64
}

// Schedules lists the loaded workflows' schedules with their stored state
// and their next fire times after now, up to next of them.
func (e *Engine) Schedules(ctx context.Context, now time.Time, next int) ([]ScheduleInfo, error) {
	states, err := e.store.ListSchedules(ctx)
	if err != nil {
		return nil, err
	}
	byKey := make(map[scheduleKey]storage.Schedule, len(states))
	for _, st := range states {
		byKey[scheduleKey{st.Workflow, st.Index}] = st
	}
	out := []ScheduleInfo{}
	for _, w := range e.Workflows() {
		for _, sch := range w.Schedules {
			info := ScheduleInfo{Workflow: w.Name, Index: sch.Index, Cron: sch.Cron, Timezone: sch.Timezone,
				Overlap: sch.Overlap, Catchup: sch.Catchup, Next: []time.Time{}}
			from := now
			if st, ok := byKey[scheduleKey{w.Name, sch.Index}]; ok {
				info.Paused = st.Paused
				info.Fired, info.Skipped = st.Fired, st.Skipped
				info.LastInstanceID, info.LastInstanceStatus = st.LastInstanceID, st.LastInstanceStatus
				if st.Fingerprint == sch.Fingerprint() {
					from = later(from, st.LastTick)
				}
			}
			for t := sch.Next(from); !t.IsZero() && len(info.Next) < next; t = sch.Next(t) {
				info.Next = append(info.Next, t)
			}
			out = append(out, info)
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Workflow != out[j].Workflow {
			return out[i].Workflow < out[j].Workflow
		}
		return out[i].Index < out[j].Index
	})
	return out, nil
}

// UnknownScheduleError reports a schedule index the workflow does not
// have. It matches storage.ErrNotFound.
type UnknownScheduleError struct {
	Workflow string
	// Index is negative when all the workflow's schedules were asked for.
	Index int
	// Count is how many schedules the workflow has.
	Count int
}

func (e *UnknownScheduleError) Error() string {
	if e.Count == 0 {
		return fmt.Sprintf("workflow %s has no schedule: add a schedule: list to its file", e.Workflow)
	}
	return fmt.Sprintf("workflow %s has no schedule %d: its schedules are numbered 0 to %d", e.Workflow, e.Index, e.Count-1)
}

// Is makes errors.Is(err, storage.ErrNotFound) true.
func (e *UnknownScheduleError) Is(target error) bool { return target == storage.ErrNotFound }

// PauseSchedule pauses (or, with paused false, resumes) schedule index of
// workflow, or all its schedules when index is negative. The pause is
// stored, so it holds for every scheduler and survives restarts; a resumed
// schedule starts from now and does not catch up the ticks of its pause.
func (e *Engine) PauseSchedule(ctx context.Context, workflow string, index int, paused bool) error {
	w, err := e.lookupWorkflow(workflow)
	if err != nil {
		return err
	}
	if len(w.Schedules) == 0 || index >= len(w.Schedules) {
		return &UnknownScheduleError{Workflow: workflow, Index: index, Count: len(w.Schedules)}
	}
	now := time.Now()
	targets := w.Schedules
	if index >= 0 {
		targets = w.Schedules[index : index+1]
	}
	specs := make([]storage.ScheduleSpec, len(targets))
	for i, sch := range targets {
		specs[i] = scheduleSpec(w, sch)
	}
	// Registering first lets a schedule be paused before any scheduler
	// has run; a registered one is left as it is, even if this process's
	// file differs from the one the schedulers run.
	if _, err := e.store.RegisterSchedules(ctx, storage.RegisterSchedulesParams{Specs: specs, Now: now, OnlyNew: true}); err != nil {
		return err
	}
	for _, sch := range targets {
		if err := e.store.SetSchedulePaused(ctx, storage.SetPausedParams{Workflow: w.Name, Index: sch.Index, Paused: paused, Now: now}); err != nil {
			return err
		}
	}
	return nil
}
