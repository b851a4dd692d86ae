package storagetest

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
)

// KeyPlan is Plan for steps with a step-level concurrency limit: a step
// made pending gets the instance input's "key" as its ConcurrencyKey.
func KeyPlan(st *storage.InstanceState) (*storage.Plan, error) {
	p, err := Plan(st)
	if err != nil || p == nil {
		return p, err
	}
	var in struct{ Key string }
	if len(st.Input) > 0 {
		if err := json.Unmarshal(st.Input, &in); err != nil {
			return nil, err
		}
	}
	for i := range p.Steps {
		if p.Steps[i].Status == storage.StepPending {
			p.Steps[i].ConcurrencyKey = in.Key
		}
	}
	return p, nil
}

// keyed returns an instance of step "work" (in queue q.work) whose input
// carries key; with instanceLimit it is under a workflow-level limit of
// that key, with stepLimit its step under a step-level one.
func keyed(key string, instanceLimit, stepLimit int) storage.CreateParams {
	s := spec("work")
	s.ConcurrencyLimit = stepLimit
	p := params(s)
	p.Input, _ = json.Marshal(map[string]string{"key": key})
	if instanceLimit > 0 {
		p.ConcurrencyKey, p.ConcurrencyLimit = key, instanceLimit
	}
	return p
}

// oneSlotLimit is a limit of one slot, and how to make work under it.
type oneSlotLimit struct {
	name  string
	limit func(b *limitBundle)
	make  func() storage.CreateParams
}

// oneSlotLimits are the three limits that hold work: a workflow's key, a
// step's key and a queue's concurrency.
func oneSlotLimits() []oneSlotLimit {
	return []oneSlotLimit{
		{"instance key", func(*limitBundle) {}, func() storage.CreateParams { return keyed("a", 1, 0) }},
		{"step key", func(*limitBundle) {}, func() storage.CreateParams { return keyed("a", 0, 1) }},
		{"queue", func(b *limitBundle) {
			require.NoError(b.t, b.setQueueLimit(storage.QueueLimit{Queue: "q.work", Concurrency: 1}))
		}, func() storage.CreateParams { return keyed("", 0, 0) }},
	}
}

// delayedBy is p with its first steps due at runAfter.
func delayedBy(p storage.CreateParams, runAfter time.Time) storage.CreateParams {
	p.RunAfter = runAfter
	return p
}

func (b *bundle) createKeyed(ps ...storage.CreateParams) []string {
	b.t.Helper()
	_, err := b.store.CreateInstances(b.ctx, nil, ps, KeyPlan)
	require.NoError(b.t, err)
	ids := make([]string, len(ps))
	for i, p := range ps {
		ids[i] = p.ID
	}
	return ids
}

// setQueueLimit replaces every limit of l's queue.
func (b *bundle) setQueueLimit(l storage.QueueLimit) error {
	_, err := b.store.SetQueueLimit(b.ctx, storage.SetAll(l))
	return err
}

// limitBundle is a bundle that remembers the claims it took, by instance.
type limitBundle struct {
	*bundle
	claims map[string]storage.Claim
}

func (h *Harness) setupLimits(t *testing.T) *limitBundle {
	t.Helper()
	return &limitBundle{bundle: h.setup(t), claims: map[string]storage.Claim{}}
}

// twoASecond limits q.work to two starts a second and creates n instances
// of one step in it, one after the other, returning their IDs.
func (b *limitBundle) twoASecond(n int) []string {
	b.t.Helper()
	require.NoError(b.t, b.setQueueLimit(storage.QueueLimit{Queue: "q.work", Rate: 2, Per: time.Second}))
	var ids []string
	for range n {
		ids = append(ids, b.createKeyed(keyed("", 0, 0))...)
	}
	return ids
}

// startTwoASecond requires that the steps of ids start one at a time,
// 500 ms apart (q.work at two a second) from now, in their order; why
// names the failure of a second start with the first.
func (b *limitBundle) startTwoASecond(ids []string, why string) {
	b.t.Helper()
	require.Equal(b.t, ids[:1], b.claimAll())
	require.Empty(b.t, b.claimAll(), why)
	for i := 1; i < len(ids); i++ {
		b.clock.Advance(500 * time.Millisecond)
		require.Equal(b.t, ids[i:i+1], b.claimAll(), "start %d", i)
	}
}

// claimAll claims every claimable step and returns their instances.
func (b *limitBundle) claimAll() []string {
	b.t.Helper()
	var ids []string
	for _, c := range b.claim(storage.ClaimParams{Limit: 1000}) {
		ids = append(ids, c.InstanceID)
		b.claims[c.InstanceID] = c.Claim
	}
	return ids
}

func (b *bundle) finishKeyed(c storage.Claim, outcome storage.Outcome) {
	b.t.Helper()
	r := storage.StepResult{Claim: c, Outcome: outcome, Output: json.RawMessage(`1`), Error: "boom"}
	got, err := b.store.FinishSteps(b.ctx, []storage.StepResult{r}, KeyPlan)
	require.NoError(b.t, err)
	require.True(b.t, got[0].Accepted)
}

func (b *bundle) held(id string) bool {
	b.t.Helper()
	s := step(b.t, b.get(id), "work")
	return s.Held()
}

// complete completes the running step of instance id.
func (b *limitBundle) complete(id string) {
	b.t.Helper()
	b.finishKeyed(b.runningClaim(id), storage.OutcomeCompleted)
}

// runningClaim is the claim of instance id's running step, taken by
// claimAll.
func (b *limitBundle) runningClaim(id string) storage.Claim {
	b.t.Helper()
	c, ok := b.claims[id]
	require.True(b.t, ok, "instance %s's step was not claimed", id)
	delete(b.claims, id)
	return c
}

var limitTests = map[string]func(*testing.T, *Harness){
	// The finish that frees a limit's slot releases the held work in
	// the same transaction, and tells the store's subscribers as of any
	// step made ready: a worker whose last claim found nothing would
	// otherwise leave the released step for its next poll.
	"ReleaseSignalsSubscribers": func(t *testing.T, h *Harness) {
		for _, tc := range oneSlotLimits() {
			t.Run(tc.name, func(t *testing.T) {
				b := h.setupLimits(t)
				ch, cancel := b.store.Subscribe(nil)
				defer cancel()
				tc.limit(b)
				ids := b.createKeyed(tc.make(), tc.make())
				require.Equal(t, ids[:1], b.claimAll(), "one at a time")
				require.True(t, b.held(ids[1]))
				if h.Settle != nil {
					h.Settle(t, b.store)
				}
				drainSignals(ch)
				b.complete(ids[0])
				awaitSignal(t, ch, "a finish that released a held step")
				require.Equal(t, ids[1:], b.claimAll())
			})
		}
	},
	"PausedHeldWorkIsPassedOverAndRunsWhenResumed": func(t *testing.T, h *Harness) {
		// A paused instance's held work takes no slot that frees while it
		// is paused, which goes to the next held work; resumed, it takes
		// the next slot, or at once one that freed while it was paused.
		for _, l := range oneSlotLimits() {
			t.Run(l.name, func(t *testing.T) {
				b := h.setupLimits(t)
				l.limit(b)
				ids := b.createKeyed(l.make(), l.make(), l.make())
				require.Equal(t, ids[:1], b.claimAll())
				require.NoError(t, b.op().PauseInstance(b.ctx, ids[1]))
				b.complete(ids[0])
				require.Equal(t, ids[2:], b.claimAll(), "the slot goes past the paused instance")
				require.NoError(t, b.op().ResumeInstance(b.ctx, ids[1]))
				require.Empty(t, b.claimAll(), "the resumed instance waits for a slot")
				require.True(t, b.held(ids[1]))
				b.complete(ids[2])
				require.Equal(t, ids[1:2], b.claimAll())

				more := b.createKeyed(l.make(), l.make())
				require.NoError(t, b.op().PauseInstance(b.ctx, more[0]))
				b.complete(ids[1])
				require.Equal(t, more[1:], b.claimAll())
				b.complete(more[1])
				require.Empty(t, b.claimAll(), "the slot is free, its held instance paused")
				require.NoError(t, b.op().ResumeInstance(b.ctx, more[0]))
				require.Equal(t, more[:1], b.claimAll(), "the resume takes the free slot")
			})
		}
	},
	"QueueRatePausedStepsHoldNoSlot": func(t *testing.T, h *Harness) {
		// A paused instance's step that a rate spaced out gives up its
		// slot, which the steps behind it move up to; resumed, it takes
		// the rate's next slot as a step made ready then would, rather
		// than keeping one that passed while it was paused.
		b := h.setupLimits(t)
		ids := b.twoASecond(4)
		require.Equal(t, ids[:1], b.claimAll())
		require.NoError(t, b.op().PauseInstance(b.ctx, ids[1]))
		b.clock.Advance(500 * time.Millisecond)
		require.Equal(t, ids[2:3], b.claimAll(), "the paused step kept its slot")
		b.clock.Advance(500 * time.Millisecond)
		require.Equal(t, ids[3:], b.claimAll())
		require.NoError(t, b.op().ResumeInstance(b.ctx, ids[1]))
		require.Empty(t, b.claimAll(), "the resumed step started in the slot it had before its pause")
		b.clock.Advance(500 * time.Millisecond)
		require.Equal(t, ids[1:2], b.claimAll())
	},
	"QueueRateSpacesResumedSteps": func(t *testing.T, h *Harness) {
		// Resumed together, the steps of paused instances start the
		// rate's interval apart, those whose slots passed while paused
		// and those made ready while paused alike.
		b := h.setupLimits(t)
		ids := b.twoASecond(3)
		early := params(spec("a"), spec("work", "a"))
		b.createKeyed(early)
		require.ElementsMatch(t, []string{ids[0], early.ID}, b.claimAll())
		a := b.runningClaim(early.ID)
		for _, id := range append(ids[1:], early.ID) {
			require.NoError(t, b.op().PauseInstance(b.ctx, id))
		}
		b.finishKeyed(a, storage.OutcomeCompleted)
		require.Equal(t, storage.StepPending, b.status(early.ID, "work"))
		b.clock.Advance(time.Second)
		for _, id := range append(ids[1:], early.ID) {
			require.NoError(t, b.op().ResumeInstance(b.ctx, id))
		}
		var started []string
		for i := range 3 {
			got := b.claimAll()
			require.Len(t, got, 1, "start %d", i)
			require.Empty(t, b.claimAll(), "resumed steps started together")
			started = append(started, got...)
			b.clock.Advance(500 * time.Millisecond)
		}
		require.ElementsMatch(t, append(ids[1:], early.ID), started)
	},
	"StepMadeReadyWhilePausedTakesItsSlotWhenResumed": func(t *testing.T, h *Harness) {
		// A step made ready while its instance is paused takes no slot
		// then; resumed, it takes a free one or is held, as a step made
		// ready now.
		for _, l := range oneSlotLimits()[1:] {
			t.Run(l.name, func(t *testing.T) {
				b := h.setupLimits(t)
				l.limit(b)
				p := l.make()
				p.Steps = append([]storage.StepSpec{spec("a")}, p.Steps...)
				p.Steps[1].DependsOn = []string{"a"}
				b.createKeyed(p)
				require.Equal(t, []string{p.ID}, b.claimAll())
				a := b.runningClaim(p.ID)
				other := b.createKeyed(l.make())
				require.Equal(t, other, b.claimAll())
				require.NoError(t, b.op().PauseInstance(b.ctx, p.ID))
				b.finishKeyed(a, storage.OutcomeCompleted)
				require.NoError(t, b.op().ResumeInstance(b.ctx, p.ID))
				require.Empty(t, b.claimAll(), "the resumed step took a slot that was not free")
				b.complete(other[0])
				require.Equal(t, []string{p.ID}, b.claimAll())
			})
		}
	},
	"ResumedStepTakesItsSlotAgain": func(t *testing.T, h *Harness) {
		// A paused instance's ready step holds no slot of its limits, so
		// another step may take it; resumed, the step takes a free slot
		// or is held, as a step made ready now, and one waiting out a
		// retry's backoff does so when its time comes.
		for _, l := range oneSlotLimits()[1:] {
			t.Run(l.name, func(t *testing.T) {
				b := h.setupLimits(t)
				l.limit(b)
				ready := b.createKeyed(l.make())
				require.NoError(t, b.op().PauseInstance(b.ctx, ready[0]))
				other := b.createKeyed(l.make())
				require.NoError(t, b.op().ResumeInstance(b.ctx, ready[0]))
				require.Equal(t, other, b.claimAll(), "the resumed step took a slot that was not free")
				require.True(t, b.held(ready[0]))
				b.complete(other[0])
				require.Equal(t, ready, b.claimAll())

				b.finishKeyed(b.runningClaim(ready[0]), storage.OutcomeRetry)
				require.NoError(t, b.op().PauseInstance(b.ctx, ready[0]))
				other = b.createKeyed(l.make())
				require.Equal(t, other, b.claimAll())
				require.NoError(t, b.op().ResumeInstance(b.ctx, ready[0]))
				b.clock.Advance(time.Minute)
				require.Empty(t, b.claimAll(), "the retried step took a slot that was not free")
				b.complete(other[0])
				require.Equal(t, ready, b.claimAll())
			})
		}
	},
	"InstanceKeyAdmitsInCreationOrder": func(t *testing.T, h *Harness) {
		b := h.setupLimits(t)
		ids := b.createKeyed(keyed("a", 1, 0), keyed("a", 1, 0), keyed("b", 1, 0))
		more := b.createKeyed(keyed("a", 1, 0))
		require.ElementsMatch(t, []string{ids[0], ids[2]}, b.claimAll(), "one instance per key runs")
		require.True(t, b.held(ids[1]))
		waiting := b.get(ids[1])
		require.Equal(t, storage.InstancePending, waiting.Status)
		require.True(t, waiting.Held, "the instance says it waits for a slot of its key")
		require.Equal(t, "a", waiting.ConcurrencyKey)
		admitted := b.get(ids[0])
		require.False(t, admitted.Held)
		require.Equal(t, "a", admitted.ConcurrencyKey)

		require.Empty(t, b.claimAll())
		// The running one finishes: the next one of its key, in creation
		// order, is admitted in the same transaction.
		b.complete(ids[0])
		require.False(t, b.held(ids[1]))
		require.False(t, b.get(ids[1]).Held, "admitted")
		require.True(t, b.held(more[0]))
		require.Equal(t, []string{ids[1]}, b.claimAll())
		// A cancel frees the slot too.
		require.NoError(t, b.store.CancelInstance(b.ctx, ids[1], "x", Plan))
		require.Equal(t, []string{more[0]}, b.claimAll())
	},
	"DelayedInstanceIsAdmittedWhenDue": func(t *testing.T, h *Harness) {
		// An instance that starts later holds no slot of its key until
		// then: it is admitted when its time comes if a slot is free, or
		// by the next finish of its key after that.
		b := h.setupLimits(t)
		hour := b.now().Add(time.Hour)
		late := b.createKeyed(delayedBy(keyed("a", 1, 0), hour))
		alone := b.createKeyed(delayedBy(keyed("b", 1, 0), hour))
		now := b.createKeyed(keyed("a", 1, 0), keyed("a", 1, 0))
		require.Equal(t, now[:1], b.claimAll(), "a delayed instance held its key's slot")
		require.True(t, b.held(now[1]))

		b.clock.Advance(time.Hour)
		require.Equal(t, alone, b.claimAll(), "a due instance with a free slot is admitted")
		require.True(t, b.held(late[0]), "a due instance took a slot that was not free")
		// The slot frees: the oldest held instance that is due goes next,
		// in creation order.
		b.complete(now[0])
		require.Equal(t, late, b.claimAll())
		b.complete(late[0])
		require.Equal(t, now[1:], b.claimAll())

		// A delayed instance is not admitted by a finish before its time.
		later := b.createKeyed(delayedBy(keyed("a", 1, 0), b.now().Add(time.Hour)))
		b.complete(now[1])
		b.clock.Advance(time.Hour)
		more := b.createKeyed(keyed("a", 1, 0))
		require.Equal(t, more, b.claimAll(), "the finish before its time admitted the delayed instance")
		require.True(t, b.held(later[0]))
		b.complete(more[0])
		require.Equal(t, later, b.claimAll())
	},
	"HeldInstanceIsAdmittedByAFinishWhoseClockIsBehind": func(t *testing.T, h *Harness) {
		// A held instance whose time has come (it was not delayed, or its
		// delayed start fell due while the key was full) is admitted by
		// the next finish of its key, whatever time that finish reads: a
		// worker's clock may be behind the creator's, and on PostgreSQL a
		// finish reads the time as its transaction begins, before an
		// instance created meanwhile commits. Left held, it waited for the
		// next finish of its key, which might never come.
		b := h.setupLimits(t)
		first := b.createKeyed(keyed("a", 1, 0))
		require.Equal(t, first, b.claimAll())
		b.clock.Advance(time.Minute)
		next := b.createKeyed(keyed("a", 1, 0))
		delayed := b.createKeyed(delayedBy(keyed("a", 1, 0), b.now().Add(time.Minute)))
		b.clock.Advance(time.Minute)
		require.Empty(t, b.claimAll(), "the key is full")
		require.True(t, b.held(next[0]))
		require.True(t, b.held(delayed[0]), "the delayed instance fell due while the key was full")

		b.clock.Advance(-2*time.Minute - time.Second) // a finish by a clock behind
		b.complete(first[0])
		require.False(t, b.held(next[0]), "the finish left the instance created before it held")
		require.True(t, b.held(delayed[0]))
		b.clock.Advance(2*time.Minute + time.Second)
		require.Equal(t, next, b.claimAll())

		b.clock.Advance(-time.Minute - time.Second)
		b.complete(next[0])
		require.False(t, b.held(delayed[0]), "the finish left the instance that fell due before it held")
		b.clock.Advance(time.Minute + time.Second)
		require.Equal(t, delayed, b.claimAll())
		// DelayedInstanceIsAdmittedWhenDue: one whose time has not come by
		// any clock is still not admitted by a finish.
	},
	"InstanceKeyCountsOneCallsOwnInstances": func(t *testing.T, h *Harness) {
		b := h.setupLimits(t)
		ids := b.createKeyed(keyed("a", 2, 0), keyed("a", 2, 0), keyed("a", 2, 0), keyed("a", 2, 0))
		require.ElementsMatch(t, ids[:2], b.claimAll())
		require.True(t, b.held(ids[2]))
		require.True(t, b.held(ids[3]))
	},
	"CancelledHeldInstanceFreesNothing": func(t *testing.T, h *Harness) {
		b := h.setupLimits(t)
		ids := b.createKeyed(keyed("a", 1, 0), keyed("a", 1, 0), keyed("a", 1, 0))
		require.NoError(t, b.store.CancelInstance(b.ctx, ids[1], "x", Plan))
		require.Equal(t, []string{ids[0]}, b.claimAll())
		require.True(t, b.held(ids[2]))
	},
	"RetriedInstanceWaitsForASlot": func(t *testing.T, h *Harness) {
		b := h.setupLimits(t)
		ids := b.createKeyed(keyed("a", 1, 0), keyed("a", 1, 0))
		require.Equal(t, ids[:1], b.claimAll())
		b.finishKeyed(b.runningClaim(ids[0]), storage.OutcomeFailed)
		require.Equal(t, storage.InstanceFailed, b.get(ids[0]).Status)
		require.Equal(t, []string{ids[1]}, b.claimAll(), "a failure frees the slot")

		require.NoError(t, b.store.RetryInstance(b.ctx, ids[0], KeyPlan))
		in := b.get(ids[0])
		require.Equal(t, storage.InstancePending, in.Status, "the key is full: the retried instance waits")
		require.True(t, b.held(ids[0]))
		require.Empty(t, b.claimAll())
		b.complete(ids[1])
		require.Equal(t, []string{ids[0]}, b.claimAll())
	},
	"StepKeyLimitsRunningStepsAcrossInstances": func(t *testing.T, h *Harness) {
		b := h.setupLimits(t)
		ids := b.createKeyed(keyed("a", 0, 1), keyed("a", 0, 1), keyed("a", 0, 1), keyed("b", 0, 1))
		require.ElementsMatch(t, []string{ids[0], ids[3]}, b.claimAll())
		require.Equal(t, storage.InstanceRunning, b.get(ids[0]).Status)
		require.True(t, b.held(ids[1]))
		// A retry keeps the slot: the step is pending again, not held.
		c := b.runningClaim(ids[0])
		b.finishKeyed(c, storage.OutcomeRetry)
		require.False(t, b.held(ids[0]))
		require.True(t, b.held(ids[1]))
		b.clock.Advance(time.Minute)
		require.Equal(t, []string{ids[0]}, b.claimAll())
		b.complete(ids[0])
		require.Equal(t, []string{ids[1]}, b.claimAll(), "the oldest held step goes next")
		require.True(t, b.held(ids[2]))
	},
	"QueueConcurrency": func(t *testing.T, h *Harness) {
		b := h.setupLimits(t)
		var ids []string
		for range 5 {
			ids = append(ids, b.createKeyed(keyed("", 0, 0))...)
		}
		require.NoError(t, b.setQueueLimit(storage.QueueLimit{Queue: "q.work", Concurrency: 2}))
		require.Len(t, b.claimAll(), 2, "ready steps beyond a new limit are held")
		more := b.createKeyed(keyed("", 0, 0))
		require.True(t, b.held(more[0]))
		b.complete(ids[0])
		require.Equal(t, []string{ids[2]}, b.claimAll())

		// Lowered: nothing more starts until the running ones are under it.
		require.NoError(t, b.setQueueLimit(storage.QueueLimit{Queue: "q.work", Concurrency: 1}))
		b.complete(ids[1])
		require.Empty(t, b.claimAll())
		b.complete(ids[2])
		require.Equal(t, []string{ids[3]}, b.claimAll())

		// Raised, then cleared: the held ones are released.
		require.NoError(t, b.setQueueLimit(storage.QueueLimit{Queue: "q.work", Concurrency: 2}))
		require.Equal(t, []string{ids[4]}, b.claimAll())
		require.NoError(t, b.setQueueLimit(storage.QueueLimit{Queue: "q.work"}))
		require.Equal(t, []string{more[0]}, b.claimAll())
	},
	"DelayedStepTakesItsSlotWhenDue": func(t *testing.T, h *Harness) {
		// A step that waits for a time of its own holds no slot of its
		// queue's limit or of its key's until then, so a step due now
		// runs; when its time comes it takes a free slot or is held.
		for _, tc := range []struct {
			name  string
			limit func(b *limitBundle)
			step  func() storage.CreateParams
		}{
			{"queue", func(b *limitBundle) {
				require.NoError(b.t, b.setQueueLimit(storage.QueueLimit{Queue: "q.work", Concurrency: 1}))
			}, func() storage.CreateParams { return keyed("", 0, 0) }},
			{"step key", func(*limitBundle) {}, func() storage.CreateParams { return keyed("a", 0, 1) }},
		} {
			t.Run(tc.name, func(t *testing.T) {
				b := h.setupLimits(t)
				tc.limit(b)
				due := b.now().Add(time.Hour)
				late := b.createKeyed(delayedBy(tc.step(), due))
				ids := b.createKeyed(tc.step(), tc.step())
				require.Equal(t, ids[:1], b.claimAll(), "a delayed step held back one due now")
				require.True(t, b.held(ids[1]))

				b.clock.Advance(time.Hour)
				require.Empty(t, b.claimAll(), "the delayed step took a slot that was not free")
				require.True(t, b.held(late[0]))
				// Held steps go in creation order, as ever.
				b.complete(ids[0])
				require.Equal(t, late, b.claimAll())
				b.complete(late[0])
				require.Equal(t, ids[1:], b.claimAll())
			})
		}
	},
	"QueueRateSpacesStarts": func(t *testing.T, h *Harness) {
		b := h.setupLimits(t)
		ids := b.twoASecond(3)
		require.Equal(t, ids[:1], b.claimAll())
		wake, err := b.store.NextWake(b.ctx, storage.ClaimParams{})
		require.NoError(t, err)
		require.Equal(t, b.now().Add(500*time.Millisecond), wake.UTC())
		b.clock.Advance(500 * time.Millisecond)
		require.Equal(t, ids[1:2], b.claimAll())
		require.Empty(t, b.claimAll())
		b.clock.Advance(500 * time.Millisecond)
		require.Equal(t, ids[2:], b.claimAll())
		// Cleared: steps spaced out by the rate start at once.
		later := b.createKeyed(keyed("", 0, 0), keyed("", 0, 0))
		require.Empty(t, b.claimAll())
		require.NoError(t, b.setQueueLimit(storage.QueueLimit{Queue: "q.work"}))
		require.Equal(t, later, b.claimAll())
	},
	"QueueRateAfterAnIdleSpellStartsFromNow": func(t *testing.T, h *Harness) {
		b := h.setupLimits(t)
		ids := b.twoASecond(4)
		// No worker for 1.5 s: the slots of the first three passed. The
		// first claim starts one, and the others keep the rate's interval
		// from it rather than starting together.
		b.clock.Advance(1500 * time.Millisecond)
		require.Equal(t, ids[:1], b.claimAll())
		require.Empty(t, b.claimAll(), "a step whose slot passed while no worker ran started with the first")
		wake, err := b.store.NextWake(b.ctx, storage.ClaimParams{})
		require.NoError(t, err)
		require.Equal(t, b.now().Add(500*time.Millisecond), wake.UTC())
		b.clock.Advance(500 * time.Millisecond)
		require.Equal(t, ids[1:2], b.claimAll())
		// A claim that comes late while the queue is busy keeps the slots:
		// the next start catches up, so the rate holds on average.
		b.clock.Advance(700 * time.Millisecond)
		require.Equal(t, ids[2:3], b.claimAll())
		b.clock.Advance(300 * time.Millisecond)
		require.Equal(t, ids[3:], b.claimAll())
	},
	"QueueRateAfterAnIdleSpellSpacesReadySteps": func(t *testing.T, h *Harness) {
		b := h.setupLimits(t)
		require.NoError(t, b.setQueueLimit(storage.QueueLimit{Queue: "q.work", Rate: 2, Per: time.Second}))
		// Started a second apart with no worker: each is ready at once,
		// its slot its own start. The first claim takes one, and the
		// others keep the rate's interval from it.
		var ids []string
		for range 3 {
			ids = append(ids, b.createKeyed(keyed("", 0, 0))...)
			b.clock.Advance(time.Second)
		}
		b.startTwoASecond(ids, "ready steps of an idle queue started together")
	},
	"QueueRateAfterAnIdleSpellStartsDelayedStepsFromNow": func(t *testing.T, h *Harness) {
		b := h.setupLimits(t)
		require.NoError(t, b.setQueueLimit(storage.QueueLimit{Queue: "q.work", Rate: 2, Per: time.Second}))
		at := b.now().Add(500 * time.Millisecond)
		ids := b.createKeyed(delayedBy(keyed("", 0, 0), at), delayedBy(keyed("", 0, 0), at), delayedBy(keyed("", 0, 0), at))
		// Their time came 1.5 s before any claim: each takes its slot of
		// the rate from the first claim's time, not from its own.
		b.clock.Advance(2 * time.Second)
		b.startTwoASecond(ids, "steps whose time came while no worker ran started together")
	},
	"QueueRateRespacesAnIdleQueueOnceUntilAStart": func(t *testing.T, h *Harness) {
		// An idle queue's late steps are given slots from the first claim
		// after the spell, once: until one of them starts, later claims
		// keep those slots. A claimer that can take only the third (a
		// following start, bound to its instance) takes it at its slot,
		// while the two before it wait for a worker that takes them; a
		// new respace at each of its claims pushed its slot on for ever.
		b := h.setupLimits(t)
		ids := b.twoASecond(3)
		ours := storage.ClaimParams{InstanceID: ids[2], Limit: 10}
		b.clock.Advance(2 * time.Second)
		require.Empty(t, b.claim(ours), "its slot is the third from now")
		b.clock.Advance(500 * time.Millisecond)
		require.Empty(t, b.claim(ours), "its slot is the third from the spell's end")
		b.clock.Advance(500 * time.Millisecond)
		got := b.claim(ours)
		require.Len(t, got, 1, "the step started at its slot")
		require.Equal(t, ids[2], got[0].InstanceID)
		// The two before it start when a worker that may take them comes,
		// spaced again: the queue was idle since the last start.
		b.clock.Advance(2 * time.Second)
		require.Equal(t, ids[:1], b.claimAll())
		b.clock.Advance(500 * time.Millisecond)
		require.Equal(t, ids[1:2], b.claimAll())
	},
	"QueueRateSlotsStepsWhenTheyFallDue": func(t *testing.T, h *Harness) {
		b := h.setupLimits(t)
		require.NoError(t, b.setQueueLimit(storage.QueueLimit{Queue: "q.work", Rate: 2, Per: time.Second}))
		late0 := b.now().Add(time.Hour)
		late := b.createKeyed(delayedBy(keyed("", 0, 0), late0))
		ids := b.createKeyed(keyed("", 0, 0), keyed("", 0, 0))
		// A step an hour away does not hold back the ones due now.
		require.Equal(t, ids[:1], b.claimAll())
		b.clock.Advance(500 * time.Millisecond)
		require.Equal(t, ids[1:], b.claimAll())
		// Nor does a snooze.
		b.finishKeyed(b.runningClaim(ids[0]), storage.OutcomeCompleted)
		snoozed := b.runningClaim(ids[1])
		_, err := b.store.FinishSteps(b.ctx, []storage.StepResult{{Claim: snoozed, Outcome: storage.OutcomeSnooze,
			RunAfter: b.now().Add(30 * time.Minute)}}, KeyPlan)
		require.NoError(t, err)
		now := b.createKeyed(keyed("", 0, 0))
		b.clock.Advance(500 * time.Millisecond)
		require.Equal(t, now, b.claimAll())
		b.complete(now[0])

		// Each takes its slot when its time comes, and a step made ready
		// just after it waits for the rate's next start.
		b.clock.Advance(30 * time.Minute)
		require.Equal(t, ids[1:], b.claimAll(), "the snoozed step, once due")
		b.complete(ids[1])
		b.clock.Advance(late0.Sub(b.now()) - time.Millisecond)
		require.Empty(t, b.claimAll(), "the delayed step started before its time")
		b.clock.Advance(time.Millisecond)
		require.Equal(t, late, b.claimAll(), "the delayed step, once its hour is up")
		ready := b.createKeyed(keyed("", 0, 0))
		require.Empty(t, b.claimAll(), "the delayed step took the rate's slot")
		b.clock.Advance(500 * time.Millisecond)
		require.Equal(t, ready, b.claimAll())
	},
	"QueueRateChangedOrClearedKeepsDelays": func(t *testing.T, h *Harness) {
		b := h.setupLimits(t)
		hour := b.now().Add(time.Hour)
		// Made ready before the queue had a limit, and after.
		late := b.createKeyed(delayedBy(keyed("", 0, 0), hour))
		require.NoError(t, b.setQueueLimit(storage.QueueLimit{Queue: "q.work", Rate: 1, Per: time.Second}))
		late = append(late, b.createKeyed(delayedBy(keyed("", 0, 0), hour))...)
		ids := b.createKeyed(keyed("", 0, 0), keyed("", 0, 0), keyed("", 0, 0))
		require.Equal(t, ids[:1], b.claimAll())

		// A faster rate respaces the steps due now, from now; the delayed
		// ones keep their hour.
		require.NoError(t, b.setQueueLimit(storage.QueueLimit{Queue: "q.work", Rate: 4, Per: time.Second}))
		require.Equal(t, ids[1:2], b.claimAll())
		b.clock.Advance(250 * time.Millisecond)
		require.Equal(t, ids[2:], b.claimAll())

		// Cleared: the spaced steps start at once, the delayed ones when
		// their time comes.
		more := b.createKeyed(keyed("", 0, 0), keyed("", 0, 0))
		require.Empty(t, b.claimAll())
		require.NoError(t, b.setQueueLimit(storage.QueueLimit{Queue: "q.work"}))
		require.Equal(t, more, b.claimAll())
		b.clock.Advance(59 * time.Minute)
		require.Empty(t, b.claimAll(), "a delayed step started before its time")
		b.clock.Advance(time.Minute)
		require.ElementsMatch(t, late, b.claimAll())
	},
	"QueueRateSetLaterSpacesReadySteps": func(t *testing.T, h *Harness) {
		b := h.setupLimits(t)
		var ids []string
		for range 3 {
			ids = append(ids, b.createKeyed(keyed("", 0, 0))...)
		}
		require.NoError(t, b.setQueueLimit(storage.QueueLimit{Queue: "q.work", Rate: 10, Per: 10 * time.Second}))
		require.Equal(t, ids[:1], b.claimAll())
		b.clock.Advance(time.Second)
		require.Equal(t, ids[1:2], b.claimAll())
	},
	"Queues": func(t *testing.T, h *Harness) {
		b := h.setupLimits(t)
		require.NoError(t, b.setQueueLimit(storage.QueueLimit{Queue: "q.work", Concurrency: 1, Rate: 5, Per: time.Minute}))
		require.NoError(t, b.setQueueLimit(storage.QueueLimit{Queue: "idle", Concurrency: 3}))
		b.createKeyed(keyed("", 0, 0), keyed("", 0, 0))
		require.Len(t, b.claimAll(), 1)
		b.clock.Advance(2 * time.Second)
		qs, err := b.store.Queues(b.ctx)
		require.NoError(t, err)
		require.Equal(t, []storage.QueueInfo{
			{QueueLimit: storage.QueueLimit{Queue: "idle", Concurrency: 3}},
			{QueueLimit: storage.QueueLimit{Queue: "q.work", Concurrency: 1, Rate: 5, Per: time.Minute},
				Ready: 1, Held: 1, Running: 1, OldestWait: 2 * time.Second},
		}, qs)
	},
	"QueuesCountScheduledSteps": func(t *testing.T, h *Harness) {
		// Steps a rate spaced out, delayed starts and retries waiting out
		// their backoff are pending but not due: a queue shows them as
		// scheduled, apart from its depth, until their time comes.
		b := h.setupLimits(t)
		limit := storage.QueueLimit{Queue: "q.work", Rate: 1, Per: 10 * time.Second}
		require.NoError(t, b.setQueueLimit(limit))
		queues := func() []storage.QueueInfo {
			t.Helper()
			qs, err := b.store.Queues(b.ctx)
			require.NoError(t, err)
			return qs
		}
		var ids []string
		for range 5 {
			ids = append(ids, b.createKeyed(keyed("", 0, 0))...)
		}
		hour := b.now().Add(time.Hour)
		b.createKeyed(delayedBy(keyed("", 0, 0), hour))
		later := b.createKeyed(delayedBy(params(spec("later")), hour))
		require.Equal(t, []storage.QueueInfo{
			{QueueLimit: storage.QueueLimit{Queue: "q.later"}, Scheduled: 1},
			{QueueLimit: limit, Ready: 1, Scheduled: 5},
		}, queues(), "a queue with only scheduled steps is listed")

		require.Equal(t, ids[:1], b.claimAll())
		b.clock.Advance(10 * time.Second)
		require.Equal(t, []storage.QueueInfo{
			{QueueLimit: storage.QueueLimit{Queue: "q.later"}, Scheduled: 1},
			{QueueLimit: limit, Ready: 1, Running: 1, Scheduled: 4, OldestWait: 10 * time.Second},
		}, queues(), "a spaced step, once due, is ready")

		b.clock.Advance(time.Hour)
		require.Equal(t, []storage.QueueInfo{
			{QueueLimit: storage.QueueLimit{Queue: "q.later"}, Ready: 1, OldestWait: time.Hour + 10*time.Second},
			{QueueLimit: limit, Ready: 5, Running: 1, OldestWait: time.Hour + 10*time.Second},
		}, queues(), "every step is due: none is scheduled")

		// A retry waits out its backoff.
		got := b.claim(storage.ClaimParams{InstanceID: later[0], Limit: 1, Lease: time.Minute})
		require.Len(t, got, 1)
		_, err := b.store.FinishSteps(b.ctx, []storage.StepResult{{Claim: got[0].Claim, Outcome: storage.OutcomeRetry,
			Error: "boom", RunAfter: b.now().Add(time.Minute)}}, KeyPlan)
		require.NoError(t, err)
		require.Equal(t, storage.QueueInfo{QueueLimit: storage.QueueLimit{Queue: "q.later"}, Scheduled: 1}, queues()[0])
		b.clock.Advance(time.Minute)
		require.Equal(t, storage.QueueInfo{QueueLimit: storage.QueueLimit{Queue: "q.later"}, Ready: 1, OldestWait: time.Minute}, queues()[0])
	},
	"QueueLimitChangeKeepsWhatItDoesNotName": func(t *testing.T, h *Harness) {
		b := h.setupLimits(t)
		require.NoError(t, b.setQueueLimit(storage.QueueLimit{Queue: "q.work", Concurrency: 2, Rate: 5, Per: time.Minute}))
		three, none := 3, storage.QueueRate{}
		got, err := b.store.SetQueueLimit(b.ctx, storage.QueueLimitChange{Queue: "q.work", Concurrency: &three})
		require.NoError(t, err)
		require.Equal(t, storage.QueueLimit{Queue: "q.work", Concurrency: 3, Rate: 5, Per: time.Minute}, got)
		got, err = b.store.SetQueueLimit(b.ctx, storage.QueueLimitChange{Queue: "q.work", Rate: &none})
		require.NoError(t, err)
		require.Equal(t, storage.QueueLimit{Queue: "q.work", Concurrency: 3}, got)
		qs, err := b.store.Queues(b.ctx)
		require.NoError(t, err)
		require.Equal(t, []storage.QueueInfo{{QueueLimit: got}}, qs)

		bad := -1
		_, err = b.store.SetQueueLimit(b.ctx, storage.QueueLimitChange{Queue: "q.work", Concurrency: &bad})
		require.ErrorContains(t, err, "concurrency -1 is out of range")
		require.Equal(t, 1, strings.Count(err.Error(), "set queue limit"), "one line naming the operation once: %v", err)
		qs, err = b.store.Queues(b.ctx)
		require.NoError(t, err)
		require.Equal(t, []storage.QueueInfo{{QueueLimit: got}}, qs, "a refused change writes nothing")
	},
	"QueueLimitChangesMadeAtOnceBothHold": func(t *testing.T, h *Harness) {
		b := h.setupLimits(t)
		for i := 1; i <= 10; i++ {
			require.NoError(t, b.setQueueLimit(storage.QueueLimit{Queue: "q.work"}))
			concurrency, rate := i, storage.QueueRate{Rate: i, Per: time.Second}
			var (
				wg   sync.WaitGroup
				errs [2]error
			)
			wg.Go(func() {
				_, errs[0] = b.store.SetQueueLimit(b.ctx, storage.QueueLimitChange{Queue: "q.work", Concurrency: &concurrency})
			})
			wg.Go(func() {
				_, errs[1] = b.store.SetQueueLimit(b.ctx, storage.QueueLimitChange{Queue: "q.work", Rate: &rate})
			})
			wg.Wait()
			require.NoError(t, errs[0])
			require.NoError(t, errs[1])
			qs, err := b.store.Queues(b.ctx)
			require.NoError(t, err)
			require.Equal(t, []storage.QueueInfo{{QueueLimit: storage.QueueLimit{Queue: "q.work", Concurrency: i, Rate: i, Per: time.Second}}}, qs, "round %d", i)
		}
	},
	"SetQueueLimitRefusesBadLimits": func(t *testing.T, h *Harness) {
		b := h.setupLimits(t)
		for _, l := range []storage.QueueLimit{
			{Queue: "q", Concurrency: -1},
			{Queue: "q", Rate: 1},
			{Queue: "", Concurrency: 1},
			{Queue: "q\x00", Concurrency: 1},
			{Queue: "q", Rate: storage.MaxQueueLimit + 1, Per: time.Hour},
		} {
			require.Error(t, b.setQueueLimit(l), "%+v", l)
		}
		qs, err := b.store.Queues(b.ctx)
		require.NoError(t, err)
		require.Empty(t, qs)
	},
	"AdmittedInstanceStepsRespectTheirQueue": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		require.NoError(t, b.setQueueLimit(storage.QueueLimit{Queue: "shared", Concurrency: 1}))
		x, y := spec("x"), spec("y")
		x.Queue, y.Queue = "shared", "shared"
		var ids []string
		for range 2 {
			p := params(x, y)
			p.ConcurrencyKey, p.ConcurrencyLimit = "k", 1
			b.create(p)
			ids = append(ids, p.ID)
		}
		run := func(want string) {
			t.Helper()
			cs := b.claim(storage.ClaimParams{})
			require.Len(t, cs, 1, "one step of the queue at a time")
			require.Equal(t, want, cs[0].InstanceID)
			require.Equal(t, []storage.FinishResult{{Accepted: true}}, b.finish(completed(cs[0].Claim, "1")))
		}
		run(ids[0])
		run(ids[0])
		require.Equal(t, storage.InstanceCompleted, b.get(ids[0]).Status)
		// The second instance is admitted with two ready steps, and its
		// queue still lets one run at a time.
		run(ids[1])
		run(ids[1])
		require.Equal(t, storage.InstanceCompleted, b.get(ids[1]).Status)
	},
	"HeldWorkGoesByPriority": func(t *testing.T, h *Harness) {
		// Held instances and steps are released as ready steps are
		// claimed: highest priority first, then oldest.
		for _, tc := range oneSlotLimits() {
			t.Run(tc.name, func(t *testing.T) {
				b := h.setupLimits(t)
				tc.limit(b)
				var ids []string
				for _, priority := range []int{0, 0, 5, -3, 5} {
					p := tc.make()
					p.Priority = priority
					ids = append(ids, b.createKeyed(p)...)
				}
				running := b.claimAll()
				require.Equal(t, ids[:1], running, "one at a time")
				for _, next := range []string{ids[2], ids[4], ids[1], ids[3]} {
					require.True(t, b.held(next))
					b.complete(running[0])
					running = b.claimAll()
					require.Equal(t, []string{next}, running, "the held one of the highest priority goes next, the oldest of it first")
				}
			})
		}
	},
	"DelayedWorkDueTogetherGoesByPriority": func(t *testing.T, h *Harness) {
		// Delayed work that falls due at once, while a slot is free, takes
		// it in claim order (highest priority, then earliest, then
		// oldest), not in the order it was created.
		for _, tc := range oneSlotLimits() {
			t.Run(tc.name, func(t *testing.T) {
				b := h.setupLimits(t)
				tc.limit(b)
				due := b.now().Add(time.Minute)
				var ids []string
				for _, priority := range []int{0, 0, 9, 5} {
					p := delayedBy(tc.make(), due)
					p.Priority = priority
					ids = append(ids, b.createKeyed(p)...)
				}
				b.clock.Advance(time.Hour)
				running := b.claimAll()
				require.Equal(t, ids[2:3], running, "the highest priority takes the free slot")
				for _, next := range []string{ids[3], ids[0], ids[1]} {
					require.True(t, b.held(next))
					b.complete(running[0])
					running = b.claimAll()
					require.Equal(t, []string{next}, running, "the held one of the highest priority goes next, the oldest of it first")
				}
			})
		}
	},
	"QueueLimitChangesGoByPriority": func(t *testing.T, h *Harness) {
		// A lowered limit holds the steps a release would take last; a
		// raised one releases those it would take first.
		b := h.setupLimits(t)
		var ids []string
		for _, priority := range []int{0, 3, 5} {
			p := keyed("", 0, 0)
			p.Priority = priority
			ids = append(ids, b.createKeyed(p)...)
		}
		require.NoError(t, b.setQueueLimit(storage.QueueLimit{Queue: "q.work", Concurrency: 1}))
		require.True(t, b.held(ids[0]))
		require.True(t, b.held(ids[1]))
		require.Equal(t, ids[2:], b.claimAll(), "the highest priority keeps its slot")
		require.NoError(t, b.setQueueLimit(storage.QueueLimit{Queue: "q.work", Concurrency: 2}))
		require.Equal(t, ids[1:2], b.claimAll(), "the raised limit releases the higher priority")
		require.True(t, b.held(ids[0]))
	},
	"ConcurrentClaimersNeverExceedAStepKey": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		b.concurrentClaimers(func(i int) storage.CreateParams { return keyed(fmt.Sprint(i%3), 0, 2) }, 2)
	},
	"ConcurrentClaimersNeverExceedAnInstanceKey": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		b.concurrentClaimers(func(i int) storage.CreateParams { return keyed(fmt.Sprint(i%3), 2, 0) }, 2)
	},
	"ConcurrentClaimersNeverExceedAQueueLimit": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		require.NoError(t, b.setQueueLimit(storage.QueueLimit{Queue: "q.work", Concurrency: 3}))
		b.concurrentClaimers(func(i int) storage.CreateParams { return keyed("", 0, 0) }, 3)
	},
}

// concurrentClaimers creates instances from many goroutines while as many
// claim and finish steps, each claimer checking after every claim, in one
// snapshot of the store, that no key (the input's "key"; the queue when
// all share "") has more than limit steps running.
func (b *bundle) concurrentClaimers(p func(i int) storage.CreateParams, limit int) {
	t := b.t
	const (
		workers   = 8
		instances = 48
	)
	keyOf := map[string]string{}
	all := make([]storage.CreateParams, instances)
	for i := range all {
		all[i] = p(i)
		var in struct{ Key string }
		require.NoError(t, json.Unmarshal(all[i].Input, &in))
		keyOf[all[i].ID] = in.Key
	}
	var (
		mu   sync.Mutex
		peak int
		done int
		wg   sync.WaitGroup
		errs = make(chan error, 2*workers)
	)
	runningPerKey := func() (int, error) {
		in, err := b.store.ListInstances(b.ctx, storage.ListParams{Status: storage.InstanceRunning, Limit: 1000})
		if err != nil {
			return 0, err
		}
		counts, most := map[string]int{}, 0
		for _, i := range in {
			for _, s := range i.Steps {
				if s.Status == storage.StepRunning {
					counts[keyOf[i.ID]]++
					most = max(most, counts[keyOf[i.ID]])
				}
			}
		}
		return most, nil
	}
	for w := range workers {
		wg.Add(2)
		go func() { // a creator
			defer wg.Done()
			for i := w; i < instances; i += workers {
				if _, err := b.store.CreateInstances(b.ctx, nil, all[i:i+1], KeyPlan); err != nil {
					errs <- err
					return
				}
			}
		}()
		go func() { // a claimer
			defer wg.Done()
			deadline := time.Now().Add(time.Minute)
			for time.Now().Before(deadline) {
				mu.Lock()
				finished := done == instances
				mu.Unlock()
				if finished {
					return
				}
				cs, err := b.store.ClaimSteps(b.ctx, storage.ClaimParams{WorkerID: fmt.Sprint("w", w), Limit: 2, Lease: time.Minute})
				if err != nil {
					errs <- err
					return
				}
				most, err := runningPerKey()
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				peak = max(peak, most)
				mu.Unlock()
				var rs []storage.StepResult
				for _, c := range cs {
					rs = append(rs, completed(c.Claim, "1"))
				}
				if len(rs) > 0 {
					if _, err := b.store.FinishSteps(b.ctx, rs, KeyPlan); err != nil {
						errs <- err
						return
					}
					mu.Lock()
					done += len(rs)
					mu.Unlock()
				}
			}
			errs <- fmt.Errorf("claimer %d: not all instances finished within a minute", w)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.LessOrEqual(t, peak, limit, "steps of one key ran at once")
	require.Positive(t, peak)
	require.Equal(t, instances, done)
	in, err := b.store.ListInstances(b.ctx, storage.ListParams{Status: storage.InstanceCompleted, Limit: 1000})
	require.NoError(t, err)
	require.Len(t, in, instances)
}
