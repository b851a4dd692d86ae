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
// transaction takes two round trips, the COMMIT going with the last batch;
// finishing the step so claimed takes one, planned from the snapshot the
// first finish kept (see speculate.go), also when the step's instance
// completes (a top-level instance that completes has nothing to follow
// up).
func TestFinishRoundTrips(t *testing.T) {
	t.Parallel()
	s, tracer := storeCountingTrips(t)
	ctx := t.Context()

	step := func(name string, deps ...string) storage.StepSpec {
		return storage.StepSpec{Name: name, Handler: "h", Queue: "default", DependsOn: deps, Retry: storage.RetryPolicy{MaxAttempts: 1}}
	}
	_, err := s.CreateInstances(ctx, nil, []storage.CreateParams{{ID: "rt-1", Workflow: "wf", DefinitionHash: "h1",
		Definition: []byte("name: wf\n"), Steps: []storage.StepSpec{step("a"), step("b", "a")}}}, storagetest.Plan)
	require.NoError(t, err)
	claim := storage.ClaimParams{WorkerID: "w", Limit: 1, Lease: time.Minute}
	claimed, err := s.ClaimSteps(ctx, claim)
	require.NoError(t, err)
	require.Len(t, claimed, 1)

	finish := func(c storage.ClaimedStep) []storage.ClaimedStep {
		t.Helper()
		tracer.trips.Store(0)
		out, next, err := s.FinishAndClaim(ctx, []storage.StepResult{{Claim: c.Claim, Outcome: storage.OutcomeCompleted,
			Output: json.RawMessage(`1`)}}, storagetest.Plan, claim)
		require.NoError(t, err)
		require.True(t, out[0].Accepted)
		return next
	}
	next := finish(claimed[0])
	require.Len(t, next, 1, "b claimed in the same transaction")
	require.EqualValues(t, 2, tracer.trips.Load(), "finish a and claim b")
	finish(next[0])
	require.EqualValues(t, 1, tracer.trips.Load(), "finish b, completing the instance")
	require.EqualValues(t, 1, s.speculated.Load(), "finishes planned from a snapshot")
	in, err := s.GetInstance(ctx, "rt-1")
	require.NoError(t, err)
	require.Equal(t, storage.InstanceCompleted, in.Status)
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
