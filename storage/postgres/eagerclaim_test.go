package postgres

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/storagetest"
)

// eagerFixture is a worker (see newWorker) whose store s has a subscriber,
// as a worker's claim loop does, and a listener that LISTENs.
type eagerFixture struct {
	*worker
	signals <-chan struct{}
}

func newEagerFixture(t *testing.T, app string) *eagerFixture {
	t.Helper()
	w := newWorker(t, app, nil)
	ch, cancel := w.s.Subscribe(nil)
	t.Cleanup(cancel)
	f := &eagerFixture{worker: w, signals: ch}
	f.look(1) // a short claim: the store listens, and signals once it does
	awaitListener(t, w.s, 0)
	awaitSignal(t, ch, 10*time.Second, "the listener's first LISTEN")
	return f
}

// startOwn creates n instances of one step in the worker's own store.
func (f *eagerFixture) startOwn(n int, runAfter time.Time) {
	f.t.Helper()
	for range n {
		p := params(spec("a"))
		p.RunAfter = runAfter
		_, err := f.s.CreateInstances(f.t.Context(), nil, []storage.CreateParams{p}, storagetest.Plan)
		require.NoError(f.t, err)
	}
}

// look is the claim loop's claim of up to limit steps, with the next wake.
func (f *eagerFixture) look(limit int) []storage.ClaimedStep {
	f.t.Helper()
	claimed, _, err := f.s.ClaimStepsAndWake(f.t.Context(), storage.ClaimParams{WorkerID: "w", Limit: limit, Lease: time.Minute})
	require.NoError(f.t, err)
	return claimed
}

// finish completes step with an eager claim of one step, and returns what
// the claim took and whether the store left it out.
func (f *eagerFixture) finish(step storage.ClaimedStep) (claimed []storage.ClaimedStep, skipped bool) {
	f.t.Helper()
	before := f.s.skippedClaims.Load()
	results, claimed, err := f.s.FinishAndClaim(f.t.Context(), []storage.StepResult{{Claim: step.Claim, Outcome: storage.OutcomeCompleted,
		Output: json.RawMessage(`1`)}}, storagetest.Plan, storage.ClaimParams{WorkerID: "w", Limit: 1, Lease: time.Minute})
	require.NoError(f.t, err)
	require.True(f.t, results[0].Accepted, "the finish was refused")
	return claimed, f.s.skippedClaims.Load() > before
}

// TestFinishLeavesOutAClaimThatCanFindNothing: a finish that makes nothing
// ready leaves its eager claim out while its worker's claim loop last
// found nothing to claim and nothing due later, and nothing was signalled
// since; a step made ready since, by this process or another, is claimed
// by the next finish once the store heard of it, and a look that found a
// step due later, or a store with no listener, keeps the claim.
func TestFinishLeavesOutAClaimThatCanFindNothing(t *testing.T) {
	t.Parallel()

	t.Run("settled, then another process's step", func(t *testing.T) {
		t.Parallel()
		f := newEagerFixture(t, "eager-other")
		f.startOwn(2, time.Time{})
		drain(f.signals)
		steps := f.look(3)
		require.Len(t, steps, 2, "the claim loop takes both steps and comes back short")

		claimed, skipped := f.finish(steps[0])
		require.True(t, skipped, "a finish that made nothing ready claimed for a settled claim loop")
		require.Empty(t, claimed)

		f.create() // another process makes a step ready
		awaitSignal(t, f.signals, 10*time.Second, "another process's commit")
		claimed, skipped = f.finish(steps[1])
		require.False(t, skipped, "the claim was left out after the store heard of a ready step")
		require.Len(t, claimed, 1, "the eager claim took the step another process made ready")
	})

	t.Run("settled, then a step of its own", func(t *testing.T) {
		t.Parallel()
		f := newEagerFixture(t, "eager-own")
		f.startOwn(1, time.Time{})
		steps := f.look(3)
		require.Len(t, steps, 1)
		f.startOwn(1, time.Time{}) // this process's commit signals
		claimed, skipped := f.finish(steps[0])
		require.False(t, skipped)
		require.Len(t, claimed, 1, "the eager claim took the step this process made ready")
	})

	t.Run("a step due later", func(t *testing.T) {
		t.Parallel()
		f := newEagerFixture(t, "eager-due")
		f.startOwn(1, time.Time{})
		f.startOwn(1, time.Now().Add(time.Hour))
		steps := f.look(3)
		require.Len(t, steps, 1, "the delayed step is not claimable yet")
		claimed, skipped := f.finish(steps[0])
		require.False(t, skipped, "the claim was left out while a step comes due later")
		require.Empty(t, claimed)
	})

	t.Run("a finish that makes a step ready", func(t *testing.T) {
		t.Parallel()
		f := newEagerFixture(t, "eager-chain")
		_, err := f.s.CreateInstances(t.Context(), nil, []storage.CreateParams{params(spec("a"), spec("b", "a"))}, storagetest.Plan)
		require.NoError(t, err)
		steps := f.look(3)
		require.Len(t, steps, 1)
		claimed, skipped := f.finish(steps[0])
		require.False(t, skipped)
		require.Len(t, claimed, 1)
		require.Equal(t, "b", claimed[0].Step)
	})

	t.Run("no listener", func(t *testing.T) {
		t.Parallel()
		w := newWorker(t, "eager-deaf", nil) // no subscriber: no listener
		f := &eagerFixture{worker: w}
		f.startOwn(1, time.Time{})
		steps := f.look(3)
		require.Len(t, steps, 1)
		claimed, skipped := f.finish(steps[0])
		require.False(t, skipped, "a store that hears of no other process's commit left its claim out")
		require.Empty(t, claimed)
	})
}

// TestClaimersSettled: a claim loop's look is settled until the store
// signals again, or a later look of the same worker and filters is not
// settled; another worker's, or other filters', looks are their own.
func TestClaimersSettled(t *testing.T) {
	w := storage.ClaimParams{WorkerID: "w", Limit: 2}
	queued := storage.ClaimParams{WorkerID: "w", Limit: 2, Queues: []string{"q"}}
	other := storage.ClaimParams{WorkerID: "x", Limit: 2}
	c := newClaimers()
	require.False(t, c.settledSince(w, 0), "settled before any look")
	c.looked(w, 3, true)
	require.True(t, c.settledSince(w, 3))
	require.False(t, c.settledSince(w, 4), "settled after a signal")
	require.False(t, c.settledSince(queued, 3), "another filter's look")
	require.False(t, c.settledSince(other, 3), "another worker's look")
	c.looked(other, 3, true)
	c.looked(w, 3, false)
	require.False(t, c.settledSince(w, 3), "settled after a look that was not")
	require.True(t, c.settledSince(other, 3))
}

// TestSettledHandoffWritesWhatAHandoffWrites: a settled worker's finish
// hands off the step its plan makes ready without walking the ready index,
// and leaves the same history, claim and steps as a worker's that is not
// settled (whose store has no listener).
func TestSettledHandoffWritesWhatAHandoffWrites(t *testing.T) {
	t.Parallel()
	type outcome struct {
		claimed []string
		events  []string
		steps   []string
	}
	run := func(t *testing.T, f *eagerFixture) outcome {
		t.Helper()
		p := params(spec("a"), spec("b", "a"), spec("c", "a"))
		_, err := f.s.CreateInstances(t.Context(), nil, []storage.CreateParams{p}, storagetest.Plan)
		require.NoError(t, err)
		steps := f.look(3)
		require.Len(t, steps, 1)
		results, claimed, err := f.s.FinishAndClaim(t.Context(), []storage.StepResult{{Claim: steps[0].Claim, Outcome: storage.OutcomeCompleted,
			Output: json.RawMessage(`1`)}}, storagetest.Plan, storage.ClaimParams{WorkerID: "w", Limit: 1, Lease: time.Minute})
		require.NoError(t, err)
		require.True(t, results[0].Accepted)
		var out outcome
		for _, c := range claimed {
			out.claimed = append(out.claimed, fmt.Sprintf("%s attempt %d fence %d", c.Step, c.Attempt, c.Fence))
		}
		events, err := f.s.ListEvents(t.Context(), storage.EventsParams{InstanceID: p.ID})
		require.NoError(t, err)
		for _, e := range events {
			out.events = append(out.events, fmt.Sprintf("%s %s %d %q", e.Type, e.Step, e.Attempt, e.Message))
		}
		st, err := f.s.GetInstance(t.Context(), p.ID)
		require.NoError(t, err)
		for _, s := range st.Steps {
			out.steps = append(out.steps, fmt.Sprintf("%s %s %d", s.Name, s.Status, s.Attempts))
		}
		return out
	}

	settled := newEagerFixture(t, "handoff-settled")
	got := run(t, settled)
	require.EqualValues(t, 1, settled.s.settledHandoffs.Load(), "a settled worker's finish walked the ready index")

	deaf := &eagerFixture{worker: newWorker(t, "handoff-deaf", nil)}
	want := run(t, deaf)
	require.Zero(t, deaf.s.settledHandoffs.Load(), "a worker that hears of no other process's commit took a settled hand-off")

	require.Equal(t, want, got)
	require.Equal(t, []string{"b attempt 1 fence 1"}, got.claimed, "the claim took the first readied step in claim order")
	require.Contains(t, got.steps, "c pending 0", "the readied step the claim left is pending")
}
