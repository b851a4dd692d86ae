package storagetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
)

var txTests = map[string]func(*testing.T, *Harness){
	"CommitsWithCaller": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		if h.BeginTx == nil {
			t.Skip("Harness.BeginTx not set")
		}
		tx, commit, _ := h.BeginTx(t, b.store)
		p := params(spec("a"), spec("b", "a"))
		p.Key = "outbox"
		res, err := b.store.CreateInstances(b.ctx, tx, []storage.CreateParams{p}, Plan)
		require.NoError(t, err)
		require.Equal(t, []storage.CreateResult{{ID: p.ID}}, res)
		require.NoError(t, commit())

		in := b.get(p.ID)
		require.Equal(t, storage.StepPending, step(t, in, "a").Status)
		require.Len(t, events(in, "", storage.EventInstanceCreated), 1)
		require.Len(t, b.claim(storage.ClaimParams{}), 1)
	},

	"RollsBackWithCaller": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		if h.BeginTx == nil {
			t.Skip("Harness.BeginTx not set")
		}
		tx, _, rollback := h.BeginTx(t, b.store)
		p := params(spec("a"))
		p.Key = "outbox"
		_, err := b.store.CreateInstances(b.ctx, tx, []storage.CreateParams{p}, Plan)
		require.NoError(t, err)
		require.NoError(t, rollback())

		_, err = b.store.GetInstance(b.ctx, p.ID)
		require.ErrorIs(t, err, storage.ErrNotFound)
		require.Empty(t, b.claim(storage.ClaimParams{}))
		list, err := b.store.ListInstances(b.ctx, storage.ListParams{})
		require.NoError(t, err)
		require.Empty(t, list)
		require.Equal(t, []storage.CreateResult{{ID: p.ID}}, b.create(p), "the key was released too")
	},

	// A start that fails half-way inside the caller's transaction leaves
	// nothing of its instances there, while the caller's earlier writes
	// (here an instance it created first) stay and can commit: the store
	// writes inside a savepoint.
	"FailureHalfWayLeavesNothing": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		if h.BeginTx == nil {
			t.Skip("Harness.BeginTx not set")
		}
		tx, commit, _ := h.BeginTx(t, b.store)
		first := params(spec("a"))
		_, err := b.store.CreateInstances(b.ctx, tx, []storage.CreateParams{first}, Plan)
		require.NoError(t, err)

		// Two new instances, then one whose ID is taken: the store has
		// written some of the batch when it meets the conflict.
		batch := []storage.CreateParams{params(spec("a")), params(spec("a"))}
		batch[0].DefinitionHash, batch[0].Definition = "hash-half-way", []byte("v1")
		dup := params(spec("a"))
		dup.ID = first.ID
		_, err = b.store.CreateInstances(b.ctx, tx, append(batch, dup), Plan)
		require.ErrorIs(t, err, storage.ErrConflict)
		require.NoError(t, commit())

		require.Equal(t, storage.StepPending, b.status(first.ID, "a"), "the caller's own writes stay")
		for _, p := range batch {
			_, err := b.store.GetInstance(b.ctx, p.ID)
			require.ErrorIs(t, err, storage.ErrNotFound, "instance %s of the failed start", p.ID)
		}
		require.Len(t, b.claim(storage.ClaimParams{}), 1, "only the first instance's step is ready")
		again := params(spec("a"))
		again.DefinitionHash, again.Definition = "hash-half-way", []byte("v2")
		b.create(again)
		require.Equal(t, "v2", string(b.get(again.ID).Definition), "the failed start's definition was not kept")
	},

	"WrongTransactionType": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		p := params(spec("a"))
		_, err := b.store.CreateInstances(b.ctx, struct{}{}, []storage.CreateParams{p}, Plan)
		require.Error(t, err)
		_, err = b.store.GetInstance(b.ctx, p.ID)
		require.ErrorIs(t, err, storage.ErrNotFound)
	},
}

// awaitSignal fails the test unless ch is signalled soon after what.
func awaitSignal(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		require.FailNow(t, "no signal after "+what)
	}
}

// drainSignals empties ch of the signals already sent.
func drainSignals(ch <-chan struct{}) {
	for {
		select {
		case <-ch:
		default:
			return
		}
	}
}

var subscribeTests = map[string]func(*testing.T, *Harness){
	"SignalsReadySteps": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		ch, cancel := b.store.Subscribe(nil)
		defer cancel()
		other, cancelOther := b.store.Subscribe(nil)
		cancelOther()
		cancelOther() // idempotent

		await := func(what string) { t.Helper(); awaitSignal(t, ch, what) }
		drain := func() { drainSignals(ch) }

		drain()
		id := b.createOne(spec("a"), spec("b", "a"))
		await("create")
		c := b.claimStep(id, "a")
		drain()
		b.finish(completed(c.Claim, `1`))
		await("a completion that made a step ready")
		c = b.claimStep(id, "b")
		drain()
		b.finish(storage.StepResult{Claim: c.Claim, Outcome: storage.OutcomeRetry, Error: "x", RunAfter: b.now()})
		await("a retry")
		select {
		case <-other:
			require.FailNow(t, "a cancelled subscription was signalled")
		default:
		}
	},

	// An item under its forEach step's concurrency cap is pending all
	// along, so no finish makes it ready; the finish of a running sibling
	// is what lets it run, and must wake the claimers as a step made
	// ready does, or the next items wait for a poll each.
	"SignalsAFreedItemSlot": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		ch, cancel := b.store.Subscribe(nil)
		defer cancel()
		each := eachSpec("each")
		each.ItemConcurrency = 1
		id := b.createItems(3, each)
		got := b.claimItems(id, "each", 10)
		require.Len(t, got, 1, "the cap lets one item run")
		if h.Settle != nil {
			h.Settle(t, b.store)
		}
		drainSignals(ch)
		for next := 1; next < 3; next++ {
			b.finishItems(completed(got[0].Claim, itemOutput(got[0])))
			awaitSignal(t, ch, fmt.Sprintf("item %d completed under its step's cap", next-1))
			got = b.claimItems(id, "each", 10)
			require.Len(t, got, 1, "item %d, once its sibling completed", next)
			require.Equal(t, next, got[0].Item)
		}
		// A finish whose eager claim came back without the sibling must
		// signal all the same: its claim did not see every ready step.
		fc, ok := b.store.(storage.FinishClaimer)
		if !ok {
			return
		}
		id = b.createItems(2, each)
		got = b.claimItems(id, "each", 10)
		require.Len(t, got, 1)
		drainSignals(ch)
		_, claimed, err := fc.FinishAndClaim(b.ctx, []storage.StepResult{completed(got[0].Claim, itemOutput(got[0]))}, ItemsPlan,
			storage.ClaimParams{WorkerID: "eager", Limit: 5, Lease: time.Minute})
		require.NoError(t, err)
		if len(claimed) == 1 {
			require.Equal(t, 1, claimed[0].Item, "the eager claim took the sibling")
			return
		}
		require.Empty(t, claimed)
		awaitSignal(t, ch, "an item completed under its cap and the eager claim left its sibling")
		require.Len(t, b.claimItems(id, "each", 10), 1)
	},

	// An eager claim that took every ready step leaves nothing for the
	// store's other claimers: waking them would only run empty claims.
	// The store signals its own subscribers when it commits, so the
	// absence of a signal right after the call is the behaviour.
	"NoSignalWhenAnEagerClaimTookAll": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		ch, cancel := b.store.Subscribe(nil)
		defer cancel()
		signalled := func() bool {
			select {
			case <-ch:
				return true
			default:
				return false
			}
		}
		all := storage.ClaimParams{WorkerID: "eager", Limit: 5, Lease: time.Minute}

		if cc, ok := b.store.(storage.CreateClaimer); ok {
			_, claimed, err := cc.CreateAndClaim(b.ctx, []storage.CreateParams{params(spec("a"))}, Plan, all)
			require.NoError(t, err)
			require.Len(t, claimed, 1)
			require.False(t, signalled(), "a create whose claim took every ready step")
			_, _, err = cc.CreateAndClaim(b.ctx, []storage.CreateParams{params(spec("a"))}, Plan,
				storage.ClaimParams{WorkerID: "eager", Queues: []string{"elsewhere"}, Limit: 5, Lease: time.Minute})
			require.NoError(t, err)
			require.True(t, signalled(), "a create whose claim looked at one queue only")
		}
		if fc, ok := b.store.(storage.FinishClaimer); ok {
			b.claim(storage.ClaimParams{}) // what the creates above left
			id := b.createOne(spec("a"), spec("b", "a"))
			c := b.claimStep(id, "a")
			if h.Settle != nil {
				h.Settle(t, b.store)
			}
			for signalled() {
			}
			_, claimed, err := fc.FinishAndClaim(b.ctx, []storage.StepResult{completed(c.Claim, `1`)}, Plan, all)
			require.NoError(t, err)
			require.Len(t, claimed, 1)
			require.False(t, signalled(), "a finish whose claim took every ready step")
		}
	},
}
