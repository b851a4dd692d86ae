package storagetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
)

// handlerTests: a claim that names handlers never takes a step of another
// handler, on every claim path, whatever else it filters on.
var handlerTests = map[string]func(*testing.T, *Harness){
	"ClaimStepsTakesOnlyListedHandlers": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createOne(spec("a"), spec("b"), spec("c"))
		cases := []struct {
			name string
			p    storage.ClaimParams
		}{
			{"any queue", storage.ClaimParams{}},
			{"one queue", storage.ClaimParams{Queues: []string{"q.b"}}},
			{"queues", storage.ClaimParams{Queues: []string{"q.a", "q.b"}}},
			{"instance", storage.ClaimParams{InstanceID: id}},
			{"instance and queue", storage.ClaimParams{InstanceID: id, Queues: []string{"q.b"}}},
		}
		for _, c := range cases {
			c.p.Handlers = []string{"h.other", "h.x"}
			require.Empty(t, b.claim(c.p), "%s: no step has these handlers", c.name)
		}
		got := b.claim(storage.ClaimParams{Handlers: []string{"h.b", "h.other"}})
		require.Len(t, got, 1)
		require.Equal(t, "b", got[0].Step)
		got = b.claim(storage.ClaimParams{InstanceID: id, Queues: []string{"q.a", "q.c"}, Handlers: []string{"h.c"}})
		require.Len(t, got, 1)
		require.Equal(t, "c", got[0].Step)
		require.Equal(t, storage.StepPending, b.status(id, "a"), "a step no claimer had stays pending")
		require.Zero(t, step(t, b.get(id), "a").Attempts, "and no attempt of it was spent")
		got = b.claim(storage.ClaimParams{}) // empty Handlers: any handler
		require.Len(t, got, 1)
		require.Equal(t, "a", got[0].Step)
	},

	// A claim that names its handlers takes its steps in claim order
	// however many ready steps of other handlers come first (a backlog of
	// a handler no live worker has): the first by priority, then age,
	// across its handlers, and no more than it asks for.
	"ClaimPastOtherHandlersKeepsClaimOrder": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		create := func(name string, priority int) string {
			p := params(spec(name))
			p.Priority = priority
			b.create(p)
			return p.ID
		}
		create("theirs", 9)
		for range 30 {
			create("theirs", 0)
		}
		a1, b1, a2, b2, a3 := create("a", 0), create("b", 5), create("a", 5), create("b", 0), create("a", 1)
		create("theirs", 9)
		// One of the other handler's steps heads queue q.a too.
		inA := params(spec("theirs"))
		inA.Steps[0].Queue = "q.a"
		inA.Priority = 9
		b.create(inA)
		claimed := func(p storage.ClaimParams) []string {
			t.Helper()
			var ids []string
			for _, c := range b.claim(p) {
				ids = append(ids, c.InstanceID)
			}
			return ids
		}
		mine := []string{"h.a", "h.b", "h.none"}
		require.Equal(t, []string{b1, a2, a3}, claimed(storage.ClaimParams{Handlers: mine, Limit: 3}))
		require.Equal(t, []string{a1}, claimed(storage.ClaimParams{Handlers: mine, Queues: []string{"q.a"}}))
		require.Equal(t, []string{b2}, claimed(storage.ClaimParams{Handlers: mine}))
		require.Empty(t, claimed(storage.ClaimParams{Handlers: mine}))
		require.Len(t, claimed(storage.ClaimParams{Handlers: []string{"h.theirs"}}), 33, "the other handler's steps wait as they were")
	},

	"FinishAndClaimPastOtherHandlers": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		fc, ok := b.store.(storage.FinishClaimer)
		if !ok {
			t.Skip("the store does not claim while finishing")
		}
		for range 30 {
			b.createOne(spec("theirs"))
		}
		other := b.createOne(spec("c"))
		id := b.createOne(spec("a"), spec("c", "a"))
		a := b.claimStep(id, "a")
		_, claimed, err := fc.FinishAndClaim(b.ctx, []storage.StepResult{completed(a.Claim, `1`)}, Plan,
			storage.ClaimParams{WorkerID: "eager", Limit: 5, Lease: time.Minute, Handlers: []string{"h.c"}})
		require.NoError(t, err)
		var ids []string
		for _, c := range claimed {
			require.Equal(t, "c", c.Step)
			ids = append(ids, c.InstanceID)
		}
		require.ElementsMatch(t, []string{other, id}, ids, "the step its finish made ready and the one ready before")
	},

	"FinishAndClaimTakesOnlyListedHandlers": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		fc, ok := b.store.(storage.FinishClaimer)
		if !ok {
			t.Skip("the store does not claim while finishing")
		}
		id := b.createOne(spec("a"), spec("b", "a"), spec("c", "a"))
		c := b.claimStep(id, "a")
		_, claimed, err := fc.FinishAndClaim(b.ctx, []storage.StepResult{completed(c.Claim, `1`)}, Plan,
			storage.ClaimParams{WorkerID: "eager", Limit: 5, Lease: time.Minute, Handlers: []string{"h.c"}})
		require.NoError(t, err)
		require.Len(t, claimed, 1)
		require.Equal(t, "c", claimed[0].Step)
		require.Equal(t, storage.StepPending, b.status(id, "b"))
	},

	"CreateAndClaimTakesOnlyListedHandlers": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		cc, ok := b.store.(storage.CreateClaimer)
		if !ok {
			t.Skip("the store does not claim while creating")
		}
		p := params(spec("a"), spec("b"))
		_, claimed, err := cc.CreateAndClaim(b.ctx, []storage.CreateParams{p}, Plan,
			storage.ClaimParams{WorkerID: "eager", Limit: 5, Lease: time.Minute, Handlers: []string{"h.b"}})
		require.NoError(t, err)
		require.Len(t, claimed, 1)
		require.Equal(t, "b", claimed[0].Step)
		require.Equal(t, storage.StepPending, b.status(p.ID, "a"))
		_, claimed, err = cc.CreateAndClaim(b.ctx, []storage.CreateParams{params(spec("a"))}, Plan,
			storage.ClaimParams{WorkerID: "eager", Limit: 5, Lease: time.Minute, Handlers: []string{"h.none"}})
		require.NoError(t, err)
		require.Empty(t, claimed)
	},
}
