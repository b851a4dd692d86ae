package storagetest

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
)

// eagerTests cover storage.FinishClaimer, for stores that implement it.
var eagerTests = map[string]func(*testing.T, *Harness){
	"ClaimsWhatTheFinishMadeReady": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		fc := implements[storage.FinishClaimer](b)
		id := b.createOne(spec("a"), spec("b", "a"))
		a := b.claimStep(id, "a")
		res, claimed, err := fc.FinishAndClaim(b.ctx, []storage.StepResult{completed(a.Claim, `1`)}, Plan,
			storage.ClaimParams{WorkerID: "eager", InstanceID: id, Limit: 5, Lease: time.Minute})
		require.NoError(t, err)
		require.Equal(t, []storage.FinishResult{{Accepted: true}}, res)
		require.Len(t, claimed, 1, "the step the completion made ready is claimed in the same transaction")
		require.Equal(t, "b", claimed[0].Step)
		require.Equal(t, 1, claimed[0].Attempt)
		require.True(t, claimed[0].LeaseUntil.Equal(b.now().Add(time.Minute)))

		in := b.get(id)
		require.Equal(t, storage.StepCompleted, step(t, in, "a").Status)
		require.Equal(t, storage.StepRunning, step(t, in, "b").Status)
		started := events(in, "b", storage.EventStepStarted)
		require.Len(t, started, 1)
		require.Equal(t, "eager", started[0].Message)
	},

	// The finish's claim takes the steps it made ready in claim order
	// among every ready step, at their instance's place: after those of
	// older instances of the same priority and ones of a higher priority,
	// before ones of a lower priority and those of instances started
	// later; and only those of the claim's queues.
	"ClaimsWhatTheFinishMadeReadyInClaimOrder": func(t *testing.T, h *Harness) {
		for _, tc := range []struct {
			name             string
			waitingPriority  int
			waitingLater     bool // the waiting instance starts after the finishing one
			limit            int
			queues           []string
			want             []string // the claimed steps, in order
			bPending, xReady bool     // left pending
		}{
			{name: "an older step first", limit: 1, want: []string{"x"}, bPending: true},
			{name: "both, the older first", limit: 2, want: []string{"x", "b"}},
			{name: "a higher priority first", waitingPriority: 1, limit: 1, want: []string{"x"}, bPending: true},
			{name: "before a lower priority", waitingPriority: -1, limit: 1, want: []string{"b"}, xReady: true},
			{name: "before a younger instance", waitingLater: true, limit: 1, want: []string{"b"}, xReady: true},
			{name: "both, the younger instance last", waitingLater: true, limit: 2, want: []string{"b", "x"}},
			{name: "only the claim's queues", limit: 2, queues: []string{"q.x"}, want: []string{"x"}, bPending: true},
		} {
			t.Run(tc.name, func(t *testing.T) {
				b := h.setup(t)
				fc := implements[storage.FinishClaimer](b)
				waiting := params(spec("x"))
				waiting.Priority = tc.waitingPriority
				if !tc.waitingLater {
					b.create(waiting)
					b.clock.Advance(time.Second)
				}
				id := b.createOne(spec("a"), spec("b", "a"))
				a := b.claimStep(id, "a")
				b.clock.Advance(time.Second)
				if tc.waitingLater {
					b.create(waiting)
					b.clock.Advance(time.Second)
				}
				_, claimed, err := fc.FinishAndClaim(b.ctx, []storage.StepResult{completed(a.Claim, `1`)}, Plan,
					storage.ClaimParams{WorkerID: "eager", Queues: tc.queues, Limit: tc.limit, Lease: time.Minute})
				require.NoError(t, err)
				var got []string
				for _, c := range claimed {
					got = append(got, c.Step)
				}
				require.Equal(t, tc.want, got)
				wantB, wantX := storage.StepRunning, storage.StepRunning
				if tc.bPending {
					wantB = storage.StepPending
				}
				if tc.xReady {
					wantX = storage.StepPending
				}
				require.Equal(t, wantB, b.status(id, "b"))
				require.Equal(t, wantX, b.status(waiting.ID, "x"))
				// Made ready, then started if claimed: its history is the
				// same whichever way the claim took it.
				in := b.get(id)
				require.Len(t, events(in, "b", storage.EventStepReady), 1)
				require.Len(t, events(in, "b", storage.EventStepStarted), map[bool]int{true: 0, false: 1}[tc.bPending])
			})
		}
	},

	// A step the finish made ready and its claim did not take is news
	// for the store's subscribers: the caller claims again only when
	// told, and learns when a step falls due only from a claim of its
	// own. On PostgreSQL a claim in the statement that applies the plans
	// hands over no step under a limit, and any claim leaves a step its
	// queue's rate starts later.
	"MadeReadyAndNotClaimedSignalsSubscribers": func(t *testing.T, h *Harness) {
		rated := func(b *bundle) {
			require.NoError(t, b.setQueueLimit(storage.QueueLimit{Queue: "q.b", Rate: 1, Per: time.Minute}))
		}
		for _, tc := range []struct {
			name      string
			instances int // each with steps a and b, b under a key of its own
			setup     func(b *bundle)
			fillers   int           // steps made ready once the a's are claimed
			due       time.Duration // when every b may be claimed
		}{
			{name: "a step under a key with room", instances: 1},
			{name: "a step its queue's rate starts later", instances: 2, due: time.Minute, setup: rated},
			// The second finish claims after its plans, in a statement of
			// its own (the first one's claim came back full), and leaves
			// the second b for later.
			{name: "a step its queue's rate starts later, after a full claim", instances: 2, fillers: 2, due: time.Minute, setup: rated},
		} {
			t.Run(tc.name, func(t *testing.T) {
				b := h.setup(t)
				fc := implements[storage.FinishClaimer](b)
				if tc.setup != nil {
					tc.setup(b)
				}
				keyedStep := spec("b", "a")
				keyedStep.ConcurrencyLimit = 1
				var ps []storage.CreateParams
				for i := range tc.instances {
					p := params(spec("a"), keyedStep)
					p.Input = json.RawMessage(fmt.Sprintf(`{"key": "k%d"}`, i))
					ps = append(ps, p)
				}
				_, err := b.store.CreateInstances(b.ctx, nil, ps, KeyPlan)
				require.NoError(t, err)
				claim := storage.ClaimParams{WorkerID: "eager", Limit: 5, Lease: time.Minute}
				if tc.fillers > 0 {
					claim.Limit = tc.fillers
				}
				as, err := b.store.ClaimSteps(b.ctx, claim)
				require.NoError(t, err)
				require.Len(t, as, tc.instances)
				for range tc.fillers {
					b.createOne(spec("x"))
				}
				ch, cancel := b.store.Subscribe(nil)
				defer cancel()
				if h.Settle != nil {
					h.Settle(t, b.store)
				}
				var got []string // the instances whose b was claimed
				for _, a := range as {
					drainSignals(ch)
					_, claimed, err := fc.FinishAndClaim(b.ctx, []storage.StepResult{completed(a.Claim, `1`)}, KeyPlan, claim)
					require.NoError(t, err)
					ids := stepsOf(claimed, "b")
					got = append(got, ids...)
					if !slices.Contains(ids, a.InstanceID) {
						awaitSignal(t, ch, "a finish that made a step ready and did not claim it")
					}
				}
				b.clock.Advance(tc.due)
				got = append(got, stepsOf(b.claim(claim), "b")...)
				require.ElementsMatch(t, paramIDs(ps), got)
			})
		}
	},

	"StaleResultStillClaims": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		fc := implements[storage.FinishClaimer](b)
		first := b.createOne(spec("a"))
		stale := b.claimStep(first, "a")
		b.clock.Advance(time.Hour)
		_, err := b.store.RecoverExpired(b.ctx, 10, Plan)
		require.NoError(t, err)
		other := b.createOne(spec("x"))
		res, claimed, err := fc.FinishAndClaim(b.ctx, []storage.StepResult{completed(stale.Claim, `1`)}, Plan,
			storage.ClaimParams{WorkerID: "eager", InstanceID: other, Limit: 5, Lease: time.Minute})
		require.NoError(t, err)
		require.Equal(t, []storage.FinishResult{{Accepted: false}}, res)
		require.Len(t, claimed, 1)
		require.Equal(t, "x", claimed[0].Step)
		require.Equal(t, storage.StepPending, step(t, b.get(first), "a").Status, "the stale result wrote nothing")
	},

	"NothingReadyClaimsNothing": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		fc := implements[storage.FinishClaimer](b)
		id := b.createOne(spec("a"))
		a := b.claimStep(id, "a")
		res, claimed, err := fc.FinishAndClaim(b.ctx, []storage.StepResult{completed(a.Claim, `1`)}, Plan,
			storage.ClaimParams{WorkerID: "eager", Limit: 5, Lease: time.Minute})
		require.NoError(t, err)
		require.Equal(t, []storage.FinishResult{{Accepted: true}}, res)
		require.Empty(t, claimed)
		require.Equal(t, storage.InstanceCompleted, b.get(id).Status)
	},
}

// eagerStartTests cover storage.CreateClaimer, for stores that implement it.
var eagerStartTests = map[string]func(*testing.T, *Harness){
	"ClaimsTheNewRoots": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		cc := implements[storage.CreateClaimer](b)
		p := params(spec("a"), spec("b", "a"))
		res, claimed, err := cc.CreateAndClaim(b.ctx, []storage.CreateParams{p}, Plan,
			storage.ClaimParams{WorkerID: "eager", Limit: 5, Lease: time.Minute})
		require.NoError(t, err)
		require.Equal(t, []storage.CreateResult{{ID: p.ID}}, res)
		require.Len(t, claimed, 1, "the root is claimed in the creating transaction")
		require.Equal(t, p.ID, claimed[0].InstanceID)
		require.Equal(t, "a", claimed[0].Step)
		require.Equal(t, 1, claimed[0].Attempt)
		require.True(t, claimed[0].LeaseUntil.Equal(b.now().Add(time.Minute)))

		in := b.get(p.ID)
		require.Equal(t, storage.InstanceRunning, in.Status)
		require.Equal(t, storage.StepRunning, step(t, in, "a").Status)
		require.Equal(t, storage.StepBlocked, step(t, in, "b").Status)
		started := events(in, "a", storage.EventStepStarted)
		require.Len(t, started, 1)
		require.Equal(t, "eager", started[0].Message)
	},

	"KeepsToLimitAndQueues": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		cc := implements[storage.CreateClaimer](b)
		ps := []storage.CreateParams{params(spec("a"), spec("x")), params(spec("a"), spec("x")), params(spec("a"), spec("x"))}
		_, claimed, err := cc.CreateAndClaim(b.ctx, ps, Plan,
			storage.ClaimParams{WorkerID: "eager", Queues: []string{"q.a"}, Limit: 2, Lease: time.Minute})
		require.NoError(t, err)
		require.Len(t, claimed, 2)
		for i, c := range claimed {
			require.Equal(t, "a", c.Step)
			require.Equal(t, ps[i].ID, c.InstanceID, "claimed in creation order")
		}
		require.Equal(t, storage.StepPending, b.status(ps[2].ID, "a"), "over the limit")
		for _, p := range ps {
			require.Equal(t, storage.StepPending, b.status(p.ID, "x"), "another queue")
		}
	},

	// A new instance's step the claim leaves (its queue's rate starts it
	// later) is news for the store's subscribers, as a finish's is (see
	// MadeReadyAndNotClaimedSignalsSubscribers).
	"LeftStepSignalsSubscribers": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		cc := implements[storage.CreateClaimer](b)
		require.NoError(t, b.setQueueLimit(storage.QueueLimit{Queue: "q.a", Rate: 1, Per: time.Minute}))
		ch, cancel := b.store.Subscribe(nil)
		defer cancel()
		if h.Settle != nil {
			h.Settle(t, b.store)
		}
		claim := storage.ClaimParams{WorkerID: "eager", Limit: 5, Lease: time.Minute}
		first, second := params(spec("a")), params(spec("a"))
		var got []string
		for _, p := range []storage.CreateParams{first, second} {
			drainSignals(ch)
			_, claimed, err := cc.CreateAndClaim(b.ctx, []storage.CreateParams{p}, Plan, claim)
			require.NoError(t, err)
			ids := stepsOf(claimed, "a")
			got = append(got, ids...)
			if !slices.Contains(ids, p.ID) {
				awaitSignal(t, ch, "a start whose claim left its step")
			}
		}
		require.Equal(t, []string{first.ID}, got, "the rate starts the second a minute later")
		b.clock.Advance(time.Minute)
		require.Equal(t, []string{second.ID}, stepsOf(b.claim(claim), "a"))
	},

	"FailedCreateClaimsNothing": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		cc := implements[storage.CreateClaimer](b)
		waiting := b.createOne(spec("a"))
		taken := params(spec("a"))
		b.create(taken)
		again := params(spec("a"))
		again.ID = taken.ID
		_, claimed, err := cc.CreateAndClaim(b.ctx, []storage.CreateParams{params(spec("a")), again}, Plan,
			storage.ClaimParams{WorkerID: "eager", Limit: 5, Lease: time.Minute})
		require.ErrorIs(t, err, storage.ErrConflict)
		require.Empty(t, claimed)
		require.Equal(t, storage.StepPending, b.status(waiting, "a"), "the claim rolled back with the create")
		require.Equal(t, storage.StepPending, b.status(taken.ID, "a"))
	},
}

// implements returns the store as the optional interface I, skipping the
// test when the store does not implement it.
func implements[I any](b *bundle) I {
	b.t.Helper()
	v, ok := b.store.(I)
	if !ok {
		b.t.Skipf("the store does not implement %T", (*I)(nil))
	}
	return v
}

// stepsOf returns the instances of the steps of claimed named name.
func stepsOf(claimed []storage.ClaimedStep, name string) []string {
	var ids []string
	for _, c := range claimed {
		if c.Step == name {
			ids = append(ids, c.InstanceID)
		}
	}
	return ids
}

func paramIDs(ps []storage.CreateParams) []string {
	ids := make([]string, len(ps))
	for i, p := range ps {
		ids[i] = p.ID
	}
	return ids
}
