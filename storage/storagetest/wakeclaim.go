package storagetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
)

// wakeClaimTests cover storage.WakeClaimer, for stores that implement it.
var wakeClaimTests = map[string]func(*testing.T, *Harness){
	"ShortClaimTellsTheNextWake": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		wc := implements[storage.WakeClaimer](b)
		b.createOne(waitSpec("await-a", "a", time.Hour))
		sleepy := b.createOne(spec("sleepy"))
		c := b.claimStep(sleepy, "sleepy")
		b.finish(storage.StepResult{Claim: c.Claim, Outcome: storage.OutcomeSnooze, RunAfter: start.Add(10 * time.Minute)})
		ready := b.createOne(spec("ready"))

		tests := []struct {
			name    string
			p       storage.ClaimParams
			claimed []string
			want    time.Time
		}{
			{"another queue: nothing to claim, only the deadline", storage.ClaimParams{Queues: []string{"q.other"}}, nil, start.Add(time.Hour)},
			{"any queue: the ready step, then the snoozed one's time", storage.ClaimParams{}, []string{"ready"}, start.Add(10 * time.Minute)},
			{"nothing left to claim", storage.ClaimParams{}, nil, start.Add(10 * time.Minute)},
		}
		for _, tt := range tests {
			tt.p.WorkerID, tt.p.Limit, tt.p.Lease = "w", 5, time.Minute
			claimed, next, err := wc.ClaimStepsAndWake(b.ctx, tt.p)
			require.NoError(t, err, tt.name)
			var names []string
			for _, s := range claimed {
				require.Equal(t, ready, s.InstanceID, tt.name)
				names = append(names, s.Step)
			}
			require.Equal(t, tt.claimed, names, tt.name)
			require.True(t, next.Equal(tt.want), "%s: got %v, want %v", tt.name, next, tt.want)
			alone, err := b.store.NextWake(b.ctx, tt.p)
			require.NoError(t, err)
			require.True(t, next.Equal(alone), "%s: %v, while NextWake says %v", tt.name, next, alone)
		}
	},

	"FullClaimTellsNoWake": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		wc := implements[storage.WakeClaimer](b)
		b.createOne(waitSpec("await-a", "a", time.Hour))
		b.createOne(spec("a"), spec("b"))
		claimed, next, err := wc.ClaimStepsAndWake(b.ctx, storage.ClaimParams{WorkerID: "w", Limit: 2, Lease: time.Minute})
		require.NoError(t, err)
		require.Len(t, claimed, 2)
		require.True(t, next.IsZero(), "a worker whose claim was full claims again as a slot frees: %v", next)
	},

	"NothingAtAll": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		wc := implements[storage.WakeClaimer](b)
		claimed, next, err := wc.ClaimStepsAndWake(b.ctx, storage.ClaimParams{WorkerID: "w", Limit: 1, Lease: time.Minute})
		require.NoError(t, err)
		require.Empty(t, claimed)
		require.True(t, next.IsZero(), "nothing to wake for: %v", next)
	},
}
