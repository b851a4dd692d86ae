package storagetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
)

// requireExactCounts checks that Stats counts every workflow's instances
// per status exactly as listing them all does: backends may keep the
// counts as instances change instead of counting on each call, and must
// never drift.
func (b *bundle) requireExactCounts(msg string) {
	b.t.Helper()
	want := map[string]map[storage.InstanceStatus]int{}
	list, err := b.store.ListInstances(b.ctx, storage.ListParams{Limit: 10_000})
	require.NoError(b.t, err)
	for _, in := range list {
		if want[in.Workflow] == nil {
			want[in.Workflow] = map[storage.InstanceStatus]int{}
		}
		want[in.Workflow][in.Status]++
	}
	st, err := b.store.Stats(b.ctx)
	require.NoError(b.t, err)
	got := map[string]map[storage.InstanceStatus]int{}
	for _, w := range st.Workflows {
		for status, n := range w.Instances {
			if n == 0 {
				continue
			}
			if got[w.Workflow] == nil {
				got[w.Workflow] = map[storage.InstanceStatus]int{}
			}
			got[w.Workflow][status] = n
		}
	}
	require.Equal(b.t, want, got, "instance counts after %s", msg)
}

// countTests follow the instance counts of Stats through every way an
// instance is created, changes status or goes.
var countTests = map[string]func(*testing.T, *Harness){
	"ExactThroughEveryTransition": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		b.requireExactCounts("nothing")
		other := params(spec("a"))
		other.Workflow = "other"
		b.create(params(spec("a"), spec("b", "a")), params(spec("a")), params(spec("a")), other)
		completes, fails, cancels, retries := b.createOne(spec("a")), b.createOne(spec("a")), b.createOne(spec("a")), b.createOne(spec("a"))
		b.requireExactCounts("create")

		b.claim(storage.ClaimParams{Limit: 3})
		b.requireExactCounts("claim")
		b.complete(completes, "a", `1`)
		b.requireExactCounts("complete")
		c := b.claimStep(fails, "a")
		b.finish(storage.StepResult{Claim: c.Claim, Outcome: storage.OutcomeFailed, Error: "x"})
		b.requireExactCounts("fail")
		require.NoError(t, b.store.CancelInstance(b.ctx, cancels, "x", Plan))
		b.requireExactCounts("cancel")
		c = b.claimStep(retries, "a")
		b.finish(storage.StepResult{Claim: c.Claim, Outcome: storage.OutcomeFailed, Error: "x"})
		require.NoError(t, b.store.RetryInstance(b.ctx, retries, Plan))
		b.requireExactCounts("retry")
		require.NoError(t, b.store.RetryInstance(b.ctx, cancels, Plan))
		b.requireExactCounts("retry of a cancelled instance")

		b.clock.Advance(time.Hour)
		n, err := b.store.Prune(b.ctx, b.now(), true)
		require.NoError(t, err)
		require.Positive(t, n)
		b.requireExactCounts("dry-run prune")
		_, err = b.store.Prune(b.ctx, b.now(), false)
		require.NoError(t, err)
		b.requireExactCounts("prune")

		if h.BeginTx != nil {
			tx, _, rollback := h.BeginTx(t, b.store)
			_, err := b.store.CreateInstances(b.ctx, tx, []storage.CreateParams{params(spec("a"))}, Plan)
			require.NoError(t, err)
			require.NoError(t, rollback())
			b.requireExactCounts("a rolled back create")
			tx, commit, _ := h.BeginTx(t, b.store)
			_, err = b.store.CreateInstances(b.ctx, tx, []storage.CreateParams{params(spec("a"))}, Plan)
			require.NoError(t, err)
			require.NoError(t, commit())
			b.requireExactCounts("a create committed with the caller")
		}
	},
}
