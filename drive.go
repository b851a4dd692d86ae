package dagrun

import (
	"cmp"
	"context"
	"errors"
	"time"

	"github.com/dagrun/dagrun/handlers"
	"github.com/dagrun/dagrun/storage"
)

// Driving an engine by hand: workflow tests (dagrun test) run instances
// without a Worker. A worker's claim loop waits for wake-ups, polls and
// timers, which is right for production and too slow and too
// nondeterministic for running hundreds of test cases a second. Drive
// does one round of the same work in the calling goroutine (the same
// claims, handler calls, failure policy and plans as a worker), so a
// test harness that also owns the store's clock can run an instance to its
// end in milliseconds, jumping the clock to each NextWake in between.

// DriveOptions tune one Drive round. The zero value is usable.
type DriveOptions struct {
	// WorkerID names the driver in the event history. Default: "driver".
	WorkerID string
	// InstanceID restricts the round to one instance's steps. Default:
	// every instance of the store.
	InstanceID string
	// Limit bounds how many steps one round claims. Default: 100.
	Limit int
	// Now is the clock handlers read through handlers.Now (the built-in
	// sleep decides with it whether its wake time has come), normally the
	// fake clock the store was opened with. Default: time.Now.
	Now func() time.Time
}

// DriveResult tells what one Drive round did.
type DriveResult struct {
	// Ran counts the attempts whose handler ran and whose result was
	// recorded; Expired the waiting steps whose deadline had passed.
	Ran, Expired int
	// NextWake is when, by the store's clock, a step next becomes
	// claimable or a wait times out; zero when nothing is due later.
	NextWake time.Time
}

// driveLease is the lease a driven attempt takes: the round records the
// result before it returns, so the lease only has to outlast the handler.
const driveLease = time.Hour

// Drive runs one round of an instance's life without a worker: it times
// out the waits whose deadline passed, claims the steps that are ready now
// and runs their handlers one after another in the calling goroutine,
// records their results in one commit, and reports when the next step
// becomes due. A round that ran nothing and reports no NextWake means
// nothing will happen until someone acts (a signal, a cancel, a retry).
//
// Drive is meant for tests and tools that own the store's clock; a
// production process runs Workers.
func (e *Engine) Drive(ctx context.Context, opts *DriveOptions) (DriveResult, error) {
	if opts == nil {
		opts = &DriveOptions{}
	}
	var res DriveResult
	expired, err := e.expireWaits(ctx)
	if err != nil {
		return res, err
	}
	res.Expired = expired
	params := storage.ClaimParams{
		WorkerID:   cmp.Or(opts.WorkerID, "driver"),
		InstanceID: opts.InstanceID,
		Limit:      cmp.Or(opts.Limit, 100),
		Lease:      driveLease,
		Handlers:   e.claimHandlers(),
	}
	steps, err := e.store.ClaimSteps(ctx, params)
	if err != nil {
		return res, err
	}
	if len(steps) > 0 {
		handlerCtx := ctx
		if opts.Now != nil {
			handlerCtx = handlers.WithClock(ctx, opts.Now)
		}
		results := make([]storage.StepResult, 0, len(steps))
		for _, step := range steps {
			result, ok := e.runAttempt(handlerCtx, e.logger, step)
			if !ok {
				return res, cmp.Or(ctx.Err(), errors.New("dagrun: drive: attempt was not recorded"))
			}
			results = append(results, result)
		}
		rec := e.newFinishRecorder()
		if _, err := e.store.FinishSteps(ctx, results, rec.plan); err != nil {
			return res, err
		}
		rec.report()
		res.Ran = len(steps)
	}
	params.Limit = 1
	res.NextWake, err = e.store.NextWake(ctx, params)
	return res, err
}
