package storagetest

import (
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

	"WrongTransactionType": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		p := params(spec("a"))
		_, err := b.store.CreateInstances(b.ctx, struct{}{}, []storage.CreateParams{p}, Plan)
		require.Error(t, err)
		_, err = b.store.GetInstance(b.ctx, p.ID)
		require.ErrorIs(t, err, storage.ErrNotFound)
	},
}

var subscribeTests = map[string]func(*testing.T, *Harness){
	"SignalsReadySteps": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		ch, cancel := b.store.Subscribe()
		defer cancel()
		other, cancelOther := b.store.Subscribe()
		cancelOther()
		cancelOther() // idempotent

		await := func(what string) {
			t.Helper()
			select {
			case <-ch:
			case <-time.After(10 * time.Second):
				require.FailNow(t, "no signal after "+what)
			}
		}
		drain := func() {
			for {
				select {
				case <-ch:
				default:
					return
				}
			}
		}

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
}
