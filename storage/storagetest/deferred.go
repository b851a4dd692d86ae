package storagetest

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
)

// startDeferred runs the sweep and returns how many instances it planned.
func (b *bundle) startDeferred() int {
	b.t.Helper()
	n, err := b.store.StartDeferred(b.ctx, 100, Plan)
	require.NoError(b.t, err)
	return n
}

// nextWake is the store's NextWake for any claimer.
func (b *bundle) nextWake() time.Time {
	b.t.Helper()
	next, err := b.store.NextWake(b.ctx, storage.ClaimParams{})
	require.NoError(b.t, err)
	return next
}

// limitedBy is p under a workflow concurrency limit of key.
func limitedBy(p storage.CreateParams, key string, limit int) storage.CreateParams {
	p.Input, _ = json.Marshal(map[string]string{"key": key})
	p.ConcurrencyKey, p.ConcurrencyLimit = key, limit
	return p
}

// requireNotStarted checks that instance id and its wait step did not
// start: no waiting, no signal taken, no instance.started event.
func (b *bundle) requireNotStarted(id, wait string) {
	b.t.Helper()
	in := b.get(id)
	require.Equal(b.t, storage.InstancePending, in.Status)
	require.Nil(b.t, in.StartedAt)
	require.Empty(b.t, events(in, "", storage.EventInstanceStarted))
	require.Equal(b.t, storage.StepBlocked, step(b.t, in, wait).Status)
}

var deferredTests = map[string]func(*testing.T, *Harness){
	"DelayedWaitStartsWhenDue": func(t *testing.T, h *Harness) {
		// A delayed instance whose first step waits begins waiting, and
		// counts its wait's timeout, at its time, not at its creation.
		b := h.setup(t)
		p := delayedBy(params(waitSpec("await-go", "go", time.Minute), spec("ship", "await-go")), b.now().Add(time.Hour))
		b.create(p)
		b.requireNotStarted(p.ID, "await-go")
		require.True(t, b.nextWake().Equal(b.now().Add(time.Hour)), "next wake %v", b.nextWake())
		require.Zero(t, b.startDeferred(), "started before its time")

		res := b.mustSignal(storage.SignalParams{InstanceID: p.ID, Name: "go", Payload: json.RawMessage(`1`)})
		require.False(t, res.Delivered, "a step that does not wait yet takes no signal")
		b.requireNotStarted(p.ID, "await-go")

		b.clock.Advance(time.Hour)
		require.Equal(t, 1, b.startDeferred())
		in := b.get(p.ID)
		require.Equal(t, storage.InstanceRunning, in.Status)
		require.NotNil(t, in.StartedAt)
		require.True(t, in.StartedAt.Equal(b.now()), "started at %v", in.StartedAt)
		require.Len(t, events(in, "", storage.EventInstanceStarted), 1)
		require.Equal(t, storage.StepCompleted, step(t, in, "await-go").Status, "the stored signal is taken as the step starts waiting")
		require.Equal(t, storage.StepPending, step(t, in, "ship").Status)
		require.Zero(t, b.startDeferred(), "an instance is started once")
		require.True(t, b.nextWake().IsZero(), "nothing left to wake for: %v", b.nextWake())
	},
	"StartedBeforeItsWaitIsReady": func(t *testing.T, h *Harness) {
		// The history says the instance started, then its step waited.
		b := h.setup(t)
		p := delayedBy(params(waitSpec("await-go", "go", 0)), b.now().Add(time.Minute))
		b.create(p)
		b.clock.Advance(time.Minute)
		require.Equal(t, 1, b.startDeferred())
		var got []string
		for _, e := range b.get(p.ID).Events {
			got = append(got, e.Step+":"+string(e.Type))
		}
		require.Equal(t, []string{":instance.created", ":instance.started", "await-go:step.ready"}, got)
	},
	"AnOperationBeforeTheDelayStartsNothing": func(t *testing.T, h *Harness) {
		// A plan made before the instance's time, other than its
		// creation's (here a skip of its first step), leaves its wait for
		// the sweep too.
		b := h.setup(t)
		p := delayedBy(params(spec("check"), waitSpec("await-go", "go", time.Minute, "check")), b.now().Add(time.Hour))
		b.create(p)
		require.NoError(t, b.op().SkipStep(b.ctx, p.ID, "check", nil, Plan))
		b.requireNotStarted(p.ID, "await-go")
		b.clock.Advance(time.Hour)
		require.Equal(t, 1, b.startDeferred())
		require.Equal(t, storage.StepWaiting, b.status(p.ID, "await-go"))
	},
	"HeldBacklogDoesNotStarveAnEmptyKey": func(t *testing.T, h *Harness) {
		// However many instances wait behind a full key, a due instance
		// of an empty key is admitted.
		b := h.setup(t)
		var backlog []storage.CreateParams
		backlog = append(backlog, limitedBy(params(spec("work")), "a", 1))
		for range 12 {
			backlog = append(backlog, limitedBy(params(waitSpec("await-go", "go", 0)), "a", 1))
		}
		b.create(backlog...)
		late := delayedBy(limitedBy(params(waitSpec("await-go", "go", 0)), "b", 1), b.now().Add(time.Minute))
		b.create(late)
		b.clock.Advance(time.Minute)
		n, err := b.store.StartDeferred(b.ctx, 5, Plan)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.Equal(t, storage.StepWaiting, b.status(late.ID, "await-go"))
	},
	"DelayedWaitTimesOutFromItsStart": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		p := delayedBy(params(waitSpec("await-go", "go", time.Minute)), b.now().Add(time.Hour))
		b.create(p)
		b.clock.Advance(2 * time.Hour) // the sweep comes late
		require.Equal(t, 1, b.startDeferred())
		w := step(t, b.get(p.ID), "await-go")
		require.Equal(t, storage.StepWaiting, w.Status)
		require.NotNil(t, w.Deadline)
		require.True(t, w.Deadline.Equal(b.now().Add(time.Minute)), "deadline %v", w.Deadline)
	},
	"HeldWaitStartsWhenAdmitted": func(t *testing.T, h *Harness) {
		// Under a workflow limit, an instance whose first step waits takes
		// its turn: it starts waiting once admitted.
		b := h.setup(t)
		first := limitedBy(params(spec("work")), "a", 1)
		second := limitedBy(params(waitSpec("await-go", "go", 0)), "a", 1)
		other := limitedBy(params(waitSpec("await-go", "go", 0)), "b", 1)
		b.create(first, second, other)
		require.Equal(t, storage.StepWaiting, b.status(other.ID, "await-go"), "an instance admitted at once starts at once")
		b.requireNotStarted(second.ID, "await-go")
		require.Zero(t, b.startDeferred())
		require.True(t, b.nextWake().IsZero(), "a held instance waits for a finish, not a time: %v", b.nextWake())

		b.complete(first.ID, "work", `1`)
		require.Equal(t, storage.InstanceCompleted, b.get(first.ID).Status)
		require.Equal(t, 1, b.startDeferred(), "the finish admitted it")
		require.Equal(t, storage.StepWaiting, b.status(second.ID, "await-go"))
		require.Equal(t, storage.InstanceRunning, b.get(second.ID).Status)
	},
	"AnAdmittedInstanceIsPlannedOnce": func(t *testing.T, h *Harness) {
		// An instance admitted as it is created whose plan left nothing
		// blocked is neither planned again nor left for the sweep.
		b := h.setup(t)
		calls := 0
		counted := func(st *storage.InstanceState) (*storage.Plan, error) {
			calls++
			return Plan(st)
		}
		p := limitedBy(params(spec("work")), "a", 1)
		_, err := b.store.CreateInstances(b.ctx, nil, []storage.CreateParams{p}, counted)
		require.NoError(t, err)
		require.Equal(t, 1, calls)
		require.Equal(t, storage.StepPending, b.status(p.ID, "work"))
		require.Zero(t, b.startDeferred(), "the instance was left for the sweep")
		require.True(t, b.nextWake().IsZero(), "next wake %v", b.nextWake())
	},
	"DelayedHeldInstanceIsAdmittedByTheSweep": func(t *testing.T, h *Harness) {
		// A delayed instance under a limit is admitted when its first step
		// is promoted; one whose first step waits has none, so the sweep
		// admits it, if its key has room, and never one whose key is full.
		b := h.setup(t)
		hour := b.now().Add(time.Hour)
		alone := delayedBy(limitedBy(params(waitSpec("await-go", "go", 0)), "a", 1), hour)
		crowded := delayedBy(limitedBy(params(waitSpec("await-go", "go", 0)), "b", 1), hour)
		runner := limitedBy(params(spec("work")), "b", 1)
		b.create(alone, crowded, runner)
		b.clock.Advance(time.Hour)
		require.Equal(t, 1, b.startDeferred())
		require.Equal(t, storage.StepWaiting, b.status(alone.ID, "await-go"))
		b.requireNotStarted(crowded.ID, "await-go")
		require.True(t, b.nextWake().IsZero(), "a held instance waits for a finish, not a time: %v", b.nextWake())

		b.complete(runner.ID, "work", `1`)
		require.Equal(t, 1, b.startDeferred())
		require.Equal(t, storage.StepWaiting, b.status(crowded.ID, "await-go"))
	},
	"ParkedInstanceIsAdmittedByAFinishWhoseClockIsBehind": func(t *testing.T, h *Harness) {
		// A delayed instance whose time came while its key was full waits
		// for a finish of its key: the sweep does not look at it again,
		// and the finish admits it even when the finishing worker's clock
		// is behind the instance's time.
		b := h.setup(t)
		runner := limitedBy(params(spec("work")), "a", 1)
		delayed := delayedBy(limitedBy(params(waitSpec("await-go", "go", 0)), "a", 1), b.now().Add(time.Hour))
		b.create(runner, delayed)
		b.clock.Advance(time.Hour)
		require.Zero(t, b.startDeferred(), "the key is full")
		require.True(t, b.nextWake().IsZero(), "a held instance whose time came waits for a finish, not a time: %v", b.nextWake())

		b.clock.Advance(-time.Minute)
		b.complete(runner.ID, "work", `1`)
		b.clock.Advance(time.Minute)
		require.True(t, b.nextWake().Before(b.now().Add(time.Nanosecond)), "the admitted instance may start now: %v", b.nextWake())
		require.Equal(t, 1, b.startDeferred())
		require.Equal(t, storage.StepWaiting, b.status(delayed.ID, "await-go"))
	},
	"SweepParksTheBacklogOfAFullKey": func(t *testing.T, h *Harness) {
		// Delayed instances of a full key that fall due together: the
		// first the sweep finds the key full for parks them all, so that
		// no worker wakes for them again until a finish of the key.
		b := h.setup(t)
		runner := limitedBy(params(spec("work")), "a", 1)
		b.create(runner)
		var backlog []storage.CreateParams
		for range 5 {
			backlog = append(backlog, delayedBy(limitedBy(params(waitSpec("await-go", "go", 0)), "a", 1), b.now().Add(time.Hour)))
		}
		b.create(backlog...)
		b.clock.Advance(time.Hour)
		require.False(t, b.nextWake().After(b.now()), "instances fell due: %v", b.nextWake())
		n, err := b.store.StartDeferred(b.ctx, 1, Plan)
		require.NoError(t, err)
		require.Zero(t, n, "the key is full")
		require.True(t, b.nextWake().IsZero(), "parked instances wait for a finish, not a time: %v", b.nextWake())

		b.complete(runner.ID, "work", `1`)
		require.Equal(t, 1, b.startDeferred(), "the finish admitted one")
		require.Equal(t, storage.StepWaiting, b.status(backlog[0].ID, "await-go"), "the oldest goes first")
	},
	"KeyFreedBeforeTheTimeAdmitsAtTheTime": func(t *testing.T, h *Harness) {
		// A delayed instance is held for its time, not for its key: when
		// the key it found full frees before its time, the sweep admits it
		// at its time.
		b := h.setup(t)
		runner := limitedBy(params(spec("work")), "a", 1)
		delayed := delayedBy(limitedBy(params(waitSpec("await-go", "go", 0)), "a", 1), b.now().Add(time.Hour))
		b.create(runner, delayed)
		b.complete(runner.ID, "work", `1`)
		other := limitedBy(params(waitSpec("await-go", "go", 0)), "a", 1)
		b.create(other)
		require.Equal(t, storage.StepWaiting, b.status(other.ID, "await-go"), "the delayed instance took the slot before its time")
		b.mustSignal(storage.SignalParams{InstanceID: other.ID, Name: "go", Payload: json.RawMessage(`1`)})
		require.Equal(t, storage.InstanceCompleted, b.get(other.ID).Status)
		require.True(t, b.nextWake().Equal(b.now().Add(time.Hour)), "next wake %v", b.nextWake())
		b.clock.Advance(time.Hour)
		require.Equal(t, 1, b.startDeferred())
		require.Equal(t, storage.StepWaiting, b.status(delayed.ID, "await-go"))
	},
	"SweepAdmitsTheHighestPriorityFirst": func(t *testing.T, h *Harness) {
		// Delayed instances of one key that fall due together, whose first
		// steps wait: the sweep admits them as a finish would, the highest
		// priority first, then the oldest.
		b := h.setup(t)
		hour := b.now().Add(time.Hour)
		var ps []storage.CreateParams
		for _, priority := range []int{0, 7, 7} {
			p := delayedBy(limitedBy(params(waitSpec("await-go", "go", 0)), "a", 1), hour)
			p.Priority = priority
			ps = append(ps, p)
		}
		b.create(ps...)
		b.clock.Advance(time.Hour)
		require.Equal(t, 1, b.startDeferred())
		require.Equal(t, storage.StepWaiting, b.status(ps[1].ID, "await-go"), "the oldest of the highest priority goes first")
		b.requireNotStarted(ps[0].ID, "await-go")
		b.requireNotStarted(ps[2].ID, "await-go")
	},
	"RetriedHeldInstanceWaitsForItsTurn": func(t *testing.T, h *Harness) {
		// A retried instance whose key is full waits for a slot again: its
		// first wait step does not wait before it is admitted.
		b := h.setup(t)
		first := limitedBy(params(waitSpec("await-go", "go", 0)), "a", 1)
		second := limitedBy(params(waitSpec("await-go", "go", 0)), "a", 1)
		b.create(first, second)
		require.Equal(t, storage.StepWaiting, b.status(first.ID, "await-go"))
		require.NoError(t, b.store.CancelInstance(b.ctx, first.ID, "x", Plan))
		require.Equal(t, 1, b.startDeferred())
		require.Equal(t, storage.StepWaiting, b.status(second.ID, "await-go"))

		require.NoError(t, b.store.RetryInstance(b.ctx, first.ID, Plan))
		in := b.get(first.ID)
		require.Equal(t, storage.InstancePending, in.Status)
		require.Equal(t, storage.StepBlocked, step(t, in, "await-go").Status)
		require.Zero(t, b.startDeferred())
		require.NoError(t, b.store.CancelInstance(b.ctx, second.ID, "x", Plan))
		require.Equal(t, 1, b.startDeferred())
		require.Equal(t, storage.StepWaiting, b.status(first.ID, "await-go"))
	},
	"PausedOrCancelledInstancesStayUnstarted": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		hour := b.now().Add(time.Hour)
		paused := delayedBy(params(waitSpec("await-go", "go", 0)), hour)
		cancelled := delayedBy(params(waitSpec("await-go", "go", 0)), hour)
		b.create(paused, cancelled)
		require.NoError(t, b.op().PauseInstance(b.ctx, paused.ID))
		require.NoError(t, b.store.CancelInstance(b.ctx, cancelled.ID, "x", Plan))
		b.clock.Advance(time.Hour)
		require.True(t, b.nextWake().IsZero(), "next wake %v", b.nextWake())
		require.Zero(t, b.startDeferred())
		b.requireNotStarted(paused.ID, "await-go")
		require.Equal(t, storage.StepCancelled, b.status(cancelled.ID, "await-go"))

		require.NoError(t, b.op().ResumeInstance(b.ctx, paused.ID))
		require.Equal(t, 1, b.startDeferred())
		require.Equal(t, storage.StepWaiting, b.status(paused.ID, "await-go"))
	},
	"ManyDueInstancesStartInBatches": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		var ps []storage.CreateParams
		for range 5 {
			ps = append(ps, delayedBy(params(waitSpec("await-go", "go", 0)), b.now().Add(time.Minute)))
		}
		b.create(ps...)
		b.clock.Advance(time.Minute)
		n, err := b.store.StartDeferred(b.ctx, 3, Plan)
		require.NoError(t, err)
		require.Equal(t, 3, n)
		require.Equal(t, 2, b.startDeferred())
		for _, p := range ps {
			require.Equal(t, storage.StepWaiting, b.status(p.ID, "await-go"))
		}
	},
}
