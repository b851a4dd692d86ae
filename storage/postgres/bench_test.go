package postgres

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/storagetest"
)

func chain4() storage.CreateParams {
	return params(spec("s1"), spec("s2", "s1"), spec("s3", "s2"), spec("s4", "s3"))
}

// BenchmarkCreate measures starting instances of a 4-step chain, 1000 per
// CreateInstances call (reported as instances/s).
func BenchmarkCreate(b *testing.B) {
	s := openTestStore(b, nil)
	const batch = 1000
	start := time.Now()
	for b.Loop() {
		ps := make([]storage.CreateParams, batch)
		for i := range ps {
			ps[i] = chain4()
		}
		_, err := s.CreateInstances(b.Context(), nil, ps, storagetest.Plan)
		require.NoError(b, err)
	}
	b.ReportMetric(float64(b.N*batch)/time.Since(start).Seconds(), "instances/s")
}

// BenchmarkChain4 measures running 4-step chains with 8 workers, each
// claiming and finishing one step at a time as the engine's workers would
// without group commit, woken by Subscribe with a 50ms polling fallback
// (reported as steps/s).
func BenchmarkChain4(b *testing.B) {
	s := openTestStore(b, nil)
	ctx := b.Context()
	const chains = 500
	for b.Loop() {
		b.StopTimer()
		ps := make([]storage.CreateParams, chains)
		for i := range ps {
			ps[i] = chain4()
		}
		b.StartTimer()
		start := time.Now()
		_, err := s.CreateInstances(ctx, nil, ps, storagetest.Plan)
		require.NoError(b, err)
		var (
			done atomic.Int64
			wg   sync.WaitGroup
		)
		for w := range 8 {
			wg.Go(func() {
				ch, cancel := s.Subscribe(nil)
				defer cancel()
				for done.Load() < chains*4 {
					cs, err := s.ClaimSteps(ctx, storage.ClaimParams{WorkerID: fmt.Sprint("w", w), Limit: 1, Lease: time.Minute})
					if err != nil {
						b.Error(err)
						return
					}
					if len(cs) == 0 {
						select {
						case <-ch:
						case <-time.After(50 * time.Millisecond):
						}
						continue
					}
					_, err = s.FinishSteps(ctx, []storage.StepResult{{Claim: cs[0].Claim, Outcome: storage.OutcomeCompleted, Output: []byte(`{}`)}}, storagetest.Plan)
					if err != nil {
						b.Error(err)
						return
					}
					done.Add(1)
				}
			})
		}
		wg.Wait()
		b.ReportMetric(float64(chains*4)/time.Since(start).Seconds(), "steps/s")
	}
}

// BenchmarkHotPaths runs the shared claim and complete-and-unblock
// benchmarks: DAGRUN_TEST_POSTGRES=... go test -run '^$' -bench HotPaths -benchmem ./storage/postgres
func BenchmarkHotPaths(b *testing.B) {
	storagetest.Benchmark(b, func(b *testing.B) storage.Store { return openBenchStore(b) })
}

// openBenchStore opens a store as Open does for a user, on its own pool
// with the URL's settings (the store's own plan_cache_mode among them),
// in a fresh schema.
func openBenchStore(b *testing.B) *Store {
	b.Helper()
	s, err := Open(b.Context(), testURL(b), &Config{Schema: newSchema(b)})
	require.NoError(b, err)
	b.Cleanup(func() { require.NoError(b, s.Close()) })
	return s
}

// BenchmarkItems runs the shared forEach benchmarks (10,000 items of one
// step): DAGRUN_TEST_POSTGRES=... go test -run '^$' -bench Items -benchmem ./storage/postgres
func BenchmarkItems(b *testing.B) {
	storagetest.BenchmarkItems(b, func(b *testing.B) storage.Store { return openTestStore(b, nil) })
}

// statsHistory is how many finished instances BenchmarkStats puts in the
// database before it measures a scrape.
const statsHistory = 1_000_000

// BenchmarkStats measures Stats (what a /metrics scrape reads) with
// statsHistory finished instances of ten workflows in the schema:
// go test -run '^$' -bench Stats -benchtime 200x ./storage/postgres
func BenchmarkStats(b *testing.B) {
	s := openTestStore(b, nil)
	_, err := s.pool.Exec(b.Context(), s.q(`
		INSERT INTO {s}instances (id, workflow, definition_hash, status, run_after, created_at, started_at, finished_at)
		SELECT 'old-' || lpad(g::text, 8, '0'), 'wf' || (g % 10), 'h',
			CASE WHEN g % 7 = 0 THEN 'failed' ELSE 'completed' END, now(), now(), now(), now()
		FROM generate_series(1, $1::int) g`), statsHistory)
	require.NoError(b, err)
	_, err = s.pool.Exec(b.Context(), s.q(`ANALYZE {s}instances`))
	require.NoError(b, err)
	b.ResetTimer()
	for range b.N {
		st, err := s.Stats(b.Context())
		require.NoError(b, err)
		require.Len(b, st.Workflows, 10)
	}
}

// BenchmarkQueues measures Queues with 200,000 finished steps in the
// schema: DAGRUN_TEST_POSTGRES=... go test -run '^$' -bench Queues ./storage/postgres
func BenchmarkQueues(b *testing.B) {
	storagetest.BenchmarkQueues(b, func(b *testing.B) storage.Store { return openTestStore(b, nil) },
		func(b *testing.B, s storage.Store, n int) { fillFinishedHistory(b, s.(*Store), n, false) })
}

// BenchmarkGetInstance reads an instance with 10 and with 100,000 events:
// DAGRUN_TEST_POSTGRES=... go test -run '^$' -bench 'GetInstance|FollowPoll' -benchmem ./storage/postgres
func BenchmarkGetInstance(b *testing.B) {
	storagetest.BenchmarkGetInstance(b, func(b *testing.B) storage.Store { return openTestStore(b, nil) }, fillHistory)
}

// BenchmarkFollowPoll looks for new events of an instance with 10 and with
// 100,000 events, when there are none.
func BenchmarkFollowPoll(b *testing.B) {
	storagetest.BenchmarkFollowPoll(b, func(b *testing.B) storage.Store { return openTestStore(b, nil) }, fillHistory)
}

// fillHistory appends n events to an instance's history with one INSERT.
func fillHistory(b *testing.B, st storage.Store, id string, n int) {
	s := st.(*Store)
	_, err := s.pool.Exec(b.Context(), s.q(`INSERT INTO {s}events (instance_id, step, type, attempt, message, at)
		SELECT $1, 'a', CASE WHEN g % 2 = 1 THEN 'step.started' ELSE 'step.snoozed' END, 1, '', now()
		FROM generate_series(1, $2::int) g`), id, n)
	require.NoError(b, err)
	_, err = s.pool.Exec(b.Context(), s.q(`ANALYZE {s}events`))
	require.NoError(b, err)
}

// BenchmarkChainLatency drives one four-step chain at a time the way a
// worker's recorder does (an eager start, then FinishAndClaim for each
// step), reporting the time per step: with the snapshots a finish plans
// from (speculate.go), and with every snapshot forgotten before each
// finish, which then reads the instance first as it did before; both
// with one free slot, whose full claims leave the next step to a claim
// after the plan. With ten free slots, the claims come back short and
// each finish hands the next step off (handoff.go):
// DAGRUN_TEST_POSTGRES=... go test -run '^$' -bench ChainLatency ./storage/postgres
func BenchmarkChainLatency(b *testing.B) {
	for _, bc := range []struct {
		name   string
		forget bool
		limit  int
	}{
		{"planned_from_snapshots", false, 1},
		{"reading_first", true, 1},
		{"handed_off", false, 10},
	} {
		forget := bc.forget
		b.Run(bc.name, func(b *testing.B) {
			s := openBenchStore(b)
			ctx := b.Context()
			steps := 0
			for b.Loop() {
				p := chain4()
				claim := storage.ClaimParams{WorkerID: "w", InstanceID: p.ID, Limit: bc.limit, Lease: time.Minute}
				_, claimed, err := s.CreateAndClaim(ctx, []storage.CreateParams{p}, storagetest.Plan, claim)
				require.NoError(b, err)
				for len(claimed) > 0 {
					if forget {
						s.snapshots = snapshots{}
					}
					_, claimed, err = s.FinishAndClaim(ctx, []storage.StepResult{{Claim: claimed[0].Claim,
						Outcome: storage.OutcomeCompleted, Output: []byte(`{}`)}}, storagetest.Plan, claim)
					require.NoError(b, err)
					steps++
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(steps), "µs/step")
			b.ReportMetric(float64(s.speculated.Load())/float64(steps), "planned/step")
			b.ReportMetric(float64(s.staleSnapshots.Load())/float64(steps), "stale/step")
			if !forget {
				require.Positive(b, s.speculated.Load(), "finishes planned from snapshots")
			} else {
				require.Zero(b, s.speculated.Load(), "finishes planned from snapshots")
			}
		})
	}
}

// BenchmarkClaimThenFinish claims the first step of a started chain, as a
// worker's claim loop does, and finishes it with FinishAndClaim, which
// claims the next: with the snapshot the claim keeps (claimsnapshot.go),
// the finish is one round trip; with it forgotten, the finish reads the
// instance first, in two. Reported per claim and finish:
// DAGRUN_TEST_POSTGRES=... go test -run '^$' -bench ClaimThenFinish ./storage/postgres
func BenchmarkClaimThenFinish(b *testing.B) {
	for _, bc := range []struct {
		name   string
		forget bool
	}{
		{"claim_keeps_snapshot", false},
		{"claim_snapshot_forgotten", true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			s := openBenchStore(b)
			ctx := b.Context()
			for b.Loop() {
				b.StopTimer()
				p := chain4()
				_, err := s.CreateInstances(ctx, nil, []storage.CreateParams{p}, storagetest.Plan)
				require.NoError(b, err)
				claim := storage.ClaimParams{WorkerID: "w", InstanceID: p.ID, Limit: 1, Lease: time.Minute}
				b.StartTimer()
				claimed, err := s.ClaimSteps(ctx, claim)
				require.NoError(b, err)
				require.Len(b, claimed, 1)
				if bc.forget {
					s.snapshots = snapshots{}
				}
				_, next, err := s.FinishAndClaim(ctx, []storage.StepResult{{Claim: claimed[0].Claim,
					Outcome: storage.OutcomeCompleted, Output: []byte(`{}`)}}, storagetest.Plan, claim)
				require.NoError(b, err)
				require.Len(b, next, 1)
			}
			if bc.forget {
				require.Zero(b, s.speculated.Load(), "finishes planned from snapshots")
			} else {
				require.EqualValues(b, b.N, s.speculated.Load(), "finishes planned from the claims' snapshots")
			}
		})
	}
}
