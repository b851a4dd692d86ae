package storagetest

import (
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
)

// waitSpec is a wait step (its name must begin with "await", see Plan)
// waiting for signal, for at most timeout (0: for ever).
func waitSpec(name, signal string, timeout time.Duration, deps ...string) storage.StepSpec {
	s := spec(name, deps...)
	s.Handler = ""
	s.Wait = &storage.WaitSpec{Signal: signal, Timeout: timeout}
	return s
}

func (b *bundle) signal(p storage.SignalParams) (storage.SignalResult, error) {
	b.t.Helper()
	return b.store.SendSignal(b.ctx, p, Plan)
}

func (b *bundle) mustSignal(p storage.SignalParams) storage.SignalResult {
	b.t.Helper()
	res, err := b.signal(p)
	require.NoError(b.t, err)
	return res
}

var signalTests = map[string]func(*testing.T, *Harness){
	// A signal is sent by hand, like an operation: its events say by whom,
	// whether it was delivered or stored for later.
	"RecordsItsSender": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createOne(waitSpec("await-approval", "approve", 0), spec("first"), waitSpec("await-later", "later", 0, "first"))
		byBob := storage.WithActor(b.ctx, "bob")
		_, err := b.store.SendSignal(byBob, storage.SignalParams{InstanceID: id, Name: "approve", Payload: json.RawMessage(`1`)}, Plan)
		require.NoError(t, err)
		_, err = b.store.SendSignal(byBob, storage.SignalParams{InstanceID: id, Name: "later", Payload: json.RawMessage(`2`)}, Plan)
		require.NoError(t, err)
		in := b.get(id)
		delivered := events(in, "await-approval", storage.EventStepCompleted)
		require.Len(t, delivered, 1)
		require.Equal(t, "bob", delivered[0].Actor, "the delivery")
		stored := events(in, "", storage.EventSignalReceived)
		require.Len(t, stored, 1)
		require.Equal(t, "bob", stored[0].Actor, "a signal stored for a step not yet waiting")
		require.Empty(t, events(in, "first", storage.EventStepReady)[0].Actor, "what the engine did before")
	},
	"DeliveredToAWaitingStepReadiesItsDependents": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createOne(waitSpec("await-approval", "approve", time.Hour), spec("ship", "await-approval"))
		w := step(t, b.get(id), "await-approval")
		require.Equal(t, storage.StepWaiting, w.Status)
		require.Equal(t, "approve", w.Signal)
		require.NotNil(t, w.Deadline)
		require.True(t, w.Deadline.Equal(start.Add(time.Hour)), "deadline %v", w.Deadline)
		require.Empty(t, b.claim(storage.ClaimParams{}), "a waiting step is never claimed")
		waiting := b.get(id)
		require.Equal(t, storage.InstanceRunning, waiting.Status, "a step that waits has started its instance")
		require.NotNil(t, waiting.StartedAt)
		require.Len(t, events(waiting, "", storage.EventInstanceStarted), 1)

		b.clock.Advance(time.Minute)
		res := b.mustSignal(storage.SignalParams{InstanceID: id, Name: "approve", Payload: json.RawMessage(`{"approved":true}`)})
		require.Equal(t, storage.SignalResult{InstanceID: id, Delivered: true}, res)
		in := b.get(id)
		w = step(t, in, "await-approval")
		require.Equal(t, storage.StepCompleted, w.Status)
		require.JSONEq(t, `{"approved":true}`, string(w.Output))
		require.Nil(t, w.Deadline)
		require.Equal(t, storage.StepPending, step(t, in, "ship").Status, "dependents are ready in the same transaction")
		require.JSONEq(t, `{"step":"ship","deps":{"await-approval":{"approved":true}}}`, string(step(t, in, "ship").Input))
		require.Len(t, events(in, "await-approval", storage.EventStepCompleted), 1)
		require.Equal(t, "signal approve received", events(in, "await-approval", storage.EventStepCompleted)[0].Message)
		require.Equal(t, "waiting for signal approve", events(in, "await-approval", storage.EventStepReady)[0].Message)
	},
	// A wait step starts when it begins to wait (at the start, or when its
	// dependencies complete), and ends when its signal comes; one that
	// finds its signal stored starts and ends at once.
	"AWaitStepStartsWhenItWaits": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createOne(waitSpec("await-root", "root", 0), spec("first"), waitSpec("await-later", "later", 0, "first"),
			spec("second"), waitSpec("await-stored", "stored", 0, "second"))
		root := step(t, b.get(id), "await-root")
		require.NotNil(t, root.StartedAt, "a wait step that waits from the start")
		require.True(t, root.StartedAt.Equal(start), "started %v", root.StartedAt)
		require.Nil(t, step(t, b.get(id), "await-later").StartedAt, "blocked: not started")

		b.clock.Advance(time.Minute)
		b.complete(id, "first", `1`)
		later := step(t, b.get(id), "await-later")
		require.Equal(t, storage.StepWaiting, later.Status)
		require.NotNil(t, later.StartedAt)
		require.True(t, later.StartedAt.Equal(b.now()), "started %v, want %v", later.StartedAt, b.now())

		b.mustSignal(storage.SignalParams{InstanceID: id, Name: "stored", Payload: json.RawMessage(`1`)})
		b.clock.Advance(time.Minute)
		b.complete(id, "second", `2`)
		stored := step(t, b.get(id), "await-stored")
		require.Equal(t, storage.StepCompleted, stored.Status)
		require.NotNil(t, stored.StartedAt)
		require.True(t, stored.StartedAt.Equal(b.now()), "started %v, want %v", stored.StartedAt, b.now())
		require.True(t, stored.FinishedAt.Equal(b.now()))

		b.clock.Advance(time.Minute)
		b.mustSignal(storage.SignalParams{InstanceID: id, Name: "root", Payload: json.RawMessage(`3`)})
		root = step(t, b.get(id), "await-root")
		require.True(t, root.StartedAt.Equal(start), "its start is kept: %v", root.StartedAt)
		require.True(t, root.FinishedAt.Equal(b.now()))
	},
	"StoredBeforeTheStepWaitsThenDelivered": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createOne(spec("first"), waitSpec("await-confirm", "confirm", 0, "first"), spec("next", "await-confirm"))
		res := b.mustSignal(storage.SignalParams{InstanceID: id, Name: "confirm", ID: "evt-1", Payload: json.RawMessage(`"paid"`)})
		require.Equal(t, storage.SignalResult{InstanceID: id}, res, "stored, not delivered")
		require.Equal(t, storage.StepBlocked, b.status(id, "await-confirm"))

		b.complete(id, "first", `1`)
		in := b.get(id)
		w := step(t, in, "await-confirm")
		require.Equal(t, storage.StepCompleted, w.Status, "the stored signal completes the step as it becomes ready")
		require.JSONEq(t, `"paid"`, string(w.Output))
		require.Nil(t, w.Deadline)
		require.Equal(t, storage.StepPending, step(t, in, "next").Status)
		// Its history is a wait's, as when the signal comes later: ready,
		// waiting for its signal, then completed by it.
		var history []string
		for _, e := range in.Events {
			if e.Step == "await-confirm" {
				history = append(history, string(e.Type)+": "+e.Message)
			}
		}
		require.Equal(t, []string{"step.ready: waiting for signal confirm", "step.completed: signal confirm received"}, history)

		// Delivered once: the same ID again changes nothing.
		again := b.mustSignal(storage.SignalParams{InstanceID: id, Name: "confirm", ID: "evt-1", Payload: json.RawMessage(`"other"`)})
		require.Equal(t, storage.SignalResult{InstanceID: id, Duplicate: true}, again)
		require.JSONEq(t, `"paid"`, string(step(t, b.get(id), "await-confirm").Output))
	},
	"RepeatIsDuplicateWithTheSameIDElseConflict": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createOne(waitSpec("await-a", "a", 0), waitSpec("await-b", "b", 0))
		b.mustSignal(storage.SignalParams{InstanceID: id, Name: "a", ID: "x", Payload: json.RawMessage(`1`)})
		before := b.get(id)
		tests := []struct {
			name string
			p    storage.SignalParams
			dup  bool
		}{
			{"same ID", storage.SignalParams{InstanceID: id, Name: "a", ID: "x", Payload: json.RawMessage(`2`)}, true},
			{"another ID", storage.SignalParams{InstanceID: id, Name: "a", ID: "y", Payload: json.RawMessage(`2`)}, false},
			{"no ID", storage.SignalParams{InstanceID: id, Name: "a", Payload: json.RawMessage(`2`)}, false},
		}
		for _, tt := range tests {
			res, err := b.signal(tt.p)
			if tt.dup {
				require.NoError(t, err, tt.name)
				require.Equal(t, storage.SignalResult{InstanceID: id, Duplicate: true}, res, tt.name)
				continue
			}
			require.ErrorIs(t, err, storage.ErrConflict, tt.name)
			require.Contains(t, err.Error(), "signal a was already sent to instance "+id+" and delivered (a repeat carrying", tt.name)
		}
		require.Equal(t, before.Events, b.get(id).Events, "a duplicate or a conflict writes nothing")
		// Without an ID, a repeat is always a conflict.
		b.mustSignal(storage.SignalParams{InstanceID: id, Name: "b"})
		_, err := b.signal(storage.SignalParams{InstanceID: id, Name: "b"})
		require.ErrorIs(t, err, storage.ErrConflict)
	},
	"FinishedOrMissingInstanceRefuses": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createOne(waitSpec("await-a", "a", 0))
		require.NoError(t, b.store.CancelInstance(b.ctx, id, "no", Plan))
		w := step(t, b.get(id), "await-a")
		require.Equal(t, storage.StepCancelled, w.Status, "cancelling cancels a waiting step")
		_, err := b.signal(storage.SignalParams{InstanceID: id, Name: "a"})
		require.ErrorIs(t, err, storage.ErrConflict)
		require.Contains(t, err.Error(), "instance "+id+" is already cancelled and takes no more signals")
		_, err = b.signal(storage.SignalParams{InstanceID: "inst-missing", Name: "a"})
		require.ErrorIs(t, err, storage.ErrNotFound)
		_, err = b.signal(storage.SignalParams{Workflow: "wf", Key: "missing", Name: "a"})
		require.ErrorIs(t, err, storage.ErrNotFound)
	},
	"RefusedByAWaitStepThatFinished": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		// The suite's plan skips a step named skip*: the wait step is
		// skipped at once, and the other step keeps the instance running.
		id := b.createOne(waitSpec("skip-await", "a", 0), spec("work"))
		require.Equal(t, storage.StepSkipped, step(t, b.get(id), "skip-await").Status)
		before := b.get(id).Events
		_, err := b.signal(storage.SignalParams{InstanceID: id, Name: "a", ID: "s1"})
		require.ErrorIs(t, err, storage.ErrConflict)
		require.Contains(t, err.Error(), "step skip-await of instance "+id+", which waited for signal a, is already skipped")
		require.Equal(t, before, b.get(id).Events, "a refused signal writes nothing")
		// Nor is it stored: a second sender is refused the same way, not
		// told that the first one's signal waits.
		_, err = b.signal(storage.SignalParams{InstanceID: id, Name: "a", ID: "s2"})
		require.Contains(t, err.Error(), "is already skipped")
	},
	"ByWorkflowAndKey": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		p := params(waitSpec("await-a", "a", 0))
		p.Key = "order-7"
		b.create(p)
		res := b.mustSignal(storage.SignalParams{Workflow: "wf", Key: "order-7", Name: "a", Payload: json.RawMessage(`true`)})
		require.Equal(t, storage.SignalResult{InstanceID: p.ID, Delivered: true}, res)
		require.Equal(t, storage.InstanceCompleted, b.get(p.ID).Status)
	},
	"TimeoutFailsTheStepByTheStoreClock": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createOne(waitSpec("await-approval", "approve", 72*time.Hour))
		n, err := b.store.ExpireWaits(b.ctx, 0, Plan)
		require.NoError(t, err)
		require.Zero(t, n)
		b.clock.Advance(72*time.Hour - time.Second)
		n, err = b.store.ExpireWaits(b.ctx, 0, Plan)
		require.NoError(t, err)
		require.Zero(t, n, "not yet")
		b.clock.Advance(time.Second)
		n, err = b.store.ExpireWaits(b.ctx, 0, Plan)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		in := b.get(id)
		w := step(t, in, "await-approval")
		require.Equal(t, storage.StepFailed, w.Status)
		require.Equal(t, "no signal approve within 72h", w.Error)
		require.Nil(t, w.Deadline)
		require.Equal(t, storage.InstanceFailed, in.Status, "the instance is planned after the timeout")
		require.Equal(t, "no signal approve within 72h", events(in, "await-approval", storage.EventStepFailed)[0].Message)

		// Retry re-arms the wait with a fresh deadline.
		b.clock.Advance(time.Hour)
		require.NoError(t, b.store.RetryInstance(b.ctx, id, Plan))
		w = step(t, b.get(id), "await-approval")
		require.Equal(t, storage.StepWaiting, w.Status)
		require.True(t, w.Deadline.Equal(b.now().Add(72*time.Hour)), "deadline %v", w.Deadline)
		b.mustSignal(storage.SignalParams{InstanceID: id, Name: "approve"})
		require.Equal(t, storage.InstanceCompleted, b.get(id).Status)
	},
	"CancelledWaitIsReArmedByRetry": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createOne(waitSpec("await-a", "a", time.Hour), spec("after", "await-a"))
		require.NoError(t, b.store.CancelInstance(b.ctx, id, "by hand", Plan))
		w := step(t, b.get(id), "await-a")
		require.Equal(t, storage.StepCancelled, w.Status)
		require.Nil(t, w.Deadline)
		n, err := b.store.ExpireWaits(b.ctx, 0, Plan)
		require.NoError(t, err)
		require.Zero(t, n, "a cancelled wait no longer times out")

		b.clock.Advance(2 * time.Hour)
		require.NoError(t, b.store.RetryInstance(b.ctx, id, Plan))
		w = step(t, b.get(id), "await-a")
		require.Equal(t, storage.StepWaiting, w.Status)
		require.True(t, w.Deadline.Equal(b.now().Add(time.Hour)), "a fresh deadline: %v", w.Deadline)
		res := b.mustSignal(storage.SignalParams{InstanceID: id, Name: "a", Payload: json.RawMessage(`7`)})
		require.True(t, res.Delivered)
		require.Equal(t, storage.StepPending, b.status(id, "after"))
	},
	"StatsCountWaitingSteps": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		b.createOne(waitSpec("await-a", "a", 0), waitSpec("await-b", "b", 0))
		st, err := b.store.Stats(b.ctx)
		require.NoError(t, err)
		require.Len(t, st.Workflows, 1)
		require.Equal(t, 2, st.Workflows[0].WaitingSteps)
		require.Empty(t, st.Queues, "waiting steps are no queue's work")
	},
	"PruneDeletesSignals": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		p := params(waitSpec("await-a", "a", 0))
		b.create(p)
		b.mustSignal(storage.SignalParams{InstanceID: p.ID, Name: "a", ID: "first"})
		b.clock.Advance(time.Hour)
		n, err := b.store.Prune(b.ctx, b.now(), false)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		// An instance of the same ID takes the signal afresh: nothing of
		// the pruned one's is left.
		b.create(p)
		res := b.mustSignal(storage.SignalParams{InstanceID: p.ID, Name: "a", ID: "second"})
		require.True(t, res.Delivered)
	},
	"TwoRacingSendersOneWins": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		for range 5 {
			id := b.createOne(waitSpec("await-a", "a", 0), spec("after", "await-a"))
			var (
				wg   sync.WaitGroup
				errs [2]error
			)
			for i := range errs {
				wg.Go(func() {
					_, errs[i] = b.store.SendSignal(b.ctx, storage.SignalParams{InstanceID: id, Name: "a",
						ID: []string{"left", "right"}[i], Payload: json.RawMessage([]string{`"left"`, `"right"`}[i])}, Plan)
				})
			}
			wg.Wait()
			won := 0
			for _, err := range errs {
				if err == nil {
					won++
				} else {
					require.ErrorIs(t, err, storage.ErrConflict)
				}
			}
			require.Equal(t, 1, won, "exactly one sender wins: %v", errs)
			in := b.get(id)
			require.Len(t, events(in, "await-a", storage.EventStepCompleted), 1)
			require.Equal(t, storage.StepPending, step(t, in, "after").Status)
		}
	},
	"NextWakeIsTheEarliestDueStepOrDeadline": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		next, err := b.store.NextWake(b.ctx, storage.ClaimParams{})
		require.NoError(t, err)
		require.True(t, next.IsZero(), "nothing to wake for: %v", next)
		b.createOne(waitSpec("await-a", "a", time.Hour))
		id := b.createOne(spec("sleepy"))
		c := b.claimStep(id, "sleepy")
		b.finish(storage.StepResult{Claim: c.Claim, Outcome: storage.OutcomeSnooze, RunAfter: start.Add(10 * time.Minute)})
		tests := []struct {
			name string
			p    storage.ClaimParams
			want time.Time
		}{
			{"any step", storage.ClaimParams{}, start.Add(10 * time.Minute)},
			{"its queue and handler", storage.ClaimParams{Queues: []string{"q.sleepy"}, Handlers: []string{"h.sleepy"}}, start.Add(10 * time.Minute)},
			{"another queue: only the deadline", storage.ClaimParams{Queues: []string{"q.other"}}, start.Add(time.Hour)},
			{"another handler: only the deadline", storage.ClaimParams{Handlers: []string{"h.other"}}, start.Add(time.Hour)},
		}
		for _, tt := range tests {
			next, err := b.store.NextWake(b.ctx, tt.p)
			require.NoError(t, err)
			require.True(t, next.Equal(tt.want), "%s: got %v, want %v", tt.name, next, tt.want)
		}
	},
	"OnlyAWaitStepWaits": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		p := params(spec("await-not-a-wait-step"))
		_, err := b.store.CreateInstances(b.ctx, nil, []storage.CreateParams{p}, Plan)
		require.Error(t, err)
		require.Contains(t, err.Error(), "is not a wait step")
		require.False(t, errors.Is(err, storage.ErrConflict))
	},
}
