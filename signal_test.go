package dagrun_test

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun"
	"github.com/dagrun/dagrun/dag"
	"github.com/dagrun/dagrun/handlers"
	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/sqlite"
)

// refundWorkflow checks a refund, waits for a person's approval, then pays
// it out or not.
const refundWorkflow = `
name: refund
steps:
  - name: check
    handler: gate
  - name: approve
    dependsOn: [check]
    wait:
      timeout: 72h
      schema:
        type: object
        required: [approved]
        properties: {approved: {type: boolean}}
  - name: confirm
    wait: {signal: payment.confirmed}
  - name: payout
    dependsOn: [approve]
    handler: echo
    input: {approved: "${{ steps.approve.output.approved }}"}
output: ${{ steps.payout.output }}
`

// gateRegistry has a "gate" handler that returns once open is closed.
func gateRegistry(t *testing.T) (*handlers.Registry, chan struct{}) {
	t.Helper()
	open := make(chan struct{})
	r := handlers.NewRegistry()
	r.Register("gate", func(ctx context.Context, in json.RawMessage) (json.RawMessage, error) {
		select {
		case <-open:
			return json.RawMessage(`{}`), nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	})
	return r, open
}

func (b *testBundle) signal(t *testing.T, id, name, data string) (dagrun.SignalResult, error) {
	t.Helper()
	return b.engine.Signal(context.Background(), dagrun.SignalRequest{InstanceID: id, Name: name, Data: json.RawMessage(data)})
}

// awaitStatus polls the instance until step name has status.
func (b *testBundle) awaitStatus(t *testing.T, id, name string, status storage.StepStatus) *storage.Instance {
	t.Helper()
	var inst *storage.Instance
	require.Eventually(t, func() bool {
		var err error
		inst, err = b.engine.Get(context.Background(), id)
		require.NoError(t, err)
		return step(t, inst, name).Status == status
	}, 30*time.Second, 5*time.Millisecond, "step %s of %s never became %s", name, id, status)
	return inst
}

// startRefundWaiting starts a refund under a running worker and returns
// once its approve step waits.
func startRefundWaiting(t *testing.T, open func(t *testing.T) storage.Store) (*testBundle, string) {
	t.Helper()
	registry, gate := gateRegistry(t)
	close(gate)
	b := setup(t, open, registry, refundWorkflow)
	b.runWorker(t, nil)
	id := b.start(t, "refund", `{}`)
	b.awaitStatus(t, id, "approve", storage.StepWaiting)
	return b, id
}

func TestSignalSentBeforeTheStepWaitsIsDeliveredWhenItBecomesReady(t *testing.T) {
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		registry, gate := gateRegistry(t)
		b := setup(t, open, registry, refundWorkflow)
		b.runWorker(t, nil)
		id := b.start(t, "refund", `{}`)
		b.awaitStatus(t, id, "check", storage.StepRunning)

		res, err := b.signal(t, id, "approve", `{"approved": true}`)
		require.NoError(t, err)
		require.Equal(t, dagrun.SignalResult{InstanceID: id}, res, "stored until approve waits")
		_, err = b.signal(t, id, "approve", ``)
		require.ErrorIs(t, err, storage.ErrConflict, "a repeat of a stored signal is a conflict, whatever its payload")
		res, err = b.signal(t, id, "payment.confirmed", `"ch_1"`)
		require.NoError(t, err)
		require.Equal(t, dagrun.SignalResult{InstanceID: id, Delivered: true}, res, "confirm waits from the start")

		close(gate)
		inst := b.wait(t, id)
		require.Equal(t, storage.InstanceCompleted, inst.Status, inst.Error)
		requireJSON(t, `{"approved": true}`, inst.Output)
		requireJSON(t, `{"approved": true}`, step(t, inst, "approve").Output)
		requireJSON(t, `"ch_1"`, step(t, inst, "confirm").Output)
	})
}

// TestOnFailureWaitStepTakesItsSignal: a wait step under onFailure, which
// waits only once a main step failed, takes its signal like any other:
// stored when sent before it waits, delivered when it does.
func TestOnFailureWaitStepTakesItsSignal(t *testing.T) {
	const escalate = `
name: escalate
steps:
  - name: charge
    handler: boom
onFailure:
  - name: ack
    wait: {signal: incident.ack}
  - name: close
    dependsOn: [ack]
    handler: echo
    input: ${{ steps.ack.output }}
`
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		for _, early := range []bool{false, true} {
			registry, gate := gateRegistry(t)
			registry.Register("boom", func(ctx context.Context, _ json.RawMessage) (json.RawMessage, error) {
				select {
				case <-gate:
					return nil, handlers.Permanent(errors.New("card declined"))
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			})
			b := setup(t, open, registry, escalate)
			b.runWorker(t, nil)
			id := b.start(t, "escalate", `{}`)
			if early {
				b.awaitStatus(t, id, "charge", storage.StepRunning)
				res, err := b.signal(t, id, "incident.ack", `{"by": "ada"}`)
				require.NoError(t, err)
				require.Equal(t, dagrun.SignalResult{InstanceID: id}, res, "stored until ack waits")
				close(gate)
			} else {
				close(gate)
				b.awaitStatus(t, id, "ack", storage.StepWaiting)
				res, err := b.signal(t, id, "incident.ack", `{"by": "ada"}`)
				require.NoError(t, err)
				require.Equal(t, dagrun.SignalResult{InstanceID: id, Delivered: true}, res)
			}
			inst := b.wait(t, id)
			require.Equal(t, storage.InstanceFailed, inst.Status)
			requireJSON(t, `{"by": "ada"}`, step(t, inst, "close").Output)
		}
	})
}

func TestSignalRefusalsWriteNothing(t *testing.T) {
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		b, id := startRefundWaiting(t, open)
		waiting := b.awaitStatus(t, id, "approve", storage.StepWaiting)
		require.Equal(t, "approve", step(t, waiting, "approve").Signal)
		require.NotNil(t, step(t, waiting, "approve").Deadline)

		tests := []struct {
			name, signal, data string
			check              func(t *testing.T, err error)
		}{
			{"schema", "approve", `{"approved": "yes"}`, func(t *testing.T, err error) {
				var de *dagrun.SignalDataError
				require.ErrorAs(t, err, &de)
				require.ErrorIs(t, err, dag.ErrInvalidPayload)
				require.Equal(t, `signal approve: payload does not match the wait step's schema: at /approved: got string, want boolean`, err.Error())
			}},
			{"malformed", "approve", `{"approved": tru`, func(t *testing.T, err error) {
				var de *dagrun.SignalDataError
				require.ErrorAs(t, err, &de)
				require.Contains(t, err.Error(), "signal approve: payload is not valid JSON")
			}},
			{"unknown name", "aprove", `{}`, func(t *testing.T, err error) {
				var ue *dagrun.UnknownSignalError
				require.ErrorAs(t, err, &ue)
				require.Equal(t, []string{"approve", "payment.confirmed"}, ue.Signals)
				require.Equal(t, []string{"approve", "confirm"}, ue.WaitSteps)
				require.Equal(t, `instance `+id+` waits for no signal "aprove" (its wait steps: step approve waits for approve, step confirm waits for payment.confirmed)`, err.Error())
			}},
			{"empty name", "", `{}`, func(t *testing.T, err error) {
				var ue *dagrun.UnknownSignalError
				require.ErrorAs(t, err, &ue)
				require.Equal(t, []string{"approve", "payment.confirmed"}, ue.Signals)
			}},
			{"malformed name", "a\xff", `{}`, func(t *testing.T, err error) {
				var ue *dagrun.UnknownSignalError
				require.ErrorAs(t, err, &ue)
				require.Equal(t, `instance `+id+` waits for no signal "a\xff" (its wait steps: step approve waits for approve, step confirm waits for payment.confirmed)`, err.Error())
			}},
			{"unknown instance", "approve", `{}`, func(t *testing.T, err error) {
				require.ErrorIs(t, err, storage.ErrNotFound)
			}},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				target := id
				if tt.name == "unknown instance" {
					target = "0190a0a0-0000-7000-8000-000000000000"
				}
				_, err := b.signal(t, target, tt.signal, tt.data)
				require.Error(t, err)
				tt.check(t, err)
				after, err := b.engine.Get(context.Background(), id)
				require.NoError(t, err)
				require.Equal(t, waiting.Events, after.Events, "a refused signal writes nothing")
				require.Equal(t, storage.StepWaiting, step(t, after, "approve").Status)
			})
		}
	})
}

func TestSignalRepeatsAndFinishedInstances(t *testing.T) {
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		b, id := startRefundWaiting(t, open)
		send := func(signalID, data string) (dagrun.SignalResult, error) {
			return b.engine.Signal(context.Background(), dagrun.SignalRequest{InstanceID: id, Name: "approve", ID: signalID, Data: json.RawMessage(data)})
		}
		res, err := send("hook-1", `{"approved": false}`)
		require.NoError(t, err)
		require.True(t, res.Delivered)

		res, err = send("hook-1", `{"approved": false}`)
		require.NoError(t, err)
		require.Equal(t, dagrun.SignalResult{InstanceID: id, Duplicate: true}, res, "the same ID again is a duplicate")
		_, err = send("hook-2", `{"approved": true}`)
		require.ErrorIs(t, err, storage.ErrConflict, "another ID is a conflict")
		// A repeat is a repeat whatever its payload: the answer is the
		// one its ID calls for, not the schema's.
		_, err = send("hook-2", ``)
		require.ErrorIs(t, err, storage.ErrConflict, "another ID without a payload is a conflict")
		res, err = send("hook-1", `{"approved": "maybe"}`)
		require.NoError(t, err)
		require.True(t, res.Duplicate, "the same ID with a payload the schema refuses is a duplicate")

		_, err = b.signal(t, id, "payment.confirmed", `1`)
		require.NoError(t, err)
		inst := b.wait(t, id)
		require.Equal(t, storage.InstanceCompleted, inst.Status, inst.Error)
		requireJSON(t, `{"approved": false}`, inst.Output) // the first signal's payload stays

		other := b.start(t, "refund", `{}`)
		require.NoError(t, b.engine.Cancel(context.Background(), other))
		_, err = b.signal(t, other, "payment.confirmed", `1`)
		require.ErrorIs(t, err, storage.ErrConflict, "a finished instance takes no signals")
		require.Contains(t, err.Error(), "is already cancelled")

		// A finished instance refuses as a conflict whatever the name or
		// payload, yet a repeat of a signal it took is still a duplicate.
		for _, req := range []dagrun.SignalRequest{
			{InstanceID: id, Name: "nosuch"},
			{InstanceID: id, Name: "approve", ID: "hook-3"},
			{InstanceID: id, Name: "approve", Data: json.RawMessage(`{"approved": "yes"}`)},
			{InstanceID: id, Name: "a\x00b", ID: "hook-4"},
			{InstanceID: id, Name: "a\xffb", ID: "hook-5"},
		} {
			_, err = b.engine.Signal(context.Background(), req)
			require.ErrorIs(t, err, storage.ErrConflict, "%+v", req)
		}
		res, err = send("hook-1", ``)
		require.NoError(t, err)
		require.True(t, res.Duplicate)
	})
}

// timeoutWorkflow waits for a signal that never comes; its dependent runs
// all the same. laterTimeoutWorkflow does the same after a first step, so
// its wait starts, and its deadline is set, by that step's finish.
const (
	timeoutWorkflow = `
name: lapse
steps:
  - name: approve
    wait: {timeout: 300ms}
    continueOnError: true
  - name: after
    dependsOn: [approve]
    handler: echo
    input: {status: "${{ steps.approve.status }}"}
output: ${{ steps.after.output }}
`
	laterTimeoutWorkflow = `
name: lapse-later
steps:
  - {name: first, handler: echo, input: {}}
  - {name: approve, dependsOn: [first], wait: {timeout: 300ms}, continueOnError: true}
  - {name: after, dependsOn: [approve], handler: echo, input: {status: "${{ steps.approve.status }}"}}
output: ${{ steps.after.output }}
`
)

// TestWaitTimeoutFailsTheStepAndContinueOnErrorLetsDependentsRun, for a
// wait that starts with its instance and one that starts after a step:
// the plan that sets a wait's deadline tells the idle worker of it (a wait
// that began after a step once timed out only at the next poll).
func TestWaitTimeoutFailsTheStepAndContinueOnErrorLetsDependentsRun(t *testing.T) {
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		b := setup(t, open, nil, timeoutWorkflow, laterTimeoutWorkflow, chainWorkflow)
		// Neither the poll nor the lease recovery pass comes within the
		// test's wait: only waking at the deadline times the step out.
		b.runWorker(t, &dagrun.WorkerConfig{Poll: time.Hour, Lease: 10 * time.Minute})
		b.wait(t, b.start(t, "chain", `{"n": 1}`)) // an idle worker
		for _, workflow := range []string{"lapse", "lapse-later"} {
			inst := b.wait(t, b.start(t, workflow, `{}`))
			require.Equal(t, storage.InstanceCompleted, inst.Status, "%s: %s", workflow, inst.Error)
			approve := step(t, inst, "approve")
			require.Equal(t, storage.StepFailed, approve.Status, workflow)
			require.Equal(t, "no signal approve within 300ms", approve.Error, workflow)
			requireJSON(t, `{"status": "failed"}`, inst.Output)
		}
	})
}

func TestWorkerWakesForADelayedStepWithoutAPoll(t *testing.T) {
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		b := setup(t, open, nil, chainWorkflow)
		b.runWorker(t, &dagrun.WorkerConfig{Poll: time.Hour, Lease: 10 * time.Minute})
		b.wait(t, b.start(t, "chain", `{"n": 1}`)) // an idle worker
		res, err := b.engine.Start(context.Background(), "chain", json.RawMessage(`{"n": 1}`), &dagrun.StartOptions{Delay: 300 * time.Millisecond})
		require.NoError(t, err)
		inst := b.wait(t, res.ID)
		require.Equal(t, storage.InstanceCompleted, inst.Status, inst.Error)
	})
}

func TestAWaitingStepHoldsNoWorkerSlot(t *testing.T) {
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		registry, gate := gateRegistry(t)
		close(gate)
		b := setup(t, open, registry, refundWorkflow, chainWorkflow)
		b.runWorker(t, &dagrun.WorkerConfig{Concurrency: 1})
		waiting := b.start(t, "refund", `{}`)
		b.awaitStatus(t, waiting, "approve", storage.StepWaiting)
		for range 3 {
			inst := b.wait(t, b.start(t, "chain", `{"n": 2}`))
			require.Equal(t, storage.InstanceCompleted, inst.Status, inst.Error)
		}
		for _, name := range []string{"approve", "payment.confirmed"} {
			_, err := b.signal(t, waiting, name, `{"approved": true}`)
			require.NoError(t, err)
		}
		inst := b.wait(t, waiting)
		require.Equal(t, storage.InstanceCompleted, inst.Status, inst.Error)
	})
}

func TestSignalByWorkflowAndKey(t *testing.T) {
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		registry, gate := gateRegistry(t)
		close(gate)
		b := setup(t, open, registry, refundWorkflow)
		res, err := b.engine.Start(context.Background(), "refund", nil, &dagrun.StartOptions{Key: "order-7"})
		require.NoError(t, err)
		got, err := b.engine.Signal(context.Background(), dagrun.SignalRequest{Workflow: "refund", Key: "order-7", Name: "payment.confirmed"})
		require.NoError(t, err)
		require.Equal(t, dagrun.SignalResult{InstanceID: res.ID, Delivered: true}, got)
		_, err = b.engine.Signal(context.Background(), dagrun.SignalRequest{Workflow: "refund", Key: "order-8", Name: "approve"})
		require.True(t, errors.Is(err, storage.ErrNotFound), "%v", err)
	})
}

// nextWakeCounter counts a store's NextWake calls, and its sweeps of
// waits past their deadline.
type nextWakeCounter struct {
	storage.Store
	calls, sweeps atomic.Int64
}

func (c *nextWakeCounter) NextWake(ctx context.Context, p storage.ClaimParams) (time.Time, error) {
	c.calls.Add(1)
	return c.Store.NextWake(ctx, p)
}

func (c *nextWakeCounter) ExpireWaits(ctx context.Context, limit int, plan storage.PlanFunc) (int, error) {
	c.sweeps.Add(1)
	return c.Store.ExpireWaits(ctx, limit, plan)
}

// TestIdleWorkerDoesNotSpinWhenClocksDisagree runs a worker over a store
// whose clock is an hour behind the worker's, with a wait that times out
// in an hour by the store's clock: by the worker's clock it is due
// already, by the store's not. The worker looks again now and then rather
// than at once, over and over; with a poll shorter than that, it looks at
// every poll but sweeps no more often.
func TestIdleWorkerDoesNotSpinWhenClocksDisagree(t *testing.T) {
	t.Parallel()
	for name, poll := range map[string]time.Duration{"long poll": time.Hour, "short poll": 5 * time.Millisecond} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			raw, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "dagrun.db"),
				&sqlite.Config{Now: func() time.Time { return time.Now().Add(-time.Hour) }})
			require.NoError(t, err)
			t.Cleanup(func() { _ = raw.Close() })
			store := &nextWakeCounter{Store: raw}
			b := setup(t, func(*testing.T) storage.Store { return store }, nil, strings.Replace(timeoutWorkflow, "300ms", "1h", 1))
			b.start(t, "lapse", `{}`)
			worker, err := b.engine.NewWorker(&dagrun.WorkerConfig{Poll: poll, Lease: 10 * time.Minute})
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			require.NoError(t, worker.Run(ctx))
			// At most one sweep per idleRecheck (50 ms) and a few more: a
			// spinning worker makes thousands, one sweeping at every
			// poll a hundred.
			require.Less(t, store.sweeps.Load(), int64(25), "sweeps in half a second")
			if poll == time.Hour {
				require.Less(t, store.calls.Load(), int64(50), "NextWake calls in half a second")
			}
		})
	}
}

// TestSkipOfAWaitStepKeepsToItsSchema: an output given to a skipped wait
// step is what the steps after it read as the signal's payload, so the
// signal's schema applies to it; without an output the skip goes on.
func TestSkipOfAWaitStepKeepsToItsSchema(t *testing.T) {
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		b, id := startRefundWaiting(t, open)
		b.awaitStatus(t, id, "approve", storage.StepWaiting)

		err := b.engine.Skip(t.Context(), id, "approve", json.RawMessage(`{"approved": "yes"}`))
		var argErr *dagrun.ArgumentError
		require.ErrorAs(t, err, &argErr)
		require.ErrorIs(t, err, dag.ErrInvalidPayload)
		require.Equal(t, `invalid output: step approve waits for signal approve: payload does not match the wait step's schema: at /approved: got string, want boolean`, err.Error())
		inst, err := b.engine.Get(t.Context(), id)
		require.NoError(t, err)
		require.Equal(t, storage.StepWaiting, step(t, inst, "approve").Status, "a refused skip changes nothing")

		require.NoError(t, b.engine.Skip(t.Context(), id, "approve", json.RawMessage(`{"approved": true}`)))
		inst, err = b.engine.Get(t.Context(), id)
		require.NoError(t, err)
		require.Equal(t, storage.StepCompleted, step(t, inst, "approve").Status)
	})
}

// TestLateSignalFindsItsTimeRunOut: with no worker to time them out, a
// signal sent after its wait's deadline, or after its instance's workflow
// timeout, is refused as a conflict, and the step or the instance has
// failed as a worker's sweep would have failed it.
func TestLateSignalFindsItsTimeRunOut(t *testing.T) {
	const (
		waitTimeout = `
name: brief-wait
steps:
  - {name: approve, wait: {timeout: 50ms}}
`
		workflowTimeout = `
name: brief-workflow
timeout: 50ms
steps:
  - {name: approve, wait: {}}
`
	)
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		b := setup(t, open, nil, waitTimeout, workflowTimeout)
		for _, tc := range []struct{ workflow, stepError, instanceError string }{
			{"brief-wait", "no signal approve within 50ms", "no signal approve within 50ms"},
			{"brief-workflow", "", "workflow timed out after 50ms"},
		} {
			id := b.start(t, tc.workflow, `{}`)
			inst, err := b.engine.Get(context.Background(), id)
			require.NoError(t, err)
			deadline := inst.Deadline
			if deadline == nil {
				deadline = step(t, inst, "approve").Deadline
			}
			require.NotNil(t, deadline, "%s: the wait begins with its instance", tc.workflow)
			b.awaitStoreTime(t, *deadline)

			_, err = b.signal(t, id, "approve", `true`)
			require.ErrorIs(t, err, storage.ErrConflict, tc.workflow)
			var conflict *dagrun.SignalConflictError
			require.ErrorAs(t, err, &conflict, tc.workflow)
			inst, err = b.engine.Get(context.Background(), id)
			require.NoError(t, err)
			require.Equal(t, storage.InstanceFailed, inst.Status, tc.workflow)
			require.Contains(t, inst.Error, tc.instanceError, tc.workflow)
			approve := step(t, inst, "approve")
			require.NotEqual(t, storage.StepCompleted, approve.Status, tc.workflow)
			if tc.stepError != "" {
				require.Equal(t, tc.stepError, approve.Error, tc.workflow)
			}
		}
	})
}

// awaitStoreTime waits until the store's clock (this machine's, for a
// store that keeps none) has passed t.
func (b *testBundle) awaitStoreTime(t *testing.T, at time.Time) {
	t.Helper()
	require.Eventually(t, func() bool {
		now := time.Now()
		if clock, ok := b.store.(storage.Clock); ok {
			var err error
			now, err = clock.Now(context.Background())
			require.NoError(t, err)
		}
		return now.After(at)
	}, 10*time.Second, 5*time.Millisecond, "the store's clock passes %s", at)
}
