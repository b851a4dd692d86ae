package storagetest

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
)

var finishTests = map[string]func(*testing.T, *Harness){
	"AttemptHookPrecedesPlans": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createOne(spec("a"), spec("b", "a"))
		a := b.claimStep(id, "a")
		var (
			mu    sync.Mutex
			calls []string
		)
		note := func(what string) {
			mu.Lock()
			defer mu.Unlock()
			calls = append(calls, what)
		}
		ctx := storage.WithAttemptHook(b.ctx, func() { note("attempt") })
		plan := func(st *storage.InstanceState) (*storage.Plan, error) {
			note("plan")
			return Plan(st)
		}
		res, err := b.store.FinishSteps(ctx, []storage.StepResult{completed(a.Claim, `1`)}, plan)
		require.NoError(t, err)
		require.True(t, res[0].Accepted)
		mu.Lock()
		defer mu.Unlock()
		require.NotEmpty(t, calls)
		require.Equal(t, "attempt", calls[0], "the hook comes before the attempt's first plan")
		require.Equal(t, "plan", calls[len(calls)-1], "the committed attempt planned the instance")
	},

	"CompletionPlansDownstream": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createOne(spec("a"), spec("b", "a"), spec("skip1", "a"), spec("c", "skip1"))
		c := b.claimStep(id, "a")
		b.clock.Advance(2 * time.Second)
		require.Equal(t, []storage.FinishResult{{Accepted: true}}, b.finish(completed(c.Claim, `{"paid":true}`)))
		now := b.now()

		in := b.get(id)
		a := step(t, in, "a")
		require.Equal(t, storage.StepCompleted, a.Status)
		require.JSONEq(t, `{"paid":true}`, string(a.Output))
		require.NotNil(t, a.FinishedAt)
		require.True(t, a.FinishedAt.Equal(now))
		require.Nil(t, a.LeaseUntil)
		done := events(in, "a", storage.EventStepCompleted)
		require.Len(t, done, 1)
		require.Equal(t, 1, done[0].Attempt)

		bs := step(t, in, "b")
		require.Equal(t, storage.StepPending, bs.Status)
		require.JSONEq(t, string(stepInput(t, "b", map[string]string{"a": `{"paid":true}`})), string(bs.Input))
		require.True(t, bs.ReadyAt.Equal(now))
		require.True(t, bs.RunAfter.Equal(in.RunAfter), "due from its instance's run_after")
		require.Equal(t, storage.StepSkipped, step(t, in, "skip1").Status)
		require.Len(t, events(in, "skip1", storage.EventStepSkipped), 1)
		require.Equal(t, storage.StepPending, step(t, in, "c").Status, "a skipped step unblocks its dependents")
		require.Equal(t, storage.InstanceRunning, in.Status)

		b.complete(id, "b", `2`)
		b.complete(id, "c", `3`)
		in = b.get(id)
		require.Equal(t, storage.InstanceCompleted, in.Status)
		require.JSONEq(t, `{"steps":4}`, string(in.Output))
		require.NotNil(t, in.FinishedAt)
		require.Len(t, events(in, "", storage.EventInstanceCompleted), 1)
	},

	"FanInConcurrent": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		const n = 20
		ps := make([]storage.CreateParams, n)
		for i := range ps {
			ps[i] = params(spec("a"), spec("b", "a"), spec("c", "a"), spec("d", "b", "c"))
		}
		b.create(ps...)
		var rs []storage.StepResult
		for _, c := range b.claim(storage.ClaimParams{Limit: n}) {
			rs = append(rs, completed(c.Claim, `"a"`))
		}
		require.Len(t, rs, n)
		b.finish(rs...)
		mid := b.claim(storage.ClaimParams{Limit: 2 * n})
		require.Len(t, mid, 2*n)

		var (
			wg   sync.WaitGroup
			mu   sync.Mutex
			errs []error
		)
		for _, c := range mid {
			wg.Go(func() {
				res, err := b.store.FinishSteps(b.ctx, []storage.StepResult{completed(c.Claim, fmt.Sprintf("%q", c.Step))}, Plan)
				mu.Lock()
				defer mu.Unlock()
				if err == nil && (len(res) != 1 || !res[0].Accepted) {
					err = fmt.Errorf("finish %s of %s: %+v", c.Step, c.InstanceID, res)
				}
				errs = append(errs, err)
			})
		}
		wg.Wait()
		require.NoError(t, errors.Join(errs...))
		for _, p := range ps {
			in := b.get(p.ID)
			d := step(t, in, "d")
			require.Equal(t, storage.StepPending, d.Status)
			require.JSONEq(t, string(stepInput(t, "d", map[string]string{"b": `"b"`, "c": `"c"`})), string(d.Input))
			require.Len(t, events(in, "d", storage.EventStepReady), 1, "the join is promoted exactly once")
		}
		require.Len(t, b.claim(storage.ClaimParams{Limit: 2 * n}), n)
	},

	"RetryOutcome": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createOne(spec("a"), spec("b", "a"))
		c := b.claimStep(id, "a")
		b.clock.Advance(time.Second)
		res := b.finish(storage.StepResult{Claim: c.Claim, Outcome: storage.OutcomeRetry, Error: "timeout talking to bank", RunAfter: b.now().Add(5 * time.Second)})
		require.Equal(t, []storage.FinishResult{{Accepted: true}}, res)
		in := b.get(id)
		a := step(t, in, "a")
		require.Equal(t, storage.StepPending, a.Status)
		require.Equal(t, 1, a.Attempts)
		require.Equal(t, "timeout talking to bank", a.Error)
		require.True(t, a.RunAfter.Equal(b.now().Add(5*time.Second)), "run after %v", a.RunAfter)
		require.Nil(t, a.LeaseUntil)
		retrying := events(in, "a", storage.EventStepRetrying)
		require.Len(t, retrying, 1)
		require.Equal(t, 1, retrying[0].Attempt)
		require.Equal(t, "timeout talking to bank", retrying[0].Message)
		require.Equal(t, storage.StepBlocked, step(t, in, "b").Status, "a retry plans nothing")

		b.clock.Advance(5*time.Second - time.Millisecond)
		require.Empty(t, b.claim(storage.ClaimParams{}))
		b.clock.Advance(time.Millisecond)
		again := b.claimStep(id, "a")
		require.Equal(t, 2, again.Attempt)
		b.finish(completed(again.Claim, `1`))
		a = step(t, b.get(id), "a")
		require.Equal(t, storage.StepCompleted, a.Status)
		require.Empty(t, a.Error, "completion clears the error of earlier attempts")
	},

	"RetryDelayIsOnTheStoreClock": func(t *testing.T, h *Harness) {
		// A worker whose clock is off still gets its backoff: the delay
		// counts from the store's now, and a RunAfter in the past is
		// ignored.
		b := h.setup(t)
		id := b.createOne(spec("a"))
		c := b.claimStep(id, "a")
		b.clock.Advance(time.Second)
		res := b.finish(storage.StepResult{Claim: c.Claim, Outcome: storage.OutcomeRetry, Error: "busy",
			RunAfter: b.now().Add(-time.Hour), Delay: 3 * time.Second})
		require.Equal(t, []storage.FinishResult{{Accepted: true}}, res)
		a := step(t, b.get(id), "a")
		require.True(t, a.RunAfter.Equal(b.now().Add(3*time.Second)), "run after %v, now %v", a.RunAfter, b.now())
		require.Empty(t, b.claim(storage.ClaimParams{}))
		b.clock.Advance(3 * time.Second)
		require.Len(t, b.claim(storage.ClaimParams{}), 1)
	},

	"SnoozeDoesNotCountAttempt": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createOne(spec("a"))
		c := b.claimStep(id, "a")
		res := b.finish(storage.StepResult{Claim: c.Claim, Outcome: storage.OutcomeSnooze, RunAfter: start.Add(time.Hour)})
		require.Equal(t, []storage.FinishResult{{Accepted: true}}, res)
		in := b.get(id)
		a := step(t, in, "a")
		require.Equal(t, storage.StepPending, a.Status)
		require.Zero(t, a.Attempts)
		require.True(t, a.RunAfter.Equal(start.Add(time.Hour)))
		require.Len(t, events(in, "a", storage.EventStepSnoozed), 1)

		require.Empty(t, b.claim(storage.ClaimParams{}))
		b.clock.Advance(time.Hour)
		again := b.claimStep(id, "a")
		require.Equal(t, 1, again.Attempt)
		require.Greater(t, again.Fence, c.Fence)
		require.True(t, again.FirstStartedAt.Equal(start), "the first start survives a snooze")
	},

	"ASnoozedAttemptKeepsItsStart": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createOne(spec("a"), spec("b"))
		c := b.claimStep(id, "a")
		b.finish(storage.StepResult{Claim: c.Claim, Outcome: storage.OutcomeSnooze, RunAfter: start.Add(time.Hour)})
		b.clock.Advance(time.Hour)
		c = b.claimStep(id, "a")
		b.clock.Advance(time.Second)
		b.finish(storage.StepResult{Claim: c.Claim, Outcome: storage.OutcomeCompleted, Output: json.RawMessage(`1`)})
		a := step(t, b.get(id), "a")
		require.NotNil(t, a.StartedAt)
		require.True(t, a.StartedAt.Equal(start), "a snoozed attempt starts at its first claim: %v", a.StartedAt)
		require.True(t, a.FinishedAt.Equal(start.Add(time.Hour+time.Second)), "finished %v", a.FinishedAt)

		// A retry is a new attempt, which starts at its own claim.
		c = b.claimStep(id, "b")
		b.finish(storage.StepResult{Claim: c.Claim, Outcome: storage.OutcomeRetry, Error: "try again"})
		b.clock.Advance(time.Minute)
		c = b.claimStep(id, "b")
		require.Equal(t, 2, c.Attempt)
		require.True(t, step(t, b.get(id), "b").StartedAt.Equal(b.now()), "the second attempt starts at its claim")
	},

	"TerminalFailureFailsInstance": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createOne(spec("a"), spec("b"), spec("c", "a"), spec("d"))
		ca := b.claimStep(id, "a")
		cb := b.claimStep(id, "b")
		res := b.finish(storage.StepResult{Claim: ca.Claim, Outcome: storage.OutcomeFailed, Error: "card declined"})
		require.Equal(t, []storage.FinishResult{{Accepted: true}}, res)

		in := b.get(id)
		require.Equal(t, storage.InstanceFailed, in.Status)
		require.Equal(t, "step a failed", in.Error)
		require.NotNil(t, in.FinishedAt)
		a := step(t, in, "a")
		require.Equal(t, storage.StepFailed, a.Status)
		require.Equal(t, "card declined", a.Error)
		failed := events(in, "a", storage.EventStepFailed)
		require.Len(t, failed, 1)
		require.Equal(t, "card declined", failed[0].Message)
		require.Equal(t, storage.StepCancelled, step(t, in, "b").Status, "running siblings are cancelled with the instance")
		require.Len(t, events(in, "b", storage.EventStepCancelled), 1)
		require.Equal(t, storage.StepCancelled, step(t, in, "c").Status)
		require.Equal(t, storage.StepCancelled, step(t, in, "d").Status)
		require.Len(t, events(in, "d", storage.EventStepCancelled), 1)
		require.Len(t, events(in, "", storage.EventInstanceFailed), 1)
		require.Empty(t, b.claim(storage.ClaimParams{}))

		lost, err := b.store.ExtendLeases(b.ctx, []storage.Claim{cb.Claim}, time.Minute)
		require.NoError(t, err)
		require.Equal(t, []storage.Claim{cb.Claim}, lost, "the running sibling's claim is gone, so its worker stops the handler")
		require.Equal(t, []storage.FinishResult{{Cancelled: true}}, b.finish(completed(cb.Claim, `"late"`)),
			"a late result of a cancelled step is refused as a cancellation, not as a stale claim")
		in = b.get(id)
		require.Equal(t, storage.StepCancelled, step(t, in, "b").Status)
		require.Equal(t, storage.InstanceFailed, in.Status)
	},

	"RetryAfterInstanceFailedCancelsStep": func(t *testing.T, h *Harness) {
		// A step still running when its instance failed must not become
		// claimable again when its attempt asks for a retry.
		b := h.setup(t)
		id := b.createOne(spec("a"), spec("b"))
		ca := b.claimStep(id, "a")
		cb := b.claimStep(id, "b")
		b.finish(storage.StepResult{Claim: ca.Claim, Outcome: storage.OutcomeFailed, Error: "x"})
		res := b.finish(storage.StepResult{Claim: cb.Claim, Outcome: storage.OutcomeRetry, Error: "y", RunAfter: b.now()})
		require.Equal(t, []storage.FinishResult{{Cancelled: true}}, res)
		require.Equal(t, storage.StepCancelled, b.status(id, "b"))
		require.Empty(t, b.claim(storage.ClaimParams{}))
	},

	"RejectionsSayWhy": func(t *testing.T, h *Harness) {
		// In one group commit: a result whose claim another attempt took
		// over is stale; one whose instance was cancelled is a cancellation;
		// the worker logs only the first as a warning.
		b := h.setup(t)
		stale := b.createOne(spec("a"))
		first := b.claimStep(stale, "a")
		b.clock.Advance(time.Hour)
		n, err := b.store.RecoverExpired(b.ctx, 10, Plan)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		b.clock.Advance(time.Hour)
		second := b.claimStep(stale, "a")
		require.Greater(t, second.Fence, first.Fence)

		cancelled := b.createOne(spec("a"))
		c := b.claimStep(cancelled, "a")
		require.NoError(t, b.store.CancelInstance(b.ctx, cancelled, "by test", Plan))

		res := b.finish(completed(first.Claim, `1`), completed(c.Claim, `2`), completed(second.Claim, `3`))
		require.Equal(t, []storage.FinishResult{{}, {Cancelled: true}, {Accepted: true}}, res)
	},

	"GroupCommit": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		const n = 50
		ps := make([]storage.CreateParams, n)
		for i := range ps {
			ps[i] = params(spec("a"), spec("b", "a"))
		}
		b.create(ps...)
		claims := b.claim(storage.ClaimParams{Limit: n})
		require.Len(t, claims, n)
		var rs []storage.StepResult
		for i, c := range claims {
			switch i % 3 {
			case 0, 1:
				rs = append(rs, completed(c.Claim, fmt.Sprintf(`{"i":%d}`, i)))
			case 2:
				rs = append(rs, storage.StepResult{Claim: c.Claim, Outcome: storage.OutcomeRetry, Error: "again", RunAfter: b.now()})
			}
		}
		// A duplicate report of the same claim is stale by then.
		rs = append(rs, completed(claims[0].Claim, `"dup"`))
		res := b.finish(rs...)
		for i := range n {
			require.True(t, res[i].Accepted, "result %d", i)
		}
		require.False(t, res[n].Accepted)

		next := b.claim(storage.ClaimParams{Limit: 2 * n})
		require.Len(t, next, n)
		steps := map[string]int{}
		for _, c := range next {
			steps[c.Step]++
		}
		require.Equal(t, map[string]int{"a": n / 3, "b": n - n/3}, steps)
		var out json.RawMessage
		for _, c := range next {
			if c.InstanceID == claims[0].InstanceID {
				out = c.Input
			}
		}
		require.JSONEq(t, string(stepInput(t, "b", map[string]string{"a": `{"i":0}`})), string(out))
	},

	"UnknownOutcome": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createOne(spec("a"))
		c := b.claimStep(id, "a")
		_, err := b.store.FinishSteps(b.ctx, []storage.StepResult{completed(c.Claim, `1`), {Claim: c.Claim, Outcome: 99}}, Plan)
		require.Error(t, err)
		require.Equal(t, storage.StepRunning, b.status(id, "a"), "the whole batch rolled back")
	},

	"PlanErrorRollsBack": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createOne(spec("a"), spec("b", "a"))
		c := b.claimStep(id, "a")
		boom := errors.New("boom")
		_, err := b.store.FinishSteps(b.ctx, []storage.StepResult{completed(c.Claim, `1`)}, func(*storage.InstanceState) (*storage.Plan, error) {
			return nil, boom
		})
		require.ErrorIs(t, err, boom)
		in := b.get(id)
		require.Equal(t, storage.StepRunning, step(t, in, "a").Status)
		require.Empty(t, events(in, "a", storage.EventStepCompleted))
		require.Equal(t, []storage.FinishResult{{Accepted: true}}, b.finish(completed(c.Claim, `1`)), "the claim still holds")
	},

	"PlanSeesState": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createOne(spec("a"), spec("b", "a"))
		c := b.claimStep(id, "a")
		var seen *storage.InstanceState
		var def []byte
		_, err := b.store.FinishSteps(b.ctx, []storage.StepResult{completed(c.Claim, `{"x":1}`)}, func(st *storage.InstanceState) (*storage.Plan, error) {
			cp := *st // the store may update its state after the plan
			cp.Steps = slices.Clone(st.Steps)
			seen = &cp
			var err error
			def, err = st.LoadDefinition()
			if err != nil {
				return nil, err
			}
			return Plan(st)
		})
		require.NoError(t, err)
		require.NotNil(t, seen)
		require.Equal(t, id, seen.ID)
		require.Equal(t, "wf", seen.Workflow)
		require.Equal(t, storage.InstanceRunning, seen.Status)
		require.JSONEq(t, `{"order":42}`, string(seen.Input))
		require.Len(t, seen.Steps, 2)
		require.Equal(t, "a", seen.Steps[0].Name)
		require.Equal(t, storage.StepCompleted, seen.Steps[0].Status)
		require.JSONEq(t, `{"x":1}`, string(seen.Steps[0].Output))
		require.Equal(t, 1, seen.Steps[0].Attempts)
		require.Equal(t, "b", seen.Steps[1].Name)
		require.Equal(t, []string{"a"}, seen.Steps[1].DependsOn)
		require.Equal(t, storage.StepBlocked, seen.Steps[1].Status)
		require.Equal(t, "name: wf\n", string(def))
	},
}
