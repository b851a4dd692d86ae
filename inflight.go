package dagrun

import "github.com/dagrun/dagrun/storage"

// A claim can commit a step of an instance just before another
// transaction of this process ends that instance (a cancel, or a failure
// that cancels its children) and tells this process's workers to stop it.
// The claim's steps are not registered as attempts yet, so that stop
// missed them: the handler ran on until its first heartbeat found the
// claim stale, a third of the lease later (10s by default), beside the
// attempts the instance ran once retried. A forEach step capped at two
// children ran three at once that way. So each claim on its way back
// collects the instances stopped meanwhile, and their steps are not run.

// claimInFlight is one claim made by this worker and not yet adopted:
// ended holds the instances stopped since it was made.
type claimInFlight struct {
	ended map[string]bool
}

// beginClaim registers a claim about to be made; adopt ends it, or
// dropClaim if it failed. It waits while the claim loop looks for steps
// claimed by a commit whose answer was lost (see orphans.go).
func (w *Worker) beginClaim() *claimInFlight {
	c := &claimInFlight{}
	w.mu.Lock()
	w.waitToClaimLocked()
	w.claiming = append(w.claiming, c)
	w.mu.Unlock()
	return c
}

// dropClaim ends claim c, which failed.
func (w *Worker) dropClaim(c *claimInFlight) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.endClaimLocked(c, nil)
}

// endClaimLocked unregisters c and splits the steps it claimed into those
// to run and those of instances stopped while it was on its way.
func (w *Worker) endClaimLocked(c *claimInFlight, steps []storage.ClaimedStep) (run, ended []storage.ClaimedStep) {
	if c == nil {
		return steps, nil // no claim was made
	}
	for i, other := range w.claiming {
		if other == c {
			w.claiming = append(w.claiming[:i], w.claiming[i+1:]...)
			break
		}
	}
	w.claimEndedLocked()
	if len(c.ended) == 0 {
		return steps, nil
	}
	run = make([]storage.ClaimedStep, 0, len(steps))
	for _, s := range steps {
		if c.ended[s.InstanceID] {
			ended = append(ended, s)
		} else {
			run = append(run, s)
		}
	}
	return run, ended
}

// stopClaimsLocked marks instanceID as stopped for every claim in flight.
func (w *Worker) stopClaimsLocked(instanceID string) {
	for _, c := range w.claiming {
		if c.ended == nil {
			c.ended = map[string]bool{}
		}
		c.ended[instanceID] = true
	}
}
