package dagrun

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/dagrun/dagrun/handlers"
	"github.com/dagrun/dagrun/storage"
)

// BenchmarkHotPaths measures what the engine does around one attempt of a
// noop handler, the path every step takes: with tracing off (the default,
// which must cost nothing), with the worker's step log writer (what every
// attempt pays for step logs when its handler logs nothing), and with
// tracing on; and of a handler logging one record with two attributes,
// what a step that logs pays before its records reach the store.
//
//	go test -run '^$' -bench HotPaths -benchmem .
func BenchmarkHotPaths(b *testing.B) {
	registry := handlers.NewRegistry()
	handlers.RegisterBuiltins(registry)
	registry.Register("log", func(ctx context.Context, _ json.RawMessage) (json.RawMessage, error) {
		handlers.Logger(ctx).Info("working", slog.Int("record", 1), slog.String("step", handlers.Info(ctx).Step))
		return json.RawMessage("null"), nil
	})
	step := storage.ClaimedStep{
		Claim:    storage.Claim{StepID: 1, InstanceID: "01a22cd6-75f6-7949-9367-a4c1c6c622a4", Step: "a", Fence: 1},
		Workflow: "bench", Handler: "noop", Queue: "default", Input: json.RawMessage(`{}`), Attempt: 1, Item: -1,
		TraceParent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	run := func(b *testing.B, config *Config, logs *logWriter) {
		b.Helper()
		e, err := New(struct{ storage.Store }{}, registry, config)
		if err != nil {
			b.Fatal(err)
		}
		ctx := context.Background()
		b.ReportAllocs()
		for b.Loop() {
			if _, ok := e.runAttempt(ctx, logger, slog.LevelWarn, logs, step); !ok {
				b.Fatal("not recorded")
			}
		}
	}
	b.Run("Attempt", func(b *testing.B) { run(b, &Config{}, nil) })
	b.Run("AttemptWithLogWriter", func(b *testing.B) {
		run(b, &Config{}, newLogWriter(nil, logger, DefaultStepLogBytes))
	})
	b.Run("AttemptThatLogs", func(b *testing.B) {
		step := step
		step.Handler = "log"
		e, err := New(struct{ storage.Store }{}, registry, &Config{})
		if err != nil {
			b.Fatal(err)
		}
		// The writer's flushes, as its worker runs them, let go of the
		// attempts' logs: the result took their records, nothing is left
		// to store.
		logs := newLogWriter(discardLogs{}, logger, DefaultStepLogBytes)
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			res, ok := e.runAttempt(context.Background(), logger, slog.LevelWarn, logs, step)
			if !ok || len(res.Logs) != 1 {
				b.Fatalf("recorded %v with %d records, want 1", ok, len(res.Logs))
			}
			if i++; i%100 == 0 {
				logs.flush()
			}
		}
	})
	b.Run("AttemptTraced", func(b *testing.B) {
		tp := sdktrace.NewTracerProvider(sdktrace.WithIDGenerator(TraceIDGenerator()))
		defer func() { _ = tp.Shutdown(context.Background()) }()
		run(b, &Config{TracerProvider: tp}, nil)
	})
}

// discardLogs is a store whose AppendLogs stores nothing.
type discardLogs struct{ storage.Store }

func (discardLogs) AppendLogs(context.Context, []storage.LogTrim, []storage.LogRecord) error {
	return nil
}
