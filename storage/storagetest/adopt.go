package storagetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
)

// adopt asks for the steps worker-1 holds without knowing it.
func (b *bundle) adopt(p storage.AdoptParams) []storage.ClaimedStep {
	b.t.Helper()
	if p.WorkerID == "" {
		p.WorkerID = "worker-1"
	}
	if p.Lease == 0 {
		p.Lease = time.Minute
	}
	got, err := b.store.AdoptSteps(b.ctx, p)
	require.NoError(b.t, err)
	return got
}

// A claim whose answer its worker lost (the connection dropped as the
// database acknowledged the commit) leaves steps running under the
// worker's ID that it never heard of: AdoptSteps hands them over.
var adoptTests = map[string]func(*testing.T, *Harness){
	"ReturnsTheStepsItsWorkerDoesNotKnow": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		first, second, other := b.createOne(spec("a")), b.createOne(spec("a")), b.createOne(spec("a"))
		known := b.claimStep(first, "a")
		lost := b.claimStep(second, "a")
		theirs := b.claim(storage.ClaimParams{WorkerID: "worker-2", InstanceID: other})
		require.Len(t, theirs, 1)
		history := b.history(second, 0)
		b.clock.Advance(time.Second)

		got := b.adopt(storage.AdoptParams{Held: []storage.Claim{known.Claim}, Lease: time.Minute})
		require.Len(t, got, 1, "the step worker-1 holds without knowing it, and no other")
		want := lost
		want.LeaseUntil = b.now().Add(time.Minute)
		require.True(t, got[0].LeaseUntil.Equal(want.LeaseUntil), "the lease is renewed from now: %v", got[0].LeaseUntil)
		got[0].LeaseUntil = want.LeaseUntil
		require.Equal(t, want, got[0], "as its claim returned it: same fence, same attempt")

		a := step(t, b.get(second), "a")
		require.Equal(t, storage.StepRunning, a.Status)
		require.Equal(t, 1, a.Attempts, "no attempt is counted again")
		require.Equal(t, "worker-1", a.WorkerID)
		require.Equal(t, history, b.history(second, 0), "no event")

		// Its worker runs it now, under its claim.
		require.Empty(t, b.adopt(storage.AdoptParams{Held: []storage.Claim{known.Claim, lost.Claim}}))
		require.Equal(t, []storage.FinishResult{{Accepted: true}}, b.finish(completed(lost.Claim, `1`)))
		require.Empty(t, b.adopt(storage.AdoptParams{Held: []storage.Claim{known.Claim}}), "finished")
	},

	"RenewsTheLease": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createOne(spec("a"))
		lost := b.claimStep(id, "a") // a 30s lease
		b.clock.Advance(20 * time.Second)
		require.Len(t, b.adopt(storage.AdoptParams{Lease: time.Minute}), 1)
		b.clock.Advance(40 * time.Second)
		n, err := b.store.RecoverExpired(b.ctx, 10, Plan)
		require.NoError(t, err)
		require.Zero(t, n, "the lease holds from the adoption")
		gone, err := b.store.ExtendLeases(b.ctx, []storage.Claim{lost.Claim}, time.Minute)
		require.NoError(t, err)
		require.Empty(t, gone)
	},

	"LeavesExpiredOldAndOtherSteps": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		expired := b.createOne(spec("a"))
		b.claimStep(expired, "a")
		b.clock.Advance(31 * time.Second)
		require.Empty(t, b.adopt(storage.AdoptParams{}), "an expired lease is the recovery's")

		old := b.createOne(spec("a"))
		b.claimStep(old, "a")
		b.clock.Advance(10 * time.Second)
		fresh := b.createOne(spec("a"))
		c := b.claimStep(fresh, "a")
		b.clock.Advance(time.Second)
		got := b.adopt(storage.AdoptParams{Within: 5 * time.Second})
		require.Len(t, got, 1, "only the step claimed within 5s")
		require.Equal(t, c.Claim, got[0].Claim)
		require.Len(t, b.adopt(storage.AdoptParams{Held: []storage.Claim{c.Claim}}), 1, "Within 0: any")

		// Pending, finished and other workers' steps are not leased to
		// worker-1.
		b.createOne(spec("a"))
		done := b.createOne(spec("a"))
		b.complete(done, "a", `1`)
		b.claim(storage.ClaimParams{WorkerID: "worker-2", InstanceID: b.createOne(spec("a"))})
		require.Len(t, b.adopt(storage.AdoptParams{}), 2, "old and fresh")
	},

	"ANewerClaimOfAHeldStep": func(t *testing.T, h *Harness) {
		// The worker holds an older claim of the step; the lost commit
		// finished it and claimed it again.
		b := h.setup(t)
		id := b.createOne(spec("a"))
		older := b.claimStep(id, "a")
		b.finish(storage.StepResult{Claim: older.Claim, Outcome: storage.OutcomeRetry, Error: "busy"})
		b.clock.Advance(time.Minute)
		newer := b.claimStep(id, "a")
		got := b.adopt(storage.AdoptParams{Held: []storage.Claim{older.Claim}})
		require.Len(t, got, 1)
		require.Equal(t, newer.Claim, got[0].Claim)
		require.Equal(t, 2, got[0].Attempt)
	},

	"ItemsAndTraceParent": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		p := itemsParams(2, spec("first"), eachSpec("each", "first"))
		p.TraceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
		res, err := b.store.CreateInstances(b.ctx, nil, []storage.CreateParams{p}, ItemsPlan)
		require.NoError(t, err)
		require.Len(t, res, 1)
		first := b.claimStep(p.ID, "first")
		b.finishItems(completed(first.Claim, `1`))
		items := b.claimItems(p.ID, "each", 10)
		require.Len(t, items, 2)
		got := b.adopt(storage.AdoptParams{Held: []storage.Claim{items[0].Claim}, TraceParent: true})
		require.Len(t, got, 1, "the items, not their forEach step, which holds no lease")
		require.Equal(t, items[1].Claim, got[0].Claim)
		require.Equal(t, 1, got[0].Item)
		require.Equal(t, p.TraceParent, got[0].TraceParent)
	},

	"LeaseMustBePositive": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		_, err := b.store.AdoptSteps(b.ctx, storage.AdoptParams{WorkerID: "worker-1"})
		require.Error(t, err)
	},
}
