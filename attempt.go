package dagrun

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/trace"

	"github.com/dagrun/dagrun/handlers"
	"github.com/dagrun/dagrun/storage"
)

// attemptKey identifies one attempt: a claim of a step, told apart from
// every other claim of it by its fence.
type attemptKey struct{ stepID, fence int64 }

// attempt is one claimed step: its handler runs, or its result awaits its
// commit. Fields other than step's Claim are guarded by the worker's mu.
type attempt struct {
	step   storage.ClaimedStep
	ctx    context.Context
	cancel context.CancelCauseFunc
	began  time.Time
	// stopped: the worker cancelled it (lease lost, step cancelled, a
	// newer claim of the step); its result is not recorded and its lease
	// not renewed.
	stopped bool
	// handlerDone: the handler returned, or the worker stopped waiting
	// for it. sent: its result went to the recorder.
	handlerDone bool
	sent        bool
	// overrun fires when the handler outlives its timeout, or its
	// cancellation, by the grace.
	overrun *time.Timer
}

func (a *attempt) key() attemptKey { return attemptKey{a.step.StepID, a.step.Fence} }

func (a *attempt) stopTimer() {
	if a.overrun != nil {
		a.overrun.Stop()
	}
}

// finished is an attempt's result on its way to the recorder.
type finished struct {
	attempt *attempt
	// step is a copy of the attempt's step: the heartbeat updates the
	// attempt's own under the worker's mu.
	step      storage.ClaimedStep
	result    storage.StepResult
	duration  time.Duration
	queueWait time.Duration
}

// Causes a handler's context is cancelled with; with any of them its
// result is not recorded.
var (
	errLeaseLost  = errors.New("its lease was taken over by another worker")
	errCancelled  = errors.New("the step was cancelled: its instance was cancelled or failed")
	errSuperseded = errors.New("the step was claimed again; a newer attempt runs it")
	errShutdown   = errors.New("worker is shutting down")
)

// errAttemptOver is the cause of a handler's context once the handler has
// returned.
var errAttemptOver = errors.New("the attempt is over: its handler returned")

// lastAttempt reports whether step runs its last attempt: released at
// shutdown, it would run once more than its retry policy allows.
func lastAttempt(step storage.ClaimedStep) bool {
	return step.Attempt >= step.Retry.MaxAttempts
}

// errStoppedOnLastAttempt is the error of a last attempt the worker
// stopped at shutdown.
func errStoppedOnLastAttempt(step storage.ClaimedStep) error {
	return fmt.Errorf("the worker stopped during attempt %d of %d, its last: it is not run again (retry the instance to run it)", step.Attempt, step.Retry.MaxAttempts)
}

// newAttempt prepares an attempt of a claimed step; the caller holds mu.
func (w *Worker) newAttempt(step storage.ClaimedStep) *attempt {
	ctx, cancel := context.WithCancelCause(w.handlerCtx)
	a := &attempt{step: step, ctx: ctx, cancel: cancel, began: time.Now()}
	if step.Timeout > 0 {
		// A handler that ignores its context would otherwise hold the step
		// for ever: its heartbeat renews the lease as long as it runs.
		a.overrun = time.AfterFunc(step.Timeout+w.config.ShutdownGrace, func() { w.overran(a) })
	}
	return a
}

// errHandlerGoexit is the error of an attempt whose handler ended its
// goroutine without returning.
var errHandlerGoexit = errors.New("the handler ended its goroutine without returning (runtime.Goexit, as t.FailNow calls it): the attempt failed")

// execute runs one attempt's handler and hands its result to the recorder.
func (w *Worker) execute(a *attempt) {
	w.mu.Lock()
	step := a.step // the heartbeat updates a.step.LeaseUntil under mu
	stopped := a.stopped
	w.mu.Unlock()
	var (
		result storage.StepResult
		ok     bool
	)
	if !stopped {
		// An attempt stopped before its handler began (its instance
		// ended, a newer claim took the step) has nothing to do.
		returned := false
		defer func() {
			if !returned {
				// The handler called runtime.Goexit, which no recover
				// stops: this goroutine ends, and without this the step
				// would wait for a result until its worker stopped.
				go w.finish(a, step, w.engine.failure(step, errHandlerGoexit), true)
			}
		}()
		result, ok = w.engine.runAttempt(a.ctx, w.logger, w.failureLevel(), w.logs, step)
		returned = true
	}
	w.finish(a, step, result, ok)
}

// finish hands an attempt's result to the recorder, or settles the
// attempt when it has none to record.
func (w *Worker) finish(a *attempt, step storage.ClaimedStep, result storage.StepResult, ok bool) {
	ran := time.Since(a.began)
	cause := context.Cause(a.ctx)
	// As net/http does when ServeHTTP returns: what the handler left
	// running learns that its attempt is over, and the context leaves
	// the worker's, which otherwise keeps every attempt's for its life.
	a.cancel(errAttemptOver)

	w.mu.Lock()
	defer w.mu.Unlock()
	a.stopTimer()
	if a.handlerDone {
		// The worker gave up on this handler long ago and has dealt with
		// its step.
		w.logger.Warn("dagrun: handler returned after the worker stopped waiting for it",
			slog.String("instance", step.InstanceID), slog.String("step", step.Step), slog.Duration("ran", ran))
		return
	}
	w.handlerReturnedLocked(a)
	if errors.Is(cause, errShutdown) && !a.stopped && !ok {
		if !lastAttempt(step) {
			// Released with the other unfinished steps when Run ends.
			return
		}
		// Released, its last attempt would run again (a step with
		// maxAttempts 1 twice): it fails as a crash would fail it.
		result, ok = w.engine.failure(step, errStoppedOnLastAttempt(step)), true
	}
	if !ok || a.stopped {
		w.settleLocked(a)
		return
	}
	var wait time.Duration
	if !step.ReadyAt.IsZero() {
		wait = max(a.began.Sub(step.ReadyAt), 0)
	}
	w.sendLocked(finished{attempt: a, result: result, duration: ran, queueWait: wait})
}

// handlerReturnedLocked marks the handler as no longer waited for.
func (w *Worker) handlerReturnedLocked(a *attempt) {
	a.handlerDone = true
	w.waiting--
	select {
	case w.handlerExit <- struct{}{}:
	default:
	}
}

// sendLocked queues a result for the recorder.
func (w *Worker) sendLocked(f finished) {
	f.attempt.sent = true
	f.step = f.attempt.step
	// Its attempt lets the store recognise the result if a commit whose
	// answer was lost recorded it already (storage.FinishResult.Repeated).
	f.result.Attempt = f.step.Attempt
	w.queue = append(w.queue, f)
	select {
	case w.queued <- struct{}{}:
	default:
	}
}

// settleLocked forgets an attempt whose handler is done and whose result
// is recorded or dropped, and frees its slot.
func (w *Worker) settleLocked(a *attempt) {
	if !a.stopped {
		// Not recorded, its claim may hold (see orphans.go).
		w.disownLocked(a)
	}
	w.forgetLocked(a)
	w.slots.give(1)
}

// forgetLocked drops an attempt from the registry, leaving its slot to the
// caller.
func (w *Worker) forgetLocked(a *attempt) {
	key := a.key()
	if w.attempts[key] != a {
		return
	}
	delete(w.attempts, key)
	if w.newest[key.stepID] == key {
		delete(w.newest, key.stepID)
	}
}

// stopLocked cancels an attempt's handler with cause: its result will not
// be recorded and its lease is no longer renewed. A handler that does not
// return within the grace is given up on.
func (w *Worker) stopLocked(a *attempt, cause error) {
	if a.stopped || a.sent {
		return
	}
	a.stopped = true
	a.cancel(cause)
	level := slog.LevelInfo
	if errors.Is(cause, errLeaseLost) {
		level = slog.LevelWarn
	}
	w.logger.Log(context.Background(), level, "dagrun: stopping handler", slog.String("instance", a.step.InstanceID),
		slog.String("step", a.step.Step), slog.Int("attempt", a.step.Attempt), slog.String("reason", cause.Error()))
	a.stopTimer()
	a.overrun = time.AfterFunc(w.config.ShutdownGrace, func() { w.overran(a) })
}

// overran deals with a handler that outlived its timeout, or its
// cancellation, by the grace: the worker stops waiting for it. A timed-out
// attempt is recorded as failed (and retried as its policy says); the
// goroutine is left running, since Go cannot stop it, and its eventual
// result is ignored.
func (w *Worker) overran(a *attempt) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if a.handlerDone || w.closing || w.attempts[a.key()] != a {
		return
	}
	w.handlerReturnedLocked(a)
	a.cancel(errOverran)
	if a.stopped {
		w.logger.Error("dagrun: handler ignored its cancelled context; its slot is freed and its goroutine left running",
			slog.String("instance", a.step.InstanceID), slog.String("step", a.step.Step), slog.String("handler", a.step.Handler))
		w.settleLocked(a)
		return
	}
	err := fmt.Errorf("attempt timed out after %s and its handler did not return within %s of being cancelled: it ignores its context (its goroutine is left running)",
		a.step.Timeout, w.config.ShutdownGrace)
	w.logger.Error("dagrun: handler overran its timeout", slog.String("instance", a.step.InstanceID),
		slog.String("step", a.step.Step), slog.String("handler", a.step.Handler), slog.Any("error", err))
	w.sendLocked(finished{attempt: a, result: w.engine.failure(a.step, err), duration: time.Since(a.began)})
}

var errOverran = errors.New("the handler overran its timeout and the worker stopped waiting for it")

// stopInstance stops this worker's attempts of an instance that was
// cancelled or failed.
func (w *Worker) stopInstance(instanceID string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopClaimsLocked(instanceID)
	for _, a := range w.attempts {
		if a.step.InstanceID == instanceID {
			w.stopLocked(a, errCancelled)
		}
	}
}

// failureLevel is the level at which the worker logs an attempt that
// fails its step for good: warn, but for a worker bound to one instance,
// the in-process worker of a following start, whose progress lines say
// so already.
func (w *Worker) failureLevel() slog.Level {
	if w.config.InstanceID != "" {
		return slog.LevelInfo
	}
	return slog.LevelWarn
}

// runAttempt runs one claimed step's handler and turns what it returned
// into a StepResult. ok is false when the result must not be recorded
// (the claim was lost or the worker is shutting down).
func (e *Engine) runAttempt(ctx context.Context, logger *slog.Logger, failedLevel slog.Level, logs *logWriter, step storage.ClaimedStep) (result storage.StepResult, ok bool) {
	if e.tracing != nil {
		var span trace.Span
		ctx, span = e.tracing.startAttempt(ctx, &step)
		defer func() { endAttempt(span, result, ok) }()
	}
	// Built only for the rare attempt that has something to say: With
	// costs more than the rest of a quick attempt's bookkeeping.
	attemptLogger := func() *slog.Logger {
		return logger.With(slog.String("instance", step.InstanceID), slog.String("step", step.Step),
			slog.String("handler", step.Handler), slog.Int("attempt", step.Attempt))
	}
	handler, found := e.registry.Lookup(step.Handler)
	if !found {
		// Another binary with this handler may share the database, so this
		// is an ordinary failed attempt rather than a permanent failure.
		err := fmt.Errorf("handler %q is not registered in this worker (registered: %v)", step.Handler, e.registry.Names())
		attemptLogger().Error("dagrun: unknown handler", slog.Any("error", err))
		return e.failure(step, err), true
	}

	key := step.InstanceID + "/" + step.Step
	if step.Item >= 0 {
		key += "/" + strconv.Itoa(step.Item) // each item's effects happen once
	}
	attemptCtx := handlers.WithInfo(ctx, handlers.StepInfo{
		InstanceID:     step.InstanceID,
		Workflow:       step.Workflow,
		Step:           step.Step,
		Attempt:        step.Attempt,
		IdempotencyKey: key,
		FirstStartedAt: step.FirstStartedAt,
		Item:           step.Item,
	})
	if logs != nil {
		al := newLazyAttemptLog(logs, &step)
		attemptCtx = handlers.WithLogHandler(attemptCtx, al)
		// What the attempt logged and no flush wrote yet goes with its
		// result, in the transaction that records it.
		defer func() {
			if ok {
				result.LogTrim, result.Logs = al.take()
			}
		}()
	}
	if step.Timeout > 0 {
		var cancel context.CancelFunc
		attemptCtx, cancel = context.WithTimeout(attemptCtx, step.Timeout)
		defer cancel()
	}

	output, err := callHandler(attemptCtx, handler, step.Input)
	if ctx.Err() != nil && (err != nil || !errors.Is(context.Cause(ctx), errShutdown)) {
		// The worker cancelled the attempt; whoever holds the step now
		// decides its fate. A handler that succeeded as the worker began
		// to stop did its work: that result is recorded.
		return storage.StepResult{}, false
	}
	var snooze *handlers.SnoozeError
	if (err == nil || errors.As(err, &snooze)) && step.Timeout > 0 && errors.Is(attemptCtx.Err(), context.DeadlineExceeded) {
		// A result that comes after the timeout is not the attempt's: its
		// time was up, as it is for a handler that heeds its context, and
		// a later attempt may run it again.
		err = fmt.Errorf("attempt timed out after %s: its handler returned after that, ignoring its context, and its result was dropped", step.Timeout)
		attemptLogger().Warn("dagrun: attempt failed", slog.Any("error", err))
		return e.failure(step, err), true
	}
	if err == nil {
		output, err = e.checkOutput(output)
		if err != nil {
			attemptLogger().Warn("dagrun: bad handler output", slog.Any("error", err))
			return storage.StepResult{Claim: step.Claim, Outcome: storage.OutcomeFailed, Error: err.Error()}, true
		}
		return storage.StepResult{Claim: step.Claim, Outcome: storage.OutcomeCompleted, Output: output}, true
	}
	if errors.Is(err, context.DeadlineExceeded) && attemptCtx.Err() != nil {
		err = fmt.Errorf("attempt timed out after %s: %w", step.Timeout, err)
	}
	if errors.As(err, &snooze) {
		return storage.StepResult{Claim: step.Claim, Outcome: storage.OutcomeSnooze, RunAfter: snooze.Until}, true
	}
	result = e.failure(step, err)
	// A failure that is retried is routine; one that fails the step for
	// good is what an operator filtering for warnings wants to see, at
	// failedLevel.
	level := slog.LevelInfo
	if result.Outcome == storage.OutcomeFailed {
		level = failedLevel
	}
	attemptLogger().Log(ctx, level, "dagrun: attempt failed", slog.Any("error", err), slog.Bool("retried", result.Outcome == storage.OutcomeRetry))
	return result, true
}

// callHandler runs a handler, turning a panic into an error that carries the
// panic value and, after its first line, the stack, so one bad handler
// never takes the worker down. The stack goes to the step's log as well.
// Tables and progress lines show an error's first line only.
func callHandler(ctx context.Context, h handlers.Handler, input json.RawMessage) (out json.RawMessage, err error) {
	defer func() {
		if r := recover(); r != nil {
			stack := debug.Stack()
			handlers.Logger(ctx).Error("handler panicked", slog.String("panic", fmt.Sprint(r)), slog.String("stack", string(stack)))
			err = fmt.Errorf("handler panicked: %v\n\n%s", r, stack)
		}
	}()
	return h(ctx, input)
}

// maxErrorBytes bounds the error text stored for one attempt: a handler
// may fail with a whole response body.
const maxErrorBytes = 16 << 10

// storableText makes an error text safe to store: PostgreSQL refuses NUL
// bytes and invalid UTF-8 in text, and a commit that can never succeed
// must not be tried at all. Long texts keep their start.
func storableText(s string) string { return cutText(s, maxErrorBytes) }

// cutText makes a text safe to store as storableText does, keeping at most
// limit bytes of it.
func cutText(s string, limit int) string {
	if len(s) > limit {
		kept := textStart(s, limit)
		s = kept + fmt.Sprintf("… (%d bytes cut)", len(s)-len(kept))
	}
	s = strings.ToValidUTF8(s, "\uFFFD")
	return strings.ReplaceAll(s, "\x00", "\uFFFD")
}

// textStart is s cut to at most limit bytes where a character starts, so
// that no character is split.
func textStart(s string, limit int) string {
	if len(s) <= limit {
		return s
	}
	cut := limit
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}

// checkOutput makes sure a handler's output can be stored: valid JSON and
// within the size limit. An empty output is JSON null.
func (e *Engine) checkOutput(out json.RawMessage) (json.RawMessage, error) {
	if len(out) == 0 {
		return json.RawMessage("null"), nil
	}
	if len(out) > e.config.MaxOutputBytes {
		return nil, fmt.Errorf("handler output is %d bytes, over the limit of %d bytes; store large data elsewhere and return a reference", len(out), e.config.MaxOutputBytes)
	}
	if !json.Valid(out) {
		return nil, errors.New("handler output is not valid JSON")
	}
	if !utf8.Valid(out) {
		// PostgreSQL refuses it, and a commit that can never succeed would
		// be retried for as long as the lease holds.
		return nil, errors.New("handler output is not valid JSON: it is not valid UTF-8")
	}
	return out, nil
}
