package dagrun_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun"
	"github.com/dagrun/dagrun/handlers"
	"github.com/dagrun/dagrun/storage"
)

const chargeWorkflow = `
name: charge
defaults:
  retry: {maxAttempts: 1}
steps:
  - name: prepare
    handler: echo
    input: {order: 42}
  - name: charge
    handler: decline
    dependsOn: [prepare]
  - name: slow
    handler: gate
    dependsOn: [prepare]
  - name: ship
    handler: echo
    dependsOn: [charge, slow]
onFailure:
  - name: refund
    handler: echo
    input:
      error: ${{ workflow.error }}
      failed: ${{ workflow.failedStep }}
      order: ${{ steps.prepare.output.order }}
      slow: ${{ steps.slow.status }}
  - name: page
    handler: decline
    dependsOn: [refund]
  - name: after-page
    handler: echo
    dependsOn: [page]
`

// failureRegistry has gate (see gateRegistry) and decline, which fails
// for good at once.
func failureRegistry(t *testing.T) (*handlers.Registry, chan struct{}) {
	t.Helper()
	r, gate := gateRegistry(t)
	r.Register("decline", func(ctx context.Context, in json.RawMessage) (json.RawMessage, error) {
		return nil, handlers.Permanent(errors.New("card declined"))
	})
	return r, gate
}

func TestOnFailureStepsRunAndTheInstanceFailsWithTheOriginalError(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		// charge fails once slow runs: slow finishes its attempt, then the
		// onFailure steps run.
		started, release := make(chan struct{}), make(chan struct{})
		registry := handlers.NewRegistry()
		registry.Register("gate", func(ctx context.Context, in json.RawMessage) (json.RawMessage, error) {
			close(started)
			select {
			case <-release:
				return json.RawMessage(`{}`), nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		})
		registry.Register("decline", func(ctx context.Context, in json.RawMessage) (json.RawMessage, error) {
			<-started
			return nil, handlers.Permanent(errors.New("card declined"))
		})
		b := setup(t, open, registry, chargeWorkflow)
		b.runWorker(t, nil)
		id := b.start(t, "charge", `{}`)
		failing := b.awaitStatus(t, id, "charge", storage.StepFailed)
		require.Equal(t, storage.InstanceRunning, failing.Status)
		require.True(t, failing.Failing)
		require.Equal(t, storage.StepRunning, step(t, failing, "slow").Status)
		require.Equal(t, storage.StepBlocked, step(t, failing, "refund").Status, "after slow's attempt")
		close(release)
		inst := b.wait(t, id)

		const original = "step charge failed: card declined"
		require.Equal(t, storage.InstanceFailed, inst.Status)
		require.Equal(t, original, inst.Error, "an onFailure step's own failure never changes the outcome")
		require.Equal(t, "charge", inst.FailedStep)
		require.False(t, inst.Failing)

		want := map[string]storage.StepStatus{
			"prepare": storage.StepCompleted, "charge": storage.StepFailed, "slow": storage.StepCompleted,
			"ship": storage.StepCancelled, "refund": storage.StepCompleted, "page": storage.StepFailed,
			"after-page": storage.StepCancelled,
		}
		var names []string
		for _, s := range inst.Steps {
			names = append(names, s.Name)
			require.Equal(t, want[s.Name], s.Status, "step %s", s.Name)
			require.Equal(t, s.Name == "refund" || s.Name == "page" || s.Name == "after-page", s.OnFailure, "step %s", s.Name)
		}
		require.Equal(t, []string{"prepare", "charge", "slow", "ship", "refund", "page", "after-page"}, names,
			"onFailure steps come after the others")
		requireJSON(t, `{"error": "`+original+`", "failed": "charge", "order": 42, "slow": "completed"}`, step(t, inst, "refund").Output)

		var types []storage.EventType
		for _, e := range inst.Events {
			if e.Step == "" {
				types = append(types, e.Type)
			}
		}
		require.Equal(t, []storage.EventType{storage.EventInstanceCreated, storage.EventInstanceStarted,
			storage.EventInstanceFailing, storage.EventInstanceFailed}, types)
	})
}

func TestOnFailureStepsAreSkippedWhenTheInstanceCompletes(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		b := setup(t, open, nil, `
name: fine
steps:
  - name: a
    handler: echo
    input: 1
output: ${{ steps.a.output }}
onFailure:
  - name: cleanup
    handler: echo
`)
		b.runWorker(t, nil)
		inst := b.wait(t, b.start(t, "fine", `{}`))
		require.Equal(t, storage.InstanceCompleted, inst.Status)
		requireJSON(t, `1`, inst.Output)
		require.Equal(t, storage.StepSkipped, step(t, inst, "cleanup").Status)
		require.True(t, step(t, inst, "cleanup").OnFailure)
	})
}

// TestAnInstanceThatFailsAtOnceNamesItsFailedStep: without onFailure
// steps or running siblings the instance fails in the transaction that
// records the step's failure, and still names the step, as one whose
// failure waited does.
func TestAnInstanceThatFailsAtOnceNamesItsFailedStep(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		r, _ := failureRegistry(t)
		b := setup(t, open, r, `
name: declined
steps:
  - name: prepare
    handler: echo
  - name: charge
    handler: decline
    dependsOn: [prepare]
`)
		b.runWorker(t, nil)
		inst := b.wait(t, b.start(t, "declined", `{}`))
		require.Equal(t, storage.InstanceFailed, inst.Status)
		require.Equal(t, "step charge failed: card declined", inst.Error)
		require.Equal(t, "charge", inst.FailedStep)
		require.False(t, inst.Failing)
	})
}

func TestWorkflowTimeoutFailsAnInstanceWaitingForASignal(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		b := setup(t, open, nil, `
name: approval
timeout: 300ms
steps:
  - name: approve
    wait: {signal: approve}
onFailure:
  - name: tell
    handler: echo
    input: {error: "${{ workflow.error }}", step: "${{ workflow.failedStep }}"}
`)
		// The worker idles: no step is claimable; it wakes for the
		// deadline, not for a poll.
		b.runWorker(t, &dagrun.WorkerConfig{Poll: time.Hour})
		started := time.Now()
		inst := b.wait(t, b.start(t, "approval", `{}`))
		require.GreaterOrEqual(t, time.Since(started), 300*time.Millisecond)
		require.Less(t, time.Since(started), 10*time.Second, "at its time, not at a lease recovery")
		require.Equal(t, storage.InstanceFailed, inst.Status)
		require.Equal(t, "workflow timed out after 300ms", inst.Error)
		require.Empty(t, inst.FailedStep)
		require.Equal(t, storage.StepCancelled, step(t, inst, "approve").Status)
		requireJSON(t, `{"error": "workflow timed out after 300ms", "step": ""}`, step(t, inst, "tell").Output)
		require.Equal(t, 300*time.Millisecond, inst.Timeout)
		require.Nil(t, inst.Deadline, "a finished instance has no deadline")
	})
}

func TestWorkflowTimeoutCancelsAHandlerAndSurvivesOneThatIgnoresIt(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		cancelled := make(chan struct{})
		release := make(chan struct{})
		returned := make(chan struct{})
		registry := handlers.NewRegistry()
		registry.Register("stubborn", func(ctx context.Context, in json.RawMessage) (json.RawMessage, error) {
			defer close(returned)
			<-ctx.Done()
			close(cancelled)
			<-release // ignores the cancellation, then claims success
			return json.RawMessage(`"done anyway"`), nil
		})
		b := setup(t, open, registry, `
name: slow
timeout: 200ms
steps:
  - name: work
    handler: stubborn
onFailure:
  - name: cleanup
    handler: echo
    input: ${{ workflow.error }}
`)
		// One slot, which the handler holds: the worker still wakes for
		// the deadline, well before its next lease recovery (15s).
		b.runWorker(t, &dagrun.WorkerConfig{Concurrency: 1, Lease: 30 * time.Second})
		started := time.Now()
		id := b.start(t, "slow", `{}`)
		select {
		case <-cancelled:
			require.Less(t, time.Since(started), 10*time.Second)
		case <-time.After(20 * time.Second):
			t.Fatal("the handler's context was not cancelled by the workflow timeout")
		}
		// The handler ignores the cancellation a while, then reports a
		// success, which is refused: the step was cancelled under its claim.
		close(release)
		<-returned
		inst := b.wait(t, id)
		require.Equal(t, storage.InstanceFailed, inst.Status)
		require.Equal(t, "workflow timed out after 200ms", inst.Error)
		require.Equal(t, storage.StepCancelled, step(t, inst, "work").Status)
		requireJSON(t, `"workflow timed out after 200ms"`, step(t, inst, "cleanup").Output)
		// The late success changes nothing.
		// (Never may still run a last condition as the test ends and its
		// store closes: an error there is not a change.)
		require.Never(t, func() bool {
			got, err := b.engine.Get(context.Background(), id)
			if err != nil {
				return false
			}
			return got.Status != storage.InstanceFailed || step(t, got, "work").Status != storage.StepCancelled
		}, 200*time.Millisecond, 20*time.Millisecond)
	})
}

// A step that completes right at the workflow's deadline: whichever
// transaction wins, the instance ends consistent, completed with the
// onFailure step skipped, or failed by the timeout with it run.
func TestWorkflowTimeoutRacingAStepsCompletion(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		registry := handlers.NewRegistry()
		registry.Register("nap", func(ctx context.Context, in json.RawMessage) (json.RawMessage, error) {
			var d time.Duration
			if err := json.Unmarshal(in, &d); err != nil {
				return nil, handlers.Permanent(err)
			}
			time.Sleep(d) // deliberately deaf to the cancellation
			return json.RawMessage(`"ok"`), nil
		})
		b := setup(t, open, registry, `
name: race
timeout: 50ms
steps:
  - name: work
    handler: nap
    input: ${{ input }}
output: ${{ steps.work.output }}
onFailure:
  - name: cleanup
    handler: echo
`)
		b.runWorker(t, &dagrun.WorkerConfig{Concurrency: 20})
		var ids []string
		for i := range 20 {
			// Around the deadline, on both sides of it.
			d := 30*time.Millisecond + time.Duration(2*i)*time.Millisecond
			ids = append(ids, b.start(t, "race", fmt.Sprint(int64(d))))
		}
		outcomes := map[storage.InstanceStatus]int{}
		for _, id := range ids {
			inst := b.wait(t, id)
			outcomes[inst.Status]++
			work, cleanup := step(t, inst, "work"), step(t, inst, "cleanup")
			switch inst.Status {
			case storage.InstanceCompleted:
				require.Equal(t, storage.StepCompleted, work.Status)
				require.Equal(t, storage.StepSkipped, cleanup.Status)
				requireJSON(t, `"ok"`, inst.Output)
			case storage.InstanceFailed:
				require.Equal(t, "workflow timed out after 50ms", inst.Error)
				require.Equal(t, storage.StepCancelled, work.Status)
				require.Equal(t, storage.StepCompleted, cleanup.Status)
			default:
				t.Fatalf("instance %s ended %s", id, inst.Status)
			}
		}
		t.Logf("outcomes: %v", outcomes)
	})
}

func TestRetryAfterAFailureRunsTheOnFailureStepsAgainOnTheNextFailure(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		registry, gate := failureRegistry(t)
		close(gate)
		b := setup(t, open, registry, chargeWorkflow)
		b.runWorker(t, nil)
		id := b.start(t, "charge", `{}`)
		first := b.wait(t, id)
		require.Equal(t, storage.InstanceFailed, first.Status)
		require.NoError(t, b.engine.Retry(context.Background(), id))
		inst := b.wait(t, id)
		require.Equal(t, storage.InstanceFailed, inst.Status)
		require.Equal(t, "step charge failed: card declined", inst.Error)
		require.Equal(t, storage.StepCompleted, step(t, inst, "refund").Status)
		require.Equal(t, 1, step(t, inst, "refund").Attempts, "re-armed, then run once more")
		failing := 0
		for _, e := range inst.Events {
			if e.Type == storage.EventInstanceFailing {
				failing++
			}
		}
		require.Equal(t, 2, failing)
	})
}

// An onFailure forEach step expands in the transaction that records the
// failure: its items run, while the main steps are cancelled.
func TestOnFailureForEachStepRunsItsItems(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		registry, _ := failureRegistry(t)
		b := setup(t, open, registry, `
name: fan-cleanup
defaults:
  retry: {maxAttempts: 1}
steps:
  - name: boom
    handler: decline
  - name: slow
    handler: gate
    dependsOn: [boom]
onFailure:
  - name: undo
    forEach: [1, 2, 3]
    handler: echo
    input: {n: "${{ item }}", why: "${{ workflow.error }}"}
`)
		b.runWorker(t, nil)
		inst := b.wait(t, b.start(t, "fan-cleanup", `{}`))
		require.Equal(t, storage.InstanceFailed, inst.Status)
		require.Equal(t, "step boom failed: card declined", inst.Error)
		require.Equal(t, storage.StepCancelled, step(t, inst, "slow").Status)
		undo := step(t, inst, "undo")
		require.Equal(t, storage.StepCompleted, undo.Status)
		requireJSON(t, `[{"n":1,"why":"step boom failed: card declined"},{"n":2,"why":"step boom failed: card declined"},{"n":3,"why":"step boom failed: card declined"}]`, undo.Output)
	})
}

// nextWakeCounting counts the store's NextWake calls. Embedding only
// storage.Store, it also hides the optional CreateClaimer and
// FinishClaimer, so starts claim nothing eagerly.
type nextWakeCounting struct {
	storage.Store
	looked *atomic.Int32
}

func (s *nextWakeCounting) NextWake(ctx context.Context, p storage.ClaimParams) (time.Time, error) {
	s.looked.Add(1)
	return s.Store.NextWake(ctx, p)
}

// TestStartWakesIdleWorkersForItsDeadline: a start that makes no step ready
// but sets a time to keep (a workflow timeout over a wait step) makes the
// idle workers of its process look for their next wake time again. A
// worker that looked just before the start committed, and claimed nothing
// in it, otherwise slept until its poll or its next lease recovery (seen
// under load: the timeout came 15 s late).
func TestStartWakesIdleWorkersForItsDeadline(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		var looked atomic.Int32
		counting := func(t *testing.T) storage.Store { return &nextWakeCounting{Store: open(t), looked: &looked} }
		b := setup(t, counting, nil, `
name: approval
timeout: 300ms
steps:
  - name: approve
    wait: {signal: approve}
`)
		b.runWorker(t, &dagrun.WorkerConfig{Poll: time.Hour, Lease: time.Hour})
		require.Eventually(t, func() bool { return looked.Load() > 0 }, 10*time.Second, time.Millisecond,
			"the worker never looked for its next wake time")
		started := time.Now()
		inst := b.wait(t, b.start(t, "approval", `{}`))
		require.Less(t, time.Since(started), 10*time.Second, "at its time, not at a poll or a lease recovery")
		require.Equal(t, storage.InstanceFailed, inst.Status)
		require.Equal(t, "workflow timed out after 300ms", inst.Error)
	})
}

// holdRegistry has decline, which fails for good as soon as hold runs,
// and hold, which tells started (once per attempt) and running (closed at
// its first attempt), then blocks until release is closed and ends as err
// says (an output, or with err a retryable failure); cancelled tells
// whether its context was cancelled meanwhile.
type holdHandler struct {
	started   chan struct{}
	running   chan struct{}
	once      sync.Once
	release   chan struct{}
	cancelled atomic.Bool
	stopped   chan struct{} // closed when cancelled is first set
	stopOnce  sync.Once
	err       error
}

func holdRegistry(t *testing.T, fail error) (*handlers.Registry, *holdHandler) {
	t.Helper()
	h := &holdHandler{started: make(chan struct{}, 10), running: make(chan struct{}), release: make(chan struct{}),
		stopped: make(chan struct{}), err: fail}
	r := handlers.NewRegistry()
	r.Register("decline", func(ctx context.Context, in json.RawMessage) (json.RawMessage, error) {
		select {
		case <-h.running:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return nil, handlers.Permanent(errors.New("card declined"))
	})
	r.Register("hold", func(ctx context.Context, in json.RawMessage) (json.RawMessage, error) {
		h.started <- struct{}{}
		h.once.Do(func() { close(h.running) })
		select {
		case <-h.release:
		case <-ctx.Done():
			h.cancelled.Store(true)
			h.stopOnce.Do(func() { close(h.stopped) })
			return nil, ctx.Err()
		}
		if h.err != nil {
			return nil, h.err
		}
		return json.RawMessage(`{"held": "done"}`), nil
	})
	return r, h
}

const siblingWorkflow = `
name: sibling
defaults:
  retry: {maxAttempts: 3, backoff: 10ms}
steps:
  - name: quick
    handler: decline
  - name: slow
    handler: hold
  - name: after
    handler: echo
    dependsOn: [quick, slow]
  - name: after-slow
    handler: echo
    dependsOn: [slow]
`

// startSibling starts the sibling workflow (with extra appended) and
// returns once quick failed while slow's handler holds: the instance is
// failing, not failed, and slow still runs.
func startSibling(t *testing.T, open func(*testing.T) storage.Store, fail error, extra string) (*testBundle, *holdHandler, string) {
	t.Helper()
	registry, h := holdRegistry(t, fail)
	b := setup(t, open, registry, siblingWorkflow+extra)
	b.runWorker(t, nil)
	id := b.start(t, "sibling", `{}`)
	b.awaitStatus(t, id, "quick", storage.StepFailed)
	time.Sleep(200 * time.Millisecond) // a heartbeat or a poll would have stopped it by now
	inst, err := b.engine.Get(context.Background(), id)
	require.NoError(t, err)
	require.Equal(t, storage.InstanceRunning, inst.Status, "not failed while a sibling runs")
	require.True(t, inst.Failing)
	require.Equal(t, "step quick failed: card declined", inst.Error)
	require.Equal(t, storage.StepRunning, step(t, inst, "slow").Status)
	require.Equal(t, storage.StepCancelled, step(t, inst, "after-slow").Status, "nothing new starts")
	require.False(t, h.cancelled.Load(), "the running sibling's context is not cancelled")
	return b, h, id
}

func TestARunningSiblingFinishesItsAttemptWhenAStepFailsForGood(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		b, h, id := startSibling(t, open, nil, "")
		close(h.release)
		inst := b.wait(t, id)
		require.False(t, h.cancelled.Load())
		require.Equal(t, storage.InstanceFailed, inst.Status)
		require.Equal(t, "step quick failed: card declined", inst.Error, "the first failure's error")
		require.Equal(t, "quick", inst.FailedStep)
		require.False(t, inst.Failing)
		require.Equal(t, storage.StepCompleted, step(t, inst, "slow").Status)
		requireJSON(t, `{"held": "done"}`, step(t, inst, "slow").Output)
		require.Equal(t, storage.StepCancelled, step(t, inst, "after").Status)
		require.Equal(t, storage.StepCancelled, step(t, inst, "after-slow").Status)

		// A retry re-arms the failed and cancelled steps and keeps the
		// output that completed while the instance was failing.
		require.NoError(t, b.engine.Retry(context.Background(), id))
		inst = b.wait(t, id)
		require.Equal(t, storage.InstanceFailed, inst.Status)
		require.Equal(t, storage.StepCompleted, step(t, inst, "slow").Status)
		require.Equal(t, 1, step(t, inst, "slow").Attempts, "kept, not run again")
		require.Equal(t, storage.StepCompleted, step(t, inst, "after-slow").Status)
		require.Equal(t, storage.StepCancelled, step(t, inst, "after").Status)
	})
}

func TestOnFailureStepsStartOnceTheRunningSiblingFinished(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		b, h, id := startSibling(t, open, nil, `
onFailure:
  - name: cleanup
    handler: echo
    input: {slow: "${{ steps.slow.status }}", error: "${{ workflow.error }}", step: "${{ workflow.failedStep }}"}
`)
		inst, err := b.engine.Get(context.Background(), id)
		require.NoError(t, err)
		require.Equal(t, storage.StepBlocked, step(t, inst, "cleanup").Status, "compensation waits for the running sibling")
		close(h.release)
		inst = b.wait(t, id)
		require.False(t, h.cancelled.Load())
		require.Equal(t, storage.InstanceFailed, inst.Status)
		require.Equal(t, "step quick failed: card declined", inst.Error)
		require.Equal(t, "quick", inst.FailedStep)
		require.Equal(t, storage.StepCompleted, step(t, inst, "slow").Status)
		requireJSON(t, `{"slow": "completed", "error": "step quick failed: card declined", "step": "quick"}`, step(t, inst, "cleanup").Output)
	})
}

func TestARunningSiblingThatFailsIsNotRetriedWhileTheInstanceFails(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		b, h, id := startSibling(t, open, errors.New("flaky"), "")
		close(h.release)
		inst := b.wait(t, id)
		require.Equal(t, storage.InstanceFailed, inst.Status)
		require.Equal(t, "step quick failed: card declined", inst.Error, "the first failure's error")
		require.Equal(t, "quick", inst.FailedStep)
		slow := step(t, inst, "slow")
		require.Equal(t, storage.StepFailed, slow.Status)
		require.Equal(t, 1, slow.Attempts, "no retry while the instance fails")
		require.Contains(t, slow.Error, "flaky")
		require.Len(t, h.started, 1, "started once")
	})
}

// A workflow step is no attempt: its child is cancelled when a sibling
// fails for good, while a running handler finishes its attempt.
func TestAFailureCancelsTheChildOfARunningWorkflowStep(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		registry, h := holdRegistry(t, nil)
		childStarted, childStopped := make(chan struct{}), make(chan struct{})
		registry.Register("forever", func(ctx context.Context, in json.RawMessage) (json.RawMessage, error) {
			close(childStarted)
			<-ctx.Done()
			close(childStopped)
			return nil, ctx.Err()
		})
		registry.Register("late", func(ctx context.Context, in json.RawMessage) (json.RawMessage, error) {
			<-childStarted
			<-h.running
			return nil, handlers.Permanent(errors.New("card declined"))
		})
		b := setup(t, open, registry, `
name: parent
steps:
  - name: quick
    handler: late
  - name: slow
    handler: hold
  - name: sub
    workflow: child
`, `
name: child
steps:
  - name: work
    handler: forever
`)
		b.runWorker(t, nil)
		id := b.start(t, "parent", `{}`)
		select {
		case <-childStopped:
		case <-time.After(20 * time.Second):
			t.Fatal("the child's handler was not stopped")
		}
		inst, err := b.engine.Get(context.Background(), id)
		require.NoError(t, err)
		require.Equal(t, storage.InstanceRunning, inst.Status)
		require.True(t, inst.Failing)
		require.Equal(t, storage.StepCancelled, step(t, inst, "sub").Status)
		require.Equal(t, storage.StepRunning, step(t, inst, "slow").Status)
		child, err := b.engine.Get(context.Background(), step(t, inst, "sub").Children[0])
		require.NoError(t, err)
		require.Equal(t, storage.InstanceCancelled, child.Status)
		require.Equal(t, "parent instance "+id+" failed", child.Error)
		require.False(t, h.cancelled.Load())
		close(h.release)
		inst = b.wait(t, id)
		require.Equal(t, storage.InstanceFailed, inst.Status)
		require.Equal(t, "step quick failed: card declined", inst.Error)
		require.Equal(t, storage.StepCompleted, step(t, inst, "slow").Status)
	})
}

// The workflow timeout of a failing instance stops the steps that still
// run: at once in this process, not at their next heartbeat.
func TestWorkflowTimeoutOfAFailingInstanceStopsItsRunningSteps(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		registry, h := holdRegistry(t, nil)
		// cleanup runs while the instance is still running (failing): it
		// reports whether slow's handler was stopped by then.
		registry.Register("stopped", func(ctx context.Context, in json.RawMessage) (json.RawMessage, error) {
			select {
			case <-h.stopped:
			case <-time.After(5 * time.Second):
			}
			return json.Marshal(map[string]any{"stopped": h.cancelled.Load(), "in": json.RawMessage(in)})
		})
		b := setup(t, open, registry, `
name: sibling
timeout: 1s
steps:
  - name: quick
    handler: decline
  - name: slow
    handler: hold
onFailure:
  - name: cleanup
    handler: stopped
    input: {slow: "${{ steps.slow.status }}", error: "${{ workflow.error }}"}
`)
		b.runWorker(t, &dagrun.WorkerConfig{Lease: time.Minute})
		started := time.Now()
		id := b.start(t, "sibling", `{}`)
		inst := b.wait(t, id)
		require.Less(t, time.Since(started), 15*time.Second, "at the timeout, not at a heartbeat")
		require.Equal(t, storage.InstanceFailed, inst.Status)
		require.Equal(t, "step quick failed: card declined", inst.Error, "the first failure's error")
		require.Equal(t, storage.StepCancelled, step(t, inst, "slow").Status)
		require.Equal(t, "workflow timed out after 1s", lifecycleOf(inst, "slow", storage.EventStepCancelled))
		requireJSON(t, `{"stopped": true, "in": {"slow": "cancelled", "error": "step quick failed: card declined"}}`, step(t, inst, "cleanup").Output)
	})
}

// lifecycleOf returns the message of step's last event of type typ.
func lifecycleOf(inst *storage.Instance, name string, typ storage.EventType) string {
	msg := ""
	for _, e := range inst.Events {
		if e.Step == name && e.Type == typ {
			msg = e.Message
		}
	}
	return msg
}
