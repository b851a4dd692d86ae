package dagrun_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun"
	"github.com/dagrun/dagrun/storage"
)

const perCustomerWorkflow = `
name: per-customer
concurrency: {key: "${{ input.customer }}", limit: 1}
steps:
  - {name: a, handler: echo, input: {c: "${{ input.customer }}"}}
`

const perRegionStepWorkflow = `
name: per-region
steps:
  - {name: lookup, handler: echo, input: {region: "${{ input.region }}"}}
  - name: charge
    handler: echo
    dependsOn: [lookup]
    concurrency: {key: "${{ steps.lookup.output.region }}", limit: 1}
`

const oneAtATimeWorkflow = `
name: one-at-a-time
concurrency: {limit: 1}
steps:
  - {name: a, handler: echo}
`

// held reports whether the instance's step is held by a limit.
func (b *testBundle) held(t *testing.T, id, name string) bool {
	t.Helper()
	inst, err := b.engine.Get(context.Background(), id)
	require.NoError(t, err)
	s := step(t, inst, name)
	return s.Held()
}

// A workflow key admits one instance per customer; the others wait
// pending, then run in start order. A key that evaluates to nothing puts
// no limit on its instance; a workflow without key has one pool.
func TestWorkflowConcurrencyKey(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		b := setup(t, open, nil, perCustomerWorkflow, oneAtATimeWorkflow)
		first := b.start(t, "per-customer", `{"customer": "acme"}`)
		second := b.start(t, "per-customer", `{"customer": "acme"}`)
		other := b.start(t, "per-customer", `{"customer": "globex"}`)
		free1 := b.start(t, "per-customer", `{}`)
		free2 := b.start(t, "per-customer", `{"customer": ""}`)
		require.False(t, b.held(t, first, "a"))
		require.True(t, b.held(t, second, "a"), "acme already has an instance")
		require.False(t, b.held(t, other, "a"))
		require.False(t, b.held(t, free1, "a"), "no key: no limit")
		require.False(t, b.held(t, free2, "a"), "an empty key: no limit")
		g1 := b.start(t, "one-at-a-time", `{}`)
		g2 := b.start(t, "one-at-a-time", `{}`)
		require.False(t, b.held(t, g1, "a"))
		require.True(t, b.held(t, g2, "a"), "without a key every instance shares one pool")

		b.runWorker(t, nil)
		for _, id := range []string{first, second, other, free1, free2, g1, g2} {
			require.Equal(t, storage.InstanceCompleted, b.wait(t, id).Status)
		}
		a, z := b.wait(t, first), b.wait(t, second)
		require.False(t, z.StartedAt.Before(*a.FinishedAt), "the second acme instance started after the first finished")
	})
}

// A step key is evaluated when the step becomes ready, from what its
// input may read; steps of that name with one key value run one at a time
// across instances.
func TestStepConcurrencyKey(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		b := setup(t, open, nil, perRegionStepWorkflow)
		ids := []string{
			b.start(t, "per-region", `{"region": "eu"}`),
			b.start(t, "per-region", `{"region": "eu"}`),
			b.start(t, "per-region", `{"region": "us"}`),
		}
		b.runWorker(t, nil)
		var eu []storage.Step
		for i, id := range ids {
			inst := b.wait(t, id)
			require.Equal(t, storage.InstanceCompleted, inst.Status)
			if i < 2 {
				eu = append(eu, step(t, inst, "charge"))
			}
		}
		// One ran after the other, never both at once.
		if eu[1].StartedAt.Before(*eu[0].StartedAt) {
			eu[0], eu[1] = eu[1], eu[0]
		}
		require.False(t, eu[1].StartedAt.Before(*eu[0].FinishedAt), "eu charges overlapped: %v-%v and %v-%v",
			eu[0].StartedAt, eu[0].FinishedAt, eu[1].StartedAt, eu[1].FinishedAt)
	})
}

// A key that is not text, a number or a boolean refuses the start (workflow level)
// or fails the step (step level), with a message naming the key.
func TestConcurrencyKeyErrors(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		b := setup(t, open, nil, perCustomerWorkflow, perRegionStepWorkflow)
		_, err := b.engine.Start(context.Background(), "per-customer", json.RawMessage(`{"customer": {"id": 1}}`), nil)
		var inputErr *dagrun.InputError
		require.True(t, errors.As(err, &inputErr), "got %v", err)
		require.ErrorContains(t, err, "concurrency.key: the key must be a text, a number or a boolean, got an object")
		list, err := b.engine.List(context.Background(), storage.ListParams{Workflow: "per-customer"})
		require.NoError(t, err)
		require.Empty(t, list, "a refused start writes nothing")

		id := b.start(t, "per-region", `{"region": [1]}`)
		b.runWorker(t, nil)
		inst := b.wait(t, id)
		require.Equal(t, storage.InstanceFailed, inst.Status)
		require.Contains(t, step(t, inst, "charge").Error, "concurrency.key: the key must be a text, a number or a boolean, got a list")
	})
}

func TestSetQueueLimitRefusesBadValues(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		b := setup(t, open, nil, chainWorkflow)
		var argErr *dagrun.ArgumentError
		err := b.engine.SetQueueLimit(context.Background(), dagrun.QueueLimit{Queue: "q", Concurrency: -1})
		require.True(t, errors.As(err, &argErr), "got %v", err)
		err = b.engine.SetQueueLimit(context.Background(), dagrun.QueueLimit{Queue: "BAD!", Concurrency: 1})
		require.True(t, errors.As(err, &argErr), "got %v", err)
		require.ErrorContains(t, err, `invalid queue name "BAD!"`)
		require.NoError(t, b.engine.SetQueueLimit(context.Background(), dagrun.QueueLimit{Queue: "BAD!"}), "clearing takes any name")
		qs, err := b.engine.Queues(context.Background())
		require.NoError(t, err)
		require.Empty(t, qs, "a refused limit stored nothing")
		require.NoError(t, b.engine.SetQueueLimit(context.Background(), dagrun.QueueLimit{Queue: "q", Rate: 5, Per: time.Second}))
		l, err := b.engine.QueueLimit(context.Background(), "q")
		require.NoError(t, err)
		require.Equal(t, dagrun.QueueLimit{Queue: "q", Rate: 5, Per: time.Second}, l)
	})
}

func TestParseRate(t *testing.T) {
	t.Parallel()
	for in, want := range map[string][2]any{
		"10/s": {10, time.Second}, "10/1s": {10, time.Second}, "100/1m": {100, time.Minute}, "5/h": {5, time.Hour},
		"3/500ms": {3, 500 * time.Millisecond}, "none": {0, time.Duration(0)}, "0": {0, time.Duration(0)}, "0/s": {0, time.Duration(0)},
		"5/1d": {5, 24 * time.Hour}, "1000/d": {1000, 24 * time.Hour}, "2/1d": {2, 24 * time.Hour},
	} {
		n, per, err := dagrun.ParseRate(in)
		require.NoError(t, err, in)
		require.Equal(t, want, [2]any{n, per}, in)
	}
	for _, in := range []string{"10", "ten/s", "-1/s", "10/", "10/0s", "10/-1s", "10/fortnight", "10/0d", "10/1.5d", "10/1d2h"} {
		_, _, err := dagrun.ParseRate(in)
		var argErr *dagrun.ArgumentError
		require.True(t, errors.As(err, &argErr), "%s: got %v", in, err)
	}
}

const queuedStepWorkflow = `
name: queued
steps:
  - {name: a, handler: echo, queue: narrow}
`

const (
	pacedStepWorkflow = `
name: paced
steps:
  - {name: a, handler: echo, input: {n: 1}}
  - {name: b, handler: echo, dependsOn: [a], queue: paced, input: {n: 2}}
`
	pacedFirstStepWorkflow = `
name: paced-first
steps:
  - {name: b, handler: echo, queue: paced, input: {n: 2}}
`
)

// A step its queue's rate spaces out starts at its slot, not at the next
// poll: the transaction that made it ready (a finish, or the start of its
// instance) tells the worker, whose claim then learns when the slot falls
// due. The worker polls once an hour.
func TestRateSpacedWorkWakesTheWorker(t *testing.T) {
	t.Parallel()
	for _, workflow := range []string{"paced", "paced-first"} {
		t.Run(workflow, func(t *testing.T) {
			t.Parallel()
			forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
				b := setup(t, open, nil, pacedStepWorkflow, pacedFirstStepWorkflow, chainWorkflow)
				ctx := context.Background()
				require.NoError(t, b.engine.SetQueueLimit(ctx, dagrun.QueueLimit{Queue: "paced", Rate: 4, Per: time.Second}))
				b.runWorker(t, &dagrun.WorkerConfig{Poll: time.Hour})
				// A run first, so that the worker's last claim found nothing.
				require.Equal(t, storage.InstanceCompleted, b.wait(t, b.start(t, "chain", `{"n": 1}`)).Status)

				b.requireCompleteSoon(t, "its rate-spaced step waits for a poll",
					b.start(t, workflow, `{}`), b.start(t, workflow, `{}`), b.start(t, workflow, `{}`))
			})
		})
	}
}

// Work a limit holds starts as soon as a slot frees, not at the next poll:
// the worker that finished what held it is told in the same commit. The
// worker here polls once an hour and has settled, idle, before the runs
// start; the held run must finish within 5 s. (Before the fix, on
// PostgreSQL, none did here, and a held step key run of an earlier version
// of this test waited 15 s for something else to wake the worker.)
func TestReleasedWorkWakesTheWorker(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, source, workflow, input string
	}{
		{"workflow key", perCustomerWorkflow, "per-customer", `{"customer": "acme"}`},
		{"step key", perRegionStepWorkflow, "per-region", `{"region": "eu"}`},
		{"queue concurrency", queuedStepWorkflow, "queued", `{}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
				b := setup(t, open, nil, c.source, chainWorkflow)
				ctx := context.Background()
				require.NoError(t, b.engine.SetQueueLimit(ctx, dagrun.QueueLimit{Queue: "narrow", Concurrency: 1}))
				b.runWorker(t, &dagrun.WorkerConfig{Poll: time.Hour})
				// A run first, so that the worker's last claim found nothing.
				require.Equal(t, storage.InstanceCompleted, b.wait(t, b.start(t, "chain", `{"n": 1}`)).Status)

				b.requireCompleteSoon(t, "the held run waits for a poll", b.start(t, c.workflow, c.input), b.start(t, c.workflow, c.input))
			})
		})
	}
}

// requireCompleteSoon requires each of ids to complete within 5 s, in
// turn: far sooner than the hour the tests' workers poll at. why says
// what a timeout means.
func (b *testBundle) requireCompleteSoon(t *testing.T, why string, ids ...string) {
	t.Helper()
	for _, id := range ids {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		inst, err := b.engine.Follow(ctx, id, nil)
		cancel()
		require.NoError(t, err, "instance %s did not finish: %s", id, why)
		require.Equal(t, storage.InstanceCompleted, inst.Status)
	}
}
