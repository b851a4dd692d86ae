package storagetest

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
)

// onFailureSpec is an onFailure step (its name must begin with "onfail",
// see FailurePlan).
func onFailureSpec(name string, deps ...string) storage.StepSpec {
	s := spec(name, deps...)
	s.OnFailure = true
	return s
}

// FailurePlan is Plan with onFailure steps, a stand-in for the engine's:
// the steps whose names begin with "onfail" run only when the instance
// fails. A failed main step, a step whose name begins with "bad" (made
// failed as it becomes ready, as an expression error would), or a
// timeout fails the instance: its failure is recorded and the onFailure
// steps run (pending with Plan's input once their dependencies
// completed); when none is left to run it fails with the recorded
// error. A completed instance skips them. A step's failure while main
// steps run an attempt (every running main step does here: there are no
// forEach or workflow steps) is recorded even without onFailure steps,
// and the onFailure steps wait, as the instance does, until no main step
// runs or is pending any more (a timeout cancels them).
func FailurePlan(st *storage.InstanceState) (*storage.Plan, error) {
	main, onFail := *st, *st
	main.Steps, onFail.Steps = nil, nil
	inFlight := false
	for _, s := range st.Steps {
		if strings.HasPrefix(s.Name, "onfail") {
			onFail.Steps = append(onFail.Steps, s)
		} else {
			main.Steps = append(main.Steps, s)
			if st.TimedOut == 0 && (s.Status == storage.StepRunning || st.Failure != nil && s.Status == storage.StepPending) {
				inFlight = true
			}
		}
	}
	p := &storage.Plan{}
	failure := st.Failure
	switch {
	case failure != nil:
		if inFlight {
			return p, nil
		}
	case st.TimedOut > 0:
		failure = &storage.Failure{Error: storage.WorkflowTimeoutError(st.TimedOut)}
		p.Failure = failure
	default:
		var err error
		if p, err = Plan(&main); err != nil {
			return nil, err
		}
		for i, c := range p.Steps {
			if strings.HasPrefix(c.Name, "bad") && c.Status == storage.StepPending {
				p.Steps[i] = storage.StepChange{Name: c.Name, Status: storage.StepFailed, Error: "expression failed"}
				p.Instance = &storage.InstanceChange{Status: storage.InstanceFailed, Error: "step " + c.Name + " failed"}
				failure = &storage.Failure{Error: p.Instance.Error, Step: c.Name}
			}
		}
		ic := p.Instance
		if ic == nil || len(onFail.Steps) == 0 && (ic.Status == storage.InstanceCompleted || !inFlight) {
			return p, nil
		}
		if ic.Status == storage.InstanceCompleted {
			for _, s := range onFail.Steps {
				p.Steps = append(p.Steps, storage.StepChange{Name: s.Name, Status: storage.StepSkipped})
			}
			return p, nil
		}
		if failure == nil {
			failure = &storage.Failure{Error: ic.Error, Step: strings.TrimSuffix(strings.TrimPrefix(ic.Error, "step "), " failed")}
		}
		p.Instance, p.Failure = nil, failure
		if inFlight {
			return p, nil
		}
	}
	op, err := Plan(&onFail)
	if err != nil {
		return nil, err
	}
	p.Steps = append(p.Steps, op.Steps...)
	for _, s := range onFail.Steps {
		if s.Status == storage.StepPending || s.Status == storage.StepRunning || s.Status == storage.StepWaiting {
			return p, nil
		}
	}
	for _, c := range op.Steps {
		if c.Status == storage.StepPending || c.Status == storage.StepWaiting {
			return p, nil
		}
	}
	p.Failure = nil
	p.Instance = &storage.InstanceChange{Status: storage.InstanceFailed, Error: failure.Error}
	return p, nil
}

// failureParams is an instance of the given steps with a workflow timeout.
func failureParams(timeout time.Duration, steps ...storage.StepSpec) storage.CreateParams {
	p := params(steps...)
	p.Timeout = timeout
	return p
}

func (b *bundle) createFailing(p storage.CreateParams) string {
	b.t.Helper()
	_, err := b.store.CreateInstances(b.ctx, nil, []storage.CreateParams{p}, FailurePlan)
	require.NoError(b.t, err)
	return p.ID
}

func (b *bundle) finishFailing(rs ...storage.StepResult) []storage.FinishResult {
	b.t.Helper()
	got, err := b.store.FinishSteps(b.ctx, rs, FailurePlan)
	require.NoError(b.t, err)
	return got
}

// completeFailing is complete, planned by FailurePlan.
func (b *bundle) completeFailing(id, name, output string) {
	b.t.Helper()
	c := b.claimStep(id, name)
	require.Equal(b.t, []storage.FinishResult{{Accepted: true}}, b.finishFailing(completed(c.Claim, output)))
}

// runOnFailureToTheEnd completes the onFailure step onfail-x, after
// which the instance fails with the failure it recorded, msg.
func (b *bundle) runOnFailureToTheEnd(id, msg string) {
	b.t.Helper()
	b.completeFailing(id, "onfail-x", `1`)
	in := b.get(id)
	require.Equal(b.t, storage.InstanceFailed, in.Status)
	require.Equal(b.t, msg, in.Error)
}

func (b *bundle) expire() int {
	b.t.Helper()
	n, err := b.store.ExpireInstances(b.ctx, 0, FailurePlan)
	require.NoError(b.t, err)
	return n
}

var failureTests = map[string]func(*testing.T, *Harness){
	"InstanceFailedAtOnceKeepsItsFailedStep": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createFailing(failureParams(0, spec("a"), spec("b", "a")))
		c := b.claimStep(id, "a")
		// A plan that fails the instance at once (no onFailure step, none
		// running) names the step in its InstanceChange.
		plan := func(st *storage.InstanceState) (*storage.Plan, error) {
			p, err := FailurePlan(st)
			if err == nil && p.Instance != nil && p.Instance.Status == storage.InstanceFailed {
				p.Instance.FailedStep = "a"
			}
			return p, err
		}
		got, err := b.store.FinishSteps(b.ctx, []storage.StepResult{failedFor(c.Claim, "boom")}, plan)
		require.NoError(t, err)
		require.Equal(t, []storage.FinishResult{{Accepted: true}}, got)
		in := b.get(id)
		require.Equal(t, storage.InstanceFailed, in.Status)
		require.False(t, in.Failing)
		require.Equal(t, "a", in.FailedStep)

		require.NoError(t, b.store.RetryInstance(b.ctx, id, FailurePlan))
		in = b.get(id)
		require.Equal(t, storage.InstanceRunning, in.Status)
		require.Empty(t, in.FailedStep, "a retried instance has not failed")
	},
	"RecordedFailureCancelsMainStepsAndRunsOnFailureSteps": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createFailing(failureParams(0, spec("a"), spec("b"), spec("c", "a", "b"),
			onFailureSpec("onfail-x"), onFailureSpec("onfail-y", "onfail-x")))
		require.Equal(t, storage.StepBlocked, b.status(id, "onfail-x"), "onFailure steps wait for a failure")
		ca, cb := b.claimStep(id, "a"), b.claimStep(id, "b")

		require.Equal(t, []storage.FinishResult{{Accepted: true}}, b.finishFailing(failedFor(ca.Claim, "boom")))
		in := b.get(id)
		require.Equal(t, storage.InstanceRunning, in.Status, "running while its onFailure steps run")
		require.True(t, in.Failing)
		require.Equal(t, "step a failed", in.Error)
		require.Equal(t, "a", in.FailedStep)
		require.Equal(t, storage.StepRunning, step(t, in, "b").Status, "a running main step finishes its attempt")
		require.Equal(t, storage.StepCancelled, step(t, in, "c").Status)
		require.Equal(t, storage.StepBlocked, step(t, in, "onfail-x").Status, "onFailure steps wait for the running ones")
		require.True(t, step(t, in, "onfail-x").OnFailure)
		require.False(t, step(t, in, "a").OnFailure)
		require.Len(t, events(in, "", storage.EventInstanceFailing), 1)
		require.Equal(t, "step a failed", events(in, "", storage.EventInstanceFailing)[0].Message)
		require.Empty(t, events(in, "", storage.EventInstanceFailed))

		lost, err := b.store.ExtendLeases(b.ctx, []storage.Claim{cb.Claim}, time.Minute)
		require.NoError(t, err)
		require.Empty(t, lost, "the running step's claim holds")
		require.Equal(t, []storage.FinishResult{{Accepted: true}}, b.finishFailing(completed(cb.Claim, `1`)))
		in = b.get(id)
		require.Equal(t, storage.InstanceRunning, in.Status)
		require.True(t, in.Failing)
		require.Equal(t, storage.StepCompleted, step(t, in, "b").Status)
		require.JSONEq(t, `1`, string(step(t, in, "b").Output))
		require.Equal(t, storage.StepCancelled, step(t, in, "c").Status, "nothing new starts")
		require.Equal(t, storage.StepPending, step(t, in, "onfail-x").Status)

		// An onFailure step's own failure does not change the outcome;
		// the one it blocks is cancelled with the instance.
		cx := b.claimStep(id, "onfail-x")
		require.Equal(t, []storage.FinishResult{{Accepted: true}}, b.finishFailing(failedFor(cx.Claim, "pager down")))
		in = b.get(id)
		require.Equal(t, storage.InstanceFailed, in.Status)
		require.Equal(t, "step a failed", in.Error)
		require.False(t, in.Failing)
		require.Equal(t, storage.StepFailed, step(t, in, "onfail-x").Status)
		require.Equal(t, storage.StepCancelled, step(t, in, "onfail-y").Status)
		require.NotNil(t, in.FinishedAt)
		names := make([]string, len(in.Steps))
		for i, s := range in.Steps {
			names[i] = s.Name
		}
		require.Equal(t, []string{"a", "b", "c", "onfail-x", "onfail-y"}, names, "onFailure steps come after the others")
	},
	"PendingStepsOfAFailingInstanceAreCancelled": func(t *testing.T, h *Harness) {
		// A step waiting for its retry's backoff or for the end of a
		// snooze when another fails for good runs no attempt: nothing
		// new starts, so it is cancelled with the blocked ones, and only
		// the running step is waited for.
		b := h.setup(t)
		id := b.createFailing(failureParams(0, spec("a"), spec("b"), spec("backoff"), spec("asleep"), onFailureSpec("onfail-x")))
		ca, cb := b.claimStep(id, "a"), b.claimStep(id, "b")
		cr, cs := b.claimStep(id, "backoff"), b.claimStep(id, "asleep")
		b.finishFailing(storage.StepResult{Claim: cr.Claim, Outcome: storage.OutcomeRetry, Error: "again", Delay: 10 * time.Second})
		b.finishFailing(storage.StepResult{Claim: cs.Claim, Outcome: storage.OutcomeSnooze, RunAfter: b.now().Add(time.Hour)})
		require.Equal(t, storage.StepPending, b.status(id, "backoff"))
		require.Equal(t, storage.StepPending, b.status(id, "asleep"))

		b.finishFailing(failedFor(ca.Claim, "boom"))
		in := b.get(id)
		require.True(t, in.Failing)
		require.Equal(t, storage.StepRunning, step(t, in, "b").Status, "a running attempt finishes")
		require.Equal(t, storage.StepCancelled, step(t, in, "backoff").Status, "a retry waiting for its backoff does not start")
		require.Equal(t, storage.StepCancelled, step(t, in, "asleep").Status, "a snoozed step does not wake")
		b.clock.Advance(time.Hour)
		require.False(t, b.claimable(id), "nothing of the failing instance is claimed but its onFailure steps")

		b.finishFailing(completed(cb.Claim, `1`))
		require.Equal(t, storage.StepPending, b.status(id, "onfail-x"), "the onFailure steps start once b ended")
		b.runOnFailureToTheEnd(id, "step a failed")
	},
	"AFailingInstanceWhoseOtherStepsWaitLosesItsDeadline": func(t *testing.T, h *Harness) {
		// Its waiting steps are cancelled, so its onFailure steps start at
		// once, without the workflow timeout.
		b := h.setup(t)
		id := b.createFailing(failureParams(time.Minute, spec("a"), spec("backoff"), onFailureSpec("onfail-x")))
		ca, cr := b.claimStep(id, "a"), b.claimStep(id, "backoff")
		b.finishFailing(storage.StepResult{Claim: cr.Claim, Outcome: storage.OutcomeRetry, Error: "again", Delay: 10 * time.Second})
		b.finishFailing(failedFor(ca.Claim, "boom"))
		in := b.get(id)
		require.Nil(t, in.Deadline, "the onFailure steps run without the workflow timeout")
		require.Equal(t, storage.StepCancelled, step(t, in, "backoff").Status)
		require.Equal(t, storage.StepPending, step(t, in, "onfail-x").Status)
	},
	"RunningStepOfAFailingInstanceIsNotRetried": func(t *testing.T, h *Harness) {
		// No onFailure steps: the failure is recorded all the same while
		// b runs, and the instance fails once b's attempt ended.
		b := h.setup(t)
		id := b.createFailing(failureParams(0, spec("a"), spec("b"), spec("c", "b")))
		ca, cb := b.claimStep(id, "a"), b.claimStep(id, "b")
		b.finishFailing(failedFor(ca.Claim, "boom"))
		in := b.get(id)
		require.Equal(t, storage.InstanceRunning, in.Status)
		require.True(t, in.Failing)
		require.Equal(t, storage.StepCancelled, step(t, in, "c").Status)
		require.Equal(t, []storage.FinishResult{{Accepted: true}}, b.finishFailing(storage.StepResult{
			Claim: cb.Claim, Outcome: storage.OutcomeRetry, Error: "flaky", RunAfter: b.now()}))
		in = b.get(id)
		require.Equal(t, storage.InstanceFailed, in.Status)
		require.Equal(t, "step a failed", in.Error, "the first failure's error")
		require.Equal(t, "a", in.FailedStep)
		require.False(t, in.Failing)
		st := step(t, in, "b")
		require.Equal(t, storage.StepFailed, st.Status, "failed for good: attempts were left, but the instance fails")
		require.Equal(t, "flaky", st.Error)
		require.Equal(t, 1, st.Attempts)
		require.NotNil(t, st.FinishedAt)
		require.Len(t, events(in, "b", storage.EventStepFailed), 1)
		require.Empty(t, events(in, "b", storage.EventStepRetrying))
		require.Empty(t, b.claim(storage.ClaimParams{InstanceID: id, Queues: []string{"q.b"}, Limit: 10}))
	},
	"LostAttemptOfAFailingInstanceIsNotRetried": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createFailing(failureParams(0, spec("a"), spec("b"), onFailureSpec("onfail-x")))
		ca := b.claimStep(id, "a")
		b.claim(storage.ClaimParams{InstanceID: id, Queues: []string{"q.b"}, Limit: 1, Lease: time.Second})
		b.finishFailing(failedFor(ca.Claim, "boom"))
		require.Equal(t, storage.StepBlocked, b.status(id, "onfail-x"))
		b.clock.Advance(2 * time.Second)
		n, err := b.store.RecoverExpired(b.ctx, 10, FailurePlan)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		in := b.get(id)
		require.Equal(t, storage.InstanceRunning, in.Status)
		require.Equal(t, storage.StepFailed, step(t, in, "b").Status, "its lost attempt fails it for good")
		require.Contains(t, step(t, in, "b").Error, "lease expired")
		require.Equal(t, storage.StepPending, step(t, in, "onfail-x").Status)
		b.runOnFailureToTheEnd(id, "step a failed")
	},
	"TimeoutOfAFailingInstanceCancelsItsRunningSteps": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createFailing(failureParams(time.Minute, spec("a"), spec("b"), onFailureSpec("onfail-x")))
		ca, cb := b.claimStep(id, "a"), b.claimStep(id, "b")
		b.finishFailing(failedFor(ca.Claim, "boom"))
		in := b.get(id)
		require.True(t, in.Failing)
		require.NotNil(t, in.Deadline, "the timeout holds while main steps run")
		b.clock.Advance(time.Minute)
		require.Equal(t, 1, b.expire())
		in = b.get(id)
		require.Equal(t, storage.InstanceRunning, in.Status)
		require.True(t, in.Failing)
		require.Equal(t, "step a failed", in.Error, "the first failure's error stays")
		require.Nil(t, in.Deadline, "the onFailure steps run without the workflow timeout")
		require.Equal(t, storage.StepCancelled, step(t, in, "b").Status)
		require.Equal(t, "workflow timed out after 1m", events(in, "b", storage.EventStepCancelled)[0].Message)
		require.Equal(t, storage.StepPending, step(t, in, "onfail-x").Status)
		lost, err := b.store.ExtendLeases(b.ctx, []storage.Claim{cb.Claim}, time.Minute)
		require.NoError(t, err)
		require.Equal(t, []storage.Claim{cb.Claim}, lost, "the cancelled step's claim is stale")
		require.Equal(t, []storage.FinishResult{{Cancelled: true}}, b.finishFailing(completed(cb.Claim, `1`)))
		require.Zero(t, b.expire())
		b.runOnFailureToTheEnd(id, "step a failed")
	},
	"SnoozedStepOfAFailingInstanceRunsToItsEnd": func(t *testing.T, h *Harness) {
		// A snooze is no failure: the step is pending again, and the
		// failing instance waits for it as for a running one.
		b := h.setup(t)
		id := b.createFailing(failureParams(0, spec("a"), spec("b"), onFailureSpec("onfail-x")))
		ca, cb := b.claimStep(id, "a"), b.claimStep(id, "b")
		b.finishFailing(failedFor(ca.Claim, "boom"))
		require.Equal(t, []storage.FinishResult{{Accepted: true}}, b.finishFailing(storage.StepResult{
			Claim: cb.Claim, Outcome: storage.OutcomeSnooze, RunAfter: b.now().Add(time.Minute)}))
		in := b.get(id)
		require.Equal(t, storage.InstanceRunning, in.Status)
		require.True(t, in.Failing)
		require.Equal(t, storage.StepPending, step(t, in, "b").Status)
		require.Equal(t, storage.StepBlocked, step(t, in, "onfail-x").Status)
		b.clock.Advance(time.Minute)
		b.completeFailing(id, "b", `2`)
		in = b.get(id)
		require.Equal(t, storage.StepCompleted, step(t, in, "b").Status)
		require.Equal(t, storage.StepPending, step(t, in, "onfail-x").Status)
		b.runOnFailureToTheEnd(id, "step a failed")
	},
	"FailingInstanceLosesItsDeadlineOnceItsStepsEnded": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createFailing(failureParams(time.Minute, spec("a"), spec("b"), onFailureSpec("onfail-x")))
		ca, cb := b.claimStep(id, "a"), b.claimStep(id, "b")
		b.finishFailing(failedFor(ca.Claim, "boom"))
		require.NotNil(t, b.get(id).Deadline)
		b.finishFailing(completed(cb.Claim, `1`))
		in := b.get(id)
		require.Nil(t, in.Deadline, "the onFailure steps run without the workflow timeout")
		require.Equal(t, storage.StepPending, step(t, in, "onfail-x").Status)
		b.clock.Advance(time.Hour)
		require.Zero(t, b.expire())
	},
	"CancelOfAFailingInstanceCancelsItsRunningSteps": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createFailing(failureParams(0, spec("a"), spec("b"), onFailureSpec("onfail-x")))
		ca, cb := b.claimStep(id, "a"), b.claimStep(id, "b")
		b.finishFailing(failedFor(ca.Claim, "boom"))
		require.NoError(t, b.store.CancelInstance(b.ctx, id, "cancelled by request", FailurePlan))
		in := b.get(id)
		require.Equal(t, storage.InstanceCancelled, in.Status)
		require.Equal(t, storage.StepCancelled, step(t, in, "b").Status)
		require.Equal(t, storage.StepCancelled, step(t, in, "onfail-x").Status)
		require.Equal(t, []storage.FinishResult{{Cancelled: true}}, b.finishFailing(completed(cb.Claim, `1`)))
	},
	"SkipIsRefusedWhileTheInstanceIsFailing": func(t *testing.T, h *Harness) {
		// A failing instance has failed and not ended: its running steps
		// finish their attempts and its onFailure steps run. A step
		// completed by hand then would leave its cancelled dependents and
		// the recorded failure as they are, so the skip waits for the
		// instance to fail, and repairs it then.
		b := h.setup(t)
		id := b.createFailing(failureParams(0, spec("a"), spec("b"), spec("c", "a"), onFailureSpec("onfail-x")))
		ca, cb := b.claimStep(id, "a"), b.claimStep(id, "b")
		b.finishFailing(failedFor(ca.Claim, "boom"))
		before := b.get(id)
		require.True(t, before.Failing)

		err := b.op().SkipStep(b.ctx, id, "a", json.RawMessage(`1`), FailurePlan)
		require.ErrorIs(t, err, storage.ErrConflict)
		require.ErrorContains(t, err, "is failing")
		after := b.get(id)
		require.Equal(t, before.Status, after.Status)
		require.True(t, after.Failing)
		require.Equal(t, "a", after.FailedStep)
		for _, name := range []string{"a", "b", "c", "onfail-x"} {
			require.Equal(t, step(t, before, name).Status, step(t, after, name).Status, "step %s", name)
		}

		b.finishFailing(completed(cb.Claim, `2`))
		b.completeFailing(id, "onfail-x", `"paged"`)
		require.Equal(t, storage.InstanceFailed, b.get(id).Status)
		require.NoError(t, b.op().SkipStep(b.ctx, id, "a", json.RawMessage(`1`), FailurePlan), "the skip once the instance failed")
		in := b.get(id)
		require.False(t, in.Failing)
		require.Equal(t, storage.InstanceRunning, in.Status)
		require.Equal(t, storage.StepPending, step(t, in, "c").Status, "the skipped step's dependent runs")
	},
	"OnFailureStepIsSkippedWhileTheInstanceIsFailing": func(t *testing.T, h *Harness) {
		// The onFailure steps are what runs while an instance is failing:
		// one stuck (a wait nobody will signal, a handler down) is
		// skipped then, and the instance goes on to fail.
		b := h.setup(t)
		id := b.createFailing(failureParams(0, spec("a"), onFailureSpec("onfail-x"), onFailureSpec("onfail-y", "onfail-x")))
		ca := b.claimStep(id, "a")
		b.finishFailing(failedFor(ca.Claim, "boom"))
		require.True(t, b.get(id).Failing)
		require.Equal(t, storage.StepPending, b.status(id, "onfail-x"))

		require.NoError(t, b.op().SkipStep(b.ctx, id, "onfail-x", json.RawMessage(`"by hand"`), FailurePlan))
		in := b.get(id)
		require.Equal(t, storage.InstanceRunning, in.Status)
		require.True(t, in.Failing, "the instance fails still")
		require.Equal(t, storage.StepCompleted, step(t, in, "onfail-x").Status)
		require.JSONEq(t, `"by hand"`, string(step(t, in, "onfail-x").Output))
		require.Equal(t, storage.StepPending, step(t, in, "onfail-y").Status, "the skipped step's dependent runs")
		b.completeFailing(id, "onfail-y", `1`)
		in = b.get(id)
		require.Equal(t, storage.InstanceFailed, in.Status)
		require.Equal(t, "step a failed", in.Error)
	},
	"RepairsRearmTheOnFailureSteps": func(t *testing.T, h *Harness) {
		// Retry from a step and a skip revive a failed instance: its
		// recorded failure is forgotten and its onFailure steps, which ran,
		// are blocked again, to run only if it fails again.
		for _, repair := range []string{"retry from", "skip"} {
			t.Run(repair, func(t *testing.T) {
				b := h.setup(t)
				id := b.createFailing(failureParams(0, spec("a"), spec("b", "a"), onFailureSpec("onfail-x")))
				b.completeFailing(id, "a", `1`)
				cb := b.claimStep(id, "b")
				b.finishFailing(failedFor(cb.Claim, "boom"))
				b.completeFailing(id, "onfail-x", `"paged"`)
				require.Equal(t, storage.InstanceFailed, b.get(id).Status)

				var err error
				if repair == "skip" {
					err = b.op().SkipStep(b.ctx, id, "b", json.RawMessage(`2`), FailurePlan)
				} else {
					err = b.op().RetryFrom(b.ctx, id, "b", FailurePlan)
				}
				require.NoError(t, err)
				in := b.get(id)
				require.False(t, in.Failing)
				require.Empty(t, in.FailedStep)
				if repair == "skip" {
					require.Equal(t, storage.InstanceCompleted, in.Status, "every main step is done")
					require.Equal(t, storage.StepSkipped, step(t, in, "onfail-x").Status, "a completed instance skips its onFailure steps")
					return
				}
				require.Equal(t, storage.StepBlocked, step(t, in, "onfail-x").Status, "the onFailure step waits for a new failure")
				require.Equal(t, storage.InstanceRunning, in.Status)
				b.completeFailing(id, "b", `2`)
				in = b.get(id)
				require.Equal(t, storage.InstanceCompleted, in.Status)
				require.Equal(t, storage.StepSkipped, step(t, in, "onfail-x").Status, "a completed instance skips its onFailure steps")
			})
		}
	},
	"CompletedInstanceSkipsItsOnFailureSteps": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createFailing(failureParams(0, spec("a"), onFailureSpec("onfail-x")))
		c := b.claimStep(id, "a")
		b.finishFailing(completed(c.Claim, `1`))
		in := b.get(id)
		require.Equal(t, storage.InstanceCompleted, in.Status)
		require.Equal(t, storage.StepSkipped, step(t, in, "onfail-x").Status)
		require.False(t, in.Failing)
	},
	"FailureAtCreationRunsOnFailureSteps": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createFailing(failureParams(time.Hour, spec("bad"), spec("next", "bad"), onFailureSpec("onfail-x")))
		in := b.get(id)
		require.Equal(t, storage.InstanceRunning, in.Status)
		require.True(t, in.Failing)
		require.Equal(t, "bad", in.FailedStep)
		require.NotNil(t, in.StartedAt)
		require.Nil(t, in.Deadline, "a failing instance has no deadline")
		require.Equal(t, storage.StepFailed, step(t, in, "bad").Status)
		require.Equal(t, storage.StepCancelled, step(t, in, "next").Status)
		require.Equal(t, storage.StepPending, step(t, in, "onfail-x").Status)
		b.completeFailing(id, "onfail-x", `"cleaned"`)
		in = b.get(id)
		require.Equal(t, storage.InstanceFailed, in.Status)
		require.Equal(t, "step bad failed", in.Error)
	},
	"DeadlineStartsWithTheInstanceAndWakesIdleWorkers": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createFailing(failureParams(time.Minute, spec("a")))
		in := b.get(id)
		require.Equal(t, time.Minute, in.Timeout)
		require.Nil(t, in.Deadline, "a pending instance has not started")
		b.clock.Advance(10 * time.Second)
		b.claimStep(id, "a")
		in = b.get(id)
		require.NotNil(t, in.Deadline)
		require.True(t, in.Deadline.Equal(start.Add(70*time.Second)), "deadline %v", in.Deadline)
		next, err := b.store.NextWake(b.ctx, storage.ClaimParams{Queues: []string{"elsewhere"}})
		require.NoError(t, err)
		require.True(t, next.Equal(start.Add(70*time.Second)), "an idle worker wakes for the deadline, got %v", next)
		require.Zero(t, b.expire(), "not yet")
	},
	"TimeoutFailsARunningInstanceAndStalesItsClaims": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createFailing(failureParams(time.Minute, spec("a"), spec("b", "a")))
		other := b.createFailing(failureParams(time.Hour, spec("a")))
		c := b.claimStep(id, "a")
		b.claimStep(other, "a")
		b.clock.Advance(time.Minute)
		require.Equal(t, 1, b.expire())
		in := b.get(id)
		require.Equal(t, storage.InstanceFailed, in.Status)
		require.Equal(t, "workflow timed out after 1m", in.Error)
		require.Equal(t, storage.StepCancelled, step(t, in, "a").Status)
		require.Equal(t, storage.StepCancelled, step(t, in, "b").Status)
		require.Nil(t, in.Deadline)
		lost, err := b.store.ExtendLeases(b.ctx, []storage.Claim{c.Claim}, time.Minute)
		require.NoError(t, err)
		require.Equal(t, []storage.Claim{c.Claim}, lost)
		require.Equal(t, []storage.FinishResult{{Cancelled: true}}, b.finishFailing(completed(c.Claim, `1`)),
			"a completion racing the timeout loses")
		require.Equal(t, storage.InstanceRunning, b.get(other).Status, "the other instance has time left")
		require.Zero(t, b.expire(), "nothing left to expire")
	},
	"TimeoutOfAWaitingInstanceRunsOnFailureSteps": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createFailing(failureParams(time.Hour, waitSpec("await-ok", "ok", 0), onFailureSpec("onfail-x")))
		in := b.get(id)
		require.Equal(t, storage.InstanceRunning, in.Status, "a step that waits starts the instance")
		require.NotNil(t, in.Deadline)
		require.True(t, in.Deadline.Equal(start.Add(time.Hour)), "deadline %v", in.Deadline)
		b.clock.Advance(time.Hour)
		require.Equal(t, 1, b.expire())
		in = b.get(id)
		require.Equal(t, storage.InstanceRunning, in.Status)
		require.True(t, in.Failing)
		require.Equal(t, "workflow timed out after 1h", in.Error)
		require.Empty(t, in.FailedStep)
		require.Nil(t, in.Deadline, "the onFailure steps run without the workflow timeout")
		require.Equal(t, storage.StepCancelled, step(t, in, "await-ok").Status)
		require.Equal(t, storage.StepPending, step(t, in, "onfail-x").Status)
		_, err := b.signal(storage.SignalParams{InstanceID: id, Name: "ok", Payload: json.RawMessage(`1`)})
		require.ErrorIs(t, err, storage.ErrConflict, "the cancelled wait takes no signal")
		require.Equal(t, storage.StepCancelled, b.status(id, "await-ok"))
		b.clock.Advance(time.Hour)
		require.Zero(t, b.expire())
		b.runOnFailureToTheEnd(id, "workflow timed out after 1h")
	},
	"APlanThatIgnoresTheTimeoutIsOverruled": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createFailing(failureParams(time.Second, spec("a")))
		b.claimStep(id, "a")
		b.clock.Advance(time.Second)
		n, err := b.store.ExpireInstances(b.ctx, 0, func(*storage.InstanceState) (*storage.Plan, error) { return &storage.Plan{}, nil })
		require.NoError(t, err)
		require.Equal(t, 1, n)
		in := b.get(id)
		require.Equal(t, storage.InstanceFailed, in.Status)
		require.Equal(t, "workflow timed out after 1s", in.Error)
	},
	"CancelOfAFailingInstanceStopsItsOnFailureSteps": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createFailing(failureParams(0, spec("a"), onFailureSpec("onfail-x"), onFailureSpec("onfail-y")))
		b.finishFailing(failedFor(b.claimStep(id, "a").Claim, "boom"))
		cx := b.claimStep(id, "onfail-x")
		require.NoError(t, b.store.CancelInstance(b.ctx, id, "cancelled by request", FailurePlan))
		in := b.get(id)
		require.Equal(t, storage.InstanceCancelled, in.Status)
		require.False(t, in.Failing)
		require.Equal(t, storage.StepCancelled, step(t, in, "onfail-x").Status)
		require.Equal(t, storage.StepCancelled, step(t, in, "onfail-y").Status)
		require.Equal(t, []storage.FinishResult{{Cancelled: true}}, b.finishFailing(completed(cx.Claim, `1`)))
	},
	"RetryRearmsOnFailureStepsAndTheTimeout": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		id := b.createFailing(failureParams(time.Minute, spec("a"), onFailureSpec("onfail-x")))
		c := b.claimStep(id, "a")
		b.finishFailing(failedFor(c.Claim, "boom"))
		b.completeFailing(id, "onfail-x", `"done"`)
		require.Equal(t, storage.InstanceFailed, b.get(id).Status)

		b.clock.Advance(time.Hour)
		require.NoError(t, b.store.RetryInstance(b.ctx, id, FailurePlan))
		in := b.get(id)
		require.Equal(t, storage.InstanceRunning, in.Status)
		require.False(t, in.Failing)
		require.Empty(t, in.FailedStep)
		require.Equal(t, storage.StepPending, step(t, in, "a").Status)
		x := step(t, in, "onfail-x")
		require.Equal(t, storage.StepBlocked, x.Status, "re-armed for another failure")
		require.Zero(t, x.Attempts)
		require.Nil(t, x.Output)
		require.NotNil(t, in.Deadline)
		require.True(t, in.Deadline.Equal(start.Add(time.Hour+time.Minute)), "the timeout counts from the retry, got %v", in.Deadline)
	},
}
