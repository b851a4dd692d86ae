package storagetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
)

var leaseTests = map[string]func(*testing.T, *Harness){
	"ExpiredIsRequeuedAfterRetryDelay": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createOne(spec("a"))
		c := b.claimStep(id, "a")
		b.clock.Advance(30*time.Second - time.Millisecond)
		n, err := b.store.RecoverExpired(b.ctx, 10, Plan)
		require.NoError(t, err)
		require.Zero(t, n, "the lease has not ended")

		b.clock.Advance(time.Millisecond + time.Microsecond)
		n, err = b.store.RecoverExpired(b.ctx, 10, Plan)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		now := b.now()
		in := b.get(id)
		a := step(t, in, "a")
		require.Equal(t, storage.StepPending, a.Status)
		require.Equal(t, 1, a.Attempts, "an expired lease counts as an attempt")
		require.NotEmpty(t, a.Error)
		require.Nil(t, a.LeaseUntil)
		// Retry.Delay(1) is the 1s backoff, less up to 20% jitter.
		require.False(t, a.RunAfter.Before(now.Add(800*time.Millisecond)), "run after %v", a.RunAfter)
		require.False(t, a.RunAfter.After(now.Add(time.Second)), "run after %v", a.RunAfter)
		require.Len(t, events(in, "a", storage.EventStepLeaseExpired), 1)
		require.Equal(t, storage.InstanceRunning, in.Status)

		n, err = b.store.RecoverExpired(b.ctx, 10, Plan)
		require.NoError(t, err)
		require.Zero(t, n)
		require.Equal(t, []storage.FinishResult{{}}, b.finish(completed(c.Claim, `1`)), "the lost claim is stale")

		require.Empty(t, b.claim(storage.ClaimParams{}))
		b.clock.Advance(time.Second)
		again := b.claimStep(id, "a")
		require.Equal(t, 2, again.Attempt)
		require.Greater(t, again.Fence, c.Fence)
	},

	"TerminalAfterMaxAttempts": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		a := spec("a")
		a.Retry.MaxAttempts = 2
		id := b.createOne(a, spec("b", "a"))
		for attempt := 1; attempt <= 2; attempt++ {
			c := b.claimStep(id, "a")
			require.Equal(t, attempt, c.Attempt)
			b.clock.Advance(31 * time.Second)
			n, err := b.store.RecoverExpired(b.ctx, 10, Plan)
			require.NoError(t, err)
			require.Equal(t, 1, n)
			b.clock.Advance(time.Minute)
		}
		in := b.get(id)
		require.Equal(t, storage.StepFailed, step(t, in, "a").Status)
		require.NotEmpty(t, step(t, in, "a").Error)
		require.Equal(t, storage.StepCancelled, step(t, in, "b").Status)
		require.Equal(t, storage.InstanceFailed, in.Status, "the plan ran for the terminal failure")
		require.NotNil(t, in.FinishedAt)
		require.Len(t, events(in, "", storage.EventInstanceFailed), 1)
		require.Empty(t, b.claim(storage.ClaimParams{}))
	},

	"RecoverLimit": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		for range 5 {
			b.createOne(spec("a"))
		}
		require.Len(t, b.claim(storage.ClaimParams{}), 5)
		b.clock.Advance(time.Minute)
		n, err := b.store.RecoverExpired(b.ctx, 3, Plan)
		require.NoError(t, err)
		require.Equal(t, 3, n)
		n, err = b.store.RecoverExpired(b.ctx, 3, Plan)
		require.NoError(t, err)
		require.Equal(t, 2, n)
	},

	"ExtendPreventsExpiry": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createOne(spec("a"))
		c := b.claimStep(id, "a")
		for range 3 {
			b.clock.Advance(20 * time.Second)
			lost, err := b.store.ExtendLeases(b.ctx, []storage.Claim{c.Claim}, 30*time.Second)
			require.NoError(t, err)
			require.Empty(t, lost)
			n, err := b.store.RecoverExpired(b.ctx, 10, Plan)
			require.NoError(t, err)
			require.Zero(t, n)
		}
		a := step(t, b.get(id), "a")
		require.Equal(t, storage.StepRunning, a.Status)
		require.True(t, a.LeaseUntil.Equal(b.now().Add(30*time.Second)), "lease until %v", a.LeaseUntil)
		require.Equal(t, []storage.FinishResult{{Accepted: true}}, b.finish(completed(c.Claim, `1`)))
	},

	"ExtendReportsLostClaims": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		held := b.createOne(spec("a"))
		stale := b.createOne(spec("a"))
		cancelled := b.createOne(spec("a"))
		hc := b.claimStep(held, "a")
		sc := b.claimStep(stale, "a")
		cc := b.claimStep(cancelled, "a")

		// stale: lease expired, recovered and claimed again.
		b.clock.Advance(20 * time.Second)
		lost, err := b.store.ExtendLeases(b.ctx, []storage.Claim{hc.Claim}, 30*time.Second)
		require.NoError(t, err)
		require.Empty(t, lost)
		b.clock.Advance(11 * time.Second)
		n, err := b.store.RecoverExpired(b.ctx, 10, Plan)
		require.NoError(t, err)
		require.Equal(t, 2, n)
		b.clock.Advance(time.Second)
		newer := b.claimStep(stale, "a")
		require.NoError(t, b.store.CancelInstance(b.ctx, cancelled, "stop", Plan))

		lost, err = b.store.ExtendLeases(b.ctx, []storage.Claim{hc.Claim, sc.Claim, cc.Claim, newer.Claim}, 30*time.Second)
		require.NoError(t, err)
		require.ElementsMatch(t, []storage.Claim{sc.Claim, cc.Claim}, lost)
		a := step(t, b.get(stale), "a")
		require.True(t, a.LeaseUntil.Equal(b.now().Add(30*time.Second)), "the newer claim was extended")
	},

	"StaleClaimCannotFinish": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createOne(spec("a"), spec("b", "a"))
		old := b.claimStep(id, "a")
		b.clock.Advance(time.Minute)
		n, err := b.store.RecoverExpired(b.ctx, 10, Plan)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		b.clock.Advance(time.Minute)
		cur := b.claimStep(id, "a")
		require.Greater(t, cur.Fence, old.Fence)
		before := b.get(id)

		for _, o := range []storage.Outcome{storage.OutcomeCompleted, storage.OutcomeFailed, storage.OutcomeRetry, storage.OutcomeSnooze} {
			res := b.finish(storage.StepResult{Claim: old.Claim, Outcome: o, Output: []byte(`"old"`), Error: "old", RunAfter: b.now()})
			require.Equal(t, []storage.FinishResult{{Accepted: false}}, res, "outcome %d", o)
		}
		require.NoError(t, b.store.ReleaseSteps(b.ctx, []storage.Claim{old.Claim}))
		after := b.get(id)
		require.Equal(t, before.Steps, after.Steps, "a stale claim writes nothing")
		require.Equal(t, before.Events, after.Events)

		require.Equal(t, []storage.FinishResult{{Accepted: true}}, b.finish(completed(cur.Claim, `"new"`)))
		require.JSONEq(t, `"new"`, string(step(t, b.get(id), "a").Output))
	},
}
