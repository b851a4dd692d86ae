package dagrun

import (
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/handlers"
	"github.com/dagrun/dagrun/storage"
)

// finishedObserver counts the instances reported finished.
type finishedObserver struct {
	mu       sync.Mutex
	finished []storage.InstanceStatus
}

func (o *finishedObserver) InstanceStarted(string) {}
func (o *finishedObserver) InstanceFinished(_ string, status storage.InstanceStatus) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.finished = append(o.finished, status)
}
func (o *finishedObserver) AttemptFinished(AttemptReport) {}

// TestFinishRecorderForgetsARolledBackAttempt: the instances a store's
// attempt planned to finish are reported once the call returns, unless the
// store ran the transaction again (storage.AttemptStarted), which starts
// what is reported over: a retry that did not plan the instance (a cancel
// had finished it meanwhile) must not report it completed.
func TestFinishRecorderForgetsARolledBackAttempt(t *testing.T) {
	t.Parallel()
	registry := handlers.NewRegistry()
	handlers.RegisterBuiltins(registry)
	state := func() *storage.InstanceState {
		return &storage.InstanceState{ID: "01a23000-0000-7000-8000-000000000001", Workflow: "one", DefinitionHash: "h",
			Status: storage.InstanceRunning, Input: json.RawMessage(`{}`),
			Steps: []storage.StepState{{Name: "a", Status: storage.StepCompleted, Output: json.RawMessage(`1`), Attempts: 1}},
			LoadDefinition: func() ([]byte, error) {
				return []byte("name: one\nsteps:\n  - name: a\n    handler: noop\n"), nil
			}}
	}
	for _, retried := range []bool{false, true} {
		obs := &finishedObserver{}
		e, err := New(struct{ storage.Store }{}, registry, &Config{Observer: obs})
		require.NoError(t, err)
		rec := e.newFinishRecorder()
		ctx := rec.attach(t.Context())
		storage.AttemptStarted(ctx)
		p, err := rec.plan(state())
		require.NoError(t, err)
		require.NotNil(t, p.Instance, "the plan completes the instance")
		if retried {
			storage.AttemptStarted(ctx) // rolled back; the retry plans nothing
		}
		rec.report()
		if retried {
			require.Empty(t, obs.finished, "retried: reported finished")
		} else {
			require.Equal(t, []storage.InstanceStatus{storage.InstanceCompleted}, obs.finished)
		}
	}
}

// TestFinishRecorderTellsDeadlinesOfTheCommittedAttemptOnly: the deadline
// of a wait a plan started reaches the local claim loops once the store's
// call returns, unless the store ran the transaction again, whose plans
// then say anew what they start.
func TestFinishRecorderTellsDeadlinesOfTheCommittedAttemptOnly(t *testing.T) {
	t.Parallel()
	registry := handlers.NewRegistry()
	handlers.RegisterBuiltins(registry)
	state := &storage.InstanceState{ID: "01a23000-0000-7000-8000-000000000002", Workflow: "approval", DefinitionHash: "h2",
		Status: storage.InstanceRunning, Input: json.RawMessage(`{}`),
		Steps: []storage.StepState{
			{Name: "first", Status: storage.StepCompleted, Output: json.RawMessage(`1`), Attempts: 1},
			{Name: "approve", DependsOn: []string{"first"}, Status: storage.StepBlocked},
		},
		LoadDefinition: func() ([]byte, error) {
			return []byte("name: approval\nsteps:\n  - {name: first, handler: noop}\n" +
				"  - {name: approve, dependsOn: [first], wait: {signal: go, timeout: 5m}}\n"), nil
		}}
	for _, retried := range []bool{false, true} {
		e, err := New(struct{ storage.Store }{}, registry, nil)
		require.NoError(t, err)
		w, err := e.NewWorker(nil)
		require.NoError(t, err)
		e.addWorker(w)
		rec := e.newFinishRecorder()
		ctx := rec.attach(t.Context())
		storage.AttemptStarted(ctx)
		p, err := rec.plan(state)
		require.NoError(t, err)
		require.Equal(t, []storage.StepChange{{Name: "approve", Status: storage.StepWaiting, Input: json.RawMessage("null")}}, p.Steps)
		if retried {
			storage.AttemptStarted(ctx) // rolled back; the retry plans nothing
		}
		before := time.Now()
		rec.report()
		told := w.wakeTimes.take()
		if retried {
			require.True(t, told.IsZero(), "retried: told of %v", told)
			continue
		}
		require.WithinDuration(t, before.Add(5*time.Minute), told, time.Second)
	}
}
