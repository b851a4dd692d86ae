package dagrun_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun"
	"github.com/dagrun/dagrun/dag"
	"github.com/dagrun/dagrun/handlers"
	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/backendtest"
)

// syncBuffer is a log destination safe for concurrent writers.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// skewedClockStore is a store whose database clock runs a minute behind
// this machine's.
type skewedClockStore struct{ storage.Store }

func (skewedClockStore) Now(context.Context) (time.Time, error) {
	return time.Now().Add(-time.Minute), nil
}

// runLoggedWorker runs a worker of an engine over store, logging to the
// returned buffer, until the test ends.
func runLoggedWorker(t *testing.T, store storage.Store) (*dagrun.Engine, *syncBuffer) {
	t.Helper()
	registry := handlers.NewRegistry()
	handlers.RegisterBuiltins(registry)
	w, err := dag.Parse("", []byte(chainWorkflow), &dag.ParseOptions{HandlerExists: registry.Has})
	require.NoError(t, err)
	logs := &syncBuffer{}
	engine, err := dagrun.New(store, registry, &dagrun.Config{Workflows: []*dag.Workflow{w}, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	require.NoError(t, err)
	worker, err := engine.NewWorker(&dagrun.WorkerConfig{Poll: 20 * time.Millisecond})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = worker.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return engine, logs
}

// TestWorkerWarnsOfClockSkew: a worker whose clock differs from the
// database's says so when it starts.
func TestWorkerWarnsOfClockSkew(t *testing.T) {
	t.Parallel()
	_, logs := runLoggedWorker(t, skewedClockStore{backendtest.OpenSQLite(t)})
	require.Eventually(t, func() bool {
		return strings.Contains(logs.String(), "clock differs from the database's")
	}, 10*time.Second, 5*time.Millisecond, "no warning in:\n%s", logs.String())
	// About a minute: the worker compares with the middle of its round trip.
	require.Regexp(t, `skew=(1m0|59\.9)`, logs.String())
}

// TestWorkerQuietWithAccurateClock: against PostgreSQL's real clock, on
// the same machine, a worker runs without a clock warning.
func TestWorkerQuietWithAccurateClock(t *testing.T) {
	t.Parallel()
	if !backendtest.PostgresAvailable(t) {
		t.Skip("set DAGRUN_TEST_POSTGRES to compare a worker's clock with PostgreSQL's")
	}
	store := backendtest.OpenPostgres(t)
	_, ok := store.(storage.Clock)
	require.True(t, ok, "the PostgreSQL store keeps the database's clock")
	engine, logs := runLoggedWorker(t, store)
	// The worker checks before it claims: an instance run to completion
	// shows it got past the check.
	res, err := engine.Start(t.Context(), "chain", []byte(`{"n": 1}`), nil)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	inst, err := engine.Follow(ctx, res.ID, nil)
	require.NoError(t, err)
	require.Equal(t, storage.InstanceCompleted, inst.Status)
	require.NotContains(t, logs.String(), "clock differs")
}

// TestDelayCountsFromTheDatabasesClock: a delayed start from a machine
// whose clock is off runs when the database's clock says, the clock the
// workers' claims go by.
func TestDelayCountsFromTheDatabasesClock(t *testing.T) {
	t.Parallel()
	store := skewedClockStore{backendtest.OpenSQLite(t)}
	w, err := dag.Parse("", []byte(chainWorkflow), nil)
	require.NoError(t, err)
	registry := handlers.NewRegistry()
	handlers.RegisterBuiltins(registry)
	engine, err := dagrun.New(store, registry, &dagrun.Config{Workflows: []*dag.Workflow{w}})
	require.NoError(t, err)
	res, err := engine.Start(t.Context(), "chain", []byte(`{"n": 1}`), &dagrun.StartOptions{Delay: 10 * time.Minute})
	require.NoError(t, err)
	inst, err := engine.Get(t.Context(), res.ID)
	require.NoError(t, err)
	// The database's clock runs a minute behind this machine's.
	require.WithinDuration(t, time.Now().Add(9*time.Minute), inst.RunAfter, 10*time.Second)
}
