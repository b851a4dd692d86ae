package storagetest

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
)

// op returns the store as a storage.Operator.
func (b *bundle) op() storage.Operator {
	b.t.Helper()
	o, ok := b.store.(storage.Operator)
	require.True(b.t, ok, "the store implements storage.Operator")
	return o
}

// byHand is a context whose operations are done by "alice".
func (b *bundle) byHand() *bundle {
	c := *b
	c.ctx = storage.WithActor(b.ctx, "alice")
	return &c
}

func (b *bundle) fail(id, name string) {
	b.t.Helper()
	c := b.claimStep(id, name)
	b.finish(storage.StepResult{Claim: c.Claim, Outcome: storage.OutcomeFailed, Error: "boom"})
}

// claimable reports whether any step of instance id can be claimed now,
// without claiming it: the claim is released at once.
func (b *bundle) claimable(id string) bool {
	b.t.Helper()
	got := b.claim(storage.ClaimParams{InstanceID: id})
	if len(got) == 0 {
		return false
	}
	claims := make([]storage.Claim, len(got))
	for i, c := range got {
		claims[i] = c.Claim
	}
	require.NoError(b.t, b.store.ReleaseSteps(b.ctx, claims))
	return true
}

// actorEvents returns the events of in done by actor.
func actorEvents(in *storage.Instance, actor string) []storage.Event {
	var out []storage.Event
	for _, e := range in.Events {
		if e.Actor == actor {
			out = append(out, e)
		}
	}
	return out
}

var operationTests = map[string]func(*testing.T, *Harness){
	"RetryFromResetsTheStepAndItsDependents": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createOne(spec("a"), spec("b", "a"), spec("c", "b"), spec("d", "a"))
		for _, n := range []string{"a", "b", "c", "d"} {
			b.complete(id, n, fmt.Sprintf(`"%s1"`, n))
		}
		require.Equal(t, storage.InstanceCompleted, b.get(id).Status)
		b.clock.Advance(time.Minute)

		require.NoError(t, b.byHand().op().RetryFrom(b.byHand().ctx, id, "b", Plan))
		in := b.get(id)
		require.Equal(t, storage.InstanceRunning, in.Status)
		require.Nil(t, in.Output)
		require.Nil(t, in.FinishedAt)
		for _, n := range []string{"a", "d"} {
			s := step(t, in, n)
			require.Equal(t, storage.StepCompleted, s.Status, n)
			require.JSONEq(t, fmt.Sprintf(`"%s1"`, n), string(s.Output), "%s keeps its output", n)
		}
		bs := step(t, in, "b")
		require.Equal(t, storage.StepPending, bs.Status)
		require.Zero(t, bs.Attempts)
		require.Nil(t, bs.Output)
		require.JSONEq(t, string(stepInput(t, "b", map[string]string{"a": `"a1"`})), string(bs.Input))
		cs := step(t, in, "c")
		require.Equal(t, storage.StepBlocked, cs.Status)
		require.Nil(t, cs.Output)
		require.Zero(t, cs.Attempts)
		ev := events(in, "", storage.EventInstanceRetried)
		require.Len(t, ev, 1)
		require.Equal(t, "from b", ev[0].Message)
		require.Equal(t, "alice", ev[0].Actor)
		for _, e := range actorEvents(in, "alice") {
			require.True(t, e.At.Equal(b.now()), "only the retry's events carry its actor: %+v", e)
		}

		c := b.claimStep(id, "b")
		require.Equal(t, 1, c.Attempt, "fresh attempts")
		require.Equal(t, []storage.FinishResult{{Accepted: true}}, b.finish(completed(c.Claim, `"b2"`)))
		b.complete(id, "c", `"c2"`)
		in = b.get(id)
		require.Equal(t, storage.InstanceCompleted, in.Status)
		require.JSONEq(t, `"c2"`, string(step(t, in, "c").Output))
	},

	"RetryFromReArmsOtherFailedAndCancelledSteps": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createOne(spec("x"), spec("y", "x"), spec("z"), spec("w"))
		b.complete(id, "w", `1`)
		b.fail(id, "x")
		in := b.get(id)
		require.Equal(t, storage.InstanceFailed, in.Status)
		require.Equal(t, storage.StepCancelled, step(t, in, "z").Status)

		require.NoError(t, b.op().RetryFrom(b.ctx, id, "w", Plan))
		in = b.get(id)
		require.Equal(t, storage.InstanceRunning, in.Status)
		for name, want := range map[string]storage.StepStatus{"w": storage.StepPending, "x": storage.StepPending, "y": storage.StepBlocked, "z": storage.StepPending} {
			require.Equal(t, want, step(t, in, name).Status, name)
		}
		require.Empty(t, step(t, in, "x").Error)
	},

	"RetryFromNeverClaimedInstanceIsPendingAgain": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		p := params(spec("a"), spec("b", "a"))
		p.Timeout = time.Hour
		b.create(p)
		require.NoError(t, b.store.CancelInstance(b.ctx, p.ID, "not now", Plan))

		b.clock.Advance(time.Minute)
		require.NoError(t, b.op().RetryFrom(b.ctx, p.ID, "a", Plan))
		in := b.get(p.ID)
		require.Equal(t, "from a", events(in, "", storage.EventInstanceRetried)[0].Message)
		require.Equal(t, storage.StepPending, step(t, in, "a").Status)
		b.requireStartsAtClaim(p.ID, "a")
	},

	"RetryFromStartedInstanceIsRunningAgain": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createOne(spec("a"), spec("b", "a"))
		b.claimStep(id, "a")
		require.NoError(t, b.store.CancelInstance(b.ctx, id, "stop", Plan))
		startedAt := b.get(id).StartedAt
		require.NotNil(t, startedAt)

		b.clock.Advance(time.Minute)
		require.NoError(t, b.op().RetryFrom(b.ctx, id, "a", Plan))
		in := b.get(id)
		require.Equal(t, storage.InstanceRunning, in.Status, "it had started")
		require.True(t, in.StartedAt.Equal(*startedAt), "it keeps its start")
		b.requireExactCounts("a retry from a step of a started instance")
	},

	"RetryFromRefusals": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createOne(spec("a"), spec("b", "a"))
		err := b.op().RetryFrom(b.ctx, id, "a", Plan)
		require.ErrorIs(t, err, storage.ErrConflict, "a pending instance")
		require.ErrorContains(t, err, "cancel it first or wait")
		b.claimStep(id, "a")
		require.ErrorIs(t, b.op().RetryFrom(b.ctx, id, "a", Plan), storage.ErrConflict, "a running instance")
		require.Equal(t, storage.StepRunning, b.status(id, "a"), "a refusal changes nothing")

		require.NoError(t, b.store.CancelInstance(b.ctx, id, "x", Plan))
		err = b.op().RetryFrom(b.ctx, id, "nope", Plan)
		require.ErrorIs(t, err, storage.ErrNotFound)
		require.ErrorContains(t, err, `no step "nope" (its steps: a, b)`)
		require.Equal(t, storage.InstanceCancelled, b.get(id).Status)
		require.ErrorIs(t, b.op().RetryFrom(b.ctx, "no-such-instance", "a", Plan), storage.ErrNotFound)
	},

	"RetryFromAForEachStepClearsItsItems": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createItems(3, eachSpec("each"), spec("after", "each"))
		var rs []storage.StepResult
		for _, c := range b.claimItems(id, "each", 10) {
			rs = append(rs, completed(c.Claim, itemOutput(c)))
		}
		b.finishItems(rs...)
		c := b.claimStep(id, "after")
		b.finishItems(completed(c.Claim, `1`))
		require.Equal(t, storage.InstanceCompleted, b.get(id).Status)

		require.NoError(t, b.op().RetryFrom(b.ctx, id, "each", ItemsPlan))
		in := b.get(id)
		require.Equal(t, storage.StepRunning, step(t, in, "each").Status, "expanded again")
		require.Nil(t, step(t, in, "each").Output)
		require.Equal(t, storage.StepBlocked, step(t, in, "after").Status)
		items := b.items(id, "each")
		require.Len(t, items, 3, "the old items are gone, new ones made")
		for _, it := range items {
			require.Equal(t, storage.StepPending, it.Status)
			require.Zero(t, it.Attempts)
			require.Nil(t, it.Output)
		}
		got := b.claimItems(id, "each", 10)
		require.Len(t, got, 3)
		require.Equal(t, 1, got[0].Attempt)
	},

	"RetryFromAWaitStepWaitsForANewSignal": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createOne(waitSpec("await-ok", "ok", 0), spec("ship", "await-ok"))
		b.mustSignal(storage.SignalParams{InstanceID: id, Name: "ok", Payload: json.RawMessage(`1`)})
		b.complete(id, "ship", `1`)
		require.Equal(t, storage.InstanceCompleted, b.get(id).Status)

		require.NoError(t, b.op().RetryFrom(b.ctx, id, "await-ok", Plan))
		require.Equal(t, storage.StepWaiting, b.status(id, "await-ok"))
		res := b.mustSignal(storage.SignalParams{InstanceID: id, Name: "ok", Payload: json.RawMessage(`2`)})
		require.True(t, res.Delivered)
		in := b.get(id)
		require.JSONEq(t, `2`, string(step(t, in, "await-ok").Output))
		require.Equal(t, storage.StepPending, step(t, in, "ship").Status)
	},

	"SkipCompletesAStepAndItsDependentsProceed": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createOne(spec("a"), spec("b", "a"), spec("c", "b"))
		hb := b.byHand()
		require.NoError(t, hb.op().SkipStep(hb.ctx, id, "b", json.RawMessage(`{"by":"hand"}`), Plan), "a blocked step")
		in := b.get(id)
		bs := step(t, in, "b")
		require.Equal(t, storage.StepCompleted, bs.Status)
		require.JSONEq(t, `{"by":"hand"}`, string(bs.Output))
		ev := events(in, "b", storage.EventStepCompleted)
		require.Len(t, ev, 1)
		require.Equal(t, storage.SkippedByHand, ev[0].Message)
		require.Equal(t, "alice", ev[0].Actor)
		require.Equal(t, storage.StepPending, step(t, in, "c").Status, "its dependent proceeds")
		require.JSONEq(t, string(stepInput(t, "c", map[string]string{"b": `{"by":"hand"}`})), string(step(t, in, "c").Input))

		require.NoError(t, b.op().SkipStep(b.ctx, id, "a", nil, Plan), "a pending step")
		require.JSONEq(t, `null`, string(step(t, b.get(id), "a").Output))
		require.False(t, b.claimable(id) && b.status(id, "a") != storage.StepCompleted)
		b.complete(id, "c", `1`)
		require.Equal(t, storage.InstanceCompleted, b.get(id).Status)
	},

	"SkipRefusals": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createOne(spec("a"), spec("b", "a"), spec("c"))
		b.complete(id, "a", `1`)
		b.claimStep(id, "b")
		for _, name := range []string{"a", "b"} {
			err := b.op().SkipStep(b.ctx, id, name, nil, Plan)
			require.ErrorIs(t, err, storage.ErrConflict, name)
			require.ErrorContains(t, err, "only a blocked, pending, waiting, failed or cancelled step can be skipped")
		}
		require.ErrorIs(t, b.op().SkipStep(b.ctx, id, "nope", nil, Plan), storage.ErrNotFound)
		require.ErrorIs(t, b.op().SkipStep(b.ctx, "no-such-instance", "a", nil, Plan), storage.ErrNotFound)
		require.NoError(t, b.store.CancelInstance(b.ctx, id, "x", Plan))
		err := b.op().SkipStep(b.ctx, id, "c", nil, Plan)
		require.ErrorIs(t, err, storage.ErrConflict, "a cancelled instance")
		require.Equal(t, storage.StepCancelled, b.status(id, "c"))
	},

	"SkipRepairsAFailedInstance": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createOne(spec("x"), spec("y", "x"), spec("z"))
		b.fail(id, "x")
		require.Equal(t, storage.InstanceFailed, b.get(id).Status)

		require.NoError(t, b.op().SkipStep(b.ctx, id, "x", json.RawMessage(`7`), Plan))
		in := b.get(id)
		require.Equal(t, storage.InstanceRunning, in.Status)
		require.Empty(t, in.Error)
		require.Equal(t, storage.StepCompleted, step(t, in, "x").Status)
		require.Empty(t, step(t, in, "x").Error)
		require.Equal(t, storage.StepPending, step(t, in, "y").Status)
		require.Equal(t, storage.StepPending, step(t, in, "z").Status, "the step the failure cancelled runs again")
		b.complete(id, "y", `1`)
		b.complete(id, "z", `1`)
		require.Equal(t, storage.InstanceCompleted, b.get(id).Status)
	},

	"SkipAFailedForEachStepDropsItsItems": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createItems(2, eachSpec("each"), spec("after", "each"))
		got := b.claimItems(id, "each", 10)
		b.finishItems(failedFor(got[0].Claim, "bad"), completed(got[1].Claim, `1`))
		require.Equal(t, storage.InstanceFailed, b.get(id).Status)
		require.NoError(t, b.op().SkipStep(b.ctx, id, "each", json.RawMessage(`[]`), ItemsPlan))
		require.Empty(t, b.items(id, "each"))
		require.Equal(t, storage.StepPending, b.status(id, "after"))
	},

	"PauseHoldsBackEveryClaimUntilResume": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createOne(spec("a"), spec("b", "a"), spec("c"), spec("r"))
		other := b.createOne(spec("a"))
		ca := b.claimStep(id, "a")
		cr := b.claimStep(id, "r")
		due := step(t, b.get(id), "c").RunAfter

		hb := b.byHand()
		require.NoError(t, hb.op().PauseInstance(hb.ctx, id))
		in := b.get(id)
		require.True(t, in.Paused)
		require.Equal(t, storage.InstanceRunning, in.Status, "the status is unchanged")
		require.True(t, step(t, in, "c").RunAfter.Equal(due), "shown due when it was")
		require.Equal(t, "alice", events(in, "", storage.EventInstancePaused)[0].Actor)
		require.False(t, b.claimable(id), "pending steps wait")
		require.True(t, b.claimable(other), "other instances are not held back")

		// The running steps finish; what they make ready, a retry and a
		// release wait too, for every claim path.
		if fc, ok := b.store.(storage.FinishClaimer); ok {
			_, claimed, err := fc.FinishAndClaim(b.ctx, []storage.StepResult{completed(ca.Claim, `1`)}, Plan,
				storage.ClaimParams{WorkerID: "w", InstanceID: id, Limit: 10, Lease: time.Minute})
			require.NoError(t, err)
			require.Empty(t, claimed, "an eager claim after a finish")
		} else {
			b.finish(completed(ca.Claim, `1`))
		}
		b.finish(storage.StepResult{Claim: cr.Claim, Outcome: storage.OutcomeRetry, Error: "again", Delay: time.Second})
		require.Equal(t, storage.StepPending, b.status(id, "b"))
		b.clock.Advance(time.Hour)
		require.False(t, b.claimable(id), "steps made ready and retried while paused wait")
		next, err := b.store.NextWake(b.ctx, storage.ClaimParams{})
		require.NoError(t, err)
		require.True(t, next.IsZero() || next.Before(b.now().Add(storage.MaxDelay)), "a worker does not sleep for the pause: %v", next)

		require.NoError(t, hb.op().ResumeInstance(hb.ctx, id))
		in = b.get(id)
		require.False(t, in.Paused)
		require.Equal(t, "alice", events(in, "", storage.EventInstanceResumed)[0].Actor)
		got := b.claim(storage.ClaimParams{InstanceID: id})
		names := map[string]bool{}
		for _, c := range got {
			names[c.Step] = true
		}
		require.Equal(t, map[string]bool{"b": true, "c": true, "r": true}, names)
	},

	"PauseKeepsAReadiedStepsPlace": func(t *testing.T, h *Harness) {
		// A step made ready while its instance is paused waits, and once
		// resumed is due from its instance's run_after like any other:
		// before the steps of an instance started later.
		b := h.setup(t)
		onQueue := func(s storage.StepSpec) storage.StepSpec { s.Queue = "q"; return s }
		id := b.createOne(onQueue(spec("a")), onQueue(spec("b", "a")))
		claimed := b.claim(storage.ClaimParams{Limit: 1})
		require.Len(t, claimed, 1)
		c := claimed[0]
		b.clock.Advance(time.Second)
		younger := b.createOne(onQueue(spec("a")))
		b.clock.Advance(time.Second)
		require.NoError(t, b.op().PauseInstance(b.ctx, id))
		b.finish(completed(c.Claim, `1`))
		b.clock.Advance(time.Second)
		require.NoError(t, b.op().ResumeInstance(b.ctx, id))
		in := b.get(id)
		require.True(t, step(t, in, "b").RunAfter.Equal(in.RunAfter), "due from its instance's run_after")
		var order []string
		for _, c := range b.claim(storage.ClaimParams{}) {
			order = append(order, c.InstanceID+"/"+c.Step)
		}
		require.Equal(t, []string{id + "/b", younger + "/a"}, order)
	},

	"PauseKeepsASleepingStepsTime": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createOne(spec("a"))
		c := b.claimStep(id, "a")
		wake := b.now().Add(time.Hour)
		b.finish(storage.StepResult{Claim: c.Claim, Outcome: storage.OutcomeSnooze, RunAfter: wake})
		require.NoError(t, b.op().PauseInstance(b.ctx, id))
		require.True(t, step(t, b.get(id), "a").RunAfter.Equal(wake), "shown as due at its wake time")
		require.NoError(t, b.op().ResumeInstance(b.ctx, id))
		require.True(t, step(t, b.get(id), "a").RunAfter.Equal(wake), "still asleep until then")
		require.False(t, b.claimable(id))
		b.clock.Advance(time.Hour)
		require.True(t, b.claimable(id))
	},

	"PauseHoldsBackItemsOfAForEachStep": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createItems(2, spec("first"), eachSpec("each", "first"))
		c := b.claimStep(id, "first")
		require.NoError(t, b.op().PauseInstance(b.ctx, id))
		b.finishItems(completed(c.Claim, `1`))
		require.Equal(t, storage.StepRunning, b.status(id, "each"), "expanded while paused")
		require.False(t, b.claimable(id), "its items wait")
		require.NoError(t, b.op().ResumeInstance(b.ctx, id))
		require.Len(t, b.claimItems(id, "each", 10), 2)
	},

	"PauseAndResumeRefusals": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		require.ErrorIs(t, b.op().PauseInstance(b.ctx, "no-such-instance"), storage.ErrNotFound)
		require.ErrorIs(t, b.op().ResumeInstance(b.ctx, "no-such-instance"), storage.ErrNotFound)
		id := b.createOne(spec("a"))
		err := b.op().ResumeInstance(b.ctx, id)
		require.ErrorIs(t, err, storage.ErrConflict)
		require.ErrorContains(t, err, "is not paused")
		require.NoError(t, b.op().PauseInstance(b.ctx, id))
		require.ErrorIs(t, b.op().PauseInstance(b.ctx, id), storage.ErrConflict)
		require.NoError(t, b.store.CancelInstance(b.ctx, id, "x", Plan))
		in := b.get(id)
		require.False(t, in.Paused, "a finished instance is not paused")
		err = b.op().PauseInstance(b.ctx, id)
		require.ErrorIs(t, err, storage.ErrConflict)
		require.ErrorContains(t, err, "already cancelled")
		require.ErrorIs(t, b.op().ResumeInstance(b.ctx, id), storage.ErrConflict)

		// A retry runs it unpaused.
		require.NoError(t, b.store.RetryInstance(b.ctx, id, Plan))
		require.False(t, b.get(id).Paused)
		require.True(t, b.claimable(id))
	},

	"CancelAndRetryRecordTheActor": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		hb := b.byHand()
		id := b.createOne(spec("a"))
		require.NoError(t, hb.store.CancelInstance(hb.ctx, id, "stop", Plan))
		in := b.get(id)
		require.Equal(t, "alice", events(in, "", storage.EventInstanceCancelled)[0].Actor)
		require.Equal(t, "alice", events(in, "a", storage.EventStepCancelled)[0].Actor)
		require.Empty(t, events(in, "", storage.EventInstanceCreated)[0].Actor, "earlier events keep no actor")
		require.NoError(t, b.store.RetryInstance(storage.WithActor(b.ctx, "cli"), id, Plan))
		in = b.get(id)
		require.Equal(t, "cli", events(in, "", storage.EventInstanceRetried)[0].Actor)
		require.Equal(t, "alice", events(in, "", storage.EventInstanceCancelled)[0].Actor)
		b.complete(id, "a", `1`)
		require.Empty(t, events(b.get(id), "a", storage.EventStepCompleted)[0].Actor, "the engine's own events have none")
	},

	"MatchInstances": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		old := b.createOne(spec("a"))
		b.clock.Advance(time.Hour)
		p := params(spec("a"))
		p.Workflow, p.DefinitionHash = "other", "hash-other"
		b.create(p)
		failed := b.createOne(spec("a"))
		b.fail(failed, "a")

		match := func(f storage.InstanceFilter) []string {
			ids, err := b.op().MatchInstances(b.ctx, f)
			require.NoError(t, err)
			return ids
		}
		require.Equal(t, []string{old, p.ID, failed}, match(storage.InstanceFilter{}))
		require.Equal(t, []string{old, failed}, match(storage.InstanceFilter{Workflow: "wf"}))
		require.Equal(t, []string{failed}, match(storage.InstanceFilter{Status: storage.InstanceFailed}))
		require.Equal(t, []string{old}, match(storage.InstanceFilter{CreatedBefore: b.now().Add(-time.Minute)}))
		require.Equal(t, []string{old}, match(storage.InstanceFilter{Limit: 1}))
		require.Equal(t, []string{p.ID}, match(storage.InstanceFilter{AfterID: old, Limit: 1}))
		require.Empty(t, match(storage.InstanceFilter{Workflow: "none"}))
	},

	"RacePauseAgainstAClaim": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		for range 20 {
			id := b.createOne(spec("a"), spec("b", "a"))
			var (
				wg      sync.WaitGroup
				claimed []storage.ClaimedStep
				err     error
			)
			wg.Add(2)
			go func() {
				defer wg.Done()
				claimed, err = b.store.ClaimSteps(b.ctx, storage.ClaimParams{WorkerID: "w", InstanceID: id, Limit: 10, Lease: time.Minute})
			}()
			go func() {
				defer wg.Done()
				require.NoError(t, b.op().PauseInstance(b.ctx, id))
			}()
			wg.Wait()
			require.NoError(t, err)
			if len(claimed) == 1 {
				require.Equal(t, storage.StepRunning, b.status(id, "a"), "the claim won: the step runs and finishes")
				b.finish(completed(claimed[0].Claim, `1`))
				require.Equal(t, storage.StepPending, b.status(id, "b"))
			}
			require.False(t, b.claimable(id), "nothing of a paused instance is claimable afterwards")
		}
	},

	"RaceSkipAgainstAClaimOfARetry": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		for range 20 {
			id := b.createOne(spec("a"), spec("b", "a"))
			c := b.claimStep(id, "a")
			b.finish(storage.StepResult{Claim: c.Claim, Outcome: storage.OutcomeRetry, Error: "again"})
			var (
				wg               sync.WaitGroup
				claimed          []storage.ClaimedStep
				claimErr, skipEr error
			)
			wg.Add(2)
			go func() {
				defer wg.Done()
				claimed, claimErr = b.store.ClaimSteps(b.ctx, storage.ClaimParams{WorkerID: "w", InstanceID: id, Limit: 10, Lease: time.Minute})
			}()
			go func() {
				defer wg.Done()
				skipEr = b.op().SkipStep(b.ctx, id, "a", json.RawMessage(`"skipped"`), Plan)
			}()
			wg.Wait()
			require.NoError(t, claimErr)
			a := step(t, b.get(id), "a")
			switch {
			case skipEr == nil:
				require.Equal(t, storage.StepCompleted, a.Status)
				for _, cl := range claimed {
					require.NotEqual(t, "a", cl.Step, "a skipped step is never claimed")
				}
			case errors.Is(skipEr, storage.ErrConflict):
				require.Len(t, claimed, 1, "the claim won")
				require.Equal(t, storage.StepRunning, a.Status)
			default:
				require.NoError(t, skipEr)
			}
		}
	},

	"RaceCancelAgainstRetryFrom": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		for range 20 {
			id := b.createOne(spec("a"), spec("b", "a"))
			b.complete(id, "a", `1`)
			b.complete(id, "b", `1`)
			var (
				wg                 sync.WaitGroup
				cancelErr, retryEr error
			)
			wg.Add(2)
			go func() {
				defer wg.Done()
				cancelErr = b.store.CancelInstance(b.ctx, id, "stop", Plan)
			}()
			go func() {
				defer wg.Done()
				retryEr = b.op().RetryFrom(b.ctx, id, "a", Plan)
			}()
			wg.Wait()
			require.NoError(t, retryEr, "a completed instance can always be retried")
			in := b.get(id)
			if cancelErr == nil {
				require.Equal(t, storage.InstanceCancelled, in.Status, "the retry went first")
				for _, s := range in.Steps {
					require.True(t, s.Status.Finished(), "a cancelled instance has no unfinished step: %s is %s", s.Name, s.Status)
				}
				continue
			}
			require.ErrorIs(t, cancelErr, storage.ErrConflict, "the cancel went first, on a completed instance")
			require.Equal(t, storage.InstanceRunning, in.Status)
			require.Equal(t, storage.StepPending, step(t, in, "a").Status)
		}
	},
}
