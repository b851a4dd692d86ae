package sqlite_test

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/sqlite"
	"github.com/dagrun/dagrun/storage/storagetest"
)

// chainPlan promotes the next step of a chain and completes the instance
// after the last, as the engine would.
func chainPlan(st *storage.InstanceState) (*storage.Plan, error) {
	for i, s := range st.Steps {
		switch s.Status {
		case storage.StepCompleted:
			continue
		case storage.StepBlocked:
			if i == 0 || st.Steps[i-1].Status == storage.StepCompleted {
				return &storage.Plan{Steps: []storage.StepChange{{Name: s.Name, Status: storage.StepPending, Input: json.RawMessage(`{"n":1}`)}}}, nil
			}
		}
		return nil, nil
	}
	return &storage.Plan{Instance: &storage.InstanceChange{Status: storage.InstanceCompleted, Output: json.RawMessage(`{}`)}}, nil
}

// BenchmarkChains runs 4-step chains with batched claims and group-committed
// finishes on one writer, and reports steps per second.
func BenchmarkChains(b *testing.B) {
	s, err := sqlite.Open(b.Context(), filepath.Join(b.TempDir(), "bench.db"), nil)
	require.NoError(b, err)
	defer s.Close()
	const batch = 100
	steps := 0
	b.ResetTimer()
	for n := 0; n < b.N; n++ {
		ps := make([]storage.CreateParams, batch)
		for i := range ps {
			ps[i] = storage.CreateParams{
				ID: fmt.Sprintf("b%08d-%03d", n, i), Workflow: "wf", DefinitionHash: "h", Definition: []byte("x"),
				Input: json.RawMessage(`{"order":1}`),
				Steps: []storage.StepSpec{{Name: "a"}, {Name: "b", DependsOn: []string{"a"}}, {Name: "c", DependsOn: []string{"b"}}, {Name: "d", DependsOn: []string{"c"}}},
			}
		}
		_, err := s.CreateInstances(b.Context(), nil, ps, chainPlan)
		require.NoError(b, err)
		for {
			got, err := s.ClaimSteps(b.Context(), storage.ClaimParams{WorkerID: "w", Limit: batch, Lease: time.Minute})
			require.NoError(b, err)
			if len(got) == 0 {
				break
			}
			rs := make([]storage.StepResult, len(got))
			for i, c := range got {
				rs[i] = storage.StepResult{Claim: c.Claim, Outcome: storage.OutcomeCompleted, Output: json.RawMessage(`{"ok":true}`)}
			}
			_, err = s.FinishSteps(b.Context(), rs, chainPlan)
			require.NoError(b, err)
			steps += len(got)
		}
	}
	b.ReportMetric(float64(steps)/b.Elapsed().Seconds(), "steps/s")
}

// BenchmarkHotPaths runs the shared claim and complete-and-unblock
// benchmarks: go test -run '^$' -bench HotPaths -benchmem ./storage/sqlite
func BenchmarkHotPaths(b *testing.B) {
	storagetest.Benchmark(b, func(b *testing.B) storage.Store {
		s, err := sqlite.Open(b.Context(), filepath.Join(b.TempDir(), "bench.db"), nil)
		require.NoError(b, err)
		b.Cleanup(func() { _ = s.Close() })
		return s
	})
}

// BenchmarkItems runs the shared forEach benchmarks (10,000 items of one
// step): go test -run '^$' -bench Items -benchmem ./storage/sqlite
func BenchmarkItems(b *testing.B) {
	storagetest.BenchmarkItems(b, func(b *testing.B) storage.Store {
		s, err := sqlite.Open(b.Context(), filepath.Join(b.TempDir(), "bench.db"), nil)
		require.NoError(b, err)
		b.Cleanup(func() { _ = s.Close() })
		return s
	})
}
