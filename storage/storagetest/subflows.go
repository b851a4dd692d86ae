package storagetest

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
)

// callSpec is a workflow step: callPlan starts its child.
func callSpec(name string, deps ...string) storage.StepSpec {
	return storage.StepSpec{
		Name:      name,
		Workflow:  "child-" + name,
		Queue:     "default",
		DependsOn: deps,
		Retry:     storage.RetryPolicy{MaxAttempts: 1},
	}
}

// callPlan is Plan with workflow steps: a step that Plan makes pending and
// whose name is a key of calls starts instead a child instance with
// calls[name] as its steps, of workflow "child-NAME", with the step's
// input. A name beginning with "each" is a forEach step: it starts one
// child per item of the instance input's "items", each with input
// {"item": ELEMENT}.
func callPlan(calls map[string][]storage.StepSpec) storage.PlanFunc {
	return func(st *storage.InstanceState) (*storage.Plan, error) {
		p, err := Plan(st)
		if err != nil || p == nil {
			return p, err
		}
		for i, c := range p.Steps {
			steps, ok := calls[c.Name]
			if !ok || c.Status != storage.StepPending {
				continue
			}
			change := storage.StepChange{Name: c.Name, Status: storage.StepRunning, Input: c.Input}
			inputs := []json.RawMessage{c.Input}
			if strings.HasPrefix(c.Name, "each") {
				var in struct{ Items []json.RawMessage }
				if err := json.Unmarshal(st.Input, &in); err != nil {
					return nil, err
				}
				inputs = inputs[:0]
				for _, item := range in.Items {
					raw, err := json.Marshal(map[string]json.RawMessage{"item": item})
					if err != nil {
						return nil, err
					}
					inputs = append(inputs, raw)
				}
				change.Input, change.Items = nil, inputs
			}
			for _, in := range inputs {
				child := params(steps...)
				child.Workflow = "child-" + c.Name
				child.DefinitionHash = "hash-child-" + c.Name
				child.Definition = []byte("name: child-" + c.Name + "\n")
				child.Input = in
				child.Depth = st.Depth + 1
				change.Children = append(change.Children, child)
			}
			p.Steps[i] = change
		}
		return p, nil
	}
}

// finishWith is finish with plan.
func (b *bundle) finishWith(plan storage.PlanFunc, rs ...storage.StepResult) []storage.FinishResult {
	b.t.Helper()
	got, err := b.store.FinishSteps(b.ctx, rs, plan)
	require.NoError(b.t, err)
	require.Len(b.t, got, len(rs))
	return got
}

// createWith creates one instance of steps, planned with plan.
func (b *bundle) createWith(plan storage.PlanFunc, p storage.CreateParams) string {
	b.t.Helper()
	res, err := b.store.CreateInstances(b.ctx, nil, []storage.CreateParams{p}, plan)
	require.NoError(b.t, err)
	return res[0].ID
}

// completeWith claims and completes step name of instance id, planning
// with plan.
func (b *bundle) completeWith(plan storage.PlanFunc, id, name, output string) {
	b.t.Helper()
	c := b.claimStep(id, name)
	require.Equal(b.t, []storage.FinishResult{{Accepted: true}}, b.finishWith(plan, completed(c.Claim, output)))
}

// child returns the only child of step name of instance id.
func (b *bundle) child(id, name string) *storage.Instance {
	b.t.Helper()
	st := step(b.t, b.get(id), name)
	require.Len(b.t, st.Children, 1, "step %s of %s has one child", name, id)
	return b.get(st.Children[0])
}

// chain creates an instance whose only step calls a child, whose only
// step calls a grandchild, whose only step calls a great-grandchild with
// one handler step, leaf; it returns the four IDs, top first.
func (b *bundle) chain(plan storage.PlanFunc) []string {
	b.t.Helper()
	top := b.createWith(plan, params(callSpec("call1")))
	ids := []string{top}
	for _, name := range []string{"call1", "call2", "call3"} {
		ids = append(ids, b.child(ids[len(ids)-1], name).ID)
	}
	return ids
}

var chainCalls = map[string][]storage.StepSpec{
	"call1": {callSpec("call2")},
	"call2": {callSpec("call3")},
	"call3": {spec("leaf")},
}

// failedChild makes an instance of steps a and call, whose child (c1, c2)
// failed at c2 after a and c1 completed, which failed the instance; it
// returns the plan, the instance and the child.
func (b *bundle) failedChild() (plan storage.PlanFunc, id, child string) {
	b.t.Helper()
	plan = callPlan(map[string][]storage.StepSpec{"call": {spec("c1"), spec("c2", "c1")}})
	id = b.createWith(plan, params(spec("a"), callSpec("call")))
	child = b.child(id, "call").ID
	b.completeWith(plan, id, "a", `"A"`)
	b.completeWith(plan, child, "c1", `"C1"`)
	c2 := b.claimStep(child, "c2")
	b.finishWith(plan, storage.StepResult{Claim: c2.Claim, Outcome: storage.OutcomeFailed, Error: "boom"})
	require.Equal(b.t, storage.InstanceFailed, b.get(id).Status)
	return plan, id, child
}

var subflowTests = map[string]func(*testing.T, *Harness){
	"ChildCreatedWhenStepBecomesReady": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		plan := callPlan(map[string][]storage.StepSpec{"call": {spec("c1"), spec("c2", "c1")}})
		parent := params(spec("a"), callSpec("call", "a"))
		parent.Priority = 7
		id := b.createWith(plan, parent)
		require.Empty(t, step(t, b.get(id), "call").Children, "no child before the step is ready")
		b.completeWith(plan, id, "a", `"A"`)

		in := b.get(id)
		call := step(t, in, "call")
		require.Equal(t, storage.StepRunning, call.Status)
		require.Equal(t, "child-call", call.Workflow)
		require.Nil(t, call.LeaseUntil, "a workflow step holds no lease")
		require.Len(t, call.Children, 1)
		ev := events(in, "call", storage.EventStepStarted)
		require.Len(t, ev, 1)
		require.Equal(t, "child instance "+call.Children[0], ev[0].Message)

		child := b.get(call.Children[0])
		require.Equal(t, &storage.ParentRef{InstanceID: id, Step: "call", Item: -1}, child.Parent)
		require.Equal(t, 1, child.Depth)
		require.Nil(t, in.Parent)
		require.Zero(t, in.Depth)
		require.Equal(t, "child-call", child.Workflow)
		require.Equal(t, "hash-child-call", child.DefinitionHash)
		require.Equal(t, "name: child-call\n", string(child.Definition), "the child runs under its own snapshot")
		require.JSONEq(t, string(stepInput(t, "call", map[string]string{"a": `"A"`})), string(child.Input))
		require.Equal(t, storage.StepPending, step(t, child, "c1").Status)
		created := events(child, "", storage.EventInstanceCreated)
		require.Len(t, created, 1)
		require.Equal(t, "child of instance "+id+", step call", created[0].Message)

		// Only the child's own steps are ever claimed; the workflow step
		// is never recovered, however long its child runs.
		got := b.claim(storage.ClaimParams{})
		require.Len(t, got, 1)
		require.Equal(t, child.ID, got[0].InstanceID)
		require.Equal(t, "c1", got[0].Step)
		b.clock.Advance(time.Hour)
		n, err := b.store.RecoverExpired(b.ctx, 0, plan)
		require.NoError(t, err)
		require.Equal(t, 1, n, "only the child's step had a lease to lose")
		call = step(t, b.get(id), "call")
		require.Equal(t, storage.StepRunning, call.Status)
		require.Zero(t, call.Attempts)
		require.Equal(t, storage.StepPending, b.status(child.ID, "c1"))
	},

	"PauseHoldsTheWholeTree": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		plan := callPlan(chainCalls)
		ids := b.chain(plan)
		leaf := ids[3]
		require.NoError(t, b.op().PauseInstance(b.ctx, ids[0]))
		for _, id := range ids {
			in := b.get(id)
			require.True(t, in.Paused, "instance %s at depth %d is paused with the top", id, in.Depth)
			require.Len(t, events(in, "", storage.EventInstancePaused), 1)
		}
		require.False(t, b.claimable(leaf), "the great-grandchild's step waits")
		require.ErrorIs(t, b.op().PauseInstance(b.ctx, ids[1]), storage.ErrConflict, "a child paused with its parent is paused")

		require.NoError(t, b.op().ResumeInstance(b.ctx, ids[0]))
		for _, id := range ids {
			require.False(t, b.get(id).Paused, "instance %s is resumed with the top", id)
		}
		b.completeWith(plan, leaf, "leaf", `"L"`)
		require.Equal(t, storage.InstanceCompleted, b.get(ids[0]).Status)
	},

	"AChildStartedWhileItsParentIsPausedIsPaused": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		plan := callPlan(map[string][]storage.StepSpec{"call": {spec("c1")}})
		id := b.createWith(plan, params(spec("a"), callSpec("call", "a")))
		ca := b.claimStep(id, "a")
		require.NoError(t, b.op().PauseInstance(b.ctx, id))
		// The running step finishes and makes the workflow step ready: its
		// child starts, but waits with its parent.
		b.finishWith(plan, completed(ca.Claim, `"A"`))
		child := b.child(id, "call")
		require.True(t, child.Paused)
		require.False(t, b.claimable(child.ID), "the child's step waits")

		require.NoError(t, b.op().ResumeInstance(b.ctx, id))
		require.False(t, b.get(child.ID).Paused)
		b.completeWith(plan, child.ID, "c1", `"C"`)
		require.Equal(t, storage.InstanceCompleted, b.get(id).Status)
	},

	"CompletionSettlesEveryAncestorInOneTransaction": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		plan := callPlan(chainCalls)
		ids := b.chain(plan)
		for depth, id := range ids {
			in := b.get(id)
			require.Equal(t, depth, in.Depth)
			require.False(t, in.Status.Finished())
		}
		require.Equal(t, storage.InstanceRunning, b.get(ids[0]).Status, "a started workflow step starts its instance")
		b.completeWith(plan, ids[3], "leaf", `{"shipped":true}`)

		for i, id := range ids {
			in := b.get(id)
			require.Equal(t, storage.InstanceCompleted, in.Status, "instance at depth %d", i)
			require.JSONEq(t, `{"steps":1}`, string(in.Output))
			if i < 3 {
				call := step(t, in, fmt.Sprintf("call%d", i+1))
				require.Equal(t, storage.StepCompleted, call.Status)
				require.JSONEq(t, `{"steps":1}`, string(call.Output), "the step's output is its child's")
				require.Len(t, events(in, call.Name, storage.EventStepCompleted), 1)
			}
		}
		require.Equal(t, storage.StepCompleted, b.status(ids[3], "leaf"))
	},

	"PlanSeesTheDepth": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		calls := callPlan(map[string][]storage.StepSpec{"call": {spec("c1"), callSpec("deeper", "c1")}, "deeper": {spec("leaf")}})
		var seen sync.Map // instance ID -> depth its plans saw
		plan := func(st *storage.InstanceState) (*storage.Plan, error) {
			seen.Store(st.ID, st.Depth)
			return calls(st)
		}
		id := b.createWith(plan, params(callSpec("call")))
		child := b.child(id, "call").ID
		b.completeWith(plan, child, "c1", `1`)
		depth, _ := seen.Load(child)
		require.Equal(t, 1, depth, "the plan of a child's later step sees its depth")
		grandchild := b.child(child, "deeper")
		require.Equal(t, 2, grandchild.Depth)
		depth, _ = seen.Load(grandchild.ID)
		require.Equal(t, 2, depth)
	},

	"ChildFinishedAtCreationSettlesAtOnce": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		plan := callPlan(map[string][]storage.StepSpec{"call": {spec("skipme")}})
		id := b.createWith(plan, params(callSpec("call")))
		in := b.get(id)
		require.Equal(t, storage.InstanceCompleted, in.Status)
		require.JSONEq(t, `{"steps":1}`, string(step(t, in, "call").Output))
		require.Equal(t, storage.InstanceCompleted, b.child(id, "call").Status)
	},

	"ChildFailureFailsParentStep": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		plan := callPlan(chainCalls)
		ids := b.chain(plan)
		c := b.claimStep(ids[3], "leaf")
		b.finishWith(plan, storage.StepResult{Claim: c.Claim, Outcome: storage.OutcomeFailed, Error: "no carrier"})

		leafChild := b.get(ids[3])
		require.Equal(t, storage.InstanceFailed, leafChild.Status)
		want := "child instance " + ids[3] + " failed in step leaf"
		for i := 2; i >= 0; i-- {
			in := b.get(ids[i])
			require.Equal(t, storage.InstanceFailed, in.Status, "depth %d", i)
			call := step(t, in, fmt.Sprintf("call%d", i+1))
			require.Equal(t, storage.StepFailed, call.Status)
			require.Equal(t, want, call.Error)
			ev := events(in, call.Name, storage.EventStepFailed)
			require.Len(t, ev, 1)
			require.Equal(t, want, ev[0].Message)
			want = "child instance " + ids[i] + " failed in step " + call.Name
		}
	},

	"ChildCancellationFailsParentStep": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		plan := callPlan(map[string][]storage.StepSpec{"call": {spec("c")}})
		id := b.createWith(plan, params(callSpec("call"), spec("other")))
		child := b.child(id, "call")
		other := b.claimStep(id, "other")
		require.NoError(t, b.store.CancelInstance(b.ctx, child.ID, "not needed", plan))

		require.Equal(t, storage.InstanceCancelled, b.get(child.ID).Status)
		in := b.get(id)
		require.Equal(t, storage.InstanceFailed, in.Status)
		call := step(t, in, "call")
		require.Equal(t, storage.StepFailed, call.Status)
		require.Equal(t, "child instance "+child.ID+" was cancelled", call.Error)
		require.Equal(t, storage.StepCancelled, step(t, in, "other").Status, "the parent's failure cancels its other steps")
		require.Equal(t, []storage.FinishResult{{Cancelled: true}}, b.finishWith(plan, completed(other.Claim, `1`)))
	},

	"OperationsRecordTheActorOnEveryInstanceTheyChange": func(t *testing.T, h *Harness) {
		// An operation by hand changes the instances of a tree with the
		// one it names: its descendants' events, and a parent's whose
		// child it cancelled, carry its actor too.
		b := h.setup(t)
		hb := b.byHand()
		plan := callPlan(chainCalls)
		ids := b.chain(plan)
		actorOf := func(id, step string, typ storage.EventType) string {
			t.Helper()
			ev := events(b.get(id), step, typ)
			require.NotEmpty(t, ev, "instance %s has a %s event of step %q", id, typ, step)
			return ev[len(ev)-1].Actor
		}
		require.NoError(t, hb.op().PauseInstance(hb.ctx, ids[0]))
		require.NoError(t, hb.op().ResumeInstance(hb.ctx, ids[0]))
		require.NoError(t, hb.store.CancelInstance(hb.ctx, ids[0], "stop everything", plan))
		for i, id := range ids {
			for _, typ := range []storage.EventType{storage.EventInstancePaused, storage.EventInstanceResumed, storage.EventInstanceCancelled} {
				require.Equal(t, "alice", actorOf(id, "", typ), "depth %d: %s", i, typ)
			}
		}
		require.NoError(t, b.store.RetryInstance(storage.WithActor(b.ctx, "cli"), ids[0], plan))
		for i, id := range ids {
			require.Equal(t, "cli", actorOf(id, "", storage.EventInstanceRetried), "depth %d", i)
		}

		// A child cancelled by itself fails its parent's step, and so the
		// parent.
		require.NoError(t, hb.store.CancelInstance(hb.ctx, ids[1], "not needed", plan))
		require.Equal(t, "alice", actorOf(ids[0], "call1", storage.EventStepFailed))
		require.Equal(t, "alice", actorOf(ids[0], "", storage.EventInstanceFailed))
	},
	"CancelCancelsDescendants": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		plan := callPlan(chainCalls)
		ids := b.chain(plan)
		leaf := b.claimStep(ids[3], "leaf")
		require.NoError(t, b.store.CancelInstance(b.ctx, ids[0], "stop everything", plan))

		require.Equal(t, "stop everything", b.get(ids[0]).Error)
		for i, id := range ids {
			in := b.get(id)
			require.Equal(t, storage.InstanceCancelled, in.Status, "depth %d", i)
			if i > 0 {
				require.Equal(t, "parent instance "+ids[i-1]+" was cancelled", in.Error)
			}
			if i < 3 {
				require.Equal(t, storage.StepCancelled, step(t, in, fmt.Sprintf("call%d", i+1)).Status)
			}
		}
		lost, err := b.store.ExtendLeases(b.ctx, []storage.Claim{leaf.Claim}, time.Minute)
		require.NoError(t, err)
		require.Equal(t, []storage.Claim{leaf.Claim}, lost, "the great-grandchild's running step lost its claim")
		require.ErrorIs(t, b.store.CancelInstance(b.ctx, ids[2], "again", plan), storage.ErrConflict)
	},

	"MatchTopLevelLeavesOutChildren": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		plan := callPlan(map[string][]storage.StepSpec{"call": {spec("c1")}})
		id := b.createWith(plan, params(callSpec("call")))
		child := b.child(id, "call").ID
		all, err := b.op().MatchInstances(b.ctx, storage.InstanceFilter{})
		require.NoError(t, err)
		require.ElementsMatch(t, []string{id, child}, all)
		top, err := b.op().MatchInstances(b.ctx, storage.InstanceFilter{TopLevel: true})
		require.NoError(t, err)
		require.Equal(t, []string{id}, top)
	},

	"RetryRetriesFailedChildren": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		plan, id, child := b.failedChild()

		err := b.store.RetryInstance(b.ctx, child, plan)
		require.ErrorIs(t, err, storage.ErrConflict, "a child is retried through its parent")
		require.Contains(t, err.Error(), "dagrun retry "+id+" retries this child")
		require.Contains(t, err.Error(), "dagrun retry "+id+" --from call runs the step again", "the way on when the parent step was passed")
		// Nor by retrying it from a step or skipping its failed step: it
		// would run on while its parent step stays failed.
		err = b.op().RetryFrom(b.ctx, child, "c1", plan)
		require.ErrorIs(t, err, storage.ErrConflict, "a child is retried from a step through its parent")
		require.Contains(t, err.Error(), "dagrun retry "+id+" retries this child")
		err = b.op().SkipStep(b.ctx, child, "c2", json.RawMessage(`"by hand"`), plan)
		require.ErrorIs(t, err, storage.ErrConflict, "a failed child's step is skipped through its parent")
		require.Contains(t, err.Error(), "dagrun retry "+id+" retries this child")
		require.Equal(t, storage.InstanceFailed, b.get(child).Status, "nothing changed")
		require.Equal(t, storage.StepFailed, step(t, b.get(child), "c2").Status, "nothing changed")

		b.clock.Advance(time.Minute)
		require.NoError(t, b.store.RetryInstance(b.ctx, id, plan))
		in := b.get(id)
		require.Equal(t, storage.InstanceRunning, in.Status)
		call := step(t, in, "call")
		require.Equal(t, storage.StepRunning, call.Status)
		require.Equal(t, []string{child}, call.Children, "the same child runs again: no new one")
		require.NotNil(t, call.StartedAt)
		require.True(t, call.StartedAt.Equal(b.now()), "the step starts again with its child: %v", call.StartedAt)
		require.Empty(t, call.Error)
		require.Equal(t, `"A"`, string(step(t, in, "a").Output))
		ch := b.get(child)
		require.Equal(t, storage.InstanceRunning, ch.Status)
		require.Equal(t, storage.StepCompleted, step(t, ch, "c1").Status, "completed steps of the child are kept")
		require.Equal(t, `"C1"`, string(step(t, ch, "c1").Output))
		require.Equal(t, storage.StepPending, step(t, ch, "c2").Status)
		require.Len(t, events(ch, "", storage.EventInstanceRetried), 1)

		b.completeWith(plan, child, "c2", `"C2"`)
		require.Equal(t, storage.InstanceCompleted, b.get(child).Status)
		require.Equal(t, storage.InstanceCompleted, b.get(id).Status)
	},

	"RetryFromRetriesTheChildOfAFailedStepOutsideIt": func(t *testing.T, h *Harness) {
		// A failed workflow step that is not downstream of the step a
		// retry starts from runs again as a plain retry runs it: by
		// retrying its child, whose completed steps are kept.
		b := h.setup(t)
		plan, id, child := b.failedChild()

		require.NoError(t, b.op().RetryFrom(b.ctx, id, "a", plan))
		in := b.get(id)
		require.Equal(t, storage.InstanceRunning, in.Status)
		require.Equal(t, storage.StepPending, step(t, in, "a").Status, "a runs afresh")
		call := step(t, in, "call")
		require.Equal(t, storage.StepRunning, call.Status)
		require.Equal(t, []string{child}, call.Children, "the same child runs again: no new one")
		ch := b.get(child)
		require.Equal(t, storage.InstanceRunning, ch.Status)
		require.Equal(t, `"C1"`, string(step(t, ch, "c1").Output), "completed steps of the child are kept")
		require.Equal(t, storage.StepPending, step(t, ch, "c2").Status)

		b.completeWith(plan, id, "a", `"A2"`)
		b.completeWith(plan, child, "c2", `"C2"`)
		require.Equal(t, storage.InstanceCompleted, b.get(child).Status)
		require.Equal(t, storage.InstanceCompleted, b.get(id).Status)
	},

	"RetryRetriesCancelledDescendants": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		plan := callPlan(chainCalls)
		ids := b.chain(plan)
		require.Equal(t, storage.InstancePending, b.get(ids[3]).Status, "its leaf was never claimed")
		require.NoError(t, b.store.CancelInstance(b.ctx, ids[0], "oops", plan))
		require.NoError(t, b.store.RetryInstance(b.ctx, ids[0], plan))
		for i, id := range ids[:3] {
			require.Equal(t, storage.InstanceRunning, b.get(id).Status, "depth %d: started by its workflow step", i)
		}
		leaf := b.get(ids[3])
		require.Equal(t, storage.InstancePending, leaf.Status, "depth 3: never started, so pending again")
		require.Nil(t, leaf.StartedAt)
		require.Equal(t, storage.StepPending, b.status(ids[3], "leaf"))
		c := b.claimStep(ids[3], "leaf")
		require.Equal(t, storage.InstanceRunning, b.get(ids[3]).Status, "the claim starts it")
		require.Equal(t, []storage.FinishResult{{Accepted: true}}, b.finishWith(plan, completed(c.Claim, `1`)))
		require.Equal(t, storage.InstanceCompleted, b.get(ids[0]).Status)
	},

	"ForEachStartsOneChildPerItem": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		plan := callPlan(map[string][]storage.StepSpec{"each": {spec("c")}})
		each := callSpec("each")
		each.ForEach = true
		id := b.createWith(plan, itemsParams(3, each))

		in := b.get(id)
		st := step(t, in, "each")
		require.Equal(t, storage.StepRunning, st.Status)
		require.Len(t, st.Children, 3)
		require.Equal(t, &storage.ItemCounts{Total: 3, Running: 3}, st.Items)
		items, err := b.store.ListItems(b.ctx, storage.ItemsParams{InstanceID: id, Step: "each"})
		require.NoError(t, err)
		require.Len(t, items, 3)
		for i, it := range items {
			require.Equal(t, st.Children[i], it.Child)
			require.Equal(t, storage.StepRunning, it.Status)
			child := b.get(it.Child)
			require.Equal(t, &storage.ParentRef{InstanceID: id, Step: "each", Item: i}, child.Parent)
			require.JSONEq(t, fmt.Sprintf(`{"item":%d}`, i), string(child.Input))
		}
		require.Empty(t, b.claim(storage.ClaimParams{InstanceID: id}), "items with children are never claimed")

		for i := 2; i >= 0; i-- {
			b.completeWith(plan, st.Children[i], "c", `1`)
		}
		in = b.get(id)
		require.Equal(t, storage.InstanceCompleted, in.Status)
		require.JSONEq(t, `[{"steps":1},{"steps":1},{"steps":1}]`, string(step(t, in, "each").Output), "child outputs in item order")
	},

	// A workflow step runs no handler: neither it nor its forEach items
	// hold a slot of their queue, whether the limit was set before they
	// started or after. They did, so a child whose steps share the
	// parent's queue waited for ever on its own parent under a limit of 1.
	"WorkflowStepsHoldNoQueueSlot": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		work := spec("c")
		work.Queue = "default"
		plan := callPlan(map[string][]storage.StepSpec{"call": {work}, "each": {work}})
		runningInDefault := func() int {
			t.Helper()
			qs, err := b.store.Queues(b.ctx)
			require.NoError(t, err)
			for _, q := range qs {
				if q.Queue == "default" {
					return q.Running
				}
			}
			return 0
		}

		require.NoError(t, b.setQueueLimit(storage.QueueLimit{Queue: "default", Concurrency: 1}))
		parent := b.createWith(plan, params(callSpec("call")))
		child := b.child(parent, "call").ID
		require.Zero(t, runningInDefault(), "a running workflow step is not a running step of its queue")
		got := b.claim(storage.ClaimParams{InstanceID: child})
		require.Len(t, got, 1, "the child's step is not held behind its parent's")
		require.Equal(t, 1, runningInDefault())
		require.Equal(t, []storage.FinishResult{{Accepted: true}}, b.finishWith(plan, completed(got[0].Claim, `1`)))
		require.Equal(t, storage.InstanceCompleted, b.get(parent).Status)

		require.NoError(t, b.setQueueLimit(storage.QueueLimit{Queue: "default"}))
		each := callSpec("each")
		each.ForEach = true
		fanned := b.createWith(plan, itemsParams(2, each))
		require.NoError(t, b.setQueueLimit(storage.QueueLimit{Queue: "default", Concurrency: 1}))
		require.Zero(t, runningInDefault(), "running workflow items are not running steps of their queue")
		got = b.claim(storage.ClaimParams{Queues: []string{"default"}})
		require.Len(t, got, 1, "one child's step runs in the one slot")
		require.Equal(t, []storage.FinishResult{{Accepted: true}}, b.finishWith(plan, completed(got[0].Claim, `1`)))
		got = b.claim(storage.ClaimParams{Queues: []string{"default"}})
		require.Len(t, got, 1, "then the other's")
		require.Equal(t, []storage.FinishResult{{Accepted: true}}, b.finishWith(plan, completed(got[0].Claim, `1`)))
		require.Equal(t, storage.InstanceCompleted, b.get(fanned).Status)
	},

	"ForEachItemOfAHeldChildIsPending": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		calls := callPlan(map[string][]storage.StepSpec{"each": {spec("c")}})
		// One child at a time, as a forEach workflow step with concurrency 1.
		plan := func(st *storage.InstanceState) (*storage.Plan, error) {
			p, err := calls(st)
			if p != nil {
				for i := range p.Steps {
					for j := range p.Steps[i].Children {
						p.Steps[i].Children[j].ConcurrencyKey, p.Steps[i].Children[j].ConcurrencyLimit = "each of "+st.ID, 1
					}
				}
			}
			return p, err
		}
		each := callSpec("each")
		each.ForEach = true
		id := b.createWith(plan, itemsParams(3, each))
		shown := func(want storage.ItemCounts, statuses ...storage.StepStatus) {
			t.Helper()
			require.Equal(t, &want, step(t, b.get(id), "each").Items)
			listed, err := b.store.ListInstances(b.ctx, storage.ListParams{})
			require.NoError(t, err)
			for _, in := range listed {
				if in.ID == id {
					require.Equal(t, &want, step(t, &in, "each").Items, "listed as got")
				}
			}
			items, err := b.store.ListItems(b.ctx, storage.ItemsParams{InstanceID: id, Step: "each"})
			require.NoError(t, err)
			var got []storage.StepStatus
			for _, it := range items {
				got = append(got, it.Status)
				// An item starts when its child does, not while it waits.
				if it.Status == storage.StepPending {
					require.Nil(t, it.StartedAt, "item %d, pending", it.Index)
				}
				if it.Status == storage.StepCompleted {
					require.NotNil(t, it.StartedAt, "item %d, completed", it.Index)
				}
			}
			require.Equal(t, statuses, got)
			for _, status := range []storage.StepStatus{storage.StepPending, storage.StepRunning} {
				items, err := b.store.ListItems(b.ctx, storage.ItemsParams{InstanceID: id, Step: "each", Status: status})
				require.NoError(t, err)
				var want []int
				for i, s := range statuses {
					if s == status {
						want = append(want, i)
					}
				}
				var got []int
				for _, it := range items {
					got = append(got, it.Index)
				}
				require.Equal(t, want, got, "items listed as %s", status)
			}
		}
		shown(storage.ItemCounts{Total: 3, Running: 1, Pending: 2}, storage.StepRunning, storage.StepPending, storage.StepPending)

		children := step(t, b.get(id), "each").Children
		b.completeWith(plan, children[0], "c", `1`)
		shown(storage.ItemCounts{Total: 3, Completed: 1, Running: 1, Pending: 1}, storage.StepCompleted, storage.StepRunning, storage.StepPending)
		b.completeWith(plan, children[1], "c", `1`)
		b.completeWith(plan, children[2], "c", `1`)
		shown(storage.ItemCounts{Total: 3, Completed: 3}, storage.StepCompleted, storage.StepCompleted, storage.StepCompleted)
		require.Equal(t, storage.InstanceCompleted, b.get(id).Status)
	},

	"ForEachChildFailureFailsStep": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		plan := callPlan(map[string][]storage.StepSpec{"each": {spec("c")}})
		each := callSpec("each")
		each.ForEach = true
		id := b.createWith(plan, itemsParams(2, each))
		children := step(t, b.get(id), "each").Children
		c := b.claimStep(children[1], "c")
		b.finishWith(plan, storage.StepResult{Claim: c.Claim, Outcome: storage.OutcomeFailed, Error: "x"})
		in := b.get(id)
		require.Equal(t, storage.InstanceFailed, in.Status)
		require.Equal(t, "item 1 failed: child instance "+children[1]+" failed in step c", step(t, in, "each").Error)
		other := b.get(children[0])
		require.Equal(t, storage.InstanceCancelled, other.Status, "the other item's child is cancelled with its step")
		require.Equal(t, "parent instance "+id+" failed", other.Error)

		require.NoError(t, b.store.RetryInstance(b.ctx, id, plan))
		require.Equal(t, storage.StepPending, b.status(children[1], "c"))
		require.Equal(t, storage.StepPending, b.status(children[0], "c"))
		b.completeWith(plan, children[0], "c", `1`)
		b.completeWith(plan, children[1], "c", `1`)
		require.Equal(t, storage.InstanceCompleted, b.get(id).Status)
	},

	// The crash points between a child's end and its parent step's
	// settlement: the plan of the parent fails inside the transaction that
	// finishes the child, and everything that transaction did is undone.
	"FailedParentPlanUndoesTheChildsCompletion": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		plan := callPlan(map[string][]storage.StepSpec{"call": {spec("c")}})
		id := b.createWith(plan, params(callSpec("call")))
		child := b.child(id, "call").ID
		c := b.claimStep(child, "c")
		crash := func(st *storage.InstanceState) (*storage.Plan, error) {
			if st.ID == id {
				return nil, errors.New("crash while settling the parent")
			}
			return plan(st)
		}
		_, err := b.store.FinishSteps(b.ctx, []storage.StepResult{completed(c.Claim, `1`)}, crash)
		require.Error(t, err)
		require.Equal(t, storage.InstanceRunning, b.get(child).Status, "the child's completion was undone with its parent's")
		require.Equal(t, storage.StepRunning, b.status(child, "c"))
		call := step(t, b.get(id), "call")
		require.Equal(t, storage.StepRunning, call.Status)
		require.Nil(t, call.Output)
		lost, err := b.store.ExtendLeases(b.ctx, []storage.Claim{c.Claim}, time.Minute)
		require.NoError(t, err)
		require.Empty(t, lost, "the attempt still holds its claim, so its result can be recorded again")

		require.Equal(t, []storage.FinishResult{{Accepted: true}}, b.finishWith(plan, completed(c.Claim, `1`)))
		require.Equal(t, storage.InstanceCompleted, b.get(child).Status)
		require.Equal(t, storage.InstanceCompleted, b.get(id).Status)
	},

	"FailedParentPlanUndoesTheChildsCancellation": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		plan := callPlan(map[string][]storage.StepSpec{"call": {spec("c")}})
		id := b.createWith(plan, params(callSpec("call")))
		child := b.child(id, "call").ID
		crash := func(st *storage.InstanceState) (*storage.Plan, error) {
			if st.ID == id {
				return nil, errors.New("crash while settling the parent")
			}
			return plan(st)
		}
		require.Error(t, b.store.CancelInstance(b.ctx, child, "stop", crash))
		require.Equal(t, storage.InstancePending, b.get(child).Status, "the cancellation was undone")
		require.Equal(t, storage.StepRunning, b.status(id, "call"))
		require.Equal(t, storage.InstanceRunning, b.get(id).Status)
	},

	"FailedChildPlanUndoesTheParentsStep": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		plan := callPlan(map[string][]storage.StepSpec{"call": {spec("c")}})
		id := b.createWith(plan, params(spec("a"), callSpec("call", "a")))
		c := b.claimStep(id, "a")
		crash := func(st *storage.InstanceState) (*storage.Plan, error) {
			if st.ID != id {
				return nil, errors.New("crash while planning the child")
			}
			return plan(st)
		}
		_, err := b.store.FinishSteps(b.ctx, []storage.StepResult{completed(c.Claim, `1`)}, crash)
		require.Error(t, err)
		in := b.get(id)
		require.Equal(t, storage.StepRunning, step(t, in, "a").Status, "a's completion was undone")
		require.Equal(t, storage.StepBlocked, step(t, in, "call").Status)
		all, err := b.store.ListInstances(b.ctx, storage.ListParams{})
		require.NoError(t, err)
		require.Len(t, all, 1, "no child was left behind")

		b.finishWith(plan, completed(c.Claim, `1`))
		require.Equal(t, storage.StepRunning, b.status(id, "call"))
		require.Len(t, step(t, b.get(id), "call").Children, 1)
	},

	"ListFilters": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		plan := callPlan(chainCalls)
		ids := b.chain(plan)
		plain := b.createOne(spec("a"))

		top, err := b.store.ListInstances(b.ctx, storage.ListParams{TopLevel: true})
		require.NoError(t, err)
		require.Equal(t, []string{plain, ids[0]}, instanceIDs(top))
		all, err := b.store.ListInstances(b.ctx, storage.ListParams{})
		require.NoError(t, err)
		require.Len(t, all, 5)
		kids, err := b.store.ListInstances(b.ctx, storage.ListParams{Parent: ids[1]})
		require.NoError(t, err)
		require.Equal(t, []string{ids[2]}, instanceIDs(kids))
		require.Equal(t, ids[1], kids[0].Parent.InstanceID)
		require.Equal(t, 2, kids[0].Depth)
		require.Equal(t, []string{ids[3]}, step(t, &kids[0], "call3").Children, "listed steps name their children")
		none, err := b.store.ListInstances(b.ctx, storage.ListParams{Parent: plain})
		require.NoError(t, err)
		require.Empty(t, none)
	},

	"PruneTakesChildrenWithTheirTopLevelAncestor": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		plan := callPlan(chainCalls)
		ids := b.chain(plan)
		b.completeWith(plan, ids[3], "leaf", `1`)
		b.clock.Advance(time.Hour)

		n, err := b.store.Prune(b.ctx, b.now(), true)
		require.NoError(t, err)
		require.Equal(t, 1, n, "children are not counted: they go with their parent")
		n, err = b.store.Prune(b.ctx, b.now(), false)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		for _, id := range ids {
			_, err := b.store.GetInstance(b.ctx, id)
			require.ErrorIs(t, err, storage.ErrNotFound)
		}
	},

	"PruneKeepsChildrenOfARecentParent": func(t *testing.T, h *Harness) {
		b := h.setup(t)
		plan := callPlan(map[string][]storage.StepSpec{"call": {spec("c")}})
		id := b.createWith(plan, params(callSpec("call"), spec("slow")))
		child := b.child(id, "call").ID
		b.completeWith(plan, child, "c", `1`)
		b.clock.Advance(time.Hour)
		b.completeWith(plan, id, "slow", `1`)
		require.Equal(t, storage.InstanceCompleted, b.get(id).Status)

		n, err := b.store.Prune(b.ctx, b.now().Add(-time.Minute), false)
		require.NoError(t, err)
		require.Zero(t, n, "the child finished long ago, but its parent did not")
		require.Equal(t, storage.InstanceCompleted, b.get(child).Status)
	},
}

func instanceIDs(list []storage.Instance) []string {
	out := make([]string, len(list))
	for i, in := range list {
		out[i] = in.ID
	}
	return out
}
