package dagrun

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
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

// maxFinishBatch bounds how many finished attempts one group commit writes.
const maxFinishBatch = 256

// WorkerConfig configures a Worker. The zero value is usable.
type WorkerConfig struct {
	// ID names the worker in the event history. Default: host-pid-random.
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
	// context ends before they are cancelled and released. Default:
	// DefaultShutdownGrace (10s).
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

func (c *WorkerConfig) validate() error {
	switch {
	case c.Concurrency < 1:
		return fmt.Errorf("worker concurrency must be at least 1, got %d", c.Concurrency)
	case c.Lease < 10*time.Millisecond:
		return fmt.Errorf("worker lease must be at least 10ms, got %s", c.Lease)
	case c.Poll < time.Millisecond:
		return fmt.Errorf("worker poll interval must be at least 1ms, got %s", c.Poll)
	case c.ShutdownGrace < 0:
		return fmt.Errorf("worker shutdown grace must not be negative, got %s", c.ShutdownGrace)
	}
	return nil
}

// Worker claims ready steps and runs their handlers. Create it with
// Engine.NewWorker and run it with Run.
type Worker struct {
	engine *Engine
	config *WorkerConfig
	logger *slog.Logger

	mu       sync.Mutex
	inflight map[int64]*attempt // by step ID

	results   chan finished
	slotFreed chan struct{}

	// Set by Run: the context handlers run under, and the count of running
	// handlers that shutdown waits for. stopping (under mu) turns away
	// steps claimed after the claim loop ended.
	handlerCtx context.Context
	running    sync.WaitGroup
	stopping   bool
	// reserved (under mu) counts free slots a group commit is claiming
	// for, so the claim loop does not claim them too.
	reserved int
	// due wakes the claim loop when a step this worker retried or snoozed
	// becomes ready before the next poll, so a 10ms backoff waits 10ms
	// rather than a poll interval.
	due chan struct{}
}

// attempt is one claimed step whose handler runs or whose result awaits
// its commit.
type attempt struct {
	step   storage.ClaimedStep
	ctx    context.Context
	cancel context.CancelCauseFunc
}

// finished is an attempt's result on its way to the group commit.
type finished struct {
	result    storage.StepResult
	step      storage.ClaimedStep
	duration  time.Duration
	queueWait time.Duration
}

// errLeaseLost and errShutdown are the causes a handler's context is
// cancelled with; either way its result is not recorded.
var (
	errLeaseLost = errors.New("step was cancelled or its lease was taken over by another worker")
	errShutdown  = errors.New("worker is shutting down")
)

// NewWorker returns a worker of this engine.
func (e *Engine) NewWorker(config *WorkerConfig) (*Worker, error) {
	if config == nil {
		config = &WorkerConfig{}
	}
	config = config.withDefaults()
	if err := config.validate(); err != nil {
		return nil, err
	}
	return &Worker{
		engine:    e,
		config:    config,
		logger:    e.logger.With(slog.String("worker", config.ID)),
		inflight:  map[int64]*attempt{},
		results:   make(chan finished, config.Concurrency),
		slotFreed: make(chan struct{}, 1),
		due:       make(chan struct{}, 1),
	}, nil
}

// ID returns the worker's ID.
func (w *Worker) ID() string { return w.config.ID }

// Run claims and runs steps until ctx ends, then shuts down gracefully: it
// stops claiming, lets running steps finish within the shutdown grace,
// cancels and releases the rest, and returns once every result is recorded.
func (w *Worker) Run(ctx context.Context) error {
	wake, unsubscribe := w.engine.store.Subscribe()
	defer unsubscribe()
	defer w.announce(ctx)()

	// Handlers outlive ctx by up to the shutdown grace.
	handlerCtx, cancelHandlers := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancelHandlers(errShutdown)
	w.handlerCtx = handlerCtx

	flushDone := make(chan struct{})
	go func() { defer close(flushDone); w.flushLoop() }()
	heartbeatCtx, stopHeartbeat := context.WithCancel(context.WithoutCancel(ctx))
	heartbeatDone := make(chan struct{})
	go func() { defer close(heartbeatDone); w.heartbeatLoop(heartbeatCtx) }()

	w.engine.addWorker(w)
	w.claimLoop(ctx, wake)
	w.engine.removeWorker(w)
	w.mu.Lock()
	w.stopping = true
	w.mu.Unlock()

	w.drain(w.running.Wait, cancelHandlers)
	close(w.results)
	<-flushDone
	stopHeartbeat()
	<-heartbeatDone
	w.releaseUnfinished()
	return nil
}

func (w *Worker) claimLoop(ctx context.Context, wake <-chan struct{}) {
	poll := time.NewTicker(w.config.Poll)
	defer poll.Stop()
	recoverEvery := time.NewTicker(max(w.config.Lease/2, 5*time.Millisecond))
	defer recoverEvery.Stop()
	errorDelay := time.Duration(0)
	for ctx.Err() == nil {
		var slotFreed <-chan struct{}
		free := w.config.Concurrency - w.busy()
		if free > 0 {
			steps, err := w.engine.store.ClaimSteps(ctx, w.claimParams(free))
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				errorDelay = min(max(2*errorDelay, 50*time.Millisecond), 5*time.Second)
				w.logger.ErrorContext(ctx, "dagrun: claim steps", slog.Any("error", err), slog.Duration("retry_in", errorDelay))
				sleepCtx(ctx, errorDelay)
				continue
			}
			errorDelay = 0
			w.start(steps, nil)
			if len(steps) > 0 {
				w.engine.notifyChanged()
			}
			if len(steps) == free {
				// There may be more ready work: claim again as soon as a
				// slot frees up.
				slotFreed = w.slotFreed
			}
		} else {
			slotFreed = w.slotFreed
		}
		select {
		case <-ctx.Done():
		case <-wake:
		case <-slotFreed:
		case <-w.due:
		case <-poll.C:
		case <-recoverEvery.C:
			w.recoverExpired(ctx)
		}
	}
}

func (w *Worker) busy() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.inflight) + w.reserved
}

// start registers claimed steps and runs their handlers, after dropping
// the finished attempts whose slots they take, all under one lock so the
// worker never holds more than its concurrency. Once the worker stopped
// claiming it starts nothing and reports false.
func (w *Worker) start(steps []storage.ClaimedStep, done []finished) bool {
	attempts := make([]*attempt, len(steps))
	w.mu.Lock()
	for _, f := range done {
		delete(w.inflight, f.step.StepID)
	}
	if w.stopping && len(steps) > 0 {
		w.mu.Unlock()
		return false
	}
	for i, step := range steps {
		ctx, cancel := context.WithCancelCause(w.handlerCtx)
		attempts[i] = &attempt{step: step, ctx: ctx, cancel: cancel}
		w.inflight[step.StepID] = attempts[i]
	}
	w.running.Add(len(steps))
	w.mu.Unlock()
	for i, a := range attempts {
		// execute gets its own copy of the step: the heartbeat updates
		// a.step.LeaseUntil under w.mu while the handler runs.
		go w.execute(a, steps[i])
	}
	return true
}

// execute runs one attempt's handler and hands its result to the flusher.
func (w *Worker) execute(a *attempt, step storage.ClaimedStep) {
	defer w.running.Done()
	ctx := a.ctx
	began := time.Now()
	result, ok := w.engine.runAttempt(ctx, w.logger, step)
	ran := time.Since(began)
	cause := context.Cause(ctx)
	a.cancel(nil)
	if !ok || errors.Is(cause, errLeaseLost) || errors.Is(cause, errShutdown) {
		// Not ours to record: the claim is stale, or the step is being
		// released at shutdown.
		if !errors.Is(cause, errShutdown) {
			w.forget(step.StepID)
		}
		return
	}
	var wait time.Duration
	if !step.ReadyAt.IsZero() {
		wait = max(began.Sub(step.ReadyAt), 0)
	}
	w.results <- finished{result: result, step: step, duration: ran, queueWait: wait}
}

// forget drops an attempt and frees its slot.
func (w *Worker) forget(stepID int64) {
	w.mu.Lock()
	delete(w.inflight, stepID)
	w.mu.Unlock()
	select {
	case w.slotFreed <- struct{}{}:
	default:
	}
}

// flushLoop group-commits finished attempts: it takes whatever results are
// waiting and records them in one store transaction, so under load many
// completions share one commit while a lone completion is written at once.
func (w *Worker) flushLoop() {
	batch := make([]finished, 0, maxFinishBatch)
	for first := range w.results {
		batch = append(batch[:0], first)
	drain:
		for len(batch) < maxFinishBatch {
			select {
			case f, ok := <-w.results:
				if !ok {
					break drain
				}
				batch = append(batch, f)
			default:
				break drain
			}
		}
		w.commit(batch)
	}
}

func (w *Worker) commit(batch []finished) {
	results := make([]storage.StepResult, len(batch))
	for i, f := range batch {
		results[i] = f.result
	}
	ctx := context.Background()
	delay := 50 * time.Millisecond
	var claimed []storage.ClaimedStep
	// The eager claim may fill every free slot, not only the batch's: a
	// claim that comes back short then proves nothing else is ready, and
	// the store need not wake this process's claim loop for an empty claim.
	extra := 0
	w.mu.Lock()
	if _, eager := w.engine.store.(storage.FinishClaimer); eager && !w.stopping {
		extra = max(w.config.Concurrency-len(w.inflight)-w.reserved, 0)
		w.reserved += extra
	}
	w.mu.Unlock()
	for {
		rec := w.engine.newFinishRecorder()
		var (
			outcomes []storage.FinishResult
			err      error
		)
		outcomes, claimed, err = w.finish(ctx, results, rec.plan, len(batch)+extra)
		if err == nil {
			for i, o := range outcomes {
				f := batch[i]
				if !o.Accepted {
					w.logger.Warn("dagrun: stale result rejected; a newer attempt owns the step",
						slog.String("instance", f.step.InstanceID), slog.String("step", f.step.Step),
						slog.Int("attempt", f.step.Attempt))
					continue
				}
				if o := f.result.Outcome; o == storage.OutcomeRetry || o == storage.OutcomeSnooze {
					w.wakeAt(f.result.RunAfter)
				}
				w.engine.observer.AttemptFinished(AttemptReport{
					Workflow: f.step.Workflow, Step: f.step.Step, Handler: f.step.Handler, Queue: f.step.Queue,
					Outcome: outcomeName(f.result.Outcome), Duration: f.duration, QueueWait: f.queueWait,
				})
			}
			rec.report()
			break
		}
		// Until the result is recorded the claim is still ours and the
		// heartbeat keeps it; if the store stays down the lease expires and
		// another worker runs the step again (at least once).
		if !w.holdsAny(batch) {
			w.logger.Error("dagrun: finish steps: giving up, leases lost", slog.Any("error", err))
			break
		}
		w.logger.Error("dagrun: finish steps", slog.Any("error", err), slog.Duration("retry_in", delay))
		time.Sleep(delay)
		delay = min(2*delay, 5*time.Second)
	}
	w.mu.Lock()
	w.reserved -= extra
	w.mu.Unlock()
	if !w.start(claimed, batch) {
		w.release(claimed)
	}
	select {
	case w.slotFreed <- struct{}{}:
	default:
	}
	w.engine.notifyChanged()
}

// finish records results and, while the worker is claiming and its store
// can, claims new steps for the slots the results free in the same
// transaction: a chain's next step then starts without another commit or a
// wake-up round trip.
func (w *Worker) finish(ctx context.Context, results []storage.StepResult, plan storage.PlanFunc, slots int) ([]storage.FinishResult, []storage.ClaimedStep, error) {
	fc, eager := w.engine.store.(storage.FinishClaimer)
	w.mu.Lock()
	eager = eager && !w.stopping
	w.mu.Unlock()
	if !eager {
		outcomes, err := w.engine.store.FinishSteps(ctx, results, plan)
		return outcomes, nil, err
	}
	return fc.FinishAndClaim(ctx, results, plan, w.claimParams(slots))
}

func (w *Worker) claimParams(limit int) storage.ClaimParams {
	return storage.ClaimParams{
		WorkerID:   w.config.ID,
		Queues:     w.config.Queues,
		InstanceID: w.config.InstanceID,
		Limit:      limit,
		Lease:      w.config.Lease,
		Handlers:   w.engine.claimHandlers(),
	}
}

// reserveEager reserves up to n free slots for the steps a start in this
// process claims for the worker in its creating transaction, and returns
// how many it reserved. A worker bound to one instance takes none: a new
// instance is never its own.
func (w *Worker) reserveEager(n int) int {
	if w.config.InstanceID != "" {
		return 0
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopping {
		return 0
	}
	n = min(n, w.config.Concurrency-len(w.inflight)-w.reserved)
	if n <= 0 {
		return 0
	}
	w.reserved += n
	return n
}

// adoptEager runs the steps a start claimed for the worker and gives back
// the reservation. When the reservation filled the worker, the claim loop
// may be waiting for a slot: the ones the claim left unused are free again.
func (w *Worker) adoptEager(reserved int, steps []storage.ClaimedStep) {
	w.mu.Lock()
	filled := len(w.inflight)+w.reserved >= w.config.Concurrency
	w.reserved -= reserved
	w.mu.Unlock()
	if !w.start(steps, nil) {
		w.release(steps)
	}
	if filled && len(steps) < reserved {
		select {
		case w.slotFreed <- struct{}{}:
		default:
		}
	}
}

// release returns steps claimed after shutdown began.
func (w *Worker) release(steps []storage.ClaimedStep) {
	claims := make([]storage.Claim, len(steps))
	for i, s := range steps {
		claims[i] = s.Claim
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := w.engine.store.ReleaseSteps(ctx, claims); err != nil {
		w.logger.Error("dagrun: release steps claimed during shutdown; they run again when their lease expires", slog.Any("error", err))
	}
}

// wakeAt makes the claim loop look for work at t, when t comes before the
// next poll would.
func (w *Worker) wakeAt(t time.Time) {
	d := time.Until(t) + time.Millisecond // the store compares run_after <= now
	if d >= w.config.Poll {
		return
	}
	time.AfterFunc(max(d, 0), func() {
		select {
		case w.due <- struct{}{}:
		default:
		}
	})
}

func (w *Worker) holdsAny(batch []finished) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, f := range batch {
		if a, ok := w.inflight[f.step.StepID]; ok && a.step.LeaseUntil.After(time.Now()) {
			return true
		}
	}
	return false
}

// heartbeatLoop renews the leases of every held claim each third of the
// lease, and stops the handlers of claims that are no longer held.
func (w *Worker) heartbeatLoop(ctx context.Context) {
	tick := time.NewTicker(max(w.config.Lease/3, time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		w.mu.Lock()
		claims := make([]storage.Claim, 0, len(w.inflight))
		for _, a := range w.inflight {
			claims = append(claims, a.step.Claim)
		}
		w.mu.Unlock()
		if len(claims) == 0 {
			continue
		}
		lost, err := w.engine.store.ExtendLeases(ctx, claims, w.config.Lease)
		if err != nil {
			if ctx.Err() == nil {
				w.logger.Error("dagrun: heartbeat", slog.Any("error", err))
			}
			continue
		}
		until := time.Now().Add(w.config.Lease)
		lostSet := make(map[int64]bool, len(lost))
		for _, c := range lost {
			lostSet[c.StepID] = true
		}
		w.mu.Lock()
		for id, a := range w.inflight {
			if lostSet[id] {
				w.logger.Info("dagrun: stopping handler", slog.String("instance", a.step.InstanceID),
					slog.String("step", a.step.Step), slog.String("reason", errLeaseLost.Error()))
				a.cancel(errLeaseLost)
			} else {
				a.step.LeaseUntil = until
			}
		}
		w.mu.Unlock()
	}
}

func (w *Worker) recoverExpired(ctx context.Context) {
	rec := w.engine.newFinishRecorder()
	n, err := w.engine.store.RecoverExpired(ctx, 100, rec.plan)
	if err != nil {
		if ctx.Err() == nil {
			w.logger.Error("dagrun: recover expired leases", slog.Any("error", err))
		}
		return
	}
	rec.report()
	if n > 0 {
		w.logger.Info("dagrun: recovered steps whose worker stopped heartbeating", slog.Int("steps", n))
		w.engine.notifyChanged()
	}
}

// drain waits for running handlers up to the shutdown grace, then cancels
// the stragglers.
func (w *Worker) drain(wait func(), cancelHandlers context.CancelCauseFunc) {
	done := make(chan struct{})
	go func() { wait(); close(done) }()
	grace := time.NewTimer(w.config.ShutdownGrace)
	defer grace.Stop()
	select {
	case <-done:
		return
	case <-grace.C:
	}
	w.logger.Warn("dagrun: shutdown grace over; cancelling running steps and releasing them", slog.Int("steps", w.busy()))
	cancelHandlers(errShutdown)
	<-done
}

// releaseUnfinished returns the claims of handlers cancelled at shutdown to
// pending, so another worker picks them up without waiting for the lease.
func (w *Worker) releaseUnfinished() {
	w.mu.Lock()
	claims := make([]storage.Claim, 0, len(w.inflight))
	for _, a := range w.inflight {
		claims = append(claims, a.step.Claim)
	}
	w.inflight = map[int64]*attempt{}
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

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
