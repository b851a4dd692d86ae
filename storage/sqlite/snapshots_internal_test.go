package sqlite

import (
	"encoding/json"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/storagetest"
)

// TestFinishPlansFromSnapshotsOnlyWhileNothingElseWrote: a finish plans
// from the snapshot its previous finish kept, and from none once another
// connection committed, the store wrote otherwise, or a finish that used
// one rolled back; the instance ends as it would have without them.
func TestFinishPlansFromSnapshotsOnlyWhileNothingElseWrote(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "dagrun.db")
	s, err := Open(ctx, path, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	other, err := Open(ctx, path, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = other.Close() })

	create := func(store *Store, id string) {
		t.Helper()
		_, err := store.CreateInstances(ctx, nil, []storage.CreateParams{{
			ID: id, Workflow: "wf", DefinitionHash: "h", Definition: []byte("x"),
			Steps: []storage.StepSpec{{Name: "a"}, {Name: "b", DependsOn: []string{"a"}}, {Name: "c", DependsOn: []string{"b"}},
				{Name: "d", DependsOn: []string{"c"}}, {Name: "e", DependsOn: []string{"d"}}, {Name: "f", DependsOn: []string{"e"}}},
		}}, storagetest.Plan)
		require.NoError(t, err)
	}
	claim := storage.ClaimParams{Limit: 1, Lease: time.Minute, InstanceID: "i1"}
	finish := func(c storage.ClaimedStep, output string) []storage.ClaimedStep {
		t.Helper()
		res, next, err := s.FinishAndClaim(ctx, []storage.StepResult{{Claim: c.Claim, Outcome: storage.OutcomeCompleted, Output: json.RawMessage(output)}}, storagetest.Plan, claim)
		require.NoError(t, err)
		require.True(t, res[0].Accepted)
		return next
	}
	create(s, "i1")
	first, err := s.ClaimSteps(ctx, claim)
	require.NoError(t, err)
	require.Len(t, first, 1)

	b := finish(first[0], `{"step": "a"}`) // loads the instance, keeps a snapshot
	require.Equal(t, "b", b[0].Step)
	require.Zero(t, s.snaps.used.Load())
	c := finish(b[0], `{"step": "b"}`)
	require.Equal(t, "c", c[0].Step)
	require.Equal(t, int64(1), s.snaps.used.Load(), "the finish of b planned from the snapshot a's finish kept")

	// A finish that rolls back puts nothing back: the snapshot it used is
	// gone, and the finish run again reads the instance.
	refused := errors.New("plan refused")
	_, _, err = s.FinishAndClaim(ctx, []storage.StepResult{{Claim: c[0].Claim, Outcome: storage.OutcomeCompleted, Output: json.RawMessage(`{"step": "c"}`)}},
		func(*storage.InstanceState) (*storage.Plan, error) { return nil, refused }, claim)
	require.ErrorIs(t, err, refused)
	require.Equal(t, int64(2), s.snaps.used.Load(), "the refused finish planned from the snapshot")
	d := finish(c[0], `{"step": "c"}`)
	require.Equal(t, "d", d[0].Step)
	require.Equal(t, int64(2), s.snaps.used.Load(), "after a rollback the instance is read")

	create(other, "i2") // another connection commits
	e := finish(d[0], `{"step": "d"}`)
	require.Equal(t, "e", e[0].Step)
	require.Equal(t, int64(2), s.snaps.used.Load(), "another connection wrote: the instance is read")

	_, err = s.ExtendLeases(ctx, []storage.Claim{e[0].Claim}, time.Minute) // another write of this store
	require.NoError(t, err)
	f := finish(e[0], `{"step": "e"}`)
	require.Equal(t, "f", f[0].Step)
	require.Equal(t, int64(2), s.snaps.used.Load(), "the store wrote otherwise: the instance is read")

	require.Empty(t, finish(f[0], `{"step": "f"}`))
	require.Equal(t, int64(3), s.snaps.used.Load())
	inst, err := s.GetInstance(ctx, "i1")
	require.NoError(t, err)
	require.Equal(t, storage.InstanceCompleted, inst.Status)
	require.JSONEq(t, `{"steps": 6}`, string(inst.Output))
	for _, st := range inst.Steps {
		require.Equal(t, storage.StepCompleted, st.Status, st.Name)
		require.Equal(t, 1, st.Attempts, st.Name)
	}
}

// TestSnapshotsOfAnOvertakenWriteAreDropped: the writer's connection goes
// back to its pool at the commit, before the committed transaction puts
// its snapshots; a write that began meanwhile may have changed what they
// hold, so they are dropped.
func TestSnapshotsOfAnOvertakenWriteAreDropped(t *testing.T) {
	t.Parallel()
	var c snapshotCache
	kept := func(w snapshots) snapshots {
		return snapshots{mark: 7, version: 3, write: w.write, m: map[string]*loaded{"i1": {}}}
	}
	first := c.take()
	second := c.take() // began before the first put
	c.put(kept(first))
	require.Nil(t, c.take().m, "the first write's snapshots were dropped")

	third := c.take()
	c.put(kept(third))
	got := c.take()
	require.Len(t, got.m, 1, "a write no other overtook puts its snapshots")
	require.Equal(t, int64(7), got.mark)
	_ = second
}
