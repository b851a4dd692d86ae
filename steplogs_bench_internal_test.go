package dagrun

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/dagrun/dagrun/handlers"
	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/sqlite"
)

// BenchmarkStepLogs measures what step logs cost one attempt that logs two
// records with two attributes each, as `dagrun bench --step-logs 2` does:
// the records through handlers.Logger, then their share of the worker's
// batched write to SQLite (one write per 100 attempts).
//
//	go test -run '^$' -bench StepLogs -benchmem .
func BenchmarkStepLogs(b *testing.B) {
	store, err := sqlite.Open(context.Background(), filepath.Join(b.TempDir(), "logs.db"), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	res, err := store.CreateInstances(context.Background(), nil, []storage.CreateParams{{
		ID: "bench", Workflow: "w", DefinitionHash: "h", Definition: []byte("name: w\n"),
		Steps: []storage.StepSpec{{Name: "a", Handler: "noop", Retry: storage.RetryPolicy{MaxAttempts: 1}}},
	}}, func(*storage.InstanceState) (*storage.Plan, error) { return &storage.Plan{}, nil })
	if err != nil || len(res) != 1 {
		b.Fatal(err)
	}
	lw := newLogWriter(store, slog.New(slog.NewTextHandler(io.Discard, nil)), DefaultStepLogBytes)
	step := storage.ClaimedStep{Claim: storage.Claim{InstanceID: "bench", Step: "a"}, Item: -1}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		step.Attempt = i
		ctx := handlers.WithLogHandler(context.Background(), newLazyAttemptLog(lw, &step))
		log := handlers.Logger(ctx)
		for r := range 2 {
			log.Info("working", slog.Int("record", r), slog.String("step", "a"))
		}
		if i%100 == 0 {
			lw.flush()
		}
	}
	lw.flush()
}
