package postgres

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/storagetest"
)

// stepWrite is an update of a step, as handoffFixture's trigger records it.
type stepWrite struct{ Step, From, To string }

// newHandoffFixture returns a store in a schema of its own (quoted)
// holding instance ho-chain (a, then b) with a claimed, and a row trigger
// that records every later update of a step (see stepWrites).
func newHandoffFixture(t *testing.T) (*Store, string, storage.ClaimedStep) {
	t.Helper()
	ctx := t.Context()
	pool := sharedPool(t)
	schema := newSchema(t)
	s, err := New(ctx, pool, &Config{Schema: schema})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	createChain(t, s, "ho-chain", "a", "b")
	claimed, err := s.ClaimSteps(ctx, storage.ClaimParams{WorkerID: "w", InstanceID: "ho-chain", Limit: 1, Lease: time.Minute})
	require.NoError(t, err)
	require.Len(t, claimed, 1)

	q := pgx.Identifier{schema}.Sanitize()
	_, err = pool.Exec(ctx, `
CREATE TABLE `+q+`.step_writes (n serial, step text, old text, new text);
CREATE FUNCTION `+q+`.record_step_write() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO `+q+`.step_writes (step, old, new) VALUES (NEW.name, OLD.status, NEW.status);
	RETURN NULL;
END $$;
CREATE TRIGGER record_step_write AFTER UPDATE ON `+q+`.steps FOR EACH ROW EXECUTE FUNCTION `+q+`.record_step_write();`)
	require.NoError(t, err)
	return s, q, claimed[0]
}

// createChain creates instance id whose steps run one after another.
func createChain(t *testing.T, s *Store, id string, names ...string) {
	t.Helper()
	createChainAt(t, s, id, 0, names...)
}

// createChainAt is createChain at a priority.
func createChainAt(t *testing.T, s *Store, id string, priority int, names ...string) {
	t.Helper()
	var steps []storage.StepSpec
	for i, name := range names {
		sp := storage.StepSpec{Name: name, Handler: "h", Queue: "default", Retry: storage.RetryPolicy{MaxAttempts: 1}}
		if i > 0 {
			sp.DependsOn = []string{names[i-1]}
		}
		steps = append(steps, sp)
	}
	_, err := s.CreateInstances(t.Context(), nil, []storage.CreateParams{{ID: id, Workflow: "wf", DefinitionHash: "h1",
		Definition: []byte("name: wf\n"), Priority: priority, Steps: steps}}, storagetest.Plan)
	require.NoError(t, err)
}

// stepWrites returns the updates of steps the fixture's trigger recorded.
func stepWrites(t *testing.T, s *Store, q string) []stepWrite {
	t.Helper()
	rows, err := s.pool.Query(t.Context(), `SELECT step, old, new FROM `+q+`.step_writes ORDER BY n`)
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[stepWrite])
	require.NoError(t, err)
	return got
}

// finishA completes the fixture's step a with a claim of one step.
func finishA(t *testing.T, s *Store, a storage.ClaimedStep) ([]storage.ClaimedStep, error) {
	t.Helper()
	_, next, err := s.FinishAndClaim(t.Context(), []storage.StepResult{{Claim: a.Claim, Outcome: storage.OutcomeCompleted,
		Output: json.RawMessage(`1`)}}, storagetest.Plan, storage.ClaimParams{WorkerID: "w", Limit: 1, Lease: time.Minute})
	return next, err
}

// TestHandoffWritesAReadiedStepOnce: a finish whose plan makes a step
// ready that its own claim takes writes that step once, blocked to
// running (also ahead of a ready step of an instance started later); one
// its claim leaves for a ready step of a higher priority is made pending
// (see handoff.go); a claimer whose last finish claimed all it asked for
// applies the plan and then claims, as before the hand-off.
func TestHandoffWritesAReadiedStepOnce(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		younger bool // a step of an instance started later is ready before the finish
		higher  bool // and of a higher priority
		// backlog: the claimer's last finish claimed all it asked for
		backlog bool
		want    []stepWrite
	}{
		{name: "handed off", want: []stepWrite{{"a", "running", "completed"}, {"b", "blocked", "running"}}},
		{name: "ahead of a younger instance", younger: true,
			want: []stepWrite{{"a", "running", "completed"}, {"b", "blocked", "running"}}},
		{name: "a higher priority first", younger: true, higher: true,
			want: []stepWrite{{"a", "running", "completed"}, {"b", "blocked", "pending"}, {"x", "pending", "running"}}},
		{name: "a claimer working off a backlog", backlog: true,
			want: []stepWrite{{"a", "running", "completed"}, {"b", "blocked", "pending"}, {"b", "pending", "running"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, q, a := newHandoffFixture(t)
			if tc.younger {
				priority := 0
				if tc.higher {
					priority = 1
				}
				createChainAt(t, s, "ho-younger", priority, "x")
			}
			if tc.backlog {
				s.claimers.claimed(storage.ClaimParams{WorkerID: "w", Limit: 1}, true, 1)
			}
			next, err := finishA(t, s, a)
			require.NoError(t, err)
			require.Len(t, next, 1)
			require.Equal(t, tc.want[len(tc.want)-1].Step, next[0].Step)
			require.Equal(t, tc.want, stepWrites(t, s, q))
		})
	}
}

// TestHandoffRefusedAtCommit: a hand-off whose commit the database
// refuses leaves nothing of itself. Refused as a serialization failure,
// the store runs the transaction again and that attempt hands the step
// off; refused otherwise, the finish fails, a is still running under its
// claim and b blocked, and the same finish sent again hands b off. A
// deferred constraint trigger refuses the first commit that updates a
// step (a sequence counts the commits, whatever rolls back).
func TestHandoffRefusedAtCommit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, code string
		retried    bool // the store retries it itself
	}{
		{name: "serialization failure", code: "40001", retried: true},
		{name: "refused outright", code: "P0001"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, q, a := newHandoffFixture(t)
			_, err := s.pool.Exec(t.Context(), `
CREATE SEQUENCE `+q+`.commits;
CREATE FUNCTION `+q+`.refuse_first_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF nextval('`+q+`.commits') = 1 THEN
		RAISE EXCEPTION 'commit refused by the test' USING ERRCODE = '`+tc.code+`';
	END IF;
	RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER refuse_first_commit AFTER UPDATE ON `+q+`.steps
	DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION `+q+`.refuse_first_commit();`)
			require.NoError(t, err)

			next, err := finishA(t, s, a)
			if !tc.retried {
				var pe *pgconn.PgError
				require.ErrorAs(t, err, &pe)
				require.Equal(t, tc.code, pe.Code)
				require.Empty(t, stepWrites(t, s, q), "nothing of the refused transaction stays")
				in, getErr := s.GetInstance(t.Context(), "ho-chain")
				require.NoError(t, getErr)
				require.Equal(t, storage.StepRunning, in.Steps[0].Status)
				require.Equal(t, storage.StepBlocked, in.Steps[1].Status)
				next, err = finishA(t, s, a)
			}
			require.NoError(t, err)
			require.Len(t, next, 1)
			require.Equal(t, "b", next[0].Step)
			require.Equal(t, 1, next[0].Attempt)
			require.Equal(t, []stepWrite{{"a", "running", "completed"}, {"b", "blocked", "running"}}, stepWrites(t, s, q))
			var counted int64
			require.NoError(t, s.pool.QueryRow(t.Context(), `SELECT last_value FROM `+q+`.commits`).Scan(&counted))
			require.EqualValues(t, 3, counted, "the refused commit's check, then the two updates of the one that held")

			in, err := s.GetInstance(t.Context(), "ho-chain")
			require.NoError(t, err)
			var history []storage.EventType
			for _, e := range in.Events {
				if e.Step == "b" {
					history = append(history, e.Type)
				}
			}
			require.Equal(t, []storage.EventType{storage.EventStepReady, storage.EventStepStarted}, history,
				"b's history holds one of each, the refused attempt's rolled back")
		})
	}
}
