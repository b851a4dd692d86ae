package sqlite_test

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"path/filepath"
	"sync"
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

// statsHistory is how many finished instances BenchmarkStats puts in the
// database before it measures a scrape.
const statsHistory = 1_000_000

// BenchmarkStats measures Stats (what a /metrics scrape reads) with
// statsHistory finished instances of ten workflows in the file:
// go test -run '^$' -bench Stats -benchtime 200x ./storage/sqlite
func BenchmarkStats(b *testing.B) {
	path := filepath.Join(b.TempDir(), "bench.db")
	s, err := sqlite.Open(b.Context(), path, nil)
	require.NoError(b, err)
	require.NoError(b, s.Close())
	db, err := sql.Open("sqlite3", sqlite.DSN(path))
	require.NoError(b, err)
	_, err = db.ExecContext(b.Context(), `INSERT INTO definitions (hash, workflow, source) VALUES ('h', 'wf', 'x');
		WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < ?)
		INSERT INTO instances (id, workflow, definition_hash, status, run_after, created_at, started_at, finished_at)
		SELECT printf('old-%08d', i), 'wf' || (i % 10), 'h', CASE WHEN i % 7 = 0 THEN 'failed' ELSE 'completed' END, i, i, i, i + 1 FROM c`, statsHistory)
	require.NoError(b, err)
	require.NoError(b, db.Close())
	s, err = sqlite.Open(b.Context(), path, nil)
	require.NoError(b, err)
	defer s.Close()
	b.ResetTimer()
	for range b.N {
		st, err := s.Stats(b.Context())
		require.NoError(b, err)
		require.Len(b, st.Workflows, 10)
	}
}

// BenchmarkGetInstance reads an instance with 10 and with 100,000 events:
// go test -run '^$' -bench 'GetInstance|FollowPoll' -benchmem ./storage/sqlite
func BenchmarkGetInstance(b *testing.B) {
	var h historyBench
	storagetest.BenchmarkGetInstance(b, h.newStore, h.fill)
}

// BenchmarkFollowPoll looks for new events of an instance with 10 and with
// 100,000 events, when there are none.
func BenchmarkFollowPoll(b *testing.B) {
	var h historyBench
	storagetest.BenchmarkFollowPoll(b, h.newStore, h.fill)
}

// historyBench opens the stores of the history benchmarks and fills their
// instances' histories with one INSERT through a pool of its own.
type historyBench struct {
	paths sync.Map // storage.Store -> file path
}

func (h *historyBench) newStore(b *testing.B) storage.Store {
	path := filepath.Join(b.TempDir(), "bench.db")
	s, err := sqlite.Open(b.Context(), path, nil)
	require.NoError(b, err)
	b.Cleanup(func() { _ = s.Close() })
	h.paths.Store(s, path)
	return s
}

func (h *historyBench) fill(b *testing.B, s storage.Store, id string, n int) {
	path, ok := h.paths.Load(s)
	require.True(b, ok)
	db, err := sql.Open("sqlite3", sqlite.DSN(path.(string)))
	require.NoError(b, err)
	defer db.Close()
	_, err = db.ExecContext(b.Context(), `WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < ?1)
		INSERT INTO events (instance_key, instance_id, step, type, attempt, message, at)
		SELECT (SELECT key FROM instance_keys WHERE id = ?2), ?2, 'a', CASE WHEN i % 2 = 1 THEN 'step.started' ELSE 'step.snoozed' END, 1, '', i FROM c`, n, id)
	require.NoError(b, err)
}
