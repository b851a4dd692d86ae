package dagrun_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun"
	"github.com/dagrun/dagrun/dag"
	"github.com/dagrun/dagrun/handlers"
	"github.com/dagrun/dagrun/storage"
)

// shippingWorkflow is a sub-workflow: its input needs an orderId.
const shippingWorkflow = `
name: shipping
input:
  type: object
  required: [orderId]
  properties:
    orderId: {type: integer}
steps:
  - name: label
    handler: ship
    input: {orderId: "${{ input.orderId }}"}
output:
  tracking: ${{ steps.label.output.tracking }}
`

// fulfilmentWorkflow calls shipping, then reads its output.
const fulfilmentWorkflow = `
name: fulfilment
steps:
  - name: pick
    handler: echo
    input: {orderId: "${{ input.orderId }}"}
  - name: ship
    dependsOn: [pick]
    workflow: shipping
    input: {orderId: "${{ steps.pick.output.orderId }}"}
  - name: notify
    dependsOn: [ship]
    handler: echo
    input: {tracking: "${{ steps.ship.output.tracking }}"}
output: ${{ steps.notify.output }}
`

// shipRegistry's ship handler returns a tracking number for the order, or
// fails for good for order 0.
func shipRegistry(ship handlers.Handler) *handlers.Registry {
	r := handlers.NewRegistry()
	if ship == nil {
		ship = func(_ context.Context, in json.RawMessage) (json.RawMessage, error) {
			var v struct{ OrderID int }
			if err := json.Unmarshal(in, &v); err != nil {
				return nil, err
			}
			if v.OrderID == 0 {
				return nil, handlers.Permanent(errors.New("no such order"))
			}
			return json.Marshal(map[string]any{"tracking": "T-" + itoa(v.OrderID)})
		}
	}
	r.Register("ship", ship)
	return r
}

func childOf(t *testing.T, inst *storage.Instance, name string) string {
	t.Helper()
	st := step(t, inst, name)
	require.Len(t, st.Children, 1, "step %s has one child", name)
	return st.Children[0]
}

func TestWorkflowStepCompletesWithItsChildsOutput(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		b := setup(t, open, shipRegistry(nil), shippingWorkflow, fulfilmentWorkflow)
		b.runWorker(t, nil)
		ctx := context.Background()
		res, err := b.engine.Start(ctx, "fulfilment", json.RawMessage(`{"orderId": 42}`), &dagrun.StartOptions{Priority: 5})
		require.NoError(t, err)
		inst := b.wait(t, res.ID)
		require.Equal(t, storage.InstanceCompleted, inst.Status, inst.Error)
		requireJSON(t, `{"tracking": "T-42"}`, inst.Output)
		ship := step(t, inst, "ship")
		require.Equal(t, "shipping", ship.Workflow)
		requireJSON(t, `{"tracking": "T-42"}`, ship.Output)

		child, err := b.engine.Get(ctx, childOf(t, inst, "ship"))
		require.NoError(t, err)
		require.Equal(t, storage.InstanceCompleted, child.Status)
		require.Equal(t, &storage.ParentRef{InstanceID: inst.ID, Step: "ship", Item: -1}, child.Parent)
		require.Equal(t, 1, child.Depth)
		require.Equal(t, 5, child.Priority, "a child runs at its parent's priority")
		requireJSON(t, `{"orderId": 42}`, child.Input)
		w, _ := b.engine.Workflow("shipping")
		require.Equal(t, w.Hash, child.DefinitionHash, "the child runs under its own workflow's snapshot")

		top, err := b.engine.List(ctx, storage.ListParams{TopLevel: true})
		require.NoError(t, err)
		require.Len(t, top, 1)
		require.Equal(t, inst.ID, top[0].ID)
	})
}

// Under a limit of one on the queue every step here shares, the parent's
// workflow step holds no slot while its child runs: the child's step
// takes the slot, and then the parent's next one. The workflow step took
// it, and the child waited for ever on its own parent.
func TestWorkflowStepUnderAQueueLimitOfOne(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		b := setup(t, open, shipRegistry(nil), shippingWorkflow, fulfilmentWorkflow)
		require.NoError(t, b.engine.SetQueueLimit(context.Background(), dagrun.QueueLimit{Queue: "default", Concurrency: 1}))
		b.runWorker(t, nil)
		inst := b.wait(t, b.start(t, "fulfilment", `{"orderId": 42}`))
		require.Equal(t, storage.InstanceCompleted, inst.Status, inst.Error)
		requireJSON(t, `{"tracking": "T-42"}`, inst.Output)
	})
}

// TestAChildTimesOutWithoutAPoll: a child instance's workflow timeout
// starts in its parent's finish, which wakes no idle claim loop when it has
// nothing else to claim; the plan that starts the child tells the claim
// loops of its deadline (a child's timeout once fired only at the next
// poll on SQLite), whether the child starts by waiting or by a step.
func TestAChildTimesOutWithoutAPoll(t *testing.T) {
	t.Parallel()
	for name, first := range map[string]string{
		"waiting first": `{name: approve, wait: {signal: go}}`,
		"a step first": `{name: x, handler: echo, input: {}}
  - {name: approve, dependsOn: [x], wait: {signal: go}}`,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
				b := setup(t, open, nil, `
name: slow-approval
timeout: 300ms
steps:
  - `+first, `
name: order
steps:
  - {name: take, handler: echo, input: {}}
  - {name: approval, dependsOn: [take], workflow: slow-approval}
`, chainWorkflow)
				b.runWorker(t, &dagrun.WorkerConfig{Poll: time.Hour, Lease: 10 * time.Minute})
				b.wait(t, b.start(t, "chain", `{"n": 1}`)) // an idle worker
				inst := b.wait(t, b.start(t, "order", `{}`))
				require.Equal(t, storage.InstanceFailed, inst.Status)
				child := childOf(t, inst, "approval")
				require.Equal(t, "child instance "+child+" failed: workflow timed out after 300ms", step(t, inst, "approval").Error)
			})
		})
	}
}

func TestChildFailureFailsTheParentStep(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		b := setup(t, open, shipRegistry(nil), shippingWorkflow, fulfilmentWorkflow)
		b.runWorker(t, nil)
		inst := b.wait(t, b.start(t, "fulfilment", `{"orderId": 0}`))
		require.Equal(t, storage.InstanceFailed, inst.Status)
		child := childOf(t, inst, "ship")
		want := "child instance " + child + " failed in step label: no such order"
		require.Equal(t, want, step(t, inst, "ship").Error)
		require.Equal(t, "step ship failed: "+want, inst.Error)
		require.Equal(t, storage.StepCancelled, step(t, inst, "notify").Status)
	})
}

func TestRetryOfTheParentRetriesTheFailedChild(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		var fail atomic.Bool
		fail.Store(true)
		var calls atomic.Int32
		registry := shipRegistry(func(_ context.Context, in json.RawMessage) (json.RawMessage, error) {
			calls.Add(1)
			if fail.Load() {
				return nil, handlers.Permanent(errors.New("carrier down"))
			}
			return json.RawMessage(`{"tracking": "T-1"}`), nil
		})
		b := setup(t, open, registry, shippingWorkflow, fulfilmentWorkflow)
		b.runWorker(t, nil)
		ctx := context.Background()
		id := b.start(t, "fulfilment", `{"orderId": 1}`)
		inst := b.wait(t, id)
		require.Equal(t, storage.InstanceFailed, inst.Status)
		child := childOf(t, inst, "ship")

		err := b.engine.Retry(ctx, child)
		require.ErrorIs(t, err, storage.ErrConflict)
		require.Contains(t, err.Error(), "dagrun retry "+id+" retries this child")

		fail.Store(false)
		require.NoError(t, b.engine.Retry(ctx, id))
		inst = b.wait(t, id)
		require.Equal(t, storage.InstanceCompleted, inst.Status, inst.Error)
		require.Equal(t, child, childOf(t, inst, "ship"), "the same child ran again")
		require.Equal(t, 1, step(t, inst, "pick").Attempts, "completed steps are kept")
		require.Equal(t, int32(2), calls.Load())
	})
}

func TestInvalidChildInputFailsTheStepForGood(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		b := setup(t, open, shipRegistry(nil), shippingWorkflow, `
name: sloppy
steps:
  - name: ship
    workflow: shipping
    input: {orderId: "not a number"}
`)
		b.runWorker(t, nil)
		inst := b.wait(t, b.start(t, "sloppy", ``))
		require.Equal(t, storage.InstanceFailed, inst.Status)
		ship := step(t, inst, "ship")
		require.Empty(t, ship.Children, "no child was created")
		require.Equal(t, "input for workflow shipping: input does not match the workflow's schema: at /orderId: got string, want integer", ship.Error)
		all, err := b.engine.List(context.Background(), storage.ListParams{})
		require.NoError(t, err)
		require.Len(t, all, 1)
	})
}

func TestDepthLimitStopsRecursion(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		// A workflow that calls itself: validation across files refuses
		// it, but an engine given one must still stop.
		w, err := dag.Parse("", []byte(`
name: forever
steps:
  - name: again
    workflow: forever
`), nil)
		require.NoError(t, err)
		store := open(t)
		engine, err := dagrun.New(store, handlers.NewRegistry(), &dagrun.Config{Workflows: []*dag.Workflow{w}, MaxDepth: 3})
		require.NoError(t, err)
		ctx := context.Background()
		res, err := engine.Start(ctx, "forever", nil, nil)
		require.NoError(t, err)
		inst, err := engine.Get(ctx, res.ID)
		require.NoError(t, err)
		require.Equal(t, storage.InstanceFailed, inst.Status, "every level failed in the creating transaction")
		ids := []string{res.ID}
		for depth := 1; depth <= 3; depth++ {
			child, err := engine.Get(ctx, childOf(t, inst, "again"))
			require.NoError(t, err)
			require.Equal(t, depth, child.Depth)
			require.Equal(t, storage.InstanceFailed, child.Status)
			ids = append(ids, child.ID)
			inst = child
		}
		require.Equal(t, "sub-workflow depth limit 3 reached: instance "+inst.ID+" (workflow forever) is at depth 3 and cannot start workflow forever; stop the recursion, or raise the engine's depth limit (--max-depth)",
			step(t, inst, "again").Error)
		require.Empty(t, step(t, inst, "again").Children)
	})
}

func TestForEachWorkflowStartsOneChildPerItem(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		b := setup(t, open, shipRegistry(nil), shippingWorkflow, `
name: batch
steps:
  - name: each
    forEach: ${{ input.orders }}
    workflow: shipping
    input: {orderId: "${{ item }}"}
output: ${{ steps.each.output }}
`)
		b.runWorker(t, nil)
		inst := b.wait(t, b.start(t, "batch", `{"orders": [3, 1, 2]}`))
		require.Equal(t, storage.InstanceCompleted, inst.Status, inst.Error)
		requireJSON(t, `[{"tracking": "T-3"}, {"tracking": "T-1"}, {"tracking": "T-2"}]`, inst.Output)
		require.Len(t, step(t, inst, "each").Children, 3)
	})
}

func TestCancelOfTheParentStopsTheChildsHandlers(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		started := make(chan struct{})
		stopped := make(chan error, 1)
		registry := shipRegistry(func(ctx context.Context, _ json.RawMessage) (json.RawMessage, error) {
			close(started)
			<-ctx.Done()
			stopped <- context.Cause(ctx)
			return nil, ctx.Err()
		})
		b := setup(t, open, registry, shippingWorkflow, fulfilmentWorkflow)
		// A long lease: only the cancel itself can stop the handler in time.
		b.runWorker(t, &dagrun.WorkerConfig{Lease: time.Minute})
		id := b.start(t, "fulfilment", `{"orderId": 7}`)
		<-started
		ctx := context.Background()
		require.NoError(t, b.engine.Cancel(ctx, id))
		select {
		case <-stopped:
		case <-time.After(10 * time.Second):
			t.Fatal("the child's handler was not stopped")
		}
		inst := b.wait(t, id)
		require.Equal(t, storage.InstanceCancelled, inst.Status)
		child, err := b.engine.Get(ctx, childOf(t, inst, "ship"))
		require.NoError(t, err)
		require.Equal(t, storage.InstanceCancelled, child.Status)
		require.Equal(t, "parent instance "+id+" was cancelled", child.Error)
	})
}

// A worker dies in the middle of the child's step: its lease expires,
// another worker takes the step over, and the parent still completes with
// the child's output.
func TestChildStepOfADeadWorkerIsRecoveredAndTheParentCompletes(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		b := setup(t, open, shipRegistry(nil), shippingWorkflow, fulfilmentWorkflow)
		ctx := context.Background()
		id := b.start(t, "fulfilment", `{"orderId": 9}`)
		// A worker that cannot ship runs pick, which starts the child; then
		// a worker claims the child's step and dies holding it.
		b.runWorkerUntil(t, func() bool {
			inst, err := b.engine.Get(ctx, id)
			require.NoError(t, err)
			return len(step(t, inst, "ship").Children) == 1
		})
		claimed, err := b.store.ClaimSteps(ctx, storage.ClaimParams{WorkerID: "dies", Limit: 10, Lease: 50 * time.Millisecond})
		require.NoError(t, err)
		require.Len(t, claimed, 1)
		require.Equal(t, "label", claimed[0].Step)

		// A second engine, as another process would run, recovers it.
		second, err := dagrun.New(b.store, b.registry, &dagrun.Config{Workflows: b.engine.Workflows()})
		require.NoError(t, err)
		b.engine = second
		b.runWorker(t, &dagrun.WorkerConfig{Lease: time.Second}) // recovers every 500ms
		inst := b.wait(t, id)
		require.Equal(t, storage.InstanceCompleted, inst.Status, inst.Error)
		requireJSON(t, `{"tracking": "T-9"}`, inst.Output)
		child, err := b.engine.Get(ctx, childOf(t, inst, "ship"))
		require.NoError(t, err)
		// The dead worker's attempt ended by its lease and counted; the
		// step completed on a later one. Not necessarily the second: on a
		// loaded machine the live worker's heartbeat can miss its 1s lease
		// too, which is one more recovery, not a fault.
		expired := lifecycle(child, storage.EventStepLeaseExpired)
		require.NotEmpty(t, expired, "the dead worker's lease expired")
		require.Equal(t, "label", expired[0].Step)
		require.Equal(t, 1, expired[0].Attempt, "the dead worker's attempt counted")
		completed := lifecycle(child, storage.EventStepCompleted)
		require.Len(t, completed, 1)
		label := step(t, child, "label")
		require.GreaterOrEqual(t, label.Attempts, 2, "the dead worker's attempt counted")
		require.Equal(t, label.Attempts, completed[0].Attempt, "the step completed on its latest attempt")
		res, err := b.store.FinishSteps(ctx, []storage.StepResult{{Claim: claimed[0].Claim, Outcome: storage.OutcomeCompleted, Output: json.RawMessage(`{"tracking": "stale"}`)}},
			func(*storage.InstanceState) (*storage.Plan, error) {
				return nil, errors.New("a stale result must not be planned")
			})
		require.NoError(t, err)
		require.False(t, res[0].Accepted, "the dead worker's late result is fenced off")
	})
}

// runWorkerUntil runs a worker with only the built-in handlers, on an
// engine of its own, until done holds, then stops it and waits for it.
func (b *testBundle) runWorkerUntil(t *testing.T, done func() bool) {
	t.Helper()
	builtins := handlers.NewRegistry()
	handlers.RegisterBuiltins(builtins)
	engine, err := dagrun.New(b.store, builtins, &dagrun.Config{Workflows: b.engine.Workflows()})
	require.NoError(t, err)
	worker, err := engine.NewWorker(&dagrun.WorkerConfig{Poll: 10 * time.Millisecond})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { defer close(stopped); _ = worker.Run(ctx) }()
	require.Eventually(t, done, 20*time.Second, 10*time.Millisecond)
	cancel()
	<-stopped
}

func TestUnknownChildWorkflowFailsTheStepForGood(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		// Loading a folder refuses this; an engine given it must not loop.
		b := setup(t, open, nil, `
name: lost
steps:
  - name: call
    workflow: nowhere
`)
		res, err := b.engine.Start(context.Background(), "lost", nil, nil)
		require.NoError(t, err)
		inst, err := b.engine.Get(context.Background(), res.ID)
		require.NoError(t, err)
		require.Equal(t, storage.InstanceFailed, inst.Status)
		require.Equal(t, `workflow step: unknown workflow "nowhere" (available: lost)`, step(t, inst, "call").Error)
	})
}

// crashingStore fails the first commit of a child's last step as a crash
// half-way through it would: the parent's plan fails inside the very
// transaction that completed the child, which then rolls back whole.
type crashingStore struct {
	storage.Store
	crashed atomic.Bool
	seen    chan afterCrash
}

// afterCrash is the child's status and its parent step's, right after
// the crash.
type afterCrash struct {
	child storage.InstanceStatus
	step  storage.StepStatus
}

func (s *crashingStore) FinishSteps(ctx context.Context, rs []storage.StepResult, plan storage.PlanFunc) ([]storage.FinishResult, error) {
	if len(rs) != 1 || rs[0].Claim.Step != "label" || s.crashed.Swap(true) {
		return s.Store.FinishSteps(ctx, rs, plan)
	}
	child := rs[0].Claim.InstanceID
	_, err := s.Store.FinishSteps(ctx, rs, func(st *storage.InstanceState) (*storage.Plan, error) {
		if st.ID != child {
			return nil, errors.New("crash while settling the parent")
		}
		return plan(st)
	})
	in, getErr := s.Store.GetInstance(ctx, child)
	if getErr == nil {
		parent, _ := s.Store.GetInstance(ctx, in.Parent.InstanceID)
		s.seen <- afterCrash{in.Status, parentStep(parent, in.Parent.Step)}
	}
	return nil, err
}

func parentStep(in *storage.Instance, name string) storage.StepStatus {
	for _, s := range in.Steps {
		if s.Name == name {
			return s.Status
		}
	}
	return ""
}

func TestACrashBetweenChildAndParentLeavesNeitherHalfDone(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		crashing := &crashingStore{Store: open(t), seen: make(chan afterCrash, 1)}
		b := setup(t, func(*testing.T) storage.Store { return crashing }, shipRegistry(nil), shippingWorkflow, fulfilmentWorkflow)
		b.runWorker(t, nil)
		id := b.start(t, "fulfilment", `{"orderId": 5}`)
		select {
		case seen := <-crashing.seen:
			require.Equal(t, afterCrash{storage.InstanceRunning, storage.StepRunning}, seen,
				"after the crash the child is still running, and so is its parent's step")
		case <-time.After(20 * time.Second):
			t.Fatal("the child's step was never finished")
		}
		// The worker records the result again, and both complete together.
		inst := b.wait(t, id)
		require.Equal(t, storage.InstanceCompleted, inst.Status, inst.Error)
		requireJSON(t, `{"tracking": "T-5"}`, inst.Output)
	})
}

// TestBulkCancelLeavesChildrenToTheirParents: a selection picks what
// `list` shows, top-level instances; cancelling a child by itself, which
// fails its parent's step, takes asking for children.
func TestBulkCancelLeavesChildrenToTheirParents(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		b := setup(t, open, shipRegistry(nil), shippingWorkflow, `
name: caller
steps:
  - {name: ship, workflow: shipping, input: {orderId: 1}}
`)
		parent := b.start(t, "caller", ``) // no worker: the child waits, pending
		ctx := context.Background()
		n, err := b.engine.CancelSelected(ctx, dagrun.Selection{Workflow: "shipping"})
		require.NoError(t, err)
		require.Zero(t, n, "the child goes with its parent")
		inst, err := b.engine.Get(ctx, parent)
		require.NoError(t, err)
		require.Equal(t, storage.InstanceRunning, inst.Status, "its workflow step started it")

		n, err = b.engine.CancelSelected(ctx, dagrun.Selection{Workflow: "shipping", Children: true})
		require.NoError(t, err)
		require.Equal(t, 1, n)
		inst = b.wait(t, parent)
		require.Equal(t, storage.InstanceFailed, inst.Status, "a child cancelled by itself fails its parent's step")
	})
}

// A child runs under its own workflow's timeout, as an instance started
// directly does: the child times out and fails its parent's step with it.
func TestChildTimesOutUnderItsWorkflowsTimeout(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		b := setup(t, open, hangRegistry(), `
name: slow-child
timeout: 200ms
steps:
  - {name: work, handler: hang}
`, `
name: caller
steps:
  - {name: call, workflow: slow-child}
`)
		b.runWorker(t, nil)
		inst := b.wait(t, b.start(t, "caller", `{}`))
		require.Equal(t, storage.InstanceFailed, inst.Status)
		child, err := b.engine.Get(context.Background(), childOf(t, inst, "call"))
		require.NoError(t, err)
		require.Equal(t, storage.InstanceFailed, child.Status)
		require.Equal(t, "workflow timed out after 200ms", child.Error)
		require.Equal(t, 200*time.Millisecond, child.Timeout)
		require.Equal(t, "child instance "+child.ID+" failed: workflow timed out after 200ms", step(t, inst, "call").Error)
	})
}

// A child counts against its workflow's concurrency limit, with the
// instances started directly: one running per key, the others held
// until it finishes. A key its input cannot give fails the step for good.
func TestChildWaitsForItsWorkflowsConcurrencyLimit(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		release := make(chan struct{})
		var gates concurrentCalls
		var calls atomic.Int32
		registry := handlers.NewRegistry()
		registry.Register("gate", func(ctx context.Context, _ json.RawMessage) (json.RawMessage, error) {
			calls.Add(1)
			defer gates.enter()()
			select {
			case <-release:
				return json.RawMessage(`"done"`), nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		})
		b := setup(t, open, registry, `
name: per-account
concurrency: {key: "${{ input.account }}", limit: 1}
steps:
  - {name: book, handler: gate}
`, `
name: batch
steps:
  - name: each
    forEach: ${{ input.accounts }}
    workflow: per-account
    input: {account: "${{ item }}"}
`)
		direct := b.start(t, "per-account", `{"account": "acme"}`)
		parent := b.start(t, "batch", `{"accounts": ["acme", "acme"]}`)
		inst, err := b.engine.Get(context.Background(), parent)
		require.NoError(t, err)
		children := step(t, inst, "each").Children
		require.Len(t, children, 2)
		for _, id := range children {
			require.True(t, b.held(t, id, "book"), "child %s waits for the directly started acme instance", id)
		}

		b.runWorker(t, nil)
		for range 3 {
			require.Eventually(t, func() bool { return gates.running.Load() == 1 }, 20*time.Second, 5*time.Millisecond)
			release <- struct{}{}
		}
		require.Equal(t, storage.InstanceCompleted, b.wait(t, direct).Status)
		require.Equal(t, storage.InstanceCompleted, b.wait(t, parent).Status)
		require.Equal(t, int32(3), calls.Load())
		require.Equal(t, int32(1), gates.most.Load(), "two acme instances ran at once")

		bad := b.wait(t, b.start(t, "batch", `{"accounts": [{"id": 1}]}`))
		require.Equal(t, storage.InstanceFailed, bad.Status)
		require.Empty(t, step(t, bad, "each").Children, "no child was created")
		require.Equal(t, "input of item 0 for workflow per-account: concurrency.key: the key must be a text, a number or a boolean, got an object", step(t, bad, "each").Error)
	})
}

// cappedFanoutWorkflow runs leg once per item of its input, two children
// at a time.
const cappedFanoutWorkflow = `
name: fanout
steps:
  - name: each
    forEach: ${{ input.items }}
    workflow: leg
    concurrency: 2
    input: {item: "${{ item }}"}
output: ${{ steps.each.output }}
`

// concurrentCalls counts the handler calls running and the most that ran
// at once.
type concurrentCalls struct{ running, most atomic.Int32 }

// enter counts a call in; the function it returns counts it out.
func (c *concurrentCalls) enter() func() {
	n := c.running.Add(1)
	for m := c.most.Load(); n > m && !c.most.CompareAndSwap(m, n); m = c.most.Load() {
	}
	return func() { c.running.Add(-1) }
}

// A forEach workflow step with concurrency N runs at most N children at
// once: the others wait pending (their items too) and are admitted in item
// order as earlier ones finish.
func TestForEachWorkflowConcurrencyCapsTheChildrenRunning(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		letters := []string{"a", "b", "c", "d", "e"}
		release := map[string]chan struct{}{}
		for _, l := range letters {
			release[l] = make(chan struct{})
		}
		var gates concurrentCalls
		registry := handlers.NewRegistry()
		registry.Register("gate", func(ctx context.Context, in json.RawMessage) (json.RawMessage, error) {
			var v struct{ Item string }
			if err := json.Unmarshal(in, &v); err != nil {
				return nil, err
			}
			defer gates.enter()()
			select {
			case <-release[v.Item]:
				return json.Marshal(map[string]string{"got": v.Item})
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		})
		b := setup(t, open, registry, `
name: leg
steps:
  - {name: hold, handler: gate, input: {item: "${{ input.item }}"}}
output: ${{ steps.hold.output }}
`, cappedFanoutWorkflow)
		parent := b.start(t, "fanout", `{"items": ["a", "b", "c", "d", "e"]}`)
		inst, err := b.engine.Get(context.Background(), parent)
		require.NoError(t, err)
		each := step(t, inst, "each")
		children := each.Children
		require.Len(t, children, 5)
		require.Equal(t, storage.ItemCounts{Total: 5, Pending: 3, Running: 2}, *each.Items, "an item whose child waits for its slot is not running")
		items, err := b.store.ListItems(context.Background(), storage.ItemsParams{InstanceID: parent, Step: "each"})
		require.NoError(t, err)
		var statuses []storage.StepStatus
		for _, it := range items {
			statuses = append(statuses, it.Status)
		}
		require.Equal(t, []storage.StepStatus{storage.StepRunning, storage.StepRunning, storage.StepPending, storage.StepPending, storage.StepPending}, statuses)
		pending, err := b.store.ListItems(context.Background(), storage.ItemsParams{InstanceID: parent, Step: "each", Status: storage.StepPending})
		require.NoError(t, err)
		require.Len(t, pending, 3, "the status filter agrees with the statuses shown")

		// admitted reports which children may run: the first n, in item order.
		admitted := func(n int) bool {
			for i, id := range children {
				if b.held(t, id, "hold") != (i >= n) {
					return false
				}
			}
			return true
		}
		require.True(t, admitted(2))
		b.runWorker(t, nil)
		for i, l := range letters {
			require.Eventually(t, func() bool { return gates.running.Load() == int32(min(2, len(letters)-i)) }, 20*time.Second, 5*time.Millisecond)
			release[l] <- struct{}{}
			require.Eventually(t, func() bool { return admitted(min(i+3, len(letters))) }, 20*time.Second, 5*time.Millisecond,
				"item %d finished: the next in item order is admitted, no other", i)
		}
		inst = b.wait(t, parent)
		require.Equal(t, storage.InstanceCompleted, inst.Status, inst.Error)
		requireJSON(t, `[{"got": "a"}, {"got": "b"}, {"got": "c"}, {"got": "d"}, {"got": "e"}]`, inst.Output)
		require.Equal(t, int32(2), gates.most.Load(), "more than 2 children ran at once")
	})
}

// A retry of the parent of a capped forEach workflow step runs its failed
// and cancelled children again under the same cap: the children it
// retries wait for their slots, as they did at the first run.
func TestForEachWorkflowConcurrencyHoldsAcrossARetry(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		var fail atomic.Bool
		fail.Store(true)
		release := make(chan struct{})
		var gates concurrentCalls
		registry := handlers.NewRegistry()
		registry.Register("gate", func(ctx context.Context, in json.RawMessage) (json.RawMessage, error) {
			if fail.Load() {
				return nil, handlers.Permanent(errors.New("not yet"))
			}
			defer gates.enter()()
			select {
			case <-release:
				return in, nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		})
		b := setup(t, open, registry, `
name: leg
steps:
  - {name: hold, handler: gate, input: {item: "${{ input.item }}"}, retry: {maxAttempts: 1}}
output: ${{ steps.hold.output.item }}
`, cappedFanoutWorkflow)
		_, stopFirst := b.runStoppableWorker(t, nil)
		ctx := context.Background()
		parent := b.start(t, "fanout", `{"items": ["a", "b", "c", "d", "e", "f"]}`)
		inst := b.wait(t, parent)
		require.Equal(t, storage.InstanceFailed, inst.Status)
		each := step(t, inst, "each")
		// A child that failed frees its slot before its failure fails the
		// step, so a third may have started meanwhile: the count is not
		// bounded here.
		require.Equal(t, 6, each.Items.Failed+each.Items.Cancelled, "every item failed or was cancelled: %+v", *each.Items)
		// An attempt of a cancelled child may still be on its way to its
		// handler as the parent fails: the worker stops it at once, but
		// it could step into the gate for a moment beside the retried
		// children. Run returns only once its handlers have, so the
		// retry starts with none of the first run's left.
		stopFirst()

		fail.Store(false)
		b.runWorker(t, nil)
		require.NoError(t, b.engine.Retry(ctx, parent))
		for left := 6; left > 0; left-- {
			require.Eventually(t, func() bool { return gates.running.Load() == int32(min(2, left)) }, 20*time.Second, 5*time.Millisecond,
				"%d children left: as many run as the cap allows", left)
			release <- struct{}{}
		}
		inst = b.wait(t, parent)
		require.Equal(t, storage.InstanceCompleted, inst.Status, inst.Error)
		requireJSON(t, `["a", "b", "c", "d", "e", "f"]`, inst.Output)
		require.Equal(t, int32(2), gates.most.Load(), "more than 2 retried children ran at once")
	})
}

// A child workflow with a concurrency of its own cannot take the cap of a
// forEach step as well: loading a folder refuses it, and a definition that
// changed since fails the step for good rather than dropping one limit.
func TestForEachWorkflowConcurrencyOverALimitedChildFailsTheStep(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		b := setup(t, open, nil, oneAtATimeWorkflow, `
name: fanout
steps:
  - name: each
    forEach: [1, 2, 3]
    workflow: one-at-a-time
    concurrency: 2
`)
		inst := b.wait(t, b.start(t, "fanout", ""))
		require.Equal(t, storage.InstanceFailed, inst.Status)
		each := step(t, inst, "each")
		require.Empty(t, each.Children, "no child was created")
		require.Equal(t, `workflow "one-at-a-time" limits its instances with its own "concurrency", so a forEach step over it cannot cap its items too: remove one of them`, each.Error)
	})
}

// countingObserver counts the instances started and finished, by workflow.
type countingObserver struct {
	mu                sync.Mutex
	started, finished map[string]int
}

func (o *countingObserver) InstanceStarted(workflow string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.started[workflow]++
}

func (o *countingObserver) InstanceFinished(workflow string, _ storage.InstanceStatus) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.finished[workflow]++
}

func (o *countingObserver) AttemptFinished(dagrun.AttemptReport) {}

// TestChildInstancesCountAsStarted: the instances workflow steps start
// are counted as started, as they are counted as finished, so that
// started less finished is what runs.
func TestChildInstancesCountAsStarted(t *testing.T) {
	const child = "name: child\nsteps:\n  - name: a\n    handler: echo\n    input: ${{ input }}\n"
	const parent = "name: parent\nsteps:\n  - name: first\n    workflow: child\n  - name: each\n    dependsOn: [first]\n    forEach: [1, 2]\n    workflow: child\n    input: ${{ item }}\n"
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		var workflows []*dag.Workflow
		for _, src := range []string{child, parent} {
			w, err := dag.Parse("", []byte(src), nil)
			require.NoError(t, err)
			workflows = append(workflows, w)
		}
		registry := handlers.NewRegistry()
		handlers.RegisterBuiltins(registry)
		obs := &countingObserver{started: map[string]int{}, finished: map[string]int{}}
		store := open(t)
		engine, err := dagrun.New(store, registry, &dagrun.Config{Workflows: workflows, Observer: obs})
		require.NoError(t, err)
		b := &testBundle{engine: engine, store: store, registry: registry}
		b.runWorker(t, nil)
		inst := b.wait(t, b.start(t, "parent", `{}`))
		require.Equal(t, storage.InstanceCompleted, inst.Status, inst.Error)
		obs.mu.Lock()
		defer obs.mu.Unlock()
		require.Equal(t, map[string]int{"parent": 1, "child": 3}, obs.started)
		require.Equal(t, obs.started, obs.finished)
	})
}
