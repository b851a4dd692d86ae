package dagruntest

import (
	"context"
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun"
	"github.com/dagrun/dagrun/handlers"
	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/sqlite"
)

// TestEquivalence runs the same cases twice: as dagrun test runs them (Drive
// on a fake clock), and under a real worker on a real clock and a SQLite
// file, with the same mocks. Both must meet the cases' expectations and
// agree on every step's status, attempts, input, output, error and events,
// and on the instance's status, output and error: what passes under
// dagrun test behaves the same in production.
func TestEquivalence(t *testing.T) {
	t.Parallel()
	dir := filepath.Join("testdata", "equivalence")
	workflows, err := LoadWorkflows(dir)
	require.NoError(t, err)
	files, err := DefaultFiles(dir)
	require.NoError(t, err)
	parsed, err := ParseFiles(files, workflows)
	require.NoError(t, err)
	registry := handlers.NewRegistry()
	handlers.RegisterBuiltins(registry)
	registry.Register("app.each", func(_ context.Context, in json.RawMessage) (json.RawMessage, error) { return in, nil })
	runner, err := NewRunner(registry, workflows)
	require.NoError(t, err)
	t.Cleanup(runner.Close)

	for _, f := range parsed {
		for _, c := range f.Cases {
			t.Run(c.Name, func(t *testing.T) {
				t.Parallel()
				fake := runner.RunCase(t.Context(), f, c)
				require.Empty(t, fake.Failures, "under dagrun test")

				problems := &problemLog{}
				real := runUnderWorker(t, mockRegistry(registry, workflows, f.Workflow, c.Mocks, problems), runner, f.Workflow, c)
				require.Empty(t, problems.all())
				require.Empty(t, check(f, c, real), "under a real worker")
				require.Equal(t, summarize(fake.Instance), summarize(real))
			})
		}
	}
}

// runUnderWorker runs a case the way production runs an instance: a
// worker on a SQLite file and the real clock, signals sent when their
// time comes. It returns the instance once it finished.
func runUnderWorker(t *testing.T, registry *handlers.Registry, runner *Runner, workflow string, c *Case) *storage.Instance {
	t.Helper()
	ctx := t.Context()
	store, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "real.db"), nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	engine, err := dagrun.New(store, registry, &dagrun.Config{Workflows: runner.workflows})
	require.NoError(t, err)
	worker, err := engine.NewWorker(&dagrun.WorkerConfig{Poll: 20 * time.Millisecond, Lease: 5 * time.Second})
	require.NoError(t, err)
	workerCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	stopped := make(chan error, 1)
	go func() { stopped <- worker.Run(workerCtx) }()
	t.Cleanup(func() { stop(); require.NoError(t, <-stopped) })

	started, err := engine.Start(ctx, workflow, c.Input, nil)
	require.NoError(t, err)
	for _, s := range c.Signals {
		time.AfterFunc(s.After, func() {
			_, _ = engine.Signal(context.WithoutCancel(ctx), dagrun.SignalRequest{InstanceID: started.ID, Name: s.Name, ID: s.ID, Data: s.Data})
		})
	}
	var inst *storage.Instance
	require.Eventually(t, func() bool {
		inst, err = engine.Get(ctx, started.ID)
		return err == nil && inst.Status.Finished() && !hasUnfinishedSteps(inst)
	}, 30*time.Second, 10*time.Millisecond)
	require.NoError(t, readHistory(ctx, engine, inst))
	return inst
}

func hasUnfinishedSteps(inst *storage.Instance) bool {
	for _, s := range inst.Steps {
		if s.Status == storage.StepRunning {
			return true
		}
	}
	return false
}

// stepSummary is what the two runs must agree on for one step. A sleep's
// output names its wake time, which differs between clocks, and is left
// out.
type stepSummary struct {
	Name, Status  string
	Attempts      int
	Input, Output string
	Error         string
	Events        []string
}

func summarize(inst *storage.Instance) map[string]any {
	steps := make([]stepSummary, len(inst.Steps))
	for i, s := range inst.Steps {
		sum := stepSummary{Name: s.Name, Status: string(s.Status), Attempts: s.Attempts, Input: string(s.Input), Output: string(s.Output), Error: s.Error}
		if s.Handler == "sleep" {
			sum.Output = ""
		}
		for _, ev := range inst.Events {
			if ev.Step == s.Name {
				sum.Events = append(sum.Events, eventName(ev))
			}
		}
		steps[i] = sum
	}
	return map[string]any{"status": inst.Status, "output": string(inst.Output), "error": inst.Error, "steps": steps}
}
