package dagrun

import (
	"context"
	"sync"

	"github.com/dagrun/dagrun/storage"
)

// Eager start: when a worker of this engine runs in the starting process
// and has free slots, Start claims the new instances' first steps for it
// in the creating transaction (storage.CreateClaimer), as Temporal's eager
// workflow start does. The steps start at once, without a claim
// transaction of their own and without waiting for a wake-up. Starts inside
// a caller's transaction never do: nothing is claimable before the commit.

// localWorkers are the engine's running workers, for eager starts.
type localWorkers struct {
	mu   sync.Mutex
	list []*Worker
}

func (e *Engine) addWorker(w *Worker) {
	e.local.mu.Lock()
	defer e.local.mu.Unlock()
	e.local.list = append(e.local.list, w)
}

func (e *Engine) removeWorker(w *Worker) {
	e.local.mu.Lock()
	defer e.local.mu.Unlock()
	for i, x := range e.local.list {
		if x == w {
			e.local.list = append(e.local.list[:i], e.local.list[i+1:]...)
			return
		}
	}
}

// stopLocalAttempts stops the running handlers of an instance that was
// cancelled or failed, in every worker of this engine.
func (e *Engine) stopLocalAttempts(instanceID string) {
	e.local.mu.Lock()
	workers := append([]*Worker(nil), e.local.list...)
	e.local.mu.Unlock()
	for _, w := range workers {
		w.stopInstance(instanceID)
	}
}

// reserveEager finds a local worker with free slots for up to n steps and
// reserves them; it returns nil when no worker can take any.
func (e *Engine) reserveEager(n int) (*Worker, int) {
	if n <= 0 {
		return nil, 0
	}
	e.local.mu.Lock()
	defer e.local.mu.Unlock()
	for _, w := range e.local.list {
		if got := w.reserveEager(n); got > 0 {
			return w, got
		}
	}
	return nil, 0
}

// createEagerly creates the instances and, when the store can and a local
// worker has room, claims their first steps for that worker in the same
// transaction.
func (e *Engine) createEagerly(ctx context.Context, params []storage.CreateParams, plan storage.PlanFunc) ([]storage.CreateResult, error) {
	cc, ok := e.store.(storage.CreateClaimer)
	if !ok {
		return e.store.CreateInstances(ctx, nil, params, plan)
	}
	roots := 0
	for _, p := range params {
		for _, s := range p.Steps {
			if len(s.DependsOn) == 0 {
				roots++
			}
		}
	}
	// One slot more than the roots: a claim that comes back short then
	// proves nothing else was ready, so the store wakes no claim loop of
	// this process for an empty claim.
	w, reserved := e.reserveEager(roots + 1)
	var (
		created []storage.CreateResult
		err     error
	)
	if w == nil {
		created, err = e.store.CreateInstances(ctx, nil, params, plan)
	} else {
		var claimed []storage.ClaimedStep
		inFlight := w.beginClaim()
		created, claimed, err = cc.CreateAndClaim(ctx, params, plan, w.claimParams(reserved))
		w.adopt(inFlight, reserved, claimed)
		if err != nil {
			// It may have committed, its answer lost (see orphans.go).
			w.suspectOrphans()
		}
	}
	return created, err
}
