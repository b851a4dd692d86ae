package app

import (
	"context"
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun"
	"github.com/dagrun/dagrun/dag"
	"github.com/dagrun/dagrun/handlers"
	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/sqlite"
)

// TestFamilyWorkersServeALimitedNumberOfChildren: a following start runs
// a forEach's children a limited number at a time, and runs them all.
func TestFamilyWorkersServeALimitedNumberOfChildren(t *testing.T) {
	t.Parallel()
	var workflows []*dag.Workflow
	for _, src := range []string{
		"name: child\nsteps:\n  - name: a\n    handler: echo\n    input: ${{ input }}\n",
		"name: fan\nsteps:\n  - name: each\n    forEach: ${{ 1..12 }}\n    workflow: child\n    input: ${{ item }}\n",
	} {
		w, err := dag.Parse("", []byte(src), nil)
		require.NoError(t, err)
		workflows = append(workflows, w)
	}
	store, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "dagrun.db"), nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	registry := handlers.NewRegistry()
	handlers.RegisterBuiltins(registry)
	engine, err := dagrun.New(store, registry, &dagrun.Config{Workflows: workflows})
	require.NoError(t, err)

	res, err := engine.Start(t.Context(), "fan", json.RawMessage(`{}`), nil)
	require.NoError(t, err)
	family := newFamilyWorkers(context.Background(), engine, followLease)
	family.limit = 3
	require.NoError(t, family.serve(res.ID, false))
	ctx, stop := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		family.watch(ctx, res.ID)
	}()
	t.Cleanup(func() {
		stop()
		<-done
		family.stopAll()
	})
	require.Eventually(t, func() bool {
		inst, err := engine.Get(t.Context(), res.ID)
		require.NoError(t, err)
		return inst.Status == storage.InstanceCompleted
	}, 30*time.Second, 10*time.Millisecond)
	family.mu.Lock()
	defer family.mu.Unlock()
	require.LessOrEqual(t, family.most, 1+3, "the followed instance and three children at most")
	require.Greater(t, family.most, 1, "children were served")
}
