package dagrun

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
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

// DriveOptions tune a Drive. The zero value is usable.
type DriveOptions struct {
	// WorkerID names the driver in the event history. Default: "driver".
	WorkerID string
	// InstanceID restricts the drive to one instance's steps. Default:
	// every instance of the store.
	InstanceID string
	// Limit bounds how many steps one claim takes. Default: 100.
	Limit int
	// MaxAttempts bounds the attempts one Drive runs, so that a handler
	// that snoozes into the past for ever cannot keep it from returning.
	// Default: 10,000.
	MaxAttempts int
	// Now is the clock handlers read through handlers.Now (the built-in
	// sleep decides with it whether its wake time has come), normally the
	// fake clock the store was opened with. Default: time.Now.
	Now func() time.Time
}

// DriveResult tells what a Drive did.
type DriveResult struct {
	// Ran counts the attempts whose handler ran and whose result was
	// recorded; Expired the waiting steps and the instances whose deadline
	// (a wait timeout, a workflow timeout) had passed.
	Ran, Expired int
	// NextWake is when, by the store's clock, a step next becomes
	// claimable or a wait times out; zero when nothing is due later.
	NextWake time.Time
}

// driveLease is the lease a driven attempt takes: its result is recorded
// before Drive returns, so the lease only has to outlast the handler.
const driveLease = time.Hour

// Drive runs, without a worker and in the calling goroutine, what is due
// by the store's clock: it times out the waits whose deadline passed, then
// claims the ready steps and runs their handlers one after another,
// recording their results (and, where the store can, claiming the steps
// they made ready in the same commit) until no step is ready. It reports
// when the next step becomes due. A Drive that ran nothing and reports no
// NextWake means nothing will happen until someone acts (a signal, a
// cancel, a retry).
//
// Claims, handler calls, the failure and retry policy and the plans are a
// worker's own; only the waiting differs. What a worker's claim loop does
// when a time comes due (expiring waits, timing out instances) Drive does too, so a new
// kind of deadline is handled in both places, and NextWake must count it. Drive is meant for tests and
// tools that own the store's clock (see dagruntest); a production process
// runs Workers.
func (e *Engine) Drive(ctx context.Context, opts *DriveOptions) (DriveResult, error) {
	if opts == nil {
		opts = &DriveOptions{}
	}
	var res DriveResult
	expired, err := e.expireWaits(ctx)
	if err != nil {
		return res, err
	}
	timedOut, err := e.expireInstances(ctx)
	if err != nil {
		return res, err
	}
	res.Expired = expired + timedOut
	if _, err := e.startDeferred(ctx); err != nil {
		return res, err
	}
	params := storage.ClaimParams{
		WorkerID:   cmp.Or(opts.WorkerID, "driver"),
		InstanceID: opts.InstanceID,
		Limit:      cmp.Or(opts.Limit, 100),
		Lease:      driveLease,
		Handlers:   e.claimHandlers(),
	}
	handlerCtx := ctx
	if opts.Now != nil {
		handlerCtx = handlers.WithClock(ctx, opts.Now)
	}
	// What the handlers log is stored as a worker stores it, once at the
	// end rather than every so often.
	logs := newLogWriter(e.store, e.logger, e.config.StepLogBytes)
	defer logs.flush()
	steps, err := e.store.ClaimSteps(ctx, params)
	for err == nil && len(steps) > 0 {
		results := make([]storage.StepResult, 0, len(steps))
		for _, step := range steps {
			// A test run reports its failures itself.
			result, ok := e.runAttempt(handlerCtx, e.logger, slog.LevelInfo, logs, step)
			if !ok {
				// ctx ended: give the claims back rather than leave them
				// to the lease.
				claims := make([]storage.Claim, len(steps))
				for i, s := range steps {
					claims[i] = s.Claim
				}
				_ = e.store.ReleaseSteps(context.WithoutCancel(ctx), claims)
				return res, cmp.Or(ctx.Err(), errors.New("dagrun: drive: an attempt's result could not be recorded"))
			}
			results = append(results, result)
		}
		res.Ran += len(steps)
		more := res.Ran < cmp.Or(opts.MaxAttempts, 10_000)
		rec := e.newFinishRecorder()
		fc, eager := e.store.(storage.FinishClaimer)
		if eager && more {
			_, steps, err = fc.FinishAndClaim(rec.attach(ctx), results, rec.plan, params)
		} else {
			_, err = e.store.FinishSteps(rec.attach(ctx), results, rec.plan)
			steps = nil
		}
		if err != nil {
			break
		}
		rec.report()
		e.notifyChanged() // for Follow
		if !eager && more {
			steps, err = e.store.ClaimSteps(ctx, params)
		}
	}
	if err != nil {
		return res, err
	}
	params.Limit = 1
	res.NextWake, err = e.store.NextWake(ctx, params)
	return res, err
}
