package dagrun

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/dagrun/dagrun/storage"
)

// Defaults for WorkerConfig fields left zero.
const (
	// DefaultConcurrency matches River's default MaxWorkers: handlers are
	// mostly I/O-bound, goroutines are cheap, and a larger batch per claim
	// and per group commit is what makes a busy worker fast.
	DefaultConcurrency   = 100
	DefaultLease         = 30 * time.Second
	DefaultPoll          = time.Second
	DefaultShutdownGrace = 10 * time.Second
)

// WorkerConfig configures a Worker. The zero value is usable.
type WorkerConfig struct {
	// ID names the worker in the event history, and its claims: no two
	// running workers may share one (a worker runs the steps leased to
	// its ID that a claim whose answer was lost took for it: see
	// orphans.go). Default: host-pid-random.
	ID string
	// Concurrency is how many steps run at once. Default: DefaultConcurrency (100).
	Concurrency int
	// Queues restricts the worker to these queues. Default: all queues.
	Queues []string
	// InstanceID restricts the worker to one instance's steps (the
	// in-process worker of a following `start`). Default: any instance.
	InstanceID string
	// Lease is how long a claim holds without a heartbeat; the worker
	// heartbeats every third of it. Default: DefaultLease (30s).
	Lease time.Duration
	// Poll is the fallback polling interval when no wake-up arrives.
	// Default: DefaultPoll (1s).
	Poll time.Duration
	// ShutdownGrace is how long running steps may finish after Run's
	// context ends before they are cancelled and released (a step on its
	// last attempt fails instead: see Worker.Run). It is also how
	// long a handler may run on after its context was cancelled (its
	// step timed out, was cancelled, or its lease was lost) before the
	// worker stops waiting for it. Default: DefaultShutdownGrace (10s).
	ShutdownGrace time.Duration
}

func (c *WorkerConfig) withDefaults() *WorkerConfig {
	out := *c
	if out.ID == "" {
		host, _ := os.Hostname()
		out.ID = fmt.Sprintf("%s-%d-%s", cmp.Or(host, "worker"), os.Getpid(), uuid.NewString()[:8])
	}
	out.Concurrency = cmp.Or(c.Concurrency, DefaultConcurrency)
	out.Lease = cmp.Or(c.Lease, DefaultLease)
	out.Poll = cmp.Or(c.Poll, DefaultPoll)
	out.ShutdownGrace = cmp.Or(c.ShutdownGrace, DefaultShutdownGrace)
	return &out
}

// Worker claims ready steps and runs their handlers. Create it with
// Engine.NewWorker and run it with Run.
//
// A worker tracks each attempt by its claim (step and fence), never by the
// step alone: the same step can be claimed again by the same worker (an
// instance cancelled and retried within one heartbeat), and then the older
// attempt is stopped while the newer one runs and heartbeats on its own.
type Worker struct {
	engine *Engine
	config *WorkerConfig
	logger *slog.Logger
	// ran is set by the first call of Run.
	ran atomic.Bool
	// debug is whether the logger takes debug records: each attempt's
	// start and end, asked for once rather than at every attempt.
	debug bool
	slots *slots
	// logs writes what the handlers log.
	logs *logWriter

	mu sync.Mutex
	// attempts holds every attempt not yet settled, by claim; newest is the
	// latest claim of each step, so a newer claim can stop an older one.
	attempts map[attemptKey]*attempt
	newest   map[int64]attemptKey
	// waiting counts handlers the worker still waits for at shutdown.
	waiting int
	// stopping turns away steps claimed after the claim loop ended;
	// closing stops late timers once the worker is being torn down.
	stopping bool
	closing  bool
	// queue holds finished attempts on their way to the recorder.
	queue []finished
	// claiming holds the claims on their way back from the store (see
	// inflight.go).
	claiming []*claimInFlight
	// orphans is the worker's doubt about claims that failed (see
	// orphans.go).
	orphans orphans

	queued      chan struct{} // a result was queued
	handlerExit chan struct{} // a handler returned or was given up on
	// due wakes the claim loop when a step this worker retried or snoozed
	// becomes ready before the next poll, so a 10ms backoff waits 10ms
	// rather than a poll interval.
	due chan struct{}
	// wakeTimes holds the deadlines this process's plans started (timed
	// waits, workflow timeouts), for the claim loop's idle timer (see
	// deadlines.go).
	wakeTimes *wakeTimes
	// sweptDueAt is when the claim loop last swept what NextWake said was
	// due already (see sleepUntilNext); only the claim loop touches it.
	sweptDueAt time.Time

	// handlerCtx is the context handlers run under, set by Run; it
	// outlives Run's context by the shutdown grace.
	handlerCtx context.Context
	// started is when Run began.
	started time.Time
}

// NewWorker returns a worker of this engine.
func (e *Engine) NewWorker(config *WorkerConfig) (*Worker, error) {
	if config == nil {
		config = &WorkerConfig{}
	}
	if err := config.Validate(); err != nil {
		return nil, err
	}
	config = config.withDefaults()
	w := &Worker{
		engine:      e,
		config:      config,
		logger:      e.logger.With(slog.String("worker", config.ID)),
		debug:       e.logger.Enabled(context.Background(), slog.LevelDebug),
		logs:        newLogWriter(e.store, e.logger, e.config.StepLogBytes),
		slots:       newSlots(config.Concurrency),
		attempts:    map[attemptKey]*attempt{},
		newest:      map[int64]attemptKey{},
		queued:      make(chan struct{}, 1),
		handlerExit: make(chan struct{}, 1),
		due:         make(chan struct{}, 1),
		wakeTimes:   newWakeTimes(),
	}
	w.orphans.opened.L = &w.mu
	return w, nil
}

// ErrWorkerRan is what Run returns when the Worker ran before: its state
// (claims, attempts, the slots) is its one run's.
var ErrWorkerRan = errors.New("dagrun: this Worker has run already; make another with Engine.NewWorker")

// ID returns the worker's ID.
func (w *Worker) ID() string { return w.config.ID }

// Run claims and runs steps until ctx ends, then shuts down gracefully: it
// stops claiming, lets running steps finish within the shutdown grace,
// cancels the rest, records every result it has, and releases the claims
// of steps that did not finish, but for a step on its last attempt
// (maxAttempts 1, say), which fails as a crash would fail it, so that no
// step runs more often than its retry policy allows. A handler that
// ignores its cancelled context does not keep Run from returning: it is
// left running, and its step is released. When the store reports its
// database lost (storage.ErrDatabaseLost), Run cancels its handlers at
// once and returns that error. A Worker runs once: Run returns
// ErrWorkerRan when called again; make another with Engine.NewWorker.
func (w *Worker) Run(ctx context.Context) error {
	if !w.ran.CompareAndSwap(false, true) {
		return ErrWorkerRan
	}
	w.started = time.Now()
	defer w.watchClock(ctx)()
	wake, unsubscribe := w.engine.store.Subscribe(w.config.Queues)
	defer unsubscribe()
	defer w.announce(ctx)()

	handlerCtx, cancelHandlers := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancelHandlers(errShutdown)
	w.handlerCtx = handlerCtx

	recorderCtx, stopRecorder := context.WithCancel(context.WithoutCancel(ctx))
	recorderDone := make(chan struct{})
	go func() { defer close(recorderDone); w.recordLoop(recorderCtx) }()
	logsCtx, stopLogs := context.WithCancel(context.WithoutCancel(ctx))
	logsDone := make(chan struct{})
	go func() { defer close(logsDone); w.logs.run(logsCtx) }()
	// Last, once no handler logs any more: the writer writes what is left.
	defer func() { stopLogs(); <-logsDone }()
	heartbeatCtx, stopHeartbeat := context.WithCancel(context.WithoutCancel(ctx))
	heartbeatDone := make(chan struct{})
	go func() { defer close(heartbeatDone); w.heartbeatLoop(heartbeatCtx) }()

	w.engine.addWorker(w)
	defer w.engine.removeWorker(w)
	lost := w.claimLoop(ctx, wake)
	w.mu.Lock()
	w.stopping = true
	w.mu.Unlock()

	if lost != nil {
		// No result can be recorded any more: stop the handlers now.
		w.logger.Error("dagrun: worker stopping: its database is lost", slog.Any("error", lost))
		cancelHandlers(errShutdown)
	}
	w.drain(cancelHandlers)
	stopRecorder()
	<-recorderDone
	stopHeartbeat()
	<-heartbeatDone
	w.releaseUnfinished()
	return lost
}

// claimLoop claims until ctx ends, or returns the error when the store
// reports its database lost.
func (w *Worker) claimLoop(ctx context.Context, wake <-chan struct{}) error {
	poll := time.NewTicker(w.config.Poll)
	defer poll.Stop()
	recoverEvery := time.NewTicker(max(w.config.Lease/2, 5*time.Millisecond))
	defer recoverEvery.Stop()
	// idle fires when the earliest step this worker could take becomes
	// claimable or a wait times out, so that neither waits for a poll.
	idle := newIdleTimer()
	defer idle.Stop()
	errorDelay := time.Duration(0)
	var busySince time.Time // when the worker last looked for a timeout while every slot was taken
	// short is whether the loop's last claim came back short: an idle
	// worker's next one most likely does too, so it asks for the next wake
	// with it when the store can answer in the same round trip.
	short := true
	for ctx.Err() == nil {
		w.adoptOrphans(ctx)
		var slotFreed <-chan struct{}
		if free := w.slots.take(w.config.Concurrency); free > 0 {
			inFlight := w.beginClaim()
			steps, next, err := w.claim(ctx, free, short)
			if err != nil {
				w.dropClaim(inFlight)
				w.slots.give(free)
				if ctx.Err() != nil {
					return nil
				}
				if errors.Is(err, storage.ErrDatabaseLost) {
					return err
				}
				// The claim may have committed, its answer lost: its
				// steps are found before the worker waits to try again.
				w.suspectOrphans()
				w.adoptOrphans(ctx)
				errorDelay = min(max(2*errorDelay, 50*time.Millisecond), 5*time.Second)
				wait := jitter(errorDelay)
				w.logger.ErrorContext(ctx, "dagrun: claim steps", slog.Any("error", err), slog.Duration("retry_in", wait))
				sleepCtx(ctx, wait)
				continue
			}
			if errorDelay > 0 {
				// The failed tries were each logged; say that they ended.
				w.logger.InfoContext(ctx, "dagrun: claim steps: the store answers again")
			}
			errorDelay = 0
			w.adopt(inFlight, free, steps)
			if len(steps) > 0 {
				w.engine.notifyChanged()
			}
			short = len(steps) < free
			if !short {
				// There may be more ready work: claim again as soon as a
				// slot frees up.
				slotFreed = w.slots.freed
			} else {
				w.sleepUntilNext(ctx, idle, next)
			}
		} else {
			slotFreed = w.slots.freed
			busySince = w.wakeWhileBusy(ctx, idle, busySince)
		}
		for waiting := true; waiting; {
			waiting = false
			select {
			case <-ctx.Done():
			case <-wake:
			case <-slotFreed:
			case <-w.due:
			case <-poll.C:
			case <-w.wakeTimes.told:
				// A deadline to look at later, not work to claim now.
				idle.fireBy(w.wakeTimes.take())
				waiting = true
			case <-idle.C:
				idle.fired()
				w.sweepDue(ctx)
			case <-recoverEvery.C:
				w.recoverExpired(ctx)
				w.sweepDue(ctx)
			}
		}
	}
	return nil
}

// claim claims up to free steps and, when it gets fewer, says when the
// next one becomes due (zero when nothing is, or the store could not say:
// the poll is the fallback). With short set, a store that can answer both
// in one round trip is asked so; otherwise the wake is a read of its own,
// made only when the claim came back short.
func (w *Worker) claim(ctx context.Context, free int, short bool) ([]storage.ClaimedStep, time.Time, error) {
	p := w.claimParams(free)
	if wc, ok := w.engine.store.(storage.WakeClaimer); ok && short {
		return wc.ClaimStepsAndWake(ctx, p)
	}
	steps, err := w.engine.store.ClaimSteps(ctx, p)
	if err != nil || len(steps) >= free {
		return steps, time.Time{}, err
	}
	next, err := w.engine.store.NextWake(ctx, p)
	if err != nil {
		next = time.Time{}
	}
	return steps, next, nil
}

func (w *Worker) claimParams(limit int) storage.ClaimParams {
	return storage.ClaimParams{
		WorkerID:   w.config.ID,
		Queues:     w.config.Queues,
		InstanceID: w.config.InstanceID,
		Limit:      limit,
		Lease:      w.config.Lease,
		Handlers:   w.engine.claimHandlers(),
		// Only a worker whose attempts have spans reads their parent.
		TraceParent: w.engine.tracing != nil,
	}
}

// adopt ends claim c: it runs the steps the claim got, which had taken
// slots, and gives back the slots it did not fill. Once the worker stopped
// claiming, it runs nothing and releases the steps instead. The steps of
// an instance stopped while the claim was on its way are released too:
// their claim is stale, which makes the release a no-op, unless the
// instance was retried in between, and then the step is claimed again.
func (w *Worker) adopt(c *claimInFlight, taken int, steps []storage.ClaimedStep) {
	run, unrun, started := w.start(c, steps)
	w.slots.give(taken - started)
	if started < len(run) {
		unrun = append(unrun, run...)
	}
	if len(unrun) > 0 {
		w.release(unrun)
	}
}

// start ends claim c, registers the steps it claimed and runs their
// handlers, each on a slot the caller took, and returns how many it
// started: all it runs, or none once the worker stopped claiming. A step
// claimed again while an older attempt of it still runs here stops that
// older attempt.
func (w *Worker) start(c *claimInFlight, steps []storage.ClaimedStep) (run, ended []storage.ClaimedStep, started int) {
	w.mu.Lock()
	// Under the lock that stopInstance takes: an instance it stops now
	// either ended the claim's steps already, or finds their attempts.
	run, ended = w.endClaimLocked(c, steps)
	if len(run) == 0 || w.stopping {
		w.mu.Unlock()
		return run, ended, 0
	}
	attempts := make([]*attempt, len(run))
	for i, step := range run {
		a := w.newAttempt(step)
		key := a.key()
		if prev, ok := w.newest[step.StepID]; ok && prev.fence < key.fence {
			if old := w.attempts[prev]; old != nil {
				w.stopLocked(old, errSuperseded)
			}
		}
		w.newest[step.StepID] = key
		w.attempts[key] = a
		w.waiting++
		attempts[i] = a
	}
	w.mu.Unlock()
	for _, a := range attempts {
		if w.debug {
			w.logger.Debug("dagrun: attempt started", attemptAttrs(a.step, slog.String("handler", a.step.Handler))...)
		}
		go w.execute(a)
	}
	return run, ended, len(run)
}

// attemptAttrs are the attributes of a debug record about an attempt of
// step: its instance, step, item (of a forEach step) and attempt, then more.
func attemptAttrs(step storage.ClaimedStep, more ...any) []any {
	attrs := []any{slog.String("instance", step.InstanceID), slog.String("step", step.Step)}
	if step.Item >= 0 {
		attrs = append(attrs, slog.Int("item", step.Item))
	}
	return append(append(attrs, slog.Int("attempt", step.Attempt)), more...)
}

// reserveEager takes up to n free slots for the steps a start in this
// process claims for the worker in its creating transaction, and returns
// how many it took. A worker bound to one instance takes none: a new
// instance is never its own.
func (w *Worker) reserveEager(n int) int {
	if w.config.InstanceID != "" {
		return 0
	}
	w.mu.Lock()
	stopping := w.stopping
	w.mu.Unlock()
	if stopping {
		return 0
	}
	return w.slots.take(n)
}

// release returns claimed steps the worker will not run to pending,
// without counting the attempt.
func (w *Worker) release(steps []storage.ClaimedStep) {
	claims := make([]storage.Claim, len(steps))
	for i, s := range steps {
		claims[i] = s.Claim
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := w.engine.store.ReleaseSteps(ctx, claims); err != nil {
		w.logger.Error("dagrun: release claimed steps this worker will not run; they run again when their lease expires", slog.Any("error", err))
	}
}

// sleepUntilNext sets idle to fire at next, the time a short claim said
// the next step this worker could claim becomes due, or the next wait
// times out (the store's clock; the millisecond covers its run_after <=
// now). A time already past by this process's clock, while the store says
// it is still to come, means the clocks disagree: looking again every
// idleRecheck bounds the lateness without spinning.
func (w *Worker) sleepUntilNext(ctx context.Context, idle *idleTimer, next time.Time) {
	if next.IsZero() {
		return // the poll is the fallback
	}
	d := time.Until(next) + time.Millisecond
	if d <= 0 {
		// Due already (a wait past its deadline while no worker ran, an
		// instance admitted by another's finish): do it now, since a
		// poll shorter than idleRecheck re-arms the timer before it fires;
		// at most once per idleRecheck, since a store whose clock is
		// behind this process's says so until its clock catches up.
		if now := time.Now(); now.Sub(w.sweptDueAt) >= idleRecheck {
			w.sweptDueAt = now
			w.sweepDue(ctx)
		}
		d = idleRecheck
	}
	idle.set(d)
}

// idleRecheck is how soon an idle worker looks again for a step or wait
// its store says is not due yet although this process's clock says it is.
const idleRecheck = 50 * time.Millisecond

// recheck makes the claim loop claim and look for the next wake time again.
func (w *Worker) recheck() {
	select {
	case w.due <- struct{}{}:
	default:
	}
}

// wakeAt makes the claim loop look for work at t, when t comes before the
// next poll would.
func (w *Worker) wakeAt(t time.Time) {
	d := time.Until(t) + time.Millisecond // the store compares run_after <= now
	if d >= w.config.Poll {
		return
	}
	time.AfterFunc(max(d, 0), w.recheck)
}

// drain waits for running handlers up to the shutdown grace, then cancels
// the stragglers and waits a last moment for them to return. One that
// still does not is left behind: its step is released like the others, and
// the log says which it was.
func (w *Worker) drain(cancelHandlers context.CancelCauseFunc) {
	grace := time.NewTimer(w.config.ShutdownGrace)
	defer grace.Stop()
	if n := w.handlersRunning(); n > 0 {
		w.logger.Info("dagrun: stopping; waiting for running steps to finish", slog.Int("steps", n), slog.Duration("grace", w.config.ShutdownGrace))
	}
	if w.waitHandlers(grace.C) {
		return
	}
	w.logger.Warn("dagrun: shutdown grace over; cancelling running steps and releasing them", slog.Int("steps", w.handlersRunning()))
	cancelHandlers(errShutdown)
	last := time.NewTimer(min(w.config.ShutdownGrace, time.Second) + 100*time.Millisecond)
	defer last.Stop()
	if w.waitHandlers(last.C) {
		return
	}
	w.mu.Lock()
	w.closing = true
	for _, a := range w.attempts {
		if !a.handlerDone {
			w.logger.Error("dagrun: handler ignored its cancelled context; exiting without it and releasing its step",
				slog.String("instance", a.step.InstanceID), slog.String("step", a.step.Step),
				slog.String("handler", a.step.Handler), slog.Int("attempt", a.step.Attempt))
		}
	}
	w.mu.Unlock()
}

// waitHandlers waits until no handler runs or until deadline fires, and
// reports whether none runs.
func (w *Worker) waitHandlers(deadline <-chan time.Time) bool {
	for w.handlersRunning() > 0 {
		select {
		case <-w.handlerExit:
		case <-deadline:
			return w.handlersRunning() == 0
		}
	}
	return true
}

func (w *Worker) handlersRunning() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.waiting
}

// releaseUnfinished returns the claims of attempts whose result was never
// recorded (cancelled at shutdown, or whose handler never returned) to
// pending, so another worker picks them up without waiting for the lease.
func (w *Worker) releaseUnfinished() {
	w.mu.Lock()
	w.closing = true
	claims := make([]storage.Claim, 0, len(w.attempts))
	for key, a := range w.attempts {
		a.stopTimer()
		switch {
		case a.stopped:
		case lastAttempt(a.step):
			// Its handler never returned, or its result could not be
			// recorded: released, the step would run once more than it
			// may, so its lease runs out instead, which fails it as a
			// crash would.
			w.logger.Warn("dagrun: not releasing a step on its last attempt; it fails when its lease expires",
				slog.String("instance", a.step.InstanceID), slog.String("step", a.step.Step), slog.Int("attempt", a.step.Attempt))
		default:
			claims = append(claims, a.step.Claim)
		}
		delete(w.attempts, key)
	}
	clear(w.newest)
	w.mu.Unlock()
	if len(claims) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := w.engine.store.ReleaseSteps(ctx, claims); err != nil {
		w.logger.Error("dagrun: release steps at shutdown; they run again when their lease expires", slog.Any("error", err))
		return
	}
	w.logger.Info("dagrun: released unfinished steps", slog.Int("steps", len(claims)))
}

// jitter returns a duration drawn between d/2 and d: workers that failed
// together (a database that turned them all away) then do not all come
// back together.
func jitter(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d-d/2)
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
