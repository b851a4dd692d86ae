package postgres

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/storagetest"
)

// TestClaimSnapshotGoesStale: a snapshot a claim kept is checked like any
// other. When another process wrote the instance between the claim and the
// finish of its step, the finish finds out, runs again the usual way, and
// answers as a read would have it.
func TestClaimSnapshotGoesStale(t *testing.T) {
	t.Parallel()
	for _, tc := range staleChanges() {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := openTestStore(t, nil)
			other := openInSchema(t, s.cfg.Schema, nil)
			ctx := t.Context()
			created, err := s.CreateInstances(ctx, nil, []storage.CreateParams{chain()}, storagetest.Plan)
			require.NoError(t, err)
			id := created[0].ID
			p := storage.ClaimParams{WorkerID: "w", InstanceID: id, Limit: 1, Lease: time.Minute}
			a, err := s.ClaimSteps(ctx, p)
			require.NoError(t, err)
			require.Len(t, a, 1)
			require.Contains(t, s.snapshots.m, id, "the claim kept a snapshot")

			tc.change(t, other, id, a[0])
			attempts := 0
			out, next, err := s.FinishAndClaim(storage.WithAttemptHook(ctx, func() { attempts++ }),
				[]storage.StepResult{completed(a[0])}, storagetest.Plan, p)
			require.NoError(t, err)
			require.Equal(t, 2, attempts, "the finish planned from the claim's snapshot, then again the usual way")
			require.Equal(t, storage.FinishResult{Accepted: tc.accepted, Cancelled: tc.cancelled}, out[0])
			require.EqualValues(t, 1, s.staleSnapshots.Load(), "finishes that found their snapshot stale")
			require.Zero(t, s.speculated.Load(), "a finish planned from a stale snapshot committed")
			if tc.accepted {
				require.Len(t, next, 1)
				require.Equal(t, "b", next[0].Step)
			} else {
				require.Empty(t, next)
			}
		})
	}
}

// TestClaimKeepsSnapshotsOnlyOfWhatItAloneChanges: a claim keeps a
// snapshot of an instance whose every unfinished step is blocked or was
// taken by it, and of no other: one with a step left ready (which another
// worker may take), with a step running elsewhere, or with a signal
// waiting would change before the finish, failing its check.
func TestClaimKeepsSnapshotsOnlyOfWhatItAloneChanges(t *testing.T) {
	t.Parallel()
	s := openTestStore(t, nil)
	other := openInSchema(t, s.cfg.Schema, nil)
	ctx := t.Context()
	claimOf := func(worker, instance string, limit int) storage.ClaimParams {
		return storage.ClaimParams{WorkerID: worker, InstanceID: instance, Limit: limit, Lease: time.Minute}
	}
	create := func(p storage.CreateParams) string {
		t.Helper()
		created, err := s.CreateInstances(ctx, nil, []storage.CreateParams{p}, storagetest.Plan)
		require.NoError(t, err)
		return created[0].ID
	}
	claim := func(s *Store, p storage.ClaimParams, want int) {
		t.Helper()
		claimed, err := s.ClaimSteps(ctx, p)
		require.NoError(t, err)
		require.Len(t, claimed, want)
	}
	fanIn := func() storage.CreateParams { return params(spec("a"), spec("b"), spec("c", "a", "b")) }

	both := create(fanIn())
	claim(s, claimOf("w", both, 2), 2)
	require.Contains(t, s.snapshots.m, both, "a and b both claimed")

	leftReady := create(fanIn())
	claim(s, claimOf("w", leftReady, 1), 1)
	require.NotContains(t, s.snapshots.m, leftReady, "one of a and b left ready")

	elsewhere := create(fanIn())
	claim(other, claimOf("theirs", elsewhere, 1), 1)
	claim(s, claimOf("w", elsewhere, 1), 1)
	require.NotContains(t, s.snapshots.m, elsewhere, "the other of a and b runs elsewhere")

	signalled := create(chain())
	_, err := other.SendSignal(ctx, storage.SignalParams{InstanceID: signalled, Name: "later"}, storagetest.Plan)
	require.NoError(t, err)
	claim(s, claimOf("w", signalled, 1), 1)
	require.NotContains(t, s.snapshots.m, signalled, "a signal waits")
}

// TestFinishKeepsSnapshotsOfTheInstancesItsClaimStarts: the eager claim of
// a finish working off a backlog takes steps of instances its plans did
// not touch, and keeps snapshots of them too: their finish plans from
// one, in one round trip.
func TestFinishKeepsSnapshotsOfTheInstancesItsClaimStarts(t *testing.T) {
	t.Parallel()
	s, tracer := storeCountingTrips(t)
	ctx := t.Context()
	first, second := params(spec("a")), params(spec("a"), spec("b", "a"))
	_, err := s.CreateInstances(ctx, nil, []storage.CreateParams{first, second}, storagetest.Plan)
	require.NoError(t, err)
	p := storage.ClaimParams{WorkerID: "w", Limit: 1, Lease: time.Minute}
	claimed, err := s.ClaimSteps(ctx, p)
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	require.Equal(t, first.ID, claimed[0].InstanceID)
	s.snapshots.mu.Lock()
	clear(s.snapshots.m)
	s.snapshots.mu.Unlock()

	// The finish of the first instance's only step reads it, and claims
	// the second's first step.
	_, next, err := s.FinishAndClaim(ctx, []storage.StepResult{completed(claimed[0])}, storagetest.Plan, p)
	require.NoError(t, err)
	require.Len(t, next, 1)
	require.Equal(t, second.ID, next[0].InstanceID)
	require.Zero(t, s.speculated.Load())
	require.Contains(t, s.snapshots.m, second.ID)

	tracer.trips.Store(0)
	out, next, err := s.FinishAndClaim(ctx, []storage.StepResult{completed(next[0])}, storagetest.Plan, p)
	require.NoError(t, err)
	require.True(t, out[0].Accepted)
	require.Len(t, next, 1)
	require.Equal(t, "b", next[0].Step)
	require.EqualValues(t, 1, tracer.trips.Load(), "the finish of a step an eager claim took")
	require.EqualValues(t, 1, s.speculated.Load(), "finishes planned from snapshots")
	require.Zero(t, s.staleSnapshots.Load())
}

// TestNoClaimSnapshotAfterFollowUps: when follow-ups ran after the tail
// of a finish (here the parent of the child instance it completed, whose
// workflow step settles), they could have written, at the transaction's
// own row versions, an instance the tail's claim read, which no check of
// versions would tell: the claim keeps no snapshot then.
func TestNoClaimSnapshotAfterFollowUps(t *testing.T) {
	t.Parallel()
	s := openTestStore(t, nil)
	ctx := t.Context()
	// call starts a child instance whose one step is leaf.
	withChild := func(st *storage.InstanceState) (*storage.Plan, error) {
		p, err := storagetest.Plan(st)
		if err != nil || p == nil {
			return p, err
		}
		for i, c := range p.Steps {
			if c.Name == "call" && c.Status == storage.StepPending {
				child := params(spec("leaf"))
				child.Workflow, child.DefinitionHash, child.Definition = "child", "hash-child", []byte("name: child\n")
				child.Depth = st.Depth + 1
				p.Steps[i] = storage.StepChange{Name: c.Name, Status: storage.StepRunning, Input: c.Input,
					Children: []storage.CreateParams{child}}
			}
		}
		return p, nil
	}
	call := spec("call")
	call.Workflow = "child"
	parent := params(call)
	_, err := s.CreateInstances(ctx, nil, []storage.CreateParams{parent}, withChild)
	require.NoError(t, err)
	in, err := s.GetInstance(ctx, parent.ID)
	require.NoError(t, err)
	require.Len(t, in.Steps[0].Children, 1)
	child := in.Steps[0].Children[0]
	other := params(spec("x"))
	_, err = s.CreateInstances(ctx, nil, []storage.CreateParams{other}, storagetest.Plan)
	require.NoError(t, err)

	leaf, err := s.ClaimSteps(ctx, storage.ClaimParams{WorkerID: "w", InstanceID: child, Limit: 1, Lease: time.Minute})
	require.NoError(t, err)
	require.Len(t, leaf, 1)
	out, next, err := s.FinishAndClaim(ctx, []storage.StepResult{completed(leaf[0])}, withChild,
		storage.ClaimParams{WorkerID: "w", Limit: 1, Lease: time.Minute})
	require.NoError(t, err)
	require.True(t, out[0].Accepted)
	require.Len(t, next, 1)
	require.Equal(t, other.ID, next[0].InstanceID, "the finish's claim took x")
	in, err = s.GetInstance(ctx, parent.ID)
	require.NoError(t, err)
	require.Equal(t, storage.InstanceCompleted, in.Status, "the follow-up settled the parent")
	require.NotContains(t, s.snapshots.m, other.ID, "a snapshot read before follow-ups")
}
