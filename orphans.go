package dagrun

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/dagrun/dagrun/storage"
)

// A commit can succeed on the database while its answer is lost: the
// connection drops just as the commit is acknowledged (a terminated
// backend, a failover, a pooler restarting, an idle-timeout kill). For a
// claim (ClaimSteps, or the claim of FinishAndClaim or CreateAndClaim) that
// leaves steps running under this worker's ID with a lease the worker
// never heard of: no handler runs them and no heartbeat renews them, and
// once their lease expires the attempt counts as lost, which failed a
// step with maxAttempts: 1 ("lease expired on attempt 1: worker ...
// presumed lost") although its worker was alive and nothing had run it.
//
// So a claim that fails leaves the worker in doubt, and its claim loop
// asks the store for the steps leased to it that it does not know of
// (storage.Store.AdoptSteps), then runs them as a claim's, under the
// fence and attempt the store holds, on free slots (releasing those it
// has no slot for, the attempt not counted). No handler ran them: their
// lease was taken by the commit whose answer was lost. The worker tells
// the store every claim it knows of: the attempts it tracks, and those it
// gave up on while their lease may still hold (a result it could not
// record: its handler ran), so that none of those is run again. While it
// looks, no other claim of the worker begins, and it waits for those on
// their way back, whose steps are not registered yet.

// orphans is a worker's doubt about its claims; its fields are guarded by
// the worker's mu.
type orphans struct {
	// doubt is set when a claim failed: its commit may have happened.
	doubt bool
	// looking is set while the claim loop asks the store; beginClaim
	// waits on opened until it ends, and idle is closed when the last
	// claim on its way back ends meanwhile.
	looking bool
	opened  sync.Cond
	idle    chan struct{}
	// disowned holds the claims the worker gave up on while their lease
	// may still hold, until when it may.
	disowned map[attemptKey]time.Time
}

// suspectOrphans records that a claim failed, and wakes the claim loop to
// look for the steps it may have taken.
func (w *Worker) suspectOrphans() {
	w.mu.Lock()
	w.orphans.doubt = true
	w.mu.Unlock()
	w.recheck()
}

// waitToClaimLocked waits while the claim loop looks for orphans: a step
// claimed meanwhile would look like one.
func (w *Worker) waitToClaimLocked() {
	for w.orphans.looking {
		w.orphans.opened.Wait()
	}
}

// claimEndedLocked is told that a claim on its way back ended.
func (w *Worker) claimEndedLocked() {
	if w.orphans.idle != nil && len(w.claiming) == 0 {
		close(w.orphans.idle)
		w.orphans.idle = nil
	}
}

// disownLocked remembers an attempt the worker stops tracking while its
// lease may hold: its handler ran, so it must never be taken for an
// orphan. A lease lasts at most a lease past its last renewal.
func (w *Worker) disownLocked(a *attempt) {
	if w.orphans.disowned == nil {
		w.orphans.disowned = map[attemptKey]time.Time{}
	}
	w.orphans.disowned[a.key()] = later(a.step.LeaseUntil, time.Now()).Add(w.config.Lease)
}

// heldLocked lists the claims the worker knows of: those of its attempts,
// and those it disowned whose lease may hold.
func (w *Worker) heldLocked() []storage.Claim {
	now := time.Now()
	held := make([]storage.Claim, 0, len(w.attempts)+len(w.orphans.disowned))
	for _, a := range w.attempts {
		held = append(held, a.step.Claim)
	}
	for key, until := range w.orphans.disowned {
		if now.After(until) {
			delete(w.orphans.disowned, key)
			continue
		}
		held = append(held, storage.Claim{StepID: key.stepID, Fence: key.fence})
	}
	return held
}

// adoptOrphans runs, when a claim failed since it last looked, the steps
// leased to this worker that it does not know of. Called by the claim loop
// only.
func (w *Worker) adoptOrphans(ctx context.Context) {
	w.mu.Lock()
	if !w.orphans.doubt || w.stopping {
		w.mu.Unlock()
		return
	}
	w.orphans.doubt = false // a claim that fails from now on raises it again
	w.orphans.looking = true
	for len(w.claiming) > 0 {
		idle := make(chan struct{})
		w.orphans.idle = idle
		w.mu.Unlock()
		select {
		case <-idle:
		case <-ctx.Done():
		}
		w.mu.Lock()
		if ctx.Err() != nil {
			w.orphans.idle = nil
			w.stopLookingLocked()
			w.mu.Unlock()
			return
		}
	}
	held := w.heldLocked()
	// The adoption is a claim on its way back (see inflight.go).
	c := &claimInFlight{}
	w.claiming = append(w.claiming, c)
	w.mu.Unlock()

	steps, err := w.engine.store.AdoptSteps(ctx, storage.AdoptParams{
		WorkerID: w.config.ID,
		Held:     held,
		// A step claimed before this worker ran is not its own, even if
		// an earlier process had its ID.
		Within:      time.Since(w.started),
		Lease:       w.config.Lease,
		TraceParent: w.engine.tracing != nil,
	})
	w.mu.Lock()
	if err != nil {
		w.orphans.doubt = true // look again at the claim loop's next turn
	}
	w.stopLookingLocked()
	w.mu.Unlock()
	if err != nil {
		w.dropClaim(c)
		level := slog.LevelError
		if transientCommitError(err) {
			level = slog.LevelDebug // the claims say so already
		}
		if ctx.Err() == nil {
			w.logger.Log(ctx, level, "dagrun: look for steps claimed by a commit whose answer was lost", slog.Any("error", err))
		}
		return
	}
	if len(steps) == 0 {
		w.dropClaim(c)
		return
	}
	w.logger.WarnContext(ctx, "dagrun: running steps claimed for this worker by a commit whose answer was lost", slog.Int("steps", len(steps)))
	taken := w.slots.take(len(steps))
	if taken < len(steps) {
		// More than its free slots: the others go back, their attempt
		// not counted.
		w.release(steps[taken:])
	}
	w.adopt(c, taken, steps[:taken])
	w.engine.notifyChanged()
}

// stopLookingLocked lets the worker's other claims begin again.
func (w *Worker) stopLookingLocked() {
	w.orphans.looking = false
	w.orphans.opened.Broadcast()
}
