package storagetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
)

var releaseTests = map[string]func(*testing.T, *Harness){
	"BackToPending": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createOne(spec("a"))
		c := b.claimStep(id, "a")
		b.clock.Advance(time.Second)
		require.NoError(t, b.store.ReleaseSteps(b.ctx, []storage.Claim{c.Claim}))
		in := b.get(id)
		a := step(t, in, "a")
		require.Equal(t, storage.StepPending, a.Status)
		require.Zero(t, a.Attempts, "a released attempt does not count")
		require.Nil(t, a.LeaseUntil)
		require.False(t, a.RunAfter.After(b.now()), "claimable at once")
		require.True(t, a.RunAfter.Equal(in.RunAfter), "in the place it had")
		require.Len(t, events(in, "a", storage.EventStepReleased), 1)

		require.Equal(t, []storage.FinishResult{{}}, b.finish(completed(c.Claim, `1`)), "the released claim is stale")
		again := b.claimStep(id, "a")
		require.Equal(t, 1, again.Attempt)
		require.Greater(t, again.Fence, c.Fence)

		// Releasing a claim no longer held changes nothing.
		require.NoError(t, b.store.ReleaseSteps(b.ctx, []storage.Claim{c.Claim}))
		require.Equal(t, storage.StepRunning, b.status(id, "a"))
		require.NoError(t, b.store.ReleaseSteps(b.ctx, nil))
	},

	// A cancel leaves a running step's fence as it was: the claim still
	// names the step, which is no longer running, and releasing it (a
	// worker shutting down after the cancel) must neither requeue it nor
	// uncount its attempt nor record it again.
	"AfterCancelChangesNothing": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createOne(spec("a"))
		c := b.claimStep(id, "a")
		b.clock.Advance(time.Second)
		require.NoError(t, b.store.CancelInstance(b.ctx, id, "stop", Plan))
		before := b.get(id)
		require.Equal(t, storage.StepCancelled, step(t, before, "a").Status)

		b.clock.Advance(time.Second)
		require.NoError(t, b.store.ReleaseSteps(b.ctx, []storage.Claim{c.Claim}))
		after := b.get(id)
		require.Equal(t, before.Steps, after.Steps, "a released claim of a cancelled step writes nothing")
		require.Equal(t, before.Events, after.Events)
	},
}

var cancelTests = map[string]func(*testing.T, *Harness){
	"CancelsUnfinishedSteps": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createOne(spec("done"), spec("run"), spec("wait"), spec("later", "wait"))
		b.complete(id, "done", `1`)
		c := b.claimStep(id, "run")
		b.clock.Advance(time.Second)
		require.NoError(t, b.store.CancelInstance(b.ctx, id, "operator said so", Plan))

		in := b.get(id)
		require.Equal(t, storage.InstanceCancelled, in.Status)
		require.Equal(t, "operator said so", in.Error)
		require.NotNil(t, in.FinishedAt)
		require.True(t, in.FinishedAt.Equal(b.now()))
		require.Equal(t, storage.StepCompleted, step(t, in, "done").Status)
		for _, name := range []string{"run", "wait", "later"} {
			require.Equal(t, storage.StepCancelled, step(t, in, name).Status, name)
			require.Len(t, events(in, name, storage.EventStepCancelled), 1, name)
		}
		ev := events(in, "", storage.EventInstanceCancelled)
		require.Len(t, ev, 1)
		require.Equal(t, "operator said so", ev[0].Message)

		lost, err := b.store.ExtendLeases(b.ctx, []storage.Claim{c.Claim}, time.Minute)
		require.NoError(t, err)
		require.Equal(t, []storage.Claim{c.Claim}, lost, "the running step's claim is stale")
		require.Equal(t, []storage.FinishResult{{Cancelled: true}}, b.finish(completed(c.Claim, `1`)))
		require.Equal(t, storage.StepCancelled, b.status(id, "run"))
		require.Empty(t, b.claim(storage.ClaimParams{}))
	},

	"Errors": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		require.ErrorIs(t, b.store.CancelInstance(b.ctx, "no-such-instance", "x", Plan), storage.ErrNotFound)
		id := b.createOne(spec("a"))
		require.NoError(t, b.store.CancelInstance(b.ctx, id, "x", Plan))
		require.ErrorIs(t, b.store.CancelInstance(b.ctx, id, "again", Plan), storage.ErrConflict)
		done := b.createOne(spec("a"))
		b.complete(done, "a", `1`)
		require.ErrorIs(t, b.store.CancelInstance(b.ctx, done, "x", Plan), storage.ErrConflict)
		require.Equal(t, storage.InstanceCompleted, b.get(done).Status)
	},
}

// statsCount returns how many instances of workflow Stats counts in
// status.
func (b *bundle) statsCount(workflow string, status storage.InstanceStatus) int {
	b.t.Helper()
	st, err := b.store.Stats(b.ctx)
	require.NoError(b.t, err)
	for _, w := range st.Workflows {
		if w.Workflow == workflow {
			return w.Instances[status]
		}
	}
	return 0
}

// requireStartsAtClaim checks that instance id, the only one of its
// workflow, made to run again before any of its steps was ever claimed,
// is pending as a new instance is, and that the claim of its step name
// starts it as it starts a new one: the reference defines running as "at
// least one step has been claimed".
func (b *bundle) requireStartsAtClaim(id, name string) {
	t := b.t
	t.Helper()
	in := b.get(id)
	require.Equal(t, storage.InstancePending, in.Status, "no step of it was ever claimed")
	require.Nil(t, in.StartedAt)
	require.Nil(t, in.FinishedAt)
	require.Nil(t, in.Deadline, "its workflow timeout counts from its start")
	require.Empty(t, in.Error)
	require.Empty(t, events(in, "", storage.EventInstanceStarted))
	require.Equal(t, 1, b.statsCount(in.Workflow, storage.InstancePending))
	require.Zero(t, b.statsCount(in.Workflow, storage.InstanceRunning))
	require.Zero(t, b.statsCount(in.Workflow, storage.InstanceCancelled))
	b.requireExactCounts("the revival of a never-claimed instance")

	b.clock.Advance(time.Minute)
	b.claimStep(id, name)
	in = b.get(id)
	require.Equal(t, storage.InstanceRunning, in.Status, "its first claim starts it")
	require.NotNil(t, in.StartedAt)
	require.True(t, in.StartedAt.Equal(b.now()), "started at the claim, not at the retry: %v", in.StartedAt)
	require.NotNil(t, in.Deadline)
	require.True(t, in.Deadline.Equal(b.now().Add(in.Timeout)), "the workflow timeout counts from the claim: %v", in.Deadline)
	started := events(in, "", storage.EventInstanceStarted)
	require.Len(t, started, 1)
	retried := events(in, "", storage.EventInstanceRetried)
	require.NotEmpty(t, retried)
	require.Greater(t, started[0].ID, retried[len(retried)-1].ID, "started after the retry")
	require.Zero(t, b.statsCount(in.Workflow, storage.InstancePending))
	require.Equal(t, 1, b.statsCount(in.Workflow, storage.InstanceRunning))
	b.requireExactCounts("the first claim of a revived instance")
}

var retryTests = map[string]func(*testing.T, *Harness){
	"NeverClaimedInstanceIsPendingAgain": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		// As started with a delay, then cancelled before its time came.
		p := params(spec("a"), spec("b", "a"))
		p.Timeout = time.Hour
		p.RunAfter = b.now().Add(10 * time.Minute)
		b.create(p)
		require.NoError(t, b.store.CancelInstance(b.ctx, p.ID, "not now", Plan))
		require.Nil(t, b.get(p.ID).StartedAt)

		b.clock.Advance(time.Minute)
		require.NoError(t, b.store.RetryInstance(b.ctx, p.ID, Plan))
		in := b.get(p.ID)
		require.Len(t, events(in, "", storage.EventInstanceRetried), 1)
		require.Equal(t, storage.StepPending, step(t, in, "a").Status)
		require.Equal(t, storage.StepBlocked, step(t, in, "b").Status)
		require.True(t, step(t, in, "a").RunAfter.Equal(b.now()), "ready at once, not at its delayed start")
		b.requireStartsAtClaim(p.ID, "a")
	},

	"DelayedOrPutOffStepsAreReadyAtOnce": func(t *testing.T, h *Harness) {
		// A retry, plain or from a step, makes the steps whose
		// dependencies are done ready at once: not at the delayed start
		// the instance was cancelled before, nor at the end of the
		// backoff or snooze their last attempt left them waiting for.
		retries := map[string]func(b *bundle, id string) error{
			"retry":      func(b *bundle, id string) error { return b.store.RetryInstance(b.ctx, id, Plan) },
			"retry from": func(b *bundle, id string) error { return b.op().RetryFrom(b.ctx, id, "a", Plan) },
		}
		putOff := map[string]func(b *bundle, p *storage.CreateParams){
			"delayed start": func(b *bundle, p *storage.CreateParams) { p.RunAfter = b.now().Add(time.Hour) },
			"backoff": func(b *bundle, p *storage.CreateParams) {
				b.create(*p)
				c := b.claimStep(p.ID, "a")
				b.finish(storage.StepResult{Claim: c.Claim, Outcome: storage.OutcomeRetry, Error: "boom", RunAfter: b.now().Add(time.Hour)})
			},
			"snooze": func(b *bundle, p *storage.CreateParams) {
				b.create(*p)
				c := b.claimStep(p.ID, "a")
				b.finish(storage.StepResult{Claim: c.Claim, Outcome: storage.OutcomeSnooze, RunAfter: b.now().Add(time.Hour)})
			},
		}
		for rname, retry := range retries {
			for pname, off := range putOff {
				t.Run(rname+"/"+pname, func(t *testing.T) {
					b := h.setup(t)
					p := params(spec("a"), spec("b", "a"))
					off(b, &p)
					if pname == "delayed start" {
						b.create(p)
					}
					require.NoError(t, b.store.CancelInstance(b.ctx, p.ID, "not now", Plan))
					b.clock.Advance(time.Minute)
					require.NoError(t, retry(b, p.ID))
					a := step(t, b.get(p.ID), "a")
					require.Equal(t, storage.StepPending, a.Status)
					require.False(t, a.RunAfter.After(b.now()), "due at %v, not now", a.RunAfter)
					b.claimStep(p.ID, "a")
				})
			}
		}
		// A delayed instance whose first step waits begins waiting when
		// the sweep finds it, which is at once.
		b := h.setup(t)
		p := delayedBy(params(waitSpec("await-go", "go", 0)), b.now().Add(time.Hour))
		b.create(p)
		require.NoError(t, b.store.CancelInstance(b.ctx, p.ID, "not now", Plan))
		require.NoError(t, b.store.RetryInstance(b.ctx, p.ID, Plan))
		require.Equal(t, 1, b.startDeferred())
		require.Equal(t, storage.StepWaiting, b.status(p.ID, "await-go"))
	},

	"StartedInstanceIsRunningAgain": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		p := params(spec("a"), spec("b", "a"))
		p.Timeout = time.Hour
		b.create(p)
		b.clock.Advance(time.Minute)
		b.complete(p.ID, "a", `1`)
		b.fail(p.ID, "b")
		failed := b.get(p.ID)
		require.Equal(t, storage.InstanceFailed, failed.Status)
		require.NotNil(t, failed.StartedAt)

		b.clock.Advance(time.Minute)
		require.NoError(t, b.store.RetryInstance(b.ctx, p.ID, Plan))
		in := b.get(p.ID)
		require.Equal(t, storage.InstanceRunning, in.Status, "it had started")
		require.NotNil(t, in.StartedAt)
		require.True(t, in.StartedAt.Equal(*failed.StartedAt), "it keeps its start")
		require.Equal(t, 1, b.statsCount(p.Workflow, storage.InstanceRunning))
		require.Zero(t, b.statsCount(p.Workflow, storage.InstancePending))
		b.requireExactCounts("the retry of a started instance")

		b.claimStep(p.ID, "b")
		in = b.get(p.ID)
		require.Equal(t, storage.InstanceRunning, in.Status)
		require.Len(t, events(in, "", storage.EventInstanceStarted), 1, "it does not start again")
	},

	"RearmsFailedAndCancelledSteps": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		a := spec("a")
		a.Retry.MaxAttempts = 2
		id := b.createOne(a, spec("b", "a"), spec("c"))
		b.complete(id, "c", `"kept"`)
		c1 := b.claimStep(id, "a")
		b.finish(storage.StepResult{Claim: c1.Claim, Outcome: storage.OutcomeRetry, Error: "first", RunAfter: b.now()})
		c2 := b.claimStep(id, "a")
		b.finish(storage.StepResult{Claim: c2.Claim, Outcome: storage.OutcomeFailed, Error: "second"})
		require.Equal(t, storage.InstanceFailed, b.get(id).Status)

		b.clock.Advance(time.Minute)
		require.NoError(t, b.store.RetryInstance(b.ctx, id, Plan))
		in := b.get(id)
		require.Equal(t, storage.InstanceRunning, in.Status)
		require.Empty(t, in.Error)
		require.Nil(t, in.FinishedAt)
		require.Len(t, events(in, "", storage.EventInstanceRetried), 1)
		sa := step(t, in, "a")
		require.Equal(t, storage.StepPending, sa.Status)
		require.Zero(t, sa.Attempts, "attempts reset")
		require.Empty(t, sa.Error)
		require.Nil(t, sa.FinishedAt)
		require.True(t, sa.RunAfter.Equal(in.RunAfter), "a re-armed step takes its instance's place")
		require.True(t, sa.ReadyAt.Equal(b.now()))
		require.Equal(t, storage.StepBlocked, step(t, in, "b").Status)
		sc := step(t, in, "c")
		require.Equal(t, storage.StepCompleted, sc.Status)
		require.JSONEq(t, `"kept"`, string(sc.Output))

		c3 := b.claimStep(id, "a")
		require.Equal(t, 1, c3.Attempt)
		require.Equal(t, []storage.FinishResult{{}}, b.finish(completed(c2.Claim, `1`)), "claims from before the retry are stale")
		b.finish(completed(c3.Claim, `"a"`))
		b.complete(id, "b", `"b"`)
		in = b.get(id)
		require.Equal(t, storage.InstanceCompleted, in.Status)
		require.JSONEq(t, `{"steps":3}`, string(in.Output))
	},

	"CancelledInstance": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createOne(spec("a"), spec("b", "a"))
		c := b.claimStep(id, "a")
		require.NoError(t, b.store.CancelInstance(b.ctx, id, "oops", Plan))
		require.NoError(t, b.store.RetryInstance(b.ctx, id, Plan))
		in := b.get(id)
		require.Equal(t, storage.InstanceRunning, in.Status)
		require.Equal(t, storage.StepPending, step(t, in, "a").Status)
		require.Equal(t, storage.StepBlocked, step(t, in, "b").Status)
		require.Equal(t, []storage.FinishResult{{}}, b.finish(completed(c.Claim, `1`)), "the cancelled claim stays stale")
		again := b.claimStep(id, "a")
		require.Equal(t, 1, again.Attempt)
	},

	"Errors": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		require.ErrorIs(t, b.store.RetryInstance(b.ctx, "no-such-instance", Plan), storage.ErrNotFound)
		pending := b.createOne(spec("a"))
		require.ErrorIs(t, b.store.RetryInstance(b.ctx, pending, Plan), storage.ErrConflict)
		running := b.createOne(spec("a"), spec("b"))
		b.complete(running, "a", `1`)
		require.ErrorIs(t, b.store.RetryInstance(b.ctx, running, Plan), storage.ErrConflict)
		done := b.createOne(spec("a"))
		b.complete(done, "a", `1`)
		require.ErrorIs(t, b.store.RetryInstance(b.ctx, done, Plan), storage.ErrConflict)
		require.Equal(t, storage.InstanceCompleted, b.get(done).Status)
	},
}
