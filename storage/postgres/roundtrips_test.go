package postgres

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/storagetest"
)

// TestFinishRoundTrips: finishing a step and claiming the next in the same
// transaction takes one round trip, planned from the snapshot the claim of
// the step kept (claimsnapshot.go), and so does finishing the step so
// claimed, planned from the snapshot the first finish kept (speculate.go),
// also when the step's instance completes (a top-level instance that
// completes has nothing to follow up). A step whose claim left a sibling
// ready, which another worker could take, gets no snapshot: its finish
// reads the instance first, in two round trips, the COMMIT going with the
// last batch.
func TestFinishRoundTrips(t *testing.T) {
	t.Parallel()
	s, tracer := storeCountingTrips(t)
	ctx := t.Context()

	step := func(name string, deps ...string) storage.StepSpec {
		return storage.StepSpec{Name: name, Handler: "h", Queue: "default", DependsOn: deps, Retry: storage.RetryPolicy{MaxAttempts: 1}}
	}
	create := func(id string, steps ...storage.StepSpec) storage.ClaimParams {
		t.Helper()
		_, err := s.CreateInstances(ctx, nil, []storage.CreateParams{{ID: id, Workflow: "wf", DefinitionHash: "h1",
			Definition: []byte("name: wf\n"), Steps: steps}}, storagetest.Plan)
		require.NoError(t, err)
		return storage.ClaimParams{WorkerID: "w", InstanceID: id, Limit: 1, Lease: time.Minute}
	}
	finish := func(c storage.ClaimedStep, claim storage.ClaimParams) []storage.ClaimedStep {
		t.Helper()
		tracer.trips.Store(0)
		out, next, err := s.FinishAndClaim(ctx, []storage.StepResult{{Claim: c.Claim, Outcome: storage.OutcomeCompleted,
			Output: json.RawMessage(`1`)}}, storagetest.Plan, claim)
		require.NoError(t, err)
		require.True(t, out[0].Accepted)
		return next
	}
	requireCompleted := func(id string) {
		t.Helper()
		in, err := s.GetInstance(ctx, id)
		require.NoError(t, err)
		require.Equal(t, storage.InstanceCompleted, in.Status)
	}

	claim := create("rt-1", step("a"), step("b", "a"))
	claimed, err := s.ClaimSteps(ctx, claim)
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	next := finish(claimed[0], claim)
	require.Len(t, next, 1, "b claimed in the same transaction")
	require.EqualValues(t, 1, tracer.trips.Load(), "finish a and claim b")
	finish(next[0], claim)
	require.EqualValues(t, 1, tracer.trips.Load(), "finish b, completing the instance")
	require.EqualValues(t, 2, s.speculated.Load(), "finishes planned from a snapshot")
	requireCompleted("rt-1")

	claim = create("rt-2", step("a"), step("b"), step("c", "a", "b"))
	claimed, err = s.ClaimSteps(ctx, claim)
	require.NoError(t, err)
	require.Len(t, claimed, 1, "one of a and b claimed, the other left ready")
	next = finish(claimed[0], claim)
	require.EqualValues(t, 2, tracer.trips.Load(), "finish a step whose sibling was left ready, and claim the sibling")
	require.EqualValues(t, 2, s.speculated.Load(), "a finish planned from a snapshot of an instance another worker could change")
	require.Len(t, next, 1)
	last := finish(next[0], claim)
	require.Len(t, last, 1, "c claimed with the sibling's finish")
	finish(last[0], claim)
	requireCompleted("rt-2")
}

// TestStartRoundTrips: a start without an idempotency key is one round
// trip, the COMMIT going with the creating statement (and with the claim
// of a start that claims its first step for a local worker); an ID taken
// already still fails as a conflict, leaving nothing behind.
func TestStartRoundTrips(t *testing.T) {
	t.Parallel()
	s, tracer := storeCountingTrips(t)
	ctx := t.Context()

	instance := func(id, key string) storage.CreateParams {
		return storage.CreateParams{ID: id, Workflow: "wf", DefinitionHash: "h1", Definition: []byte("name: wf\n"), Key: key,
			Steps: []storage.StepSpec{{Name: "a", Handler: "h", Queue: "default", Retry: storage.RetryPolicy{MaxAttempts: 1}}}}
	}
	tracer.trips.Store(0)
	_, err := s.CreateInstances(ctx, nil, []storage.CreateParams{instance("st-1", "")}, storagetest.Plan)
	require.NoError(t, err)
	require.EqualValues(t, 1, tracer.trips.Load(), "a start")

	tracer.trips.Store(0)
	created, claimed, err := s.CreateAndClaim(ctx, []storage.CreateParams{instance("st-2", "")}, storagetest.Plan,
		storage.ClaimParams{WorkerID: "w", Limit: 1, Lease: time.Minute, InstanceID: "st-2"})
	require.NoError(t, err)
	require.Equal(t, []storage.CreateResult{{ID: "st-2"}}, created)
	require.Len(t, claimed, 1)
	require.EqualValues(t, 1, tracer.trips.Load(), "a start that claims its first step")

	tracer.trips.Store(0)
	_, err = s.CreateInstances(ctx, nil, []storage.CreateParams{instance("st-3", "k")}, storagetest.Plan)
	require.NoError(t, err)
	require.EqualValues(t, 3, tracer.trips.Load(), "a start with a key: who owns it, the create, the COMMIT")

	_, err = s.CreateInstances(ctx, nil, []storage.CreateParams{instance("st-4", ""), instance("st-1", "")}, storagetest.Plan)
	require.ErrorIs(t, err, storage.ErrConflict)
	require.ErrorContains(t, err, "already exists")
	_, err = s.GetInstance(ctx, "st-4")
	require.ErrorIs(t, err, storage.ErrNotFound, "the failed start's other instance was not created")
}

// storeCountingTrips opens a store in a schema of its own whose
// connections count their round trips.
func storeCountingTrips(t *testing.T) (*Store, *countingTracer) {
	t.Helper()
	tracer := &countingTracer{}
	cfg := sharedPool(t).Config().Copy()
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	s, err := New(t.Context(), pool, &Config{Schema: newSchema(t)})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	return s, tracer
}
