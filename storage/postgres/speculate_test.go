package postgres

import (
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/storagetest"
)

// statesSeen is storagetest.Plan that keeps every state it was asked
// about, by instance.
type statesSeen struct {
	mu     sync.Mutex
	states map[string][]storage.InstanceState
}

func (r *statesSeen) plan(st *storage.InstanceState) (*storage.Plan, error) {
	cp := *st
	cp.Steps = slices.Clone(st.Steps)
	cp.LoadDefinition = nil
	r.mu.Lock()
	if r.states == nil {
		r.states = map[string][]storage.InstanceState{}
	}
	r.states[st.ID] = append(r.states[st.ID], cp)
	r.mu.Unlock()
	return storagetest.Plan(st)
}

// chain is a four-step chain, a -> b -> c -> d.
func chain() storage.CreateParams {
	return params(spec("a"), spec("b", "a"), spec("c", "b"), spec("d", "c"))
}

// completed is the result of a claimed step completing with an output that
// names it.
func completed(c storage.ClaimedStep) storage.StepResult {
	out, _ := json.Marshal(map[string]string{"done": c.Step})
	return storage.StepResult{Claim: c.Claim, Outcome: storage.OutcomeCompleted, Output: out}
}

// TestSpeculativeFinishSeesWhatAReadWould drives two instances of a
// workflow to the end with the same results: one the way a worker's
// recorder does (FinishAndClaim, which claims the next steps and plans
// from the snapshot its previous transaction or claim kept where it can),
// the other by FinishSteps and ClaimSteps, its claims' snapshots dropped,
// so that every finish reads. Every plan of
// the first must have been asked about the same state as the plan of the
// second at the same point, and the first must have planned from
// snapshots as often as the case says.
func TestSpeculativeFinishSeesWhatAReadWould(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		create func() storage.CreateParams
		limit  int
		// eager starts the first instance with CreateAndClaim, as a start
		// with a local worker does.
		eager bool
		// retry names a step whose first attempt fails and is retried.
		retry string
		// speculated is how many finishes plan from snapshots.
		speculated int64
	}{
		// The first finish plans from its claim's snapshot, the other
		// three from the snapshot their predecessor kept.
		{name: "chain", create: chain, limit: 2, speculated: 4},
		// The start keeps a snapshot of what it created and claimed: every
		// finish plans from one.
		{name: "chain started eagerly", create: chain, limit: 2, eager: true, speculated: 4},
		// a readies b and c and its claim takes b: c could be claimed
		// elsewhere, so a's finish keeps no snapshot; b's claims c, and
		// the finishes of a (from its claim's), c and d plan from
		// snapshots.
		{name: "fan-out one at a time", create: fanOut, limit: 1, speculated: 3},
		// b fails once: its retry is finished the usual way, and its
		// second attempt runs with the error of the first, which its
		// completion clears.
		{name: "retried step", create: fanOut, limit: 2, retry: "b", speculated: 3},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := openTestStore(t, nil)
			ctx := t.Context()
			rec := &statesSeen{}
			first, second := tc.create(), tc.create()
			fast, slow := first.ID, second.ID
			claimOf := func(instance string) storage.ClaimParams {
				return storage.ClaimParams{WorkerID: "w-" + instance, InstanceID: instance, Limit: tc.limit, Lease: time.Minute}
			}
			var (
				claimed []storage.ClaimedStep
				err     error
			)
			if tc.eager {
				_, claimed, err = s.CreateAndClaim(ctx, []storage.CreateParams{first}, rec.plan, claimOf(fast))
				require.NoError(t, err)
				_, err = s.CreateInstances(ctx, nil, []storage.CreateParams{second}, rec.plan)
			} else {
				_, err = s.CreateInstances(ctx, nil, []storage.CreateParams{first, second}, rec.plan)
				require.NoError(t, err)
				claimed, err = s.ClaimSteps(ctx, claimOf(fast))
			}
			require.NoError(t, err)
			resultsOf := func(claimed []storage.ClaimedStep) []storage.StepResult {
				rs := make([]storage.StepResult, len(claimed))
				for i, c := range claimed {
					rs[i] = completed(c)
					if c.Step == tc.retry && c.Attempt == 1 {
						rs[i] = storage.StepResult{Claim: c.Claim, Outcome: storage.OutcomeRetry, Error: "boom"}
					}
				}
				return rs
			}

			for len(claimed) > 0 {
				var out []storage.FinishResult
				out, claimed, err = s.FinishAndClaim(ctx, resultsOf(claimed), rec.plan, claimOf(fast))
				require.NoError(t, err)
				for _, o := range out {
					require.True(t, o.Accepted)
				}
			}
			for {
				claimed, err := s.ClaimSteps(ctx, claimOf(slow))
				require.NoError(t, err)
				if len(claimed) == 0 {
					break
				}
				s.snapshots.mu.Lock()
				delete(s.snapshots.m, slow)
				s.snapshots.mu.Unlock()
				out, err := s.FinishSteps(ctx, resultsOf(claimed), rec.plan)
				require.NoError(t, err)
				for _, o := range out {
					require.True(t, o.Accepted)
				}
			}

			require.Equal(t, tc.speculated, s.speculated.Load(), "finishes planned from snapshots")
			require.Zero(t, s.staleSnapshots.Load())
			fastStates, slowStates := rec.states[fast], rec.states[slow]
			require.Len(t, fastStates, len(slowStates))
			for i := range fastStates {
				fastStates[i].ID = slow
				require.Equal(t, slowStates[i], fastStates[i], "the state of plan %d", i)
			}
			for _, id := range []string{fast, slow} {
				in, err := s.GetInstance(ctx, id)
				require.NoError(t, err)
				require.Equal(t, storage.InstanceCompleted, in.Status)
			}
		})
	}
}

// fanOut is a -> (b, c) -> d.
func fanOut() storage.CreateParams {
	return params(spec("a"), spec("b", "a"), spec("c", "a"), spec("d", "b", "c"))
}

// TestStaleSnapshotFallsBack: when another transaction wrote the instance
// between the transaction that kept its snapshot and the next finish, the
// finish finds out, and records the result as a read would have it.
func TestStaleSnapshotFallsBack(t *testing.T) {
	t.Parallel()
	cases := staleChanges()
	for _, tc := range cases {
		// A settled worker's finish of c would also hand d off in the
		// finishing statement (finishhandoff.go).
		for _, settled := range []bool{false, true} {
			name := tc.name
			if settled {
				name += ", settled worker"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				s := openTestStore(t, nil)
				other := openInSchema(t, s.cfg.Schema, nil)
				if settled {
					f := newEagerFixture(t, "stale-settled")
					s, other = f.s, f.other
				}
				staleFallsBack(t, s, other, settled, tc.change, tc.accepted, tc.cancelled)
			})
		}
	}
}

// staleFallsBack runs a case of TestStaleSnapshotFallsBack on s, other
// changing the instance; with settled, the claim loop of s looks (and
// finds nothing) before the change.
func staleFallsBack(t *testing.T, s, other *Store, settled bool,
	change func(t *testing.T, other *Store, instance string, c storage.ClaimedStep), accepted, cancelled bool) {
	t.Helper()
	ctx := t.Context()
	id, p, claimed := snapshotWithCRunning(t, s)
	if settled {
		_, _, err := s.ClaimStepsAndWake(ctx, p)
		require.NoError(t, err)
	}

	change(t, other, id, claimed[0])
	require.Equal(t, settled, s.settled(p), "the worker is settled")
	attempts := 0
	out, next, err := s.FinishAndClaim(storage.WithAttemptHook(ctx, func() { attempts++ }),
		[]storage.StepResult{completed(claimed[0])}, storagetest.Plan, p)
	require.NoError(t, err)
	require.Equal(t, 2, attempts, "the finish planned from the snapshot, then again the usual way")
	require.Equal(t, storage.FinishResult{Accepted: accepted, Cancelled: cancelled}, out[0])
	require.EqualValues(t, 1, s.staleSnapshots.Load(), "finishes that found their snapshot stale")
	require.EqualValues(t, 2, s.speculated.Load(), "c's finish ran the usual way")
	require.Zero(t, s.finishHandoffs.Load(), "a finish and hand-off from a stale snapshot committed")

	in, err := s.GetInstance(ctx, id)
	require.NoError(t, err)
	if !accepted {
		require.Equal(t, storage.InstanceCancelled, in.Status)
		require.Empty(t, next)
		return
	}
	require.Len(t, next, 1)
	require.Equal(t, "d", next[0].Step)
	var input struct{ Deps map[string]json.RawMessage }
	require.NoError(t, json.Unmarshal(next[0].Input, &input))
	require.JSONEq(t, `{"done":"c"}`, string(input.Deps["c"]), "d's input holds c's output")
}

// snapshotWithCRunning starts a chain in s and runs it to c under a claim
// bound to it: a (planned from its claim's snapshot), then b (planned from
// a's), whose finish keeps a snapshot of the instance with c running. It returns the instance, the
// claim's parameters and c's claim.
func snapshotWithCRunning(t *testing.T, s *Store) (string, storage.ClaimParams, []storage.ClaimedStep) {
	t.Helper()
	ctx := t.Context()
	created, err := s.CreateInstances(ctx, nil, []storage.CreateParams{chain()}, storagetest.Plan)
	require.NoError(t, err)
	id := created[0].ID
	p := storage.ClaimParams{WorkerID: "w", InstanceID: id, Limit: 2, Lease: time.Minute}
	claimed, err := s.ClaimSteps(ctx, p)
	require.NoError(t, err)
	for range 2 {
		require.Len(t, claimed, 1)
		_, claimed, err = s.FinishAndClaim(ctx, []storage.StepResult{completed(claimed[0])}, storagetest.Plan, p)
		require.NoError(t, err)
	}
	require.Len(t, claimed, 1)
	require.Equal(t, "c", claimed[0].Step)
	require.EqualValues(t, 2, s.speculated.Load(), "a's and b's finishes were planned from snapshots")
	return id, p, claimed
}

// TestStaleSnapshotOfARecoveredStepCommitsNothing: a finish planned from
// a snapshot whose step was taken back meanwhile (its lease expired and
// another process recovered it) records nothing, and nothing its plan
// made from the snapshot commits, although the plan, the claim and the
// COMMIT went to the server with the finish: the step runs again, and the
// next step stays blocked.
func TestStaleSnapshotOfARecoveredStepCommitsNothing(t *testing.T) {
	t.Parallel()
	s := openTestStore(t, nil)
	other := openInSchema(t, s.cfg.Schema, nil)
	ctx := t.Context()
	id, p, claimed := snapshotWithCRunning(t, s)

	// c's lease runs out and another process takes the step back.
	lost, err := other.ExtendLeases(ctx, []storage.Claim{claimed[0].Claim}, time.Millisecond)
	require.NoError(t, err)
	require.Empty(t, lost)
	require.Eventually(t, func() bool {
		n, err := other.RecoverExpired(ctx, 10, storagetest.Plan)
		require.NoError(t, err)
		return n == 1
	}, 10*time.Second, 5*time.Millisecond)

	attempts := 0
	out, next, err := s.FinishAndClaim(storage.WithAttemptHook(ctx, func() { attempts++ }),
		[]storage.StepResult{completed(claimed[0])}, storagetest.Plan, p)
	require.NoError(t, err)
	require.Equal(t, 2, attempts, "the finish planned from the snapshot, then again the usual way")
	require.False(t, out[0].Accepted, "a result of a step taken back was recorded")
	require.EqualValues(t, 1, s.staleSnapshots.Load())
	for _, c := range next {
		require.NotEqual(t, "d", c.Step, "d was claimed from the stale plan")
	}
	in, err := s.GetInstance(ctx, id)
	require.NoError(t, err)
	require.Equal(t, storage.InstanceRunning, in.Status)
	statuses := map[string]storage.StepStatus{}
	for _, st := range in.Steps {
		statuses[st.Name] = st.Status
	}
	require.Equal(t, storage.StepBlocked, statuses["d"], "the plan made from the stale snapshot committed")
	require.Contains(t, []storage.StepStatus{storage.StepPending, storage.StepRunning}, statuses["c"], "c runs again")
}

func TestRenderVersionsAsTheServerDoes(t *testing.T) {
	t.Parallel()
	s := openTestStore(t, nil)
	ctx := t.Context()
	created, err := s.CreateInstances(ctx, nil, []storage.CreateParams{chain()}, storagetest.Plan)
	require.NoError(t, err)
	var (
		want  string
		ids   []int64
		xmins []string
		id    int64
		xmin  string
	)
	require.NoError(t, s.pool.QueryRow(ctx, s.q(`SELECT (`+snapshotStepsSQL+`) FROM (SELECT $1::text AS id) v`), created[0].ID).Scan(&want))
	rows, err := s.pool.Query(ctx, s.q(`SELECT id, xmin::text FROM {s}steps WHERE instance_id = $1 ORDER BY position DESC`), created[0].ID)
	require.NoError(t, err)
	for rows.Next() {
		require.NoError(t, rows.Scan(&id, &xmin))
		ids, xmins = append(ids, id), append(xmins, xmin)
	}
	require.NoError(t, rows.Err())
	require.Len(t, ids, 4)
	require.Equal(t, want, renderVersions(ids, xmins))
}

// TestNoSnapshotWhileAnotherWorkerHoldsAStep: a snapshot of an instance in
// which another worker runs a step would go stale when that worker
// finishes it, costing the next finish a failed check: none is kept.
func TestNoSnapshotWhileAnotherWorkerHoldsAStep(t *testing.T) {
	t.Parallel()
	s := openTestStore(t, nil)
	ctx := t.Context()
	created, err := s.CreateInstances(ctx, nil, []storage.CreateParams{
		params(spec("a"), spec("b", "a"), spec("c", "a"), spec("e", "a"), spec("d", "b", "c", "e")),
	}, storagetest.Plan)
	require.NoError(t, err)
	id := created[0].ID
	mine := storage.ClaimParams{WorkerID: "mine", InstanceID: id, Limit: 1, Lease: time.Minute}
	theirs := storage.ClaimParams{WorkerID: "theirs", InstanceID: id, Limit: 1, Lease: time.Minute}

	a, err := s.ClaimSteps(ctx, mine)
	require.NoError(t, err)
	_, b, err := s.FinishAndClaim(ctx, []storage.StepResult{completed(a[0])}, storagetest.Plan, mine)
	require.NoError(t, err)
	// Another process's worker.
	other := openInSchema(t, s.cfg.Schema, nil)
	c, err := other.ClaimSteps(ctx, theirs)
	require.NoError(t, err)
	require.Len(t, c, 1)
	// b's finish claims e while c runs elsewhere.
	_, e, err := s.FinishAndClaim(ctx, []storage.StepResult{completed(b[0])}, storagetest.Plan, mine)
	require.NoError(t, err)
	require.Len(t, e, 1)
	_, err = other.FinishSteps(ctx, []storage.StepResult{completed(c[0])}, storagetest.Plan)
	require.NoError(t, err)

	requireReadFinish(t, s, e[0], mine, "d")
}

// requireReadFinish finishes step with a FinishAndClaim of p that must
// claim next, and requires that it read the instance: it planned from no
// snapshot, and found none stale.
func requireReadFinish(t *testing.T, s *Store, step storage.ClaimedStep, p storage.ClaimParams, next string) {
	t.Helper()
	speculated, stale := s.speculated.Load(), s.staleSnapshots.Load()
	out, claimed, err := s.FinishAndClaim(t.Context(), []storage.StepResult{completed(step)}, storagetest.Plan, p)
	require.NoError(t, err)
	require.True(t, out[0].Accepted)
	require.Len(t, claimed, 1)
	require.Equal(t, next, claimed[0].Step)
	require.Equal(t, stale, s.staleSnapshots.Load(), "the finish found its snapshot stale")
	require.Equal(t, speculated, s.speculated.Load(), "the finish was planned from a snapshot")
}

// TestNoSnapshotOfAStartWithAStepLeftReady: a start whose eager claim left
// a ready step to other workers keeps no snapshot, which that step's claim
// elsewhere would make stale.
func TestNoSnapshotOfAStartWithAStepLeftReady(t *testing.T) {
	t.Parallel()
	s := openTestStore(t, nil)
	ctx := t.Context()
	p := params(spec("a"), spec("b"), spec("c", "a", "b"))
	mine := storage.ClaimParams{WorkerID: "mine", InstanceID: p.ID, Limit: 1, Lease: time.Minute}
	_, a, err := s.CreateAndClaim(ctx, []storage.CreateParams{p}, storagetest.Plan, mine)
	require.NoError(t, err)
	require.Len(t, a, 1)
	// Another process's worker.
	other := openInSchema(t, s.cfg.Schema, nil)
	b, err := other.ClaimSteps(ctx, storage.ClaimParams{WorkerID: "theirs", InstanceID: p.ID, Limit: 1, Lease: time.Minute})
	require.NoError(t, err)
	require.Len(t, b, 1)
	_, err = other.FinishSteps(ctx, []storage.StepResult{completed(b[0])}, storagetest.Plan)
	require.NoError(t, err)

	requireReadFinish(t, s, a[0], mine, "c")
}

// TestOwnRenewalKeepsSnapshot: the lease renewals of the worker that kept a
// snapshot (its heartbeat) change only the lease, and the snapshot takes
// their new versions: the next finish still plans from it.
func TestOwnRenewalKeepsSnapshot(t *testing.T) {
	t.Parallel()
	s := openTestStore(t, nil)
	ctx := t.Context()
	p := chain()
	claim := storage.ClaimParams{WorkerID: "w", InstanceID: p.ID, Limit: 1, Lease: time.Minute}
	_, a, err := s.CreateAndClaim(ctx, []storage.CreateParams{p}, storagetest.Plan, claim)
	require.NoError(t, err)
	require.Len(t, a, 1)
	for range 2 { // renewed twice: the second renewal finds the first's version
		lost, err := s.ExtendLeases(ctx, []storage.Claim{a[0].Claim}, time.Hour)
		require.NoError(t, err)
		require.Empty(t, lost)
	}
	out, b, err := s.FinishAndClaim(ctx, []storage.StepResult{completed(a[0])}, storagetest.Plan, claim)
	require.NoError(t, err)
	require.True(t, out[0].Accepted)
	require.Len(t, b, 1)
	require.Zero(t, s.staleSnapshots.Load(), "finishes that found their snapshot stale")
	require.EqualValues(t, 1, s.speculated.Load(), "finishes planned from snapshots")
}

// TestSnapshotsStayBounded: a store keeps at most maxSnapshots snapshots,
// the expired ones going first, the rest when that is not enough.
func TestSnapshotsStayBounded(t *testing.T) {
	t.Parallel()
	kept := func(id string, taken time.Time) *snapshot {
		return &snapshot{loaded: &loaded{state: storage.InstanceState{ID: id}}, taken: taken}
	}
	var c snapshots
	old := time.Now().Add(-2 * snapshotTTL)
	for i := range maxSnapshots {
		taken := time.Now()
		if i%2 == 0 {
			taken = old
		}
		c.put([]*snapshot{kept(fmt.Sprint("i", i), taken)})
	}
	require.Len(t, c.m, maxSnapshots)
	c.put([]*snapshot{kept("new", time.Now())})
	require.Len(t, c.m, maxSnapshots/2+1, "the expired half went")
	require.Contains(t, c.m, "new")
	require.Contains(t, c.m, "i1")

	for i := range maxSnapshots / 2 {
		c.put([]*snapshot{kept(fmt.Sprint("j", i), time.Now())})
	}
	require.Len(t, c.m, 1, "none had expired: all went")
	require.Contains(t, c.m, fmt.Sprint("j", maxSnapshots/2-1))
}

// staleChange is a change another process makes to an instance whose step
// c runs under claim c, making a snapshot of it stale, and what the finish
// of c must answer after it.
type staleChange struct {
	name                string
	change              func(t *testing.T, other *Store, instance string, c storage.ClaimedStep)
	accepted, cancelled bool
}

// staleChanges are the changes TestStaleSnapshotFallsBack and
// TestClaimSnapshotGoesStale make.
func staleChanges() []staleChange {
	return []staleChange{
		{
			name: "cancelled",
			change: func(t *testing.T, other *Store, instance string, _ storage.ClaimedStep) {
				require.NoError(t, other.CancelInstance(t.Context(), instance, "by test", storagetest.Plan))
			},
			cancelled: true,
		},
		{
			name: "signalled",
			change: func(t *testing.T, other *Store, instance string, _ storage.ClaimedStep) {
				_, err := other.SendSignal(t.Context(), storage.SignalParams{InstanceID: instance, Name: "later",
					Payload: json.RawMessage(`1`)}, storagetest.Plan)
				require.NoError(t, err)
			},
			accepted: true,
		},
		{
			name: "lease renewed",
			change: func(t *testing.T, other *Store, _ string, c storage.ClaimedStep) {
				lost, err := other.ExtendLeases(t.Context(), []storage.Claim{c.Claim}, time.Hour)
				require.NoError(t, err)
				require.Empty(t, lost)
			},
			accepted: true,
		},
	}
}
