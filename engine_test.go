package dagrun_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/dagrun/dagrun"
	"github.com/dagrun/dagrun/dag"
	"github.com/dagrun/dagrun/handlers"
	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/backendtest"
)

// TestMain reuses the PostgreSQL schemas of the engine's tests, which
// change rows only through their stores.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(backendtest.ReusingSchemas(m),
		// The SQLite driver and pgx keep pool goroutines that outlive a test
		// until the process ends.
		goleak.IgnoreAnyFunction("database/sql.(*DB).connectionOpener"),
		goleak.IgnoreAnyFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"),
	)
}

type testBundle struct {
	engine   *dagrun.Engine
	store    storage.Store
	registry *handlers.Registry
}

// setup builds an engine over a fresh store with the given workflows (YAML
// sources) and handlers.
func setup(t *testing.T, open func(t *testing.T) storage.Store, registry *handlers.Registry, sources ...string) *testBundle {
	t.Helper()
	if registry == nil {
		registry = handlers.NewRegistry()
	}
	if !registry.Has("echo") {
		handlers.RegisterBuiltins(registry)
	}
	var workflows []*dag.Workflow
	for _, src := range sources {
		w, err := dag.Parse("", []byte(src), &dag.ParseOptions{HandlerExists: registry.Has})
		require.NoError(t, err)
		workflows = append(workflows, w)
	}
	store := open(t)
	engine, err := dagrun.New(store, registry, &dagrun.Config{Workflows: workflows})
	require.NoError(t, err)
	return &testBundle{engine: engine, store: store, registry: registry}
}

// captureLogs makes the bundle's engine log, as text, into the buffer it
// returns, for a test to read what the worker said.
func (b *testBundle) captureLogs(t *testing.T) *syncBuffer {
	t.Helper()
	logs := &syncBuffer{}
	engine, err := dagrun.New(b.store, b.registry, &dagrun.Config{Workflows: b.engine.Workflows(), Logger: slog.New(slog.NewTextHandler(logs, nil))})
	require.NoError(t, err)
	b.engine = engine
	return logs
}

// runWorker runs a worker until the test ends.
func (b *testBundle) runWorker(t *testing.T, config *dagrun.WorkerConfig) *dagrun.Worker {
	t.Helper()
	worker, _ := b.runStoppableWorker(t, config)
	return worker
}

// runStoppableWorker runs a worker until stop, or the test, ends it; stop
// returns once Run has returned, so no handler of the worker runs after.
func (b *testBundle) runStoppableWorker(t *testing.T, config *dagrun.WorkerConfig) (worker *dagrun.Worker, stop func()) {
	t.Helper()
	if config == nil {
		config = &dagrun.WorkerConfig{}
	}
	if config.Poll == 0 {
		config.Poll = 20 * time.Millisecond
	}
	worker, err := b.engine.NewWorker(config)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = worker.Run(ctx) }()
	stop = sync.OnceFunc(func() { cancel(); <-done })
	t.Cleanup(stop)
	return worker, stop
}

// wait follows an instance until it is finished.
func (b *testBundle) wait(t *testing.T, id string) *storage.Instance {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	inst, err := b.engine.Follow(ctx, id, nil)
	require.NoError(t, err, "instance %s did not finish", id)
	return inst
}

func (b *testBundle) start(t *testing.T, workflow, input string) string {
	t.Helper()
	res, err := b.engine.Start(context.Background(), workflow, json.RawMessage(input), nil)
	require.NoError(t, err)
	return res.ID
}

func step(t *testing.T, inst *storage.Instance, name string) storage.Step {
	t.Helper()
	for _, s := range inst.Steps {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("instance %s has no step %s", inst.ID, name)
	return storage.Step{}
}

func requireJSON(t *testing.T, want string, got json.RawMessage) {
	t.Helper()
	require.JSONEq(t, want, string(got))
}

const chainWorkflow = `
name: chain
defaults:
  retry: {maxAttempts: 2, backoff: 1ms}
input:
  type: object
  required: [n]
  properties:
    n: {type: integer}
steps:
  - name: a
    handler: echo
    input: {value: "${{ input.n + 1 }}"}
  - name: b
    handler: echo
    dependsOn: [a]
    input: {value: "${{ steps.a.output.value * 2 }}", label: "n=${{ input.n }}"}
output:
  result: ${{ steps.b.output.value }}
  label: ${{ steps.b.output.label }}
`

func TestChainRunsToCompletion(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		b := setup(t, open, nil, chainWorkflow)
		b.runWorker(t, nil)
		inst := b.wait(t, b.start(t, "chain", `{"n": 7}`))
		require.Equal(t, storage.InstanceCompleted, inst.Status)
		requireJSON(t, `{"result": 16, "label": "n=7"}`, inst.Output)
		requireJSON(t, `{"value": 8}`, step(t, inst, "a").Input)
		require.Equal(t, 1, step(t, inst, "b").Attempts)
		require.NotEmpty(t, inst.Events)
	})
}

func TestStartRejectsBadInputAndWritesNothing(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		b := setup(t, open, nil, chainWorkflow)
		for _, input := range []string{`{"n": "seven"}`, `{`, `[1,2]`, `{} {}`, ``, `{}`, `  {}  `} {
			_, err := b.engine.Start(context.Background(), "chain", json.RawMessage(input), nil)
			var inputErr *dagrun.InputError
			require.ErrorAs(t, err, &inputErr, "input %s", input)
			require.NotContains(t, err.Error(), "\n")
		}
		_, err := b.engine.Start(context.Background(), "nope", nil, nil)
		var unknown *dagrun.UnknownWorkflowError
		require.ErrorAs(t, err, &unknown)
		require.Equal(t, []string{"chain"}, unknown.Available)
		list, err := b.engine.List(context.Background(), storage.ListParams{})
		require.NoError(t, err)
		require.Empty(t, list)
	})
}

// TestInputWithAKeyTwiceIsRefused: JSON readers disagree on which of
// two equal keys counts (the schema check and the steps took the last,
// the stored input kept both), so such an input is refused, nested too.
func TestInputWithAKeyTwiceIsRefused(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		b := setup(t, open, nil, chainWorkflow)
		for input, want := range map[string]string{
			`{"n": 1, "n": 2}`: `input has the key "n" twice in the object at "/": keep one (JSON readers disagree on which counts)`,
			`{"n": 1, "m": [{}, {"a/b": {"x": 1, "x": 1}}]}`: `input has the key "x" twice in the object at "/m/1/a~1b"`,
		} {
			_, err := b.engine.Start(t.Context(), "chain", json.RawMessage(input), nil)
			var inputErr *dagrun.InputError
			require.ErrorAs(t, err, &inputErr, input)
			require.ErrorContains(t, err, want)
		}
		_, err := b.engine.Start(t.Context(), "chain", json.RawMessage(`{"n": 1, "m": [{"x": 1}, {"x": 2}]}`), nil)
		require.NoError(t, err, "the same key in two objects")
		list, err := b.engine.List(t.Context(), storage.ListParams{})
		require.NoError(t, err)
		require.Len(t, list, 1)
	})
}

// TestNoInputAndNullInputAreOneStart: a start without an input and one
// with null both start with {}, the empty object the schema checks.
func TestNoInputAndNullInputAreOneStart(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		b := setup(t, open, nil, "name: plain\nsteps:\n  - {name: a, handler: echo}\n", chainWorkflow)
		for _, input := range []string{``, `null`, ` null `} {
			res, err := b.engine.Start(t.Context(), "plain", json.RawMessage(input), nil)
			require.NoError(t, err, "input %q", input)
			inst, err := b.engine.Get(t.Context(), res.ID)
			require.NoError(t, err)
			requireJSON(t, `{}`, inst.Input)
		}
		_, err := b.engine.Start(t.Context(), "chain", json.RawMessage(`null`), nil)
		require.ErrorContains(t, err, "missing property 'n'")
	})
}

// TestInputSchemaComparesWholeNumbersExactly: a whole number past 2^53
// is checked against the schema as written, not as the nearest float64:
// the exact enum value is taken and one over the maximum is refused.
func TestInputSchemaComparesWholeNumbersExactly(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		b := setup(t, open, nil, `
name: ids
input:
  type: object
  properties:
    id: {enum: [9007199254740993]}
    max: {type: integer, maximum: 9007199254740992}
steps:
  - name: a
    handler: echo
`)
		for _, tt := range []struct {
			input string
			ok    bool
		}{
			{`{"id": 9007199254740993}`, true},
			{`{"id": 9007199254740992}`, false},
			{`{"max": 9007199254740992}`, true},
			{`{"max": 9007199254740993}`, false},
		} {
			_, err := b.engine.Start(t.Context(), "ids", json.RawMessage(tt.input), nil)
			if tt.ok {
				require.NoError(t, err, tt.input)
			} else {
				require.ErrorIs(t, err, dag.ErrInvalidInput, tt.input)
			}
		}
		_, err := b.engine.Start(t.Context(), "ids", json.RawMessage(`{"max": 9007199254740995}`), nil)
		require.ErrorContains(t, err, "at /max: maximum: got 9007199254740995, want 9007199254740992")
	})
}

const fanWorkflow = `
name: fan
steps:
  - name: root
    handler: echo
    input: {items: "${{ input.items }}", big: "${{ input.big }}"}
  - name: left
    handler: echo
    dependsOn: [root]
    input: {count: "${{ len(steps.root.output.items) }}"}
  - name: middle
    handler: echo
    dependsOn: [root]
    when: ${{ steps.root.output.big }}
    input: {never: true}
  - name: after-middle
    handler: echo
    dependsOn: [middle]
    input: {skippedOutput: "${{ steps.middle.output }}", status: "${{ steps.middle.status }}"}
  - name: right
    handler: echo
    dependsOn: [root]
    input: {first: "${{ steps.root.output.items[0] }}"}
  - name: join
    handler: echo
    dependsOn: [left, after-middle, right]
    input:
      count: ${{ steps.left.output.count }}
      first: ${{ steps.right.output.first }}
      middle: ${{ steps.middle.status }}
output: ${{ steps.join.output }}
`

func TestFanOutFanInWithSkippedBranch(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		b := setup(t, open, nil, fanWorkflow)
		b.runWorker(t, &dagrun.WorkerConfig{Concurrency: 4})
		inst := b.wait(t, b.start(t, "fan", `{"items": [{"sku": "a"}, {"sku": "b"}], "big": false}`))
		require.Equal(t, storage.InstanceCompleted, inst.Status, inst.Error)
		require.Equal(t, storage.StepSkipped, step(t, inst, "middle").Status)
		// A skipped step lets its dependents run, and its output reads as nil.
		require.Equal(t, storage.StepCompleted, step(t, inst, "after-middle").Status)
		requireJSON(t, `{"skippedOutput": null, "status": "skipped"}`, step(t, inst, "after-middle").Input)
		requireJSON(t, `{"count": 2, "first": {"sku": "a"}, "middle": "skipped"}`, inst.Output)
	})
}

func TestRetriesWithBackoffThenSucceeds(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		var calls atomic.Int32
		registry := handlers.NewRegistry()
		registry.Register("flaky", func(ctx context.Context, _ json.RawMessage) (json.RawMessage, error) {
			if calls.Add(1) < 3 {
				return nil, errors.New("temporary outage")
			}
			return json.RawMessage(`{"attempt": ` + itoa(handlers.Info(ctx).Attempt) + `}`), nil
		})
		b := setup(t, open, registry, `
name: flaky
steps:
  - name: call
    handler: flaky
    retry: {maxAttempts: 5, backoff: 10ms, maxBackoff: 20ms}
output: ${{ steps.call.output }}
`)
		b.runWorker(t, nil)
		inst := b.wait(t, b.start(t, "flaky", ``))
		require.Equal(t, storage.InstanceCompleted, inst.Status)
		requireJSON(t, `{"attempt": 3}`, inst.Output)
		require.Equal(t, 3, step(t, inst, "call").Attempts)
		retrying := 0
		for _, ev := range inst.Events {
			if ev.Type == storage.EventStepRetrying {
				retrying++
				require.Contains(t, ev.Message, "temporary outage")
			}
		}
		require.Equal(t, 2, retrying)
	})
}

func TestPermanentFailureThenRetryKeepsCompletedOutputs(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		var fixed atomic.Bool
		var firstCalls, thirdCalls atomic.Int32
		registry := handlers.NewRegistry()
		registry.Register("first", func(context.Context, json.RawMessage) (json.RawMessage, error) {
			firstCalls.Add(1)
			return json.RawMessage(`{"v": 1}`), nil
		})
		registry.Register("fragile", func(context.Context, json.RawMessage) (json.RawMessage, error) {
			if !fixed.Load() {
				return nil, handlers.Permanent(errors.New("404 not found"))
			}
			return json.RawMessage(`{"v": 2}`), nil
		})
		registry.Register("third", func(context.Context, json.RawMessage) (json.RawMessage, error) {
			thirdCalls.Add(1)
			return json.RawMessage(`{"v": 3}`), nil
		})
		b := setup(t, open, registry, `
name: fragile
steps:
  - {name: one, handler: first}
  - {name: two, handler: fragile, dependsOn: [one], retry: {maxAttempts: 5}}
  - {name: three, handler: third, dependsOn: [two]}
output:
  sum: ${{ steps.one.output.v + steps.two.output.v + steps.three.output.v }}
`)
		b.runWorker(t, nil)
		id := b.start(t, "fragile", ``)
		inst := b.wait(t, id)
		require.Equal(t, storage.InstanceFailed, inst.Status)
		require.Contains(t, inst.Error, "404 not found")
		require.Equal(t, 1, step(t, inst, "two").Attempts, "a permanent error is not retried")
		require.Equal(t, storage.StepCancelled, step(t, inst, "three").Status)

		fixed.Store(true)
		require.NoError(t, b.engine.Retry(context.Background(), id))
		inst = b.wait(t, id)
		require.Equal(t, storage.InstanceCompleted, inst.Status, inst.Error)
		requireJSON(t, `{"sum": 6}`, inst.Output)
		require.Equal(t, int32(1), firstCalls.Load(), "completed steps keep their output")
		require.Equal(t, int32(1), thirdCalls.Load())

		err := b.engine.Retry(context.Background(), id)
		require.ErrorIs(t, err, storage.ErrConflict)
	})
}

func TestPanicFailsTheAttemptAndTheWorkerLivesOn(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		registry := handlers.NewRegistry()
		registry.Register("boom", func(context.Context, json.RawMessage) (json.RawMessage, error) {
			panic("kaboom")
		})
		b := setup(t, open, registry, `
name: boom
steps:
  - {name: explode, handler: boom}
`, chainWorkflow)
		b.runWorker(t, &dagrun.WorkerConfig{Concurrency: 1})
		inst := b.wait(t, b.start(t, "boom", ``))
		require.Equal(t, storage.InstanceFailed, inst.Status)
		errText := step(t, inst, "explode").Error
		first, stack, _ := strings.Cut(errText, "\n")
		require.Equal(t, "handler panicked: kaboom", first)
		require.Contains(t, stack, "goroutine", "the stack is in the step's error, after its first line")
		require.Contains(t, stack, "TestPanicFailsTheAttemptAndTheWorkerLivesOn", "down to the handler that panicked")
		logged, err := b.store.ListLogs(context.Background(), storage.LogsParams{InstanceID: inst.ID, Step: "explode"})
		require.NoError(t, err)
		require.NotEmpty(t, logged)
		require.Equal(t, "handler panicked", logged[0].Message)
		require.Contains(t, string(logged[0].Attrs), "goroutine", "the stack is in the step's log")
		// The same worker still runs the next instance.
		require.Equal(t, storage.InstanceCompleted, b.wait(t, b.start(t, "chain", `{"n": 1}`)).Status)
	})
}

// hangRegistry's hang handler returns only once its context ends.
func hangRegistry() *handlers.Registry {
	registry := handlers.NewRegistry()
	registry.Register("hang", func(ctx context.Context, _ json.RawMessage) (json.RawMessage, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	})
	return registry
}

func TestTimeoutCancelsTheAttempt(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		b := setup(t, open, hangRegistry(), `
name: hang
steps:
  - {name: wait, handler: hang, timeout: 50ms, retry: {maxAttempts: 2, backoff: 1ms}}
`)
		b.runWorker(t, nil)
		inst := b.wait(t, b.start(t, "hang", ``))
		require.Equal(t, storage.InstanceFailed, inst.Status)
		s := step(t, inst, "wait")
		require.Equal(t, 2, s.Attempts)
		require.Contains(t, s.Error, "timed out after 50ms")
	})
}

// TestALateResultOfATimedOutAttemptIsDropped: a handler that ignores its
// context and succeeds after its timeout (within the grace) has its
// attempt failed as timed out, not completed.
func TestALateResultOfATimedOutAttemptIsDropped(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		registry := handlers.NewRegistry()
		registry.Register("late", func(ctx context.Context, _ json.RawMessage) (json.RawMessage, error) {
			<-ctx.Done()
			time.Sleep(20 * time.Millisecond) // past its timeout, within the grace
			return json.RawMessage(`"done anyway"`), nil
		})
		b := setup(t, open, registry, `
name: late
steps:
  - {name: work, handler: late, timeout: 50ms, retry: {maxAttempts: 2, backoff: 1ms}}
`)
		b.runWorker(t, nil)
		inst := b.wait(t, b.start(t, "late", ``))
		require.Equal(t, storage.InstanceFailed, inst.Status)
		s := step(t, inst, "work")
		require.Equal(t, 2, s.Attempts, "the late result was retried as a timeout")
		require.Nil(t, s.Output)
		require.Contains(t, s.Error, "attempt timed out after 50ms: its handler returned after that")
	})
}

func TestContinueOnErrorLetsDependentsRun(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		registry := handlers.NewRegistry()
		registry.Register("fail", func(context.Context, json.RawMessage) (json.RawMessage, error) {
			return nil, handlers.Permanent(errors.New("mail server down"))
		})
		b := setup(t, open, registry, `
name: tolerant
steps:
  - {name: notify, handler: fail, continueOnError: true}
  - name: report
    handler: echo
    dependsOn: [notify]
    input: {notified: "${{ steps.notify.status }}"}
output: ${{ steps.report.output }}
`)
		b.runWorker(t, nil)
		inst := b.wait(t, b.start(t, "tolerant", ``))
		require.Equal(t, storage.InstanceCompleted, inst.Status, inst.Error)
		requireJSON(t, `{"notified": "failed"}`, inst.Output)
	})
}

// blocker returns a registry whose handler "block" closes started, waits
// for its context to end, and sends the cause on stopped.
func blocker() (registry *handlers.Registry, started chan struct{}, stopped chan error) {
	started, stopped = make(chan struct{}), make(chan error, 1)
	registry = handlers.NewRegistry()
	registry.Register("block", func(ctx context.Context, _ json.RawMessage) (json.RawMessage, error) {
		close(started)
		<-ctx.Done()
		stopped <- context.Cause(ctx)
		return nil, ctx.Err()
	})
	return registry, started, stopped
}

func TestCancelStopsRunningHandlers(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		registry, started, stopped := blocker()
		b := setup(t, open, registry, `
name: blocker
steps:
  - {name: block, handler: block}
  - {name: next, handler: echo, dependsOn: [block]}
`)
		b.runWorker(t, &dagrun.WorkerConfig{Lease: time.Second})
		id := b.start(t, "blocker", ``)
		<-started
		require.NoError(t, b.engine.Cancel(context.Background(), id))
		select {
		case <-stopped:
		case <-time.After(10 * time.Second):
			t.Fatal("handler context was not cancelled")
		}
		inst := b.wait(t, id)
		require.Equal(t, storage.InstanceCancelled, inst.Status)
		require.Equal(t, storage.StepCancelled, step(t, inst, "block").Status)
		require.Equal(t, storage.StepCancelled, step(t, inst, "next").Status)
		require.ErrorIs(t, b.engine.Cancel(context.Background(), id), storage.ErrConflict)
	})
}

// TestCancelFromAnotherProcessStopsTheHandlerAsCancelled: a cancel that
// another process commits reaches a running handler at its worker's next
// heartbeat, as a cancellation, not as a lease another worker took over.
func TestCancelFromAnotherProcessStopsTheHandlerAsCancelled(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		registry, started, stopped := blocker()
		const source = `
name: blocker
steps:
  - {name: block, handler: block}
`
		b := setup(t, open, registry, source)
		b.runWorker(t, &dagrun.WorkerConfig{Lease: time.Second})
		id := b.start(t, "blocker", ``)
		<-started
		// The other process: an engine of its own over the same database.
		w, err := dag.Parse("", []byte(source), &dag.ParseOptions{HandlerExists: registry.Has})
		require.NoError(t, err)
		other, err := dagrun.New(b.store, registry, &dagrun.Config{Workflows: []*dag.Workflow{w}})
		require.NoError(t, err)
		require.NoError(t, other.Cancel(context.Background(), id))
		select {
		case cause := <-stopped:
			require.ErrorContains(t, cause, "the step was cancelled")
		case <-time.After(10 * time.Second):
			t.Fatal("handler context was not cancelled")
		}
		require.Equal(t, storage.InstanceCancelled, b.wait(t, id).Status)
	})
}

func TestIdempotencyKeyReturnsTheFirstInstance(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		b := setup(t, open, nil, chainWorkflow)
		ctx := context.Background()
		first, err := b.engine.Start(ctx, "chain", json.RawMessage(`{"n": 1}`), &dagrun.StartOptions{Key: "order-1"})
		require.NoError(t, err)
		second, err := b.engine.Start(ctx, "chain", json.RawMessage(`{"n": 2}`), &dagrun.StartOptions{Key: "order-1"})
		require.NoError(t, err)
		require.False(t, first.Existed)
		require.True(t, second.Existed)
		require.Equal(t, first.ID, second.ID)
		list, err := b.engine.List(ctx, storage.ListParams{})
		require.NoError(t, err)
		require.Len(t, list, 1)
	})
}

func TestExpiredLeaseIsRecoveredByAnotherWorker(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		b := setup(t, open, nil, chainWorkflow)
		id := b.start(t, "chain", `{"n": 1}`)
		// A worker that claims and then dies: it never heartbeats or finishes.
		claimed, err := b.store.ClaimSteps(context.Background(), storage.ClaimParams{WorkerID: "dead", Limit: 1, Lease: 50 * time.Millisecond})
		require.NoError(t, err)
		require.Len(t, claimed, 1)
		// The live worker's own lease is long, so a loaded machine cannot
		// expire its claim too; it still looks for expired leases every half
		// of it.
		b.runWorker(t, &dagrun.WorkerConfig{Lease: time.Second})
		inst := b.wait(t, id)
		require.Equal(t, storage.InstanceCompleted, inst.Status, inst.Error)
		require.Equal(t, 2, step(t, inst, "a").Attempts, "the expired lease counts as an attempt")
		// The dead worker's late result is fenced off.
		res, err := b.store.FinishSteps(context.Background(), []storage.StepResult{{Claim: claimed[0].Claim, Outcome: storage.OutcomeCompleted, Output: json.RawMessage(`{"stale": true}`)}},
			func(*storage.InstanceState) (*storage.Plan, error) {
				return nil, errors.New("a stale result must not be planned")
			})
		require.NoError(t, err)
		require.False(t, res[0].Accepted)
	})
}

// stopWhileRunning starts workflowYAML's instance (its one step runs the
// handler "slow", which returns only when cancelled, with the error of its
// context or, when succeed, an output) under a worker with a short grace,
// stops the worker once the step runs, and returns the instance as the
// shutdown left it.
func stopWhileRunning(t *testing.T, open func(*testing.T) storage.Store, workflowYAML string, succeed bool) *storage.Instance {
	t.Helper()
	started := make(chan struct{}, 1)
	registry := handlers.NewRegistry()
	registry.Register("slow", func(ctx context.Context, _ json.RawMessage) (json.RawMessage, error) {
		started <- struct{}{}
		<-ctx.Done()
		if succeed {
			return json.RawMessage(`{"done": true}`), nil
		}
		return nil, ctx.Err()
	})
	b := setup(t, open, registry, workflowYAML)
	worker, err := b.engine.NewWorker(&dagrun.WorkerConfig{ShutdownGrace: 20 * time.Millisecond, Poll: 10 * time.Millisecond})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- worker.Run(ctx) }()
	id := b.start(t, b.engine.Workflows()[0].Name, ``)
	<-started
	cancel()
	require.NoError(t, <-done)
	inst, err := b.engine.Get(context.Background(), id)
	require.NoError(t, err)
	return inst
}

func TestShutdownReleasesStepsThatOutliveTheGrace(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		inst := stopWhileRunning(t, open, `
name: slow
steps:
  - {name: slow, handler: slow}
`, false)
		s := step(t, inst, "slow")
		require.Equal(t, storage.StepPending, s.Status, "released, not failed")
		require.Equal(t, 0, s.Attempts, "a released attempt does not count")
	})
}

// TestShutdownFailsALastAttempt: released, a step on its last attempt
// would run once more than its retry policy allows (a step with
// maxAttempts 1 twice), so a shutdown fails it as a crash would.
func TestShutdownFailsALastAttempt(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		inst := stopWhileRunning(t, open, `
name: once
steps:
  - {name: once, handler: slow, retry: {maxAttempts: 1}}
`, false)
		require.Equal(t, storage.InstanceFailed, inst.Status)
		s := step(t, inst, "once")
		require.Equal(t, storage.StepFailed, s.Status, "failed, not released")
		require.Equal(t, 1, s.Attempts)
		require.Contains(t, s.Error, "the worker stopped during attempt 1 of 1, its last")
	})
}

// TestShutdownRecordsASuccessThatBeatIt: a handler that returns its output
// as the worker cancels it did its work, which is recorded, not released
// to run again, nor failed on a last attempt.
func TestShutdownRecordsASuccessThatBeatIt(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		for _, retry := range []string{"", ", retry: {maxAttempts: 1}"} {
			inst := stopWhileRunning(t, open, `
name: done
steps:
  - {name: done, handler: slow`+retry+`}
`, true)
			require.Equal(t, storage.InstanceCompleted, inst.Status, "retry%s", retry)
			s := step(t, inst, "done")
			require.Equal(t, 1, s.Attempts)
			require.JSONEq(t, `{"done": true}`, string(s.Output))
		}
	})
}

func TestDurableSleepHoldsNoWorker(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		b := setup(t, open, nil, `
name: nap
steps:
  - {name: nap, handler: sleep, input: {duration: 1s}}
  - {name: after, handler: echo, dependsOn: [nap], input: {ok: true}}
output: ${{ steps.after.output }}
`, chainWorkflow)
		b.runWorker(t, &dagrun.WorkerConfig{Concurrency: 1})
		napID := b.start(t, "nap", ``)
		// With one slot, a chain still runs while the nap waits.
		require.Equal(t, storage.InstanceCompleted, b.wait(t, b.start(t, "chain", `{"n": 1}`)).Status)
		inst := b.wait(t, napID)
		require.Equal(t, storage.InstanceCompleted, inst.Status, inst.Error)
		require.Equal(t, 1, step(t, inst, "nap").Attempts, "snoozing does not count attempts")
	})
}

func TestInstanceRunsUnderItsDefinitionSnapshot(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		b := setup(t, open, nil, `
name: versioned
steps:
  - {name: s, handler: echo, input: {version: 1}}
output: ${{ steps.s.output.version }}
`)
		id := b.start(t, "versioned", ``)
		// A second engine (another process, say) with an edited YAML runs
		// the instance under the snapshot it was started with.
		v2, err := dag.Parse("", []byte(`
name: versioned
steps:
  - {name: s, handler: echo, input: {version: 2}}
  - {name: extra, handler: echo, dependsOn: [s]}
output: ${{ steps.s.output.version }}
`), nil)
		require.NoError(t, err)
		other, err := dagrun.New(b.store, b.registry, &dagrun.Config{Workflows: []*dag.Workflow{v2}})
		require.NoError(t, err)
		worker, err := other.NewWorker(&dagrun.WorkerConfig{Poll: 10 * time.Millisecond})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { defer wg.Done(); _ = worker.Run(ctx) }()
		t.Cleanup(func() { cancel(); wg.Wait() })
		inst := b.wait(t, id)
		require.Equal(t, storage.InstanceCompleted, inst.Status)
		requireJSON(t, `1`, inst.Output)
		require.Len(t, inst.Steps, 1)
	})
}

func TestBadHandlerOutputFailsTheStep(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		registry := handlers.NewRegistry()
		registry.Register("garbage", func(context.Context, json.RawMessage) (json.RawMessage, error) {
			return json.RawMessage(`{not json`), nil
		})
		registry.Register("huge", func(context.Context, json.RawMessage) (json.RawMessage, error) {
			return json.RawMessage(`"` + strings.Repeat("x", 2<<20) + `"`), nil
		})
		b := setup(t, open, registry, `
name: garbage
steps:
  - {name: s, handler: garbage}
`, `
name: huge
steps:
  - {name: s, handler: huge}
`)
		b.runWorker(t, nil)
		inst := b.wait(t, b.start(t, "garbage", ``))
		require.Equal(t, storage.InstanceFailed, inst.Status)
		require.Contains(t, step(t, inst, "s").Error, "not valid JSON")
		inst = b.wait(t, b.start(t, "huge", ``))
		require.Equal(t, storage.InstanceFailed, inst.Status)
		require.Contains(t, step(t, inst, "s").Error, "over the limit")
	})
}

func TestRuntimeExpressionErrorFailsTheStep(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(*testing.T) storage.Store) {
		b := setup(t, open, nil, `
name: badexpr
steps:
  - {name: a, handler: echo, input: {x: 1}}
  - name: b
    handler: echo
    dependsOn: [a]
    input: {y: "${{ steps.a.output.x.y.z + 'a' }}"}
`)
		b.runWorker(t, nil)
		inst := b.wait(t, b.start(t, "badexpr", ``))
		require.Equal(t, storage.InstanceFailed, inst.Status)
		s := step(t, inst, "b")
		require.Equal(t, storage.StepFailed, s.Status)
		require.Equal(t, 0, s.Attempts, "the handler never ran")
		require.Contains(t, s.Error, "steps.a.output.x.y.z")
	})
}

func itoa(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}

// TestSetWorkflowsReplacesWhatStartsAndKeepsWhatRuns: the workflows an
// engine starts are replaced whole while starts go on (under -race); a
// name that is gone is unknown, one whose file has errors is refused with
// them, a set that names a workflow twice is refused and the old one
// kept, and an instance started before runs under its definition.
func TestSetWorkflowsReplacesWhatStartsAndKeepsWhatRuns(t *testing.T) {
	t.Parallel()
	b := setup(t, func(t *testing.T) storage.Store { return backendtest.OpenSQLite(t) }, nil, chainWorkflow)
	parse := func(src string) *dag.Workflow {
		t.Helper()
		w, err := dag.Parse("", []byte(src), &dag.ParseOptions{HandlerExists: b.registry.Has})
		require.NoError(t, err)
		return w
	}
	before, err := b.engine.Start(t.Context(), "chain", json.RawMessage(`{"n": 1}`), nil)
	require.NoError(t, err)
	edited := parse(strings.Replace(chainWorkflow, "name: chain", "name: chain\ndescription: edited", 1))
	fan := parse(fanWorkflow)

	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			// Either set, never a mix: chain is always there.
			w, ok := b.engine.Workflow("chain")
			if !assert.True(t, ok) || !assert.Len(t, b.engine.Workflows(), 1) {
				return
			}
			_ = w.Description
		}
	}()
	for i := range 100 {
		set := []*dag.Workflow{edited}
		if i%2 == 1 {
			set = []*dag.Workflow{parse(chainWorkflow)}
		}
		require.NoError(t, b.engine.SetWorkflows(set, nil))
	}
	close(stop)
	wg.Wait()

	require.NoError(t, b.engine.SetWorkflows([]*dag.Workflow{edited, fan}, nil))
	w, ok := b.engine.Workflow("chain")
	require.True(t, ok)
	require.Equal(t, "edited", w.Description)
	require.Len(t, b.engine.Workflows(), 2)

	require.ErrorContains(t, b.engine.SetWorkflows([]*dag.Workflow{fan, fan}, nil), `workflow "fan" is defined twice`)
	require.Len(t, b.engine.Workflows(), 2, "a refused set changes nothing")

	broken := dag.ErrorList{&dag.Error{File: "workflows/fan.yaml", Line: 3, Col: 5, Msg: "bad"}}
	require.NoError(t, b.engine.SetWorkflows([]*dag.Workflow{edited}, map[string]error{"fan": broken}))
	_, err = b.engine.Start(t.Context(), "fan", json.RawMessage(`{}`), nil)
	var unknown *dagrun.UnknownWorkflowError
	require.ErrorAs(t, err, &unknown)
	require.ErrorContains(t, err, `workflow "fan" is invalid: workflows/fan.yaml:3:5: bad`)
	require.NoError(t, b.engine.SetWorkflows([]*dag.Workflow{edited}, nil))
	_, err = b.engine.Start(t.Context(), "fan", json.RawMessage(`{}`), nil)
	require.ErrorContains(t, err, `unknown workflow "fan" (available: chain)`)

	b.runWorker(t, nil)
	inst := b.wait(t, before.ID)
	require.Equal(t, storage.InstanceCompleted, inst.Status)
	def, err := b.engine.Definition(inst)
	require.NoError(t, err)
	require.Empty(t, def.Description, "the instance ran under the definition it started with")
}

// TestUnknownNamesAreCutBetweenCharacters: an error repeats only the start
// of a long name, cut where a character starts, so the message stays text.
func TestUnknownNamesAreCutBetweenCharacters(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, want string
	}{
		{strings.Repeat("a", 64), strings.Repeat("a", 64)},
		{strings.Repeat("a", 65), strings.Repeat("a", 64) + "…"},
		{strings.Repeat("a", 63) + "ééé", strings.Repeat("a", 63) + "…"},
		{strings.Repeat("é", 40), strings.Repeat("é", 32) + "…"},
	} {
		for _, err := range []error{
			&dagrun.UnknownWorkflowError{Name: tc.name, Available: []string{"chain"}},
			&dagrun.UnknownSignalError{InstanceID: "i", Name: tc.name},
		} {
			msg := err.Error()
			require.True(t, utf8.ValidString(msg), "%q", msg)
			require.Contains(t, msg, strconv.Quote(tc.want))
		}
	}
}

// TestUnknownWorkflowSaysWhatIsLoaded: the error of an unknown workflow
// names the ones the engine has, and when it has none says whether the
// folder is empty or its files were all left out for their errors (a
// child workflow step whose file was removed left its parents invalid,
// and "no workflows are loaded" sent the user looking for the folder).
func TestUnknownWorkflowSaysWhatIsLoaded(t *testing.T) {
	t.Parallel()
	broken := dag.ErrorList{{File: "p2.yaml", Line: 4, Col: 15, Msg: `unknown workflow "child"`}}
	for _, tc := range []struct {
		invalid map[string]error
		sources []string
		want    string
	}{
		{nil, []string{chainWorkflow},
			`unknown workflow "child" (available: chain)`},
		{nil, nil,
			`unknown workflow "child": no workflows are loaded (put WORKFLOW.yaml files in the workflows folder)`},
		{map[string]error{"p2": broken}, nil,
			`unknown workflow "child": no workflow is loaded, and p2 is left out for its errors (dagrun validate lists them)`},
		{map[string]error{"p2": broken, "parent": broken}, nil,
			`unknown workflow "child": no workflow is loaded, and p2, parent are left out for their errors (dagrun validate lists them)`},
	} {
		var workflows []*dag.Workflow
		for _, src := range tc.sources {
			w, err := dag.Parse("", []byte(src), nil)
			require.NoError(t, err)
			workflows = append(workflows, w)
		}
		registry := handlers.NewRegistry()
		handlers.RegisterBuiltins(registry)
		engine, err := dagrun.New(backendtest.OpenSQLite(t), registry, &dagrun.Config{Workflows: workflows, InvalidWorkflows: tc.invalid})
		require.NoError(t, err)
		require.EqualError(t, engine.UnknownWorkflow("child"), tc.want)
	}
}
