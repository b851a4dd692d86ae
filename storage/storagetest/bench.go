package storagetest

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
)

// Benchmark runs the hot-path benchmarks against a backend: claiming
// ready steps, and finishing attempts with the downstream step made ready
// in the same transaction. Run them with -benchmem; each op is one step.
func Benchmark(b *testing.B, newStore func(b *testing.B) storage.Store) {
	b.Run("Claim", func(b *testing.B) { benchClaim(b, newStore(b)) })
	b.Run("CompleteAndUnblock", func(b *testing.B) { benchComplete(b, newStore(b), 0) })
	b.Run("CompleteWithLogs", func(b *testing.B) { benchComplete(b, newStore(b), 1) })
	b.Run("ClaimPastUnserved", func(b *testing.B) { benchClaimPastUnserved(b, newStore(b)) })
	b.Run("ClaimPastFuture", func(b *testing.B) { benchClaimPastFuture(b, newStore(b)) })
	b.Run("ClaimOfQueues", func(b *testing.B) { benchClaimOfQueues(b, newStore(b)) })
	b.Run("NextWakePastFuture", func(b *testing.B) { benchNextWakePastFuture(b, newStore(b)) })
	b.Run("NextWakePastOthers", func(b *testing.B) { benchNextWakePastOthers(b, newStore(b)) })
	b.Run("NextWakePastHeld", func(b *testing.B) { benchNextWakePastHeld(b, newStore(b)) })
	b.Run("StartDeferredPastHeld", func(b *testing.B) { benchStartDeferredPastHeld(b, newStore(b)) })
	b.Run("StartDeferredPastFuture", func(b *testing.B) { benchStartDeferredPastFuture(b, newStore(b)) })
	b.Run("Transition", func(b *testing.B) { benchTransition(b, newStore(b)) })
}

// benchBatch is how many steps one claim or one group commit carries, as a
// worker at its default concurrency would.
const benchBatch = 100

func benchInstances(b *testing.B, s storage.Store, n int, steps ...storage.StepSpec) {
	b.Helper()
	if len(steps) == 0 {
		steps = []storage.StepSpec{spec("s1"), spec("s2", "s1")}
	}
	createBatched(b, s, n, func() storage.CreateParams { return params(steps...) })
}

// createBatched creates n instances made by next, a thousand a call.
func createBatched(b *testing.B, s storage.Store, n int, next func() storage.CreateParams) {
	b.Helper()
	for done := 0; done < n; done += 1000 {
		ps := make([]storage.CreateParams, min(1000, n-done))
		for i := range ps {
			ps[i] = next()
		}
		_, err := s.CreateInstances(b.Context(), nil, ps, Plan)
		require.NoError(b, err)
	}
}

// benchClaimParams claims as a worker of the stock binary would: naming
// its handlers, about ten, the benchmark steps' among them.
func benchClaimParams() storage.ClaimParams {
	return storage.ClaimParams{WorkerID: "bench", Limit: benchBatch, Lease: time.Minute, Handlers: []string{
		"echo", "fail", "h.s1", "h.s2", "http", "noop", "orders.charge", "orders.notify", "orders.ship", "orders.validate", "sleep",
	}}
}

// benchClaim measures claiming ready steps, benchBatch per call.
func benchClaim(b *testing.B, s storage.Store) { benchClaimWith(b, s, benchClaimParams()) }

// benchClaimWith measures claims of p, each op a step: b.N ready steps
// (and a claim's worth more) are created first.
func benchClaimWith(b *testing.B, s storage.Store, p storage.ClaimParams) {
	benchInstances(b, s, b.N+benchBatch)
	b.ReportAllocs()
	b.ResetTimer()
	for claimed := 0; claimed < b.N; {
		got, err := s.ClaimSteps(b.Context(), p)
		require.NoError(b, err)
		require.NotEmpty(b, got)
		claimed += len(got)
	}
}

// unservedBacklog is how many ready steps of a handler the claimer lacks
// wait ahead of its own in ClaimPastUnserved.
const unservedBacklog = 10000

// benchClaimPastUnserved measures claiming as benchClaim does, with
// unservedBacklog older ready steps of a handler the claimer lacks ahead of
// its own in claim order (a binary not deployed yet): every claim walks
// past them.
func benchClaimPastUnserved(b *testing.B, s storage.Store) {
	theirs := spec("s1")
	theirs.Handler = "h.theirs"
	benchInstances(b, s, unservedBacklog, theirs)
	benchClaim(b, s)
}

// queuedBacklog is how many ready steps wait in ClaimOfQueues beyond those
// the benchmark claims.
const queuedBacklog = 20_000

// benchClaimOfQueues measures claiming as a worker of two queues does
// (--queues), with queuedBacklog more ready steps of its own queue
// waiting than the benchmark claims: a claim must read the first of them,
// not all.
func benchClaimOfQueues(b *testing.B, s storage.Store) {
	benchInstances(b, s, queuedBacklog)
	p := benchClaimParams()
	p.Queues = []string{"q.other", "q.s1"}
	benchClaimWith(b, s, p)
}

// futureBacklog is how many steps that cannot run yet sit in the store in
// ClaimPastFuture: the scale the claim must not notice.
const futureBacklog = 200_000

// benchClaimPastFuture measures claiming as benchClaim does, with
// futureBacklog instances beside the claimable ones that no claim may take
// yet, each at a higher priority than theirs: a delayed first step (run
// after an hour) followed by a blocked one, so half a delayed step and
// half a blocked one per instance. A claim must not walk past them.
func benchClaimPastFuture(b *testing.B, s storage.Store) {
	createFutureBacklog(b, s)
	benchClaim(b, s)
}

// benchNextWakePastFuture measures what an idle worker reads at each claim
// that comes back short: when the next step falls due, with the
// futureBacklog of ClaimPastFuture delayed. The worker read it once while
// the store was empty, as one started with its database does.
func benchNextWakePastFuture(b *testing.B, s storage.Store) {
	_, err := s.NextWake(b.Context(), benchClaimParams())
	require.NoError(b, err)
	createFutureBacklog(b, s)
	benchNextWake(b, s)
}

// benchNextWakePastOthers measures NextWake as NextWakePastFuture does,
// with the delayed steps of the backlog all of a handler the worker lacks
// (another binary's, or another queue's for a worker of one queue): the
// worker's own next step, due after all of them, is not what it may wake
// for first.
func benchNextWakePastOthers(b *testing.B, s storage.Store) {
	benchNextWakeBeside(b, s, func() {
		theirs := spec("s1")
		theirs.Handler = "h.theirs"
		createFutureBacklog(b, s, theirs, spec("s2", "s1"))
	})
}

// benchNextWakePastHeld measures NextWake as NextWakePastFuture does,
// beside a heldBacklog: instances a full workflow concurrency key holds,
// which wait for a finish of their key, not a time.
func benchNextWakePastHeld(b *testing.B, s storage.Store) {
	benchNextWakeBeside(b, s, func() { createHeldBacklog(b, s) })
}

// benchNextWakeBeside measures NextWake as NextWakePastFuture does, once
// fill has added what the worker's own delayed step, due after it all,
// sits beside.
func benchNextWakeBeside(b *testing.B, s storage.Store, fill func()) {
	_, err := s.NextWake(b.Context(), benchClaimParams())
	require.NoError(b, err)
	fill()
	mine := params(spec("s1"))
	mine.RunAfter = time.Now().Add(2 * time.Hour)
	_, err = s.CreateInstances(b.Context(), nil, []storage.CreateParams{mine}, Plan)
	require.NoError(b, err)
	benchNextWake(b, s)
}

// benchStartDeferredPastHeld measures the sweep every idle worker runs
// when it wakes (StartDeferred) beside a heldBacklog, none of which it
// may start.
func benchStartDeferredPastHeld(b *testing.B, s storage.Store) {
	_, err := s.StartDeferred(b.Context(), 100, Plan)
	require.NoError(b, err)
	createHeldBacklog(b, s)
	benchStartDeferred(b, s)
}

// benchStartDeferredPastFuture measures the sweep as StartDeferredPastHeld
// does, with the futureBacklog of ClaimPastFuture delayed: unfinished
// instances, none deferred.
func benchStartDeferredPastFuture(b *testing.B, s storage.Store) {
	_, err := s.StartDeferred(b.Context(), 100, Plan)
	require.NoError(b, err)
	createFutureBacklog(b, s)
	benchStartDeferred(b, s)
}

// benchStartDeferred measures StartDeferred as a worker runs it, with no
// instance in the store it may start.
func benchStartDeferred(b *testing.B, s storage.Store) {
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		n, err := s.StartDeferred(b.Context(), 100, Plan)
		require.NoError(b, err)
		require.Zero(b, n, "started an instance that may not start")
	}
}

// heldBacklog is how many instances a full workflow concurrency key holds
// in NextWakePastHeld and StartDeferredPastHeld.
const heldBacklog = 5_000

// createHeldBacklog creates an instance of key "a" (limit 1) whose first
// step runs a handler, then heldBacklog more of the key, which it holds.
// Their first steps wait for a signal, so each is started by the sweep
// once admitted (as are those of a first workflow step).
func createHeldBacklog(b *testing.B, s storage.Store) {
	b.Helper()
	_, err := s.CreateInstances(b.Context(), nil, []storage.CreateParams{limitedBy(params(spec("s1")), "a", 1)}, Plan)
	require.NoError(b, err)
	createBatched(b, s, heldBacklog, func() storage.CreateParams {
		return limitedBy(params(waitSpec("await-go", "go", 0)), "a", 1)
	})
}

// benchNextWake measures NextWake as a worker of benchClaimParams asks
// it, with a delayed step of its own in the store.
func benchNextWake(b *testing.B, s storage.Store) {
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		next, err := s.NextWake(b.Context(), benchClaimParams())
		require.NoError(b, err)
		require.False(b, next.IsZero(), "no wake for the worker's delayed step")
	}
}

// createFutureBacklog creates the futureBacklog instances of
// ClaimPastFuture, of steps (s1 and s2 after it by default).
func createFutureBacklog(b *testing.B, s storage.Store, steps ...storage.StepSpec) {
	b.Helper()
	if len(steps) == 0 {
		steps = []storage.StepSpec{spec("s1"), spec("s2", "s1")}
	}
	createBatched(b, s, futureBacklog, func() storage.CreateParams {
		p := params(steps...)
		p.Priority = 10
		p.RunAfter = time.Now().Add(time.Hour)
		return p
	})
}

// benchComplete measures completing claimed first steps, benchBatch per
// group commit, each making its instance's second step ready, each result
// carrying logs records its attempt logged (what step logs cost the store).
func benchComplete(b *testing.B, s storage.Store, logs int) {
	benchInstances(b, s, b.N+benchBatch)
	var claimed []storage.ClaimedStep
	for len(claimed) < b.N {
		got, err := s.ClaimSteps(b.Context(), storage.ClaimParams{WorkerID: "bench", Limit: 1000, Queues: []string{"q.s1"}, Lease: time.Hour})
		require.NoError(b, err)
		require.NotEmpty(b, got)
		claimed = append(claimed, got...)
	}
	output := json.RawMessage(`{"ok":true}`)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i += benchBatch {
		batch := claimed[i:min(i+benchBatch, b.N)]
		results := make([]storage.StepResult, len(batch))
		for j, c := range batch {
			results[j] = storage.StepResult{Claim: c.Claim, Outcome: storage.OutcomeCompleted, Output: output}
			for range logs {
				results[j].Logs = append(results[j].Logs, storage.LogRecord{
					StepID: c.StepID, InstanceID: c.InstanceID, Step: c.Step, Item: c.Item, Attempt: c.Attempt, Time: time.Now(),
					Level: "INFO", Message: "charged the card", Attrs: json.RawMessage(`{"amount":42}`),
				})
			}
		}
		res, err := s.FinishSteps(b.Context(), results, Plan)
		require.NoError(b, err)
		for _, r := range res {
			if !r.Accepted {
				b.Fatalf("result of step %d rejected", batch[0].StepID)
			}
		}
	}
}

// transitionChain is how many steps each instance of Transition chains.
const transitionChain = 8

// benchTransition measures one transition at a time, as an idle worker
// runs a chain: finish a step and, in the same call, claim the step it
// made ready (FinishAndClaim, or FinishSteps then ClaimSteps for a store
// without it). Each op is one step of a chain of transitionChain steps,
// the last completing its instance; the next instance is created and its
// first step claimed with the timer stopped, so that one instance at a
// time is in the store's queue, as on an idle worker.
func benchTransition(b *testing.B, s storage.Store) {
	steps := []storage.StepSpec{spec("s1")}
	for i := 2; i <= transitionChain; i++ {
		steps = append(steps, spec(fmt.Sprintf("s%d", i), fmt.Sprintf("s%d", i-1)))
	}
	claim := storage.ClaimParams{WorkerID: "bench", Limit: 1, Lease: time.Minute}
	start := func() storage.ClaimedStep {
		b.StopTimer()
		defer b.StartTimer()
		benchInstances(b, s, 1, steps...)
		got, err := s.ClaimSteps(b.Context(), claim)
		require.NoError(b, err)
		require.Len(b, got, 1)
		return got[0]
	}
	fc, eager := s.(storage.FinishClaimer)
	output := json.RawMessage(`{"ok":true}`)
	b.ReportAllocs()
	b.ResetTimer()
	step := start()
	for i := 0; i < b.N; i++ {
		result := []storage.StepResult{{Claim: step.Claim, Outcome: storage.OutcomeCompleted, Output: output}}
		var got []storage.ClaimedStep
		var err error
		if eager {
			_, got, err = fc.FinishAndClaim(b.Context(), result, Plan, claim)
		} else if _, err = s.FinishSteps(b.Context(), result, Plan); err == nil {
			got, err = s.ClaimSteps(b.Context(), claim)
		}
		require.NoError(b, err)
		switch {
		case i == b.N-1:
		case len(got) == 0:
			step = start() // the chain ended
		default:
			step = got[0]
		}
	}
}

// benchItems is the item count of BenchmarkItems' forEach step: the
// engine's default limit.
const benchItems = 10_000

// BenchmarkItems measures a forEach step of benchItems items: Expand
// creates an instance whose step expands at once (one op, one instance),
// and Run claims and completes every item of one, benchBatch per claim and
// per group commit, the last commit completing the step with the array of
// the outputs (one op, one instance). Both report items/s.
func BenchmarkItems(b *testing.B, newStore func(b *testing.B) storage.Store) {
	b.Run("Expand", func(b *testing.B) {
		s := newStore(b)
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			_, err := s.CreateInstances(b.Context(), nil, []storage.CreateParams{itemsParams(benchItems, eachSpec("each"))}, ItemsPlan)
			require.NoError(b, err)
		}
		b.ReportMetric(float64(benchItems*b.N)/b.Elapsed().Seconds(), "items/s")
	})
	for _, capped := range []int{0, 3} {
		name := "Run"
		if capped > 0 {
			// Capped items are claimed a cap's worth at a time: a claim
			// must cost the same however many wait behind the cap.
			name = fmt.Sprintf("RunCapped%d", capped)
		}
		b.Run(name, func(b *testing.B) { benchmarkItemsRun(b, newStore, capped) })
	}
}

// benchmarkItemsRun claims and finishes benchItems items of one step,
// at most capped running at once (0: no cap).
func benchmarkItemsRun(b *testing.B, newStore func(b *testing.B) storage.Store, capped int) {
	s := newStore(b)
	output := json.RawMessage(`{"ok":true}`)
	each := eachSpec("each")
	each.ItemConcurrency = capped
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		p := itemsParams(benchItems, each)
		_, err := s.CreateInstances(b.Context(), nil, []storage.CreateParams{p}, ItemsPlan)
		require.NoError(b, err)
		b.StartTimer()
		claim := storage.ClaimParams{WorkerID: "bench", Limit: benchBatch, Lease: time.Minute}
		for done := 0; done < benchItems; {
			got, err := s.ClaimSteps(b.Context(), claim)
			require.NoError(b, err)
			require.NotEmpty(b, got)
			results := make([]storage.StepResult, len(got))
			for j, c := range got {
				results[j] = storage.StepResult{Claim: c.Claim, Outcome: storage.OutcomeCompleted, Output: output}
			}
			_, err = s.FinishSteps(b.Context(), results, ItemsPlan)
			require.NoError(b, err)
			done += len(got)
		}
	}
	b.ReportMetric(float64(benchItems*b.N)/b.Elapsed().Seconds(), "items/s")
}

// HistoryFiller appends n events to instance id's history the fastest way
// a backend has (a benchmark's setup, not something the store offers).
type HistoryFiller func(b *testing.B, s storage.Store, id string, n int)

// BenchmarkGetInstance measures GetInstance of a two-step instance whose
// history holds 10 events and 100,000: the read must cost the same
// whatever the history's length.
func BenchmarkGetInstance(b *testing.B, newStore func(b *testing.B) storage.Store, fill HistoryFiller) {
	for _, n := range []int{10, 100_000} {
		b.Run(fmt.Sprintf("events=%d", n), func(b *testing.B) {
			s := newStore(b)
			id := historyInstance(b, s, fill, n)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				in, err := s.GetInstance(b.Context(), id)
				require.NoError(b, err)
				require.Len(b, in.Steps, 2)
			}
		})
	}
}

// historyInstance creates a two-step instance and fills its history up to
// n events.
func historyInstance(b *testing.B, s storage.Store, fill HistoryFiller, n int) string {
	b.Helper()
	p := params(spec("a"), spec("b", "a"))
	_, err := s.CreateInstances(b.Context(), nil, []storage.CreateParams{p}, Plan)
	require.NoError(b, err)
	in, err := s.GetInstance(b.Context(), p.ID)
	require.NoError(b, err)
	fill(b, s, p.ID, n-len(in.Events))
	return p.ID
}

// BenchmarkFollowPoll measures what a follower of an instance reads when
// nothing happened since its last look (a FollowEvents call with the
// cursor of the previous one), with 10 events in the history and with
// 100,000: it must cost the same.
func BenchmarkFollowPoll(b *testing.B, newStore func(b *testing.B) storage.Store, fill HistoryFiller) {
	for _, n := range []int{10, 100_000} {
		b.Run(fmt.Sprintf("events=%d", n), func(b *testing.B) {
			s := newStore(b)
			id := historyInstance(b, s, fill, n)
			_, cursor, err := s.FollowEvents(b.Context(), id, "")
			require.NoError(b, err)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				events, next, err := s.FollowEvents(b.Context(), id, cursor)
				require.NoError(b, err)
				require.Empty(b, events)
				cursor = next
			}
		})
	}
}

// FinishedFiller adds n finished instances of four completed steps each
// the fastest way a backend has (a benchmark's setup, not something the
// store offers).
type FinishedFiller func(b *testing.B, s storage.Store, n int)

// BenchmarkQueues measures Queues (what dagrun queues and the web UI's
// Queues page read) with 200,000 finished steps and a few ready and
// running ones: the read must cost the same whatever the history's
// length.
func BenchmarkQueues(b *testing.B, newStore func(b *testing.B) storage.Store, fill FinishedFiller) {
	s := newStore(b)
	fill(b, s, 50_000)
	ps := make([]storage.CreateParams, 20)
	for i := range ps {
		ps[i] = params(spec("a"))
	}
	_, err := s.CreateInstances(b.Context(), nil, ps, Plan)
	require.NoError(b, err)
	claimed, err := s.ClaimSteps(b.Context(), storage.ClaimParams{WorkerID: "w", Limit: 5, Lease: time.Hour})
	require.NoError(b, err)
	require.Len(b, claimed, 5)
	b.ResetTimer()
	for range b.N {
		qs, err := s.Queues(b.Context())
		require.NoError(b, err)
		require.Len(b, qs, 1)
		require.Equal(b, 15, qs[0].Ready)
		require.Equal(b, 5, qs[0].Running)
	}
}
