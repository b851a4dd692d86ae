package postgres

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/storagetest"
)

// TestFinishHandoffWritesWhatTwoStatementsWrite: a settled worker's finish
// planned from a snapshot, which readies one step, writes the finish and
// the hand-off in one statement (finishhandoff.go), and leaves the same
// steps, history and claims as a worker whose store has no listener, which
// writes them in two; a readied step the claim may not take (its queue has
// a limit) is made pending by that statement, and claimed later.
func TestFinishHandoffWritesWhatTwoStatementsWrite(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		limited bool // d's queue has a concurrency limit
		// speculated: the finishes planned from snapshots
		speculated int64
		claimed    []string
	}{
		{name: "chain", speculated: 4,
			claimed: []string{"b attempt 1 fence 1", "c attempt 1 fence 1", "d attempt 1 fence 1", "(none)"}},
		{name: "a readied step the claim may not take", limited: true, speculated: 4,
			claimed: []string{"b attempt 1 fence 1", "c attempt 1 fence 1", "(none)", "d attempt 1 fence 1 (claim loop)", "(none)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			settled := newEagerFixture(t, "finish-handoff")
			got := runChain(t, settled, tc.limited)
			// a and d, claimed by the claim loop, are finished from its
			// snapshots (claimsnapshot.go) as b and c are from the finishes'.
			require.EqualValues(t, 3, settled.s.finishHandoffs.Load(), "finishes of a, b and c handed off in one statement")

			deaf := &eagerFixture{worker: newWorker(t, "finish-handoff-deaf", nil)}
			want := runChain(t, deaf, tc.limited)
			require.Zero(t, deaf.s.finishHandoffs.Load(), "a worker that is not settled finished and handed off in one statement")
			require.Equal(t, tc.speculated, deaf.s.speculated.Load(), "finishes planned from snapshots")
			require.Equal(t, tc.speculated, settled.s.speculated.Load(), "finishes planned from snapshots")

			require.Equal(t, want, got)
			require.Equal(t, tc.claimed, got.claimed)
			require.Contains(t, got.events, `step.completed c 1 ""`)
		})
	}
}

// chainOutcome is what a run of runChain left: each finish's claims, the
// instance's events, and its steps' rows.
type chainOutcome struct {
	claimed []string
	events  []string
	steps   []string
}

// runChain runs an instance of steps a, b, c, d, each after the one
// before, on f's worker: its claim loop claims a, and each finish claims
// up to two (coming back short, as an idle worker's does), the claim loop
// taking any step a finish left ready.
func runChain(t *testing.T, f *eagerFixture, limited bool) chainOutcome {
	t.Helper()
	ctx := t.Context()
	d := spec("d", "c")
	if limited {
		d.Queue = "limited"
		five := 5
		_, err := f.s.SetQueueLimit(ctx, storage.QueueLimitChange{Queue: "limited", Concurrency: &five})
		require.NoError(t, err)
	}
	p := params(spec("a"), spec("b", "a"), spec("c", "b"), d)
	_, err := f.s.CreateInstances(ctx, nil, []storage.CreateParams{p}, storagetest.Plan)
	require.NoError(t, err)
	steps := f.look(3)
	require.Len(t, steps, 1)

	var out chainOutcome
	for step, n := steps[0], 0; n < 4; n++ {
		results, claimed, err := f.s.FinishAndClaim(ctx, []storage.StepResult{{Claim: step.Claim, Outcome: storage.OutcomeCompleted,
			Output: json.RawMessage(fmt.Sprintf(`{"step": %q}`, step.Step))}}, storagetest.Plan,
			storage.ClaimParams{WorkerID: "w", Limit: 2, Lease: time.Minute})
		require.NoError(t, err)
		require.True(t, results[0].Accepted, "finish of %s", step.Step)
		// The claim loop looks after every commit it hears of, as a
		// worker's does, and takes what the finish left ready.
		looked := f.look(3)
		require.False(t, len(claimed) > 0 && len(looked) > 0, "both the finish and the claim loop claimed")
		switch {
		case len(claimed) == 1:
			out.claimed = append(out.claimed, describeClaim(claimed[0]))
			step = claimed[0]
		case len(looked) == 1:
			out.claimed = append(out.claimed, "(none)", describeClaim(looked[0])+" (claim loop)")
			step = looked[0]
		default:
			out.claimed = append(out.claimed, "(none)")
		}
	}

	in, err := f.s.GetInstance(ctx, p.ID)
	require.NoError(t, err)
	require.Equal(t, storage.InstanceCompleted, in.Status)
	events, err := f.s.ListEvents(ctx, storage.EventsParams{InstanceID: p.ID})
	require.NoError(t, err)
	for _, e := range events {
		out.events = append(out.events, fmt.Sprintf("%s %s %d %q", e.Type, e.Step, e.Attempt, e.Message))
	}
	rows, err := f.s.pool.Query(ctx, f.s.q(`SELECT format('%s %s attempts %s fence %s output %s error %L worker %L key %L promoted %s', name,
		status, attempts, fence, output, error, worker_id, concurrency_key, promoted)
		|| CASE WHEN lease_until IS NULL THEN '' ELSE ' leased' END
		|| CASE WHEN started_at IS NULL THEN '' ELSE ' started' END
		|| CASE WHEN first_started_at IS NULL THEN '' ELSE ' first-started' END
		|| CASE WHEN ready_at IS NULL THEN '' ELSE ' ready' END
		|| CASE WHEN finished_at IS NULL THEN '' ELSE ' finished' END
		|| CASE WHEN deadline IS NULL THEN '' ELSE ' deadline' END
		|| CASE WHEN run_after IS NULL THEN '' ELSE ' due' END
		FROM {s}steps WHERE instance_id = $1 ORDER BY position`), p.ID)
	require.NoError(t, err)
	out.steps, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return out
}

// describeClaim is a claimed step as chainOutcome lists it.
func describeClaim(c storage.ClaimedStep) string {
	return fmt.Sprintf("%s attempt %d fence %d", c.Step, c.Attempt, c.Fence)
}
