package storagetest

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
)

// A commit can succeed while its answer is lost: the connection drops as
// the database acknowledges it. The worker then commits the same results
// again, and the store must tell a result it recorded already from a stale
// one: accepted (Repeated), with nothing written a second time.
var repeatedTests = map[string]func(*testing.T, *Harness){
	"SameResultTwiceIsAcceptedOnceAndChangesNothing": func(t *testing.T, h *Harness) {
		for _, tc := range []struct {
			name   string
			result func(storage.ClaimedStep) storage.StepResult
		}{
			{"Completed", func(c storage.ClaimedStep) storage.StepResult {
				return storage.StepResult{Claim: c.Claim, Attempt: c.Attempt, Outcome: storage.OutcomeCompleted, Output: json.RawMessage(`{"ok":1}`)}
			}},
			{"Failed", func(c storage.ClaimedStep) storage.StepResult {
				return storage.StepResult{Claim: c.Claim, Attempt: c.Attempt, Outcome: storage.OutcomeFailed, Error: "card declined"}
			}},
			{"Retry", func(c storage.ClaimedStep) storage.StepResult {
				return storage.StepResult{Claim: c.Claim, Attempt: c.Attempt, Outcome: storage.OutcomeRetry, Error: "bank busy", Delay: time.Second}
			}},
			{"Snooze", func(c storage.ClaimedStep) storage.StepResult {
				return storage.StepResult{Claim: c.Claim, Attempt: c.Attempt, Outcome: storage.OutcomeSnooze, RunAfter: start.Add(time.Hour)}
			}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				b := h.setup(t)
				id := b.createOne(spec("a"), spec("b", "a"))
				c := b.claimStep(id, "a")
				b.clock.Advance(time.Second)
				r := tc.result(c)
				r.Logs = []storage.LogRecord{{StepID: c.StepID, InstanceID: id, Step: "a", Item: -1, Attempt: c.Attempt,
					Time: b.now(), Level: "INFO", Message: "charging"}}
				require.Equal(t, []storage.FinishResult{{Accepted: true}}, b.finish(r))
				before, history := b.get(id), b.history(id, 0)
				logs := b.listLogs(storage.LogsParams{InstanceID: id})
				require.Len(t, logs, 1)

				b.clock.Advance(time.Second)
				require.Equal(t, []storage.FinishResult{{Accepted: true, Repeated: true}}, b.finish(r),
					"a result recorded already is accepted, not stale")
				require.Equal(t, before, b.get(id), "the second finish changes nothing")
				require.Equal(t, history, b.history(id, 0), "and writes no event")
				require.Equal(t, logs, b.listLogs(storage.LogsParams{InstanceID: id}), "nor the attempt's logs again")
			})
		}
	},

	"RepeatedBesideNewResults": func(t *testing.T, h *Harness) {
		// A group commit tried again may meet results another commit
		// recorded meanwhile: each is answered for itself.
		b := h.setup(t)
		id := b.createOne(spec("a"), spec("b"), spec("c", "a", "b"))
		a, bb := b.claimStep(id, "a"), b.claimStep(id, "b")
		ra := storage.StepResult{Claim: a.Claim, Attempt: a.Attempt, Outcome: storage.OutcomeCompleted, Output: json.RawMessage(`1`)}
		rb := storage.StepResult{Claim: bb.Claim, Attempt: bb.Attempt, Outcome: storage.OutcomeCompleted, Output: json.RawMessage(`2`)}
		b.finish(ra)
		require.Equal(t, []storage.FinishResult{{Accepted: true, Repeated: true}, {Accepted: true}}, b.finish(ra, rb))
		in := b.get(id)
		require.Equal(t, storage.StepPending, step(t, in, "c").Status, "the new result planned the instance")
		require.Len(t, events(in, "a", storage.EventStepCompleted), 1)
		require.Len(t, events(in, "c", storage.EventStepReady), 1)
	},

	"RepeatedAfterFinishAndClaim": func(t *testing.T, h *Harness) {
		// The first commit claimed the next step too (and, on PostgreSQL,
		// kept what it planned for the next finish to foresee).
		b := h.setup(t)
		fc := implements[storage.FinishClaimer](b)
		id := b.createOne(spec("a"), spec("b", "a"))
		a := b.claimStep(id, "a")
		r := storage.StepResult{Claim: a.Claim, Attempt: a.Attempt, Outcome: storage.OutcomeCompleted, Output: json.RawMessage(`1`)}
		_, claimed, err := fc.FinishAndClaim(b.ctx, []storage.StepResult{r}, Plan,
			storage.ClaimParams{WorkerID: "worker-1", Limit: 10, Lease: 30 * time.Second})
		require.NoError(t, err)
		require.Len(t, claimed, 1)
		before := b.get(id)
		require.Equal(t, []storage.FinishResult{{Accepted: true, Repeated: true}}, b.finish(r))
		require.Equal(t, before, b.get(id))
		// The step the first commit claimed is still held.
		lost, err := b.store.ExtendLeases(b.ctx, []storage.Claim{claimed[0].Claim}, 30*time.Second)
		require.NoError(t, err)
		require.Empty(t, lost)
	},

	"ItemResultTwice": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createItems(2, spec("first"), eachSpec("each", "first"))
		first := b.claimStep(id, "first")
		b.finishItems(completed(first.Claim, `1`))
		items := b.claimItems(id, "each", 10)
		require.Len(t, items, 2)
		r := storage.StepResult{Claim: items[0].Claim, Attempt: items[0].Attempt, Outcome: storage.OutcomeCompleted, Output: json.RawMessage(`"x"`)}
		require.Equal(t, []storage.FinishResult{{Accepted: true}}, b.finishItems(r))
		before := b.items(id, "each")
		require.Equal(t, []storage.FinishResult{{Accepted: true, Repeated: true}}, b.finishItems(r))
		require.Equal(t, before, b.items(id, "each"))
	},

	"OtherEndsAreNotTakenForTheResult": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		// An expired lease fails the attempt with an error of its own.
		one := spec("a")
		one.Retry.MaxAttempts = 1
		id := b.createOne(one)
		c := b.claimStep(id, "a")
		b.clock.Advance(31 * time.Second)
		n, err := b.store.RecoverExpired(b.ctx, 10, Plan)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.Equal(t, storage.StepFailed, b.status(id, "a"))
		for _, r := range []storage.StepResult{
			{Claim: c.Claim, Attempt: c.Attempt, Outcome: storage.OutcomeFailed, Error: "card declined"},
			{Claim: c.Claim, Attempt: c.Attempt, Outcome: storage.OutcomeRetry, Error: "bank busy"},
		} {
			require.Equal(t, []storage.FinishResult{{}}, b.finish(r), "recovered, not recorded: stale")
		}

		// An expired lease with attempts left: pending again, counted.
		id = b.createOne(spec("a"))
		c = b.claimStep(id, "a")
		b.clock.Advance(31 * time.Second)
		n, err = b.store.RecoverExpired(b.ctx, 10, Plan)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.Equal(t, []storage.FinishResult{{}}, b.finish(storage.StepResult{Claim: c.Claim, Attempt: c.Attempt,
			Outcome: storage.OutcomeSnooze, RunAfter: b.now()}), "an expired lease is no snooze")

		// A cancel is a cancel, whatever the result.
		id = b.createOne(spec("a"))
		c = b.claimStep(id, "a")
		require.NoError(t, b.store.CancelInstance(b.ctx, id, "by test", Plan))
		require.Equal(t, []storage.FinishResult{{Cancelled: true}}, b.finish(storage.StepResult{Claim: c.Claim, Attempt: c.Attempt,
			Outcome: storage.OutcomeSnooze, RunAfter: b.now()}))

		// A result that does not say its attempt is never recognised.
		id = b.createOne(spec("a"))
		c = b.claimStep(id, "a")
		b.finish(completed(c.Claim, `1`))
		require.Equal(t, []storage.FinishResult{{}}, b.finish(completed(c.Claim, `1`)))

		// A step claimed again since answers its older claim's results as
		// stale, recorded or not: its row no longer shows them.
		id = b.createOne(spec("a"))
		c = b.claimStep(id, "a")
		r := storage.StepResult{Claim: c.Claim, Attempt: c.Attempt, Outcome: storage.OutcomeRetry, Error: "bank busy"}
		b.finish(r)
		b.clock.Advance(time.Minute)
		b.claimStep(id, "a")
		require.Equal(t, []storage.FinishResult{{}}, b.finish(r))
	},
}
