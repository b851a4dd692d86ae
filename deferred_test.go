package dagrun_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun"
	"github.com/dagrun/dagrun/storage"
)

// approvalWorkflow begins by waiting: one approval per customer at a time.
const approvalWorkflow = `
name: approval
concurrency: {key: "${{ input.customer }}", limit: 1}
steps:
  - name: approve
    wait: {signal: approve}
  - name: record
    handler: echo
    dependsOn: [approve]
    input: ${{ steps.approve.output }}
output: ${{ steps.record.output }}
`

// An instance held by its workflow's limit takes its turn even when its
// first step waits: it starts waiting, and takes signals, only once
// admitted, not as it is created.
func TestAWaitingFirstStepTakesItsTurnUnderAWorkflowLimit(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		b := setup(t, open, nil, approvalWorkflow)
		b.runWorker(t, nil)
		first := b.start(t, "approval", `{"customer": "acme"}`)
		second := b.start(t, "approval", `{"customer": "acme"}`)
		b.awaitStatus(t, first, "approve", storage.StepWaiting)

		res, err := b.signal(t, second, "approve", `"second"`)
		require.NoError(t, err)
		require.False(t, res.Delivered, "the held instance took a signal before its turn")
		inst, err := b.engine.Get(context.Background(), second)
		require.NoError(t, err)
		require.Equal(t, storage.InstancePending, inst.Status)
		require.Equal(t, storage.StepBlocked, step(t, inst, "approve").Status)

		res, err = b.signal(t, first, "approve", `"first"`)
		require.NoError(t, err)
		require.True(t, res.Delivered)
		a, z := b.wait(t, first), b.wait(t, second)
		require.Equal(t, storage.InstanceCompleted, a.Status, a.Error)
		require.Equal(t, storage.InstanceCompleted, z.Status, z.Error)
		requireJSON(t, `"second"`, z.Output)
		require.False(t, z.StartedAt.Before(*a.FinishedAt), "the second instance started at %v, before the first finished at %v", z.StartedAt, a.FinishedAt)
	})
}

// A delayed instance whose first step starts a child starts it when its
// time comes, not as it is created; its workflow timeout counts from then.
func TestADelayedFirstWorkflowStepStartsItsChildWhenDue(t *testing.T) {
	t.Parallel()
	const parent = `
name: parent
timeout: 1h
steps:
  - name: ship
    workflow: shipping
    input: {orderId: "${{ input.orderId }}"}
output: ${{ steps.ship.output }}
`
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		b := setup(t, open, shipRegistry(nil), shippingWorkflow, parent)
		const delay = 300 * time.Millisecond
		res, err := b.engine.Start(context.Background(), "parent", json.RawMessage(`{"orderId": 7}`), &dagrun.StartOptions{Delay: delay})
		require.NoError(t, err)
		inst, err := b.engine.Get(context.Background(), res.ID)
		require.NoError(t, err)
		require.Equal(t, storage.InstancePending, inst.Status)
		require.Nil(t, inst.Deadline, "the timeout counts from the start")
		ship := step(t, inst, "ship")
		require.Equal(t, storage.StepBlocked, ship.Status)
		require.Empty(t, ship.Children, "the child started before its parent's time")

		b.runWorker(t, nil)
		done := b.wait(t, res.ID)
		require.Equal(t, storage.InstanceCompleted, done.Status, done.Error)
		requireJSON(t, `{"tracking": "T-7"}`, done.Output)
		// The delay counts from the start request, whose clock may not be
		// the database's: compare with the time it set.
		require.False(t, done.RunAfter.Before(done.CreatedAt.Add(delay-100*time.Millisecond)), "run after %v, created at %v", done.RunAfter, done.CreatedAt)
		require.False(t, done.StartedAt.Before(done.RunAfter), "started at %v, due at %v", done.StartedAt, done.RunAfter)
		child, err := b.engine.Get(context.Background(), childOf(t, done, "ship"))
		require.NoError(t, err)
		require.False(t, child.CreatedAt.Before(done.RunAfter), "child created at %v, its parent due at %v", child.CreatedAt, done.RunAfter)
	})
}

// A delayed instance whose first step is a forEach expands it when its
// time comes: until then the step is blocked, neither running with items
// waiting under it nor, over an empty list, completed before its time.
func TestADelayedFirstForEachStepExpandsWhenDue(t *testing.T) {
	t.Parallel()
	const fanout = `
name: fanout
steps:
  - name: each
    forEach: ${{ input.names }}
    handler: echo
    input: ${{ item }}
output: ${{ steps.each.output }}
`
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		b := setup(t, open, nil, fanout)
		const delay = 300 * time.Millisecond
		var ids []string
		for _, names := range []string{`["a", "b"]`, `[]`} {
			res, err := b.engine.Start(context.Background(), "fanout", json.RawMessage(`{"names": `+names+`}`), &dagrun.StartOptions{Delay: delay})
			require.NoError(t, err)
			inst, err := b.engine.Get(context.Background(), res.ID)
			require.NoError(t, err)
			require.Equal(t, storage.InstancePending, inst.Status)
			each := step(t, inst, "each")
			require.Equal(t, storage.StepBlocked, each.Status, "names %s", names)
			require.Nil(t, each.StartedAt, "names %s", names)
			ids = append(ids, res.ID)
		}

		b.runWorker(t, nil)
		for i, want := range []string{`["a", "b"]`, `[]`} {
			done := b.wait(t, ids[i])
			require.Equal(t, storage.InstanceCompleted, done.Status, done.Error)
			requireJSON(t, want, done.Output)
			each := step(t, done, "each")
			require.False(t, each.FinishedAt.Before(done.RunAfter), "each finished at %v, its instance due at %v", each.FinishedAt, done.RunAfter)
			if each.StartedAt != nil {
				require.False(t, each.StartedAt.Before(done.RunAfter), "each started at %v, its instance due at %v", each.StartedAt, done.RunAfter)
			}
		}
	})
}

// TestAnInstanceDoneWithoutAClaimHasStarted: an instance whose every step
// is skipped, or an empty forEach, completes without a worker claiming
// anything; it started when it finished, not never.
func TestAnInstanceDoneWithoutAClaimHasStarted(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		b := setup(t, open, nil, `
name: nothing
steps:
  - {name: a, handler: noop, when: "${{ false }}"}
  - {name: b, handler: echo, forEach: []}
`)
		res, err := b.engine.Start(t.Context(), "nothing", nil, nil)
		require.NoError(t, err)
		b.runWorker(t, nil)
		inst := b.wait(t, res.ID)
		require.Equal(t, storage.InstanceCompleted, inst.Status)
		require.NotNil(t, inst.StartedAt, "a completed instance has started")
		require.NotNil(t, inst.FinishedAt)
		require.False(t, inst.StartedAt.After(*inst.FinishedAt))
	})
}
