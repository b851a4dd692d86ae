package dagrun

import (
	"context"
	"log/slog"
	"time"

	"github.com/dagrun/dagrun/storage"
)

// heartbeatLoop renews the leases of every claim the worker holds each
// third of the lease, and stops the handlers of claims it no longer holds.
// A stopped attempt, or one whose handler the worker gave up on, is not
// renewed: its step goes to whoever claims it next.
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
		claims := make([]storage.Claim, 0, len(w.attempts))
		for _, a := range w.attempts {
			if !a.stopped {
				claims = append(claims, a.step.Claim)
			}
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
		lostSet := make(map[attemptKey]error, len(lost))
		why := map[string]error{} // by instance: a forEach's items go together
		for _, c := range lost {
			key := attemptKey{c.StepID, c.Fence}
			if !w.mayStop(key) {
				// Recorded, or its result on the way, most likely since
				// the list was taken: nothing to stop, and no reason to
				// read the whole instance for.
				lostSet[key] = errLeaseLost
				continue
			}
			if why[c.InstanceID] == nil {
				why[c.InstanceID] = w.whyLost(ctx, c.InstanceID)
			}
			lostSet[key] = why[c.InstanceID]
		}
		w.mu.Lock()
		for _, c := range claims {
			a := w.attempts[attemptKey{c.StepID, c.Fence}]
			switch {
			case a == nil:
			case lostSet[a.key()] != nil && a.sent:
				// Its result is on the way; the store will refuse it.
			case lostSet[a.key()] != nil:
				w.stopLocked(a, lostSet[a.key()])
			default:
				a.step.LeaseUntil = until
			}
		}
		w.mu.Unlock()
	}
}

// mayStop reports whether the attempt of key still runs here with its
// result unsent: one a lost lease would stop.
func (w *Worker) mayStop(key attemptKey) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	a := w.attempts[key]
	return a != nil && !a.sent
}

// whyLost says why the store no longer renews the lease of a claim of an
// instance: the instance finished (cancelled or failed from another process, which
// stops this worker's attempts at the next heartbeat), or another worker
// took the step over. A lost lease is rare, so one read of the instance
// is cheap.
func (w *Worker) whyLost(ctx context.Context, instanceID string) error {
	in, err := w.engine.store.GetInstance(ctx, instanceID)
	if err == nil && in.Status.Finished() {
		return errCancelled
	}
	return errLeaseLost
}

// holdsAny reports whether the worker still holds the lease of any of the
// batch's attempts.
func (w *Worker) holdsAny(batch []finished) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now()
	for _, f := range batch {
		if a := w.attempts[f.attempt.key()]; a == f.attempt && a.step.LeaseUntil.After(now) {
			return true
		}
	}
	return false
}

// recoverBatch is the most expired steps one transaction of recoverExpired
// takes back: a sweep runs batches until one comes back short, so that a
// stopped worker's thousand steps wait for one sweep, not ten.
const recoverBatch = 100

// recoverExpired takes back the steps whose lease ended, in batches until
// none is left or the sweep has taken as many as the most a worker may run
// at once: a batch's steps are no longer expired, so only new expiries can
// keep it going, and those wait for the next sweep.
func (w *Worker) recoverExpired(ctx context.Context) {
	recovered := 0
	for recovered < MaxConcurrency {
		rec := w.engine.newFinishRecorder()
		n, err := w.engine.store.RecoverExpired(rec.attach(ctx), recoverBatch, rec.plan)
		if err != nil {
			if ctx.Err() == nil {
				w.logger.Error("dagrun: recover expired leases", slog.Any("error", err))
			}
			break
		}
		rec.report()
		recovered += n
		if n < recoverBatch {
			break
		}
	}
	if recovered > 0 {
		w.logger.Info("dagrun: recovered steps whose worker stopped heartbeating", slog.Int("steps", recovered))
		w.engine.notifyChanged()
	}
}

// sweepDue does what comes due by the store's clock rather than by a
// claim, whichever process runs: waits and instances that time out, and
// instances whose deferred steps may start.
func (w *Worker) sweepDue(ctx context.Context) {
	for _, s := range []struct {
		what, done string // done is logged when the sweep handled some
		run        func(context.Context) (int, error)
	}{
		{what: "time out waiting steps", run: w.engine.expireWaits},
		{what: "time out instances", done: "instances timed out", run: w.engine.expireInstances},
		{what: "start deferred instances", run: w.engine.startDeferred},
	} {
		n, err := s.run(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			w.logger.Error("dagrun: "+s.what, slog.Any("error", err))
		case err == nil && n > 0 && s.done != "":
			w.logger.Info("dagrun: "+s.done, slog.Int("instances", n))
		}
	}
}

// sweepBatch is how many instances or steps one sweep transaction takes.
const sweepBatch = 100

// sweep runs one batch of a store's sweep (ExpireWaits, ExpireInstances,
// StartDeferred) with a finish recorder, so that the instances it ends
// are observed and their local handlers stopped, and returns how many
// the sweep handled.
func (e *Engine) sweep(ctx context.Context, run func(context.Context, int, storage.PlanFunc) (int, error)) (int, error) {
	rec := e.newFinishRecorder()
	n, err := run(rec.attach(ctx), sweepBatch, rec.plan)
	if err != nil {
		return 0, err
	}
	rec.report()
	if n > 0 {
		e.notifyChanged()
	}
	return n, nil
}

// startDeferred plans up to a batch of instances whose deferred steps may
// start (see storage.Store.StartDeferred).
func (e *Engine) startDeferred(ctx context.Context) (int, error) {
	return e.sweep(ctx, e.store.StartDeferred)
}

// expireWaits fails up to a batch of waiting steps whose deadline passed.
func (e *Engine) expireWaits(ctx context.Context) (int, error) {
	return e.sweep(ctx, e.store.ExpireWaits)
}
