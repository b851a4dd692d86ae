package dagrun

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"time"

	"github.com/dagrun/dagrun/storage"
)

// The recorder group-commits finished attempts: it takes whatever results
// are waiting and records them in one store transaction, so under load many
// completions share one commit while a lone completion is written at once.
// A commit the store refuses never stops it: errors that may pass are
// retried a bounded number of times, a batch that keeps failing is split
// so one bad result cannot hold the others hostage, and a result the store
// will never take is recorded as a failed attempt instead.

// maxFinishBatch bounds how many finished attempts one group commit writes.
const maxFinishBatch = 256

// Commit retry bounds: an unavailable database is retried with backoff for
// as long as the worker holds a lease of the batch (its heartbeat fails
// too, so at most about a lease), any other error a few times.
const (
	maxUnavailableTries = 12
	maxOtherTries       = 3
	firstCommitRetry    = 50 * time.Millisecond
	maxCommitRetry      = 5 * time.Second
)

// recordLoop records results until ctx ends and every queued result is
// recorded.
func (w *Worker) recordLoop(ctx context.Context) {
	for {
		// Let the attempts the last commit started, and any other
		// runnable goroutine, run before taking a batch: an attempt that
		// finishes at once then joins this batch instead of waking the
		// loop alone, a commit of one, while its siblings queue for the
		// next. Without it a chain4 bench on SQLite split its attempts
		// into hundreds of commits of one and most of the rest into
		// commits of 32-63; with it two thirds of the attempts were in
		// commits of 64 or more, and it ran about 5% faster (see the
		// README's Performance section). It costs a scheduler pass when
		// nothing else runs.
		runtime.Gosched()
		w.mu.Lock()
		n := min(len(w.queue), maxFinishBatch)
		batch := append([]finished(nil), w.queue[:n]...)
		w.queue = w.queue[n:]
		w.mu.Unlock()
		if n > 0 {
			w.record(batch)
			continue
		}
		select {
		case <-w.queued:
		case <-ctx.Done():
			w.mu.Lock()
			empty := len(w.queue) == 0
			w.mu.Unlock()
			if empty {
				return
			}
		}
	}
}

// record commits one batch, claiming new steps in the same transaction
// for the slots it frees and any other free ones when the store can.
func (w *Worker) record(batch []finished) {
	results := make([]storage.StepResult, len(batch))
	for i, f := range batch {
		results[i] = f.result
	}
	fc, eager := w.engine.store.(storage.FinishClaimer)
	w.mu.Lock()
	eager = eager && !w.stopping
	w.mu.Unlock()
	var (
		outcomes []outcome
		recorded []storage.FinishResult
		claimed  []storage.ClaimedStep
		err      error
		extra    int
		inFlight *claimInFlight // nil without an eager claim
	)
	if eager {
		// The eager claim may fill every free slot, not only the batch's: a
		// claim that comes back short then proves nothing else is ready, and
		// the store need not wake this process's claim loop for an empty
		// claim.
		extra = w.slots.take(w.config.Concurrency)
		inFlight = w.beginClaim()
		rec := w.engine.newFinishRecorder()
		recorded, claimed, err = fc.FinishAndClaim(rec.attach(context.Background()), results, rec.plan, w.claimParams(len(batch)+extra))
		outcomes = outcomesOf(recorded)
		if err == nil {
			rec.report()
		} else {
			// Reserved slots are never held across retries.
			w.slots.give(extra)
			extra = 0
			claimed = nil
			// The claim may have committed, its answer lost (see
			// orphans.go); the claim loop looks while the results are
			// committed again.
			w.dropClaim(inFlight)
			inFlight = nil
			w.suspectOrphans()
		}
	}
	if !eager || err != nil {
		outcomes = w.store(batch, err)
	}
	w.settle(batch, outcomes, extra, inFlight, claimed)
	w.engine.notifyChanged()
}

// outcome is what became of one result: the store's answer, or given up.
type outcome struct {
	storage.FinishResult
	// givenUp is set for a result the worker could not record at all,
	// having said why: not a stale one, which a newer attempt replaced.
	givenUp bool
}

func outcomesOf(recorded []storage.FinishResult) []outcome {
	out := make([]outcome, len(recorded))
	for i, r := range recorded {
		out[i].FinishResult = r
	}
	return out
}

// givenUp is n outcomes of results not recorded at all.
func givenUp(n int) []outcome {
	out := make([]outcome, n)
	for i := range out {
		out[i].givenUp = true
	}
	return out
}

// store records a batch with FinishSteps, given the error of a first try
// (nil if there was none). It returns an outcome per result; a result it
// could not record at all is given up.
func (w *Worker) store(batch []finished, lastErr error) []outcome {
	results := make([]storage.StepResult, len(batch))
	for i, f := range batch {
		results[i] = f.result
	}
	delay := firstCommitRetry
	tries := 0
	if lastErr != nil {
		tries = 1
	}
	for {
		if lastErr != nil {
			limit := maxOtherTries
			if transientCommitError(lastErr) {
				limit = maxUnavailableTries
			}
			if tries >= limit || !w.holdsAny(batch) || errors.Is(lastErr, storage.ErrDatabaseLost) {
				break
			}
			wait := jitter(delay)
			w.logger.Error("dagrun: finish steps", slog.Any("error", lastErr), slog.Int("results", len(batch)), slog.Duration("retry_in", wait))
			time.Sleep(wait)
			delay = min(2*delay, maxCommitRetry)
		}
		tries++
		rec := w.engine.newFinishRecorder()
		out, err := w.engine.store.FinishSteps(rec.attach(context.Background()), results, rec.plan)
		if err == nil {
			rec.report()
			return outcomesOf(out)
		}
		lastErr = err
	}
	if errors.Is(lastErr, storage.ErrDatabaseLost) {
		w.logger.Error("dagrun: finish steps: the database is lost; these results are not recorded",
			slog.Any("error", lastErr), slog.Int("results", len(batch)))
		return givenUp(len(batch))
	}
	if !w.holdsAny(batch) {
		w.logger.Error("dagrun: finish steps: giving up, leases lost; their steps run again once recovered",
			slog.Any("error", lastErr), slog.Int("results", len(batch)))
		return givenUp(len(batch))
	}
	if len(batch) > 1 {
		// Split: the results the store takes are recorded, and the one it
		// refuses is found in log2(n) steps.
		half := len(batch) / 2
		return append(w.store(batch[:half], nil), w.store(batch[half:], nil)...)
	}
	return []outcome{w.storeRefused(batch[0], lastErr)}
}

// storeRefused records, in place of a result the store refuses, a failed
// attempt that says why; if even that is refused, it gives the step up to
// lease recovery.
func (w *Worker) storeRefused(f finished, err error) outcome {
	step := f.step
	log := w.logger.With(attemptAttrs(step)...)
	log.Error("dagrun: the store refuses this attempt's result; recording a failed attempt instead", slog.Any("error", err))
	failed := w.engine.failure(step, fmt.Errorf("the attempt's result could not be recorded: %w", err))
	rec := w.engine.newFinishRecorder()
	out, err := w.engine.store.FinishSteps(rec.attach(context.Background()), []storage.StepResult{failed}, rec.plan)
	if err == nil {
		rec.report()
		return outcome{FinishResult: out[0]}
	}
	log.Error("dagrun: giving up on this attempt's result; the step runs again once its lease expires", slog.Any("error", err))
	return outcome{givenUp: true}
}

// transientCommitError reports whether a failed commit may pass if tried
// again: the database was unreachable or too slow. Anything else (a value
// it refuses, a plan that cannot be made) is retried only a few times.
func transientCommitError(err error) bool {
	return errors.Is(err, storage.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded)
}

// settle applies a batch's outcomes: it reports them, settles their
// attempts, and runs the steps the commit claimed on the slots the batch
// and the extra reservation hold.
func (w *Worker) settle(batch []finished, outcomes []outcome, extra int, inFlight *claimInFlight, claimed []storage.ClaimedStep) {
	for i, o := range outcomes {
		f := batch[i]
		step := f.step
		switch {
		case o.Accepted:
			if w.debug {
				w.logger.Debug("dagrun: attempt recorded", attemptAttrs(step,
					slog.String("outcome", outcomeName(f.result.Outcome)), slog.Duration("duration", f.duration))...)
			}
			if out := f.result.Outcome; out == storage.OutcomeRetry || out == storage.OutcomeSnooze {
				w.wakeAt(later(f.result.RunAfter, time.Now().Add(f.result.Delay)))
			}
			w.engine.observer.AttemptFinished(AttemptReport{
				Workflow: step.Workflow, Step: step.Step, Handler: step.Handler, Queue: step.Queue,
				Outcome: outcomeName(f.result.Outcome), Duration: f.duration, QueueWait: f.queueWait,
			})
		case o.Cancelled:
			w.logger.Info("dagrun: result not recorded: the step was cancelled while it ran", attemptAttrs(step)...)
		case o.givenUp:
			// Said already, with why.
		default:
			// attemptAttrs names a forEach item too: its step's other
			// items' results are not the stale one.
			w.logger.Warn("dagrun: stale result rejected; a newer attempt owns the step", attemptAttrs(step)...)
		}
	}
	w.mu.Lock()
	for i, f := range batch {
		if outcomes[i].givenUp {
			w.disownLocked(f.attempt)
		}
		w.forgetLocked(f.attempt)
	}
	w.mu.Unlock()
	// The batch's slots and the extra ones carry over to the claimed steps.
	w.adopt(inFlight, len(batch)+extra, claimed)
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
