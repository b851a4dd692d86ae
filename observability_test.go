package dagrun_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/dagrun/dagrun"
	"github.com/dagrun/dagrun/dag"
	"github.com/dagrun/dagrun/handlers"
	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/backendtest"
)

// obsBundle is an engine over SQLite with the given config.
func obsBundle(t *testing.T, registry *handlers.Registry, config *dagrun.Config, sources ...string) *testBundle {
	t.Helper()
	handlers.RegisterBuiltins(registry)
	for _, src := range sources {
		w, err := dag.Parse("", []byte(src), &dag.ParseOptions{HandlerExists: registry.Has})
		require.NoError(t, err)
		config.Workflows = append(config.Workflows, w)
	}
	store := backendtest.OpenSQLite(t)
	engine, err := dagrun.New(store, registry, config)
	require.NoError(t, err)
	return &testBundle{engine: engine, store: store, registry: registry}
}

func TestStepLogs(t *testing.T) {
	t.Parallel()
	registry := handlers.NewRegistry()
	registry.Register("talk", func(ctx context.Context, _ json.RawMessage) (json.RawMessage, error) {
		log := handlers.Logger(ctx)
		log.Info("charging", slog.String("order", "A-1"), slog.Group("card", slog.String("last4", "4242")))
		log.WithGroup("g").With(slog.Int("a", 1)).Warn("careful", slog.Int("b", 2))
		if handlers.Info(ctx).Attempt == 1 {
			return nil, fmt.Errorf("try again")
		}
		return nil, nil
	})
	registry.Register("chatty", func(ctx context.Context, _ json.RawMessage) (json.RawMessage, error) {
		for i := range 100 {
			handlers.Logger(ctx).Info(fmt.Sprintf("line %03d %s", i, strings.Repeat("x", 60)))
		}
		return nil, nil
	})
	b := obsBundle(t, registry, &dagrun.Config{StepLogBytes: 1000}, `name: logs
steps:
  - {name: talk, handler: talk, retry: {maxAttempts: 2, backoff: 1ms}}
  - {name: chatty, handler: chatty, dependsOn: [talk]}
`)
	b.runWorker(t, nil)
	id := b.start(t, "logs", `{}`)
	require.Equal(t, storage.InstanceCompleted, b.wait(t, id).Status)

	var talk, chatty []storage.LogRecord
	require.Eventually(t, func() bool {
		var err error
		talk, err = b.store.ListLogs(context.Background(), storage.LogsParams{InstanceID: id, Step: "talk"})
		require.NoError(t, err)
		chatty, err = b.store.ListLogs(context.Background(), storage.LogsParams{InstanceID: id, Step: "chatty"})
		require.NoError(t, err)
		return len(talk) == 4 && len(chatty) > 0 && strings.HasPrefix(chatty[len(chatty)-1].Message, "line 099")
	}, 10*time.Second, 20*time.Millisecond, "talk: %v", talk)

	require.Equal(t, []int{1, 1, 2, 2}, []int{talk[0].Attempt, talk[1].Attempt, talk[2].Attempt, talk[3].Attempt}, "kept per attempt")
	require.Equal(t, "charging", talk[0].Message)
	require.Equal(t, "INFO", talk[0].Level)
	require.Equal(t, -1, talk[0].Item)
	require.JSONEq(t, `{"order":"A-1","card":{"last4":"4242"}}`, string(talk[0].Attrs))
	require.Equal(t, "WARN", talk[1].Level)
	require.JSONEq(t, `{"g":{"a":1,"b":2}}`, string(talk[1].Attrs))

	// The last 1000 bytes are kept behind a marker saying how much went.
	require.Regexp(t, `^… \d+ bytes of earlier logs dropped$`, chatty[0].Message)
	kept := 0
	for _, r := range chatty[1:] {
		kept += len(r.Message) + len(r.Attrs) + 32
	}
	require.LessOrEqual(t, kept, 1000)
	require.Greater(t, kept, 800, "the bound keeps what fits")
	for i := 2; i < len(chatty); i++ {
		require.Less(t, chatty[i-1].Message, chatty[i].Message, "the newest lines, in order")
	}
}

// logsRefusingStore refuses every AppendLogs, as a database would that
// is too busy for the worker's periodic writes.
type logsRefusingStore struct{ storage.Store }

func (logsRefusingStore) AppendLogs(context.Context, []storage.LogTrim, []storage.LogRecord) error {
	return errors.New("refused")
}

// TestStepLogsGoWithTheResult: what an attempt logged is stored in the
// transaction that records its result, so it is there as soon as the
// step is finished, without any write of its own.
func TestStepLogsGoWithTheResult(t *testing.T) {
	t.Parallel()
	registry := handlers.NewRegistry()
	registry.Register("talk", func(ctx context.Context, _ json.RawMessage) (json.RawMessage, error) {
		log := handlers.Logger(ctx)
		log.Info("first", slog.Int("attempt", handlers.Info(ctx).Attempt))
		log.Info("second")
		if handlers.Info(ctx).Attempt == 1 {
			return nil, fmt.Errorf("try again")
		}
		return nil, nil
	})
	b := obsBundle(t, registry, &dagrun.Config{}, `name: logs
steps:
  - {name: talk, handler: talk, retry: {maxAttempts: 2, backoff: 1ms}}
`)
	engine, err := dagrun.New(logsRefusingStore{b.store}, registry, &dagrun.Config{Workflows: b.engine.Workflows()})
	require.NoError(t, err)
	b.engine = engine
	b.runWorker(t, nil)
	id := b.start(t, "logs", `{}`)
	require.Equal(t, storage.InstanceCompleted, b.wait(t, id).Status)
	got, err := b.store.ListLogs(context.Background(), storage.LogsParams{InstanceID: id})
	require.NoError(t, err)
	require.Equal(t, []string{"first", "second", "first", "second"}, messages(got))
	require.Equal(t, []int{1, 1, 2, 2}, []int{got[0].Attempt, got[1].Attempt, got[2].Attempt, got[3].Attempt})
}

func messages(rs []storage.LogRecord) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.Message
	}
	return out
}

// spansBy indexes ended spans by name.
func spansBy(spans tracetest.SpanStubs) map[string][]tracetest.SpanStub {
	out := map[string][]tracetest.SpanStub{}
	for _, s := range spans {
		out[s.Name] = append(out[s.Name], s)
	}
	return out
}

func attr(s tracetest.SpanStub, key string) attribute.Value {
	for _, kv := range s.Attributes {
		if string(kv.Key) == key {
			return kv.Value
		}
	}
	return attribute.Value{}
}

func TestTracing(t *testing.T) {
	t.Parallel()
	exporter := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exporter), sdktrace.WithIDGenerator(dagrun.TraceIDGenerator()))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })

	registry := handlers.NewRegistry()
	handlerSpans := make(chan trace.SpanContext, 10)
	registry.Register("flaky", func(ctx context.Context, _ json.RawMessage) (json.RawMessage, error) {
		handlerSpans <- trace.SpanFromContext(ctx).SpanContext()
		if handlers.Info(ctx).Attempt == 1 {
			return nil, fmt.Errorf("first attempt fails")
		}
		return nil, nil
	})
	b := obsBundle(t, registry, &dagrun.Config{TracerProvider: tp}, `name: traced
steps:
  - {name: a, handler: flaky, retry: {maxAttempts: 2, backoff: 1ms}}
  - {name: b, handler: noop, dependsOn: [a]}
`)
	b.runWorker(t, nil)

	caller, err := dagrun.ContextWithTraceParent(context.Background(), "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	require.NoError(t, err)
	res, err := b.engine.Start(caller, "traced", nil, nil)
	require.NoError(t, err)
	inst := b.wait(t, res.ID)
	require.Equal(t, storage.InstanceCompleted, inst.Status)
	require.True(t, strings.HasPrefix(inst.TraceParent, "00-0af7651916cd43dd8448eb211c80319c-"), inst.TraceParent)
	require.Equal(t, "b7ad6b7169203331", inst.TraceCaller)

	var byName map[string][]tracetest.SpanStub
	require.Eventually(t, func() bool {
		byName = spansBy(exporter.GetSpans())
		return len(byName["workflow traced"]) == 1
	}, 10*time.Second, 10*time.Millisecond)
	root := byName["workflow traced"][0]
	require.Equal(t, "0af7651916cd43dd8448eb211c80319c", root.SpanContext.TraceID().String())
	require.Equal(t, "b7ad6b7169203331", root.Parent.SpanID().String(), "the instance span is the caller's child")
	require.Equal(t, inst.TraceParent[36:52], root.SpanContext.SpanID().String(), "with the IDs chosen at start")
	require.Equal(t, res.ID, attr(root, "workflow.instance.id").AsString())
	require.Equal(t, "completed", attr(root, "workflow.status").AsString())
	require.True(t, root.StartTime.Equal(inst.CreatedAt), "from its creation: %v %v", root.StartTime, inst.CreatedAt)

	attempts := append(byName["step a"], byName["step b"]...)
	require.Len(t, attempts, 3, "one span per attempt")
	for _, s := range attempts {
		require.Equal(t, root.SpanContext.TraceID(), s.SpanContext.TraceID())
		require.Equal(t, root.SpanContext.SpanID(), s.Parent.SpanID(), "%s is the instance span's child", s.Name)
		require.Equal(t, "traced", attr(s, "workflow.name").AsString())
	}
	first, second := byName["step a"][0], byName["step a"][1]
	if attr(first, "workflow.attempt").AsInt64() == 2 {
		first, second = second, first
	}
	require.Equal(t, codes.Error, first.Status.Code)
	require.Equal(t, "first attempt fails", first.Status.Description)
	require.Equal(t, "retry", attr(first, "workflow.outcome").AsString())
	require.Equal(t, "_OTHER", attr(first, "error.type").AsString())
	require.Equal(t, "completed", attr(second, "workflow.outcome").AsString())
	require.NotEqual(t, codes.Error, second.Status.Code)

	// The handler ran inside its attempt's span.
	seen := []trace.SpanContext{<-handlerSpans, <-handlerSpans}
	require.ElementsMatch(t, []trace.SpanID{first.SpanContext.SpanID(), second.SpanContext.SpanID()},
		[]trace.SpanID{seen[0].SpanID(), seen[1].SpanID()})
}

// A child instance is part of its parent's trace: its span is the child
// of the parent instance's span, and its attempts' spans are its own
// children, one item's child as much as a plain workflow step's.
func TestTracingChildInstances(t *testing.T) {
	t.Parallel()
	exporter := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exporter), sdktrace.WithIDGenerator(dagrun.TraceIDGenerator()))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	b := obsBundle(t, handlers.NewRegistry(), &dagrun.Config{TracerProvider: tp}, `name: parent
steps:
  - {name: one, workflow: kid}
  - {name: many, forEach: "${{ [1, 2] }}", workflow: kid}
`, `name: kid
steps:
  - {name: a, handler: noop}
`)
	b.runWorker(t, nil)
	res, err := b.engine.Start(context.Background(), "parent", nil, nil)
	require.NoError(t, err)
	require.Equal(t, storage.InstanceCompleted, b.wait(t, res.ID).Status)

	var byName map[string][]tracetest.SpanStub
	require.Eventually(t, func() bool {
		byName = spansBy(exporter.GetSpans())
		return len(byName["workflow parent"]) == 1 && len(byName["workflow kid"]) == 3
	}, 10*time.Second, 10*time.Millisecond, "an instance span for the parent and each of its 3 children")
	root := byName["workflow parent"][0]
	kids := map[trace.SpanID]bool{}
	for _, kid := range byName["workflow kid"] {
		require.Equal(t, root.SpanContext.TraceID(), kid.SpanContext.TraceID(), "a child instance is in its parent's trace")
		require.Equal(t, root.SpanContext.SpanID(), kid.Parent.SpanID(), "a child instance's span is its parent's child")
		kids[kid.SpanContext.SpanID()] = true
	}
	require.Len(t, byName["step a"], 3)
	for _, a := range byName["step a"] {
		require.Equal(t, root.SpanContext.TraceID(), a.SpanContext.TraceID())
		require.True(t, kids[a.Parent.SpanID()], "a child's attempt is its instance span's child")
		delete(kids, a.Parent.SpanID())
	}
}

// A retried instance that finishes again sends a span of its own for the
// new run, the instance span's child, rather than the instance span again:
// a trace backend keeps one span per ID.
func TestTracingRetriedInstance(t *testing.T) {
	t.Parallel()
	exporter := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exporter), sdktrace.WithIDGenerator(dagrun.TraceIDGenerator()))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	registry := handlers.NewRegistry()
	var calls atomic.Int32
	registry.Register("once-broken", func(context.Context, json.RawMessage) (json.RawMessage, error) {
		if calls.Add(1) == 1 {
			return nil, fmt.Errorf("broken")
		}
		return nil, nil
	})
	b := obsBundle(t, registry, &dagrun.Config{TracerProvider: tp}, `name: again
steps:
  - {name: a, handler: once-broken, retry: {maxAttempts: 1}}
`)
	b.runWorker(t, nil)
	res, err := b.engine.Start(context.Background(), "again", nil, nil)
	require.NoError(t, err)
	require.Equal(t, storage.InstanceFailed, b.wait(t, res.ID).Status)
	require.NoError(t, b.engine.Retry(context.Background(), res.ID))
	inst := b.wait(t, res.ID)
	require.Equal(t, storage.InstanceCompleted, inst.Status)

	var runs []tracetest.SpanStub
	require.Eventually(t, func() bool {
		runs = spansBy(exporter.GetSpans())["workflow again"]
		return len(runs) == 2
	}, 10*time.Second, 10*time.Millisecond, "a span for each run")
	first, second := runs[0], runs[1]
	require.Equal(t, inst.TraceParent[36:52], first.SpanContext.SpanID().String(), "the first run's span has the instance's IDs")
	require.Equal(t, "failed", attr(first, "workflow.status").AsString())
	require.NotEqual(t, first.SpanContext.SpanID(), second.SpanContext.SpanID(), "the second run's span has an ID of its own")
	require.Equal(t, first.SpanContext.TraceID(), second.SpanContext.TraceID())
	require.Equal(t, first.SpanContext.SpanID(), second.Parent.SpanID(), "the run is the instance span's child")
	require.Equal(t, "completed", attr(second, "workflow.status").AsString())
	require.True(t, attr(second, "workflow.retried").AsBool())
	require.False(t, second.StartTime.Before(first.EndTime), "the run starts at the retry, after the first run ended")
}

// A scheduled instance is traced as a started one is: a trace of its own
// (no caller), whose instance span parents its attempts' spans.
func TestTracingScheduledInstance(t *testing.T) {
	t.Parallel()
	exporter := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exporter), sdktrace.WithIDGenerator(dagrun.TraceIDGenerator()))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	b := obsBundle(t, handlers.NewRegistry(), &dagrun.Config{TracerProvider: tp},
		scheduledWorkflow("tick", `{cron: "@every 1s", overlap: allow}`))
	b.runWorker(t, nil)
	s, err := b.engine.NewScheduler(nil)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	var byName map[string][]tracetest.SpanStub
	require.Eventually(t, func() bool {
		byName = spansBy(exporter.GetSpans())
		return len(byName["workflow tick"]) >= 1
	}, 20*time.Second, 10*time.Millisecond, "a scheduled instance's span")
	root := byName["workflow tick"][0]
	require.False(t, root.Parent.IsValid(), "a scheduled instance's trace has no caller")
	inst, err := b.engine.Get(ctx, attr(root, "workflow.instance.id").AsString())
	require.NoError(t, err)
	require.Equal(t, inst.TraceParent[36:52], root.SpanContext.SpanID().String(), "with the IDs chosen as it was fired")
	attempts := 0
	for _, a := range byName["step a"] {
		if a.Parent.SpanID() == root.SpanContext.SpanID() {
			require.Equal(t, root.SpanContext.TraceID(), a.SpanContext.TraceID())
			attempts++
		}
	}
	require.Equal(t, 1, attempts, "its attempt is its instance span's child")
}

func TestTracingOff(t *testing.T) {
	t.Parallel()
	b := obsBundle(t, handlers.NewRegistry(), &dagrun.Config{}, `name: plain
steps:
  - {name: a, handler: noop}
`)
	b.runWorker(t, nil)
	caller, err := dagrun.ContextWithTraceParent(context.Background(), "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	require.NoError(t, err)
	res, err := b.engine.Start(caller, "plain", nil, nil)
	require.NoError(t, err)
	inst := b.wait(t, res.ID)
	require.Empty(t, inst.TraceParent, "nothing is stored when tracing is off")

	_, err = dagrun.ContextWithTraceParent(context.Background(), "00-zz-b7ad6b7169203331-01")
	require.ErrorContains(t, err, "invalid traceparent")
}
