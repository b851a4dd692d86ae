package storagetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
)

// eagerTests cover storage.FinishClaimer, for stores that implement it.
var eagerTests = map[string]func(*testing.T, *Harness){
	"ClaimsWhatTheFinishMadeReady": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		fc := b.finishClaimer()
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

	"StaleResultStillClaims": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		fc := b.finishClaimer()
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
		fc := b.finishClaimer()
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

// finishClaimer skips the test when the store does not claim eagerly.
func (b *bundle) finishClaimer() storage.FinishClaimer {
	b.t.Helper()
	fc, ok := b.store.(storage.FinishClaimer)
	if !ok {
		b.t.Skip("the store does not implement storage.FinishClaimer")
	}
	return fc
}
