package postgres

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/storagetest"
)

// TestHandoffWritesAReadiedStepOnce: a finish whose plan makes a step
// ready that its own claim takes writes that step once, blocked to
// running; one its claim leaves for an older ready step is made pending
// (see handoff.go); a claimer whose last finish claimed all it asked for
// applies the plan and then claims, as before the hand-off. A row trigger
// the test adds records every update of a step.
func TestHandoffWritesAReadiedStepOnce(t *testing.T) {
	t.Parallel()
	type write struct{ Step, From, To string }
	for _, tc := range []struct {
		name  string
		older bool // a step of another instance is ready before the finish
		// backlog: the claimer's last finish claimed all it asked for
		backlog bool
		want    []write
	}{
		{name: "handed off", want: []write{{"a", "running", "completed"}, {"b", "blocked", "running"}}},
		{name: "an older step first", older: true,
			want: []write{{"a", "running", "completed"}, {"b", "blocked", "pending"}, {"x", "pending", "running"}}},
		{name: "a claimer working off a backlog", backlog: true,
			want: []write{{"a", "running", "completed"}, {"b", "blocked", "pending"}, {"b", "pending", "running"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			pool := sharedPool(t)
			schema := newSchema(t)
			s, err := New(ctx, pool, &Config{Schema: schema})
			require.NoError(t, err)
			t.Cleanup(func() { require.NoError(t, s.Close()) })

			step := func(name string, deps ...string) storage.StepSpec {
				return storage.StepSpec{Name: name, Handler: "h", Queue: "default", DependsOn: deps, Retry: storage.RetryPolicy{MaxAttempts: 1}}
			}
			create := func(id string, steps ...storage.StepSpec) {
				t.Helper()
				_, err := s.CreateInstances(ctx, nil, []storage.CreateParams{{ID: id, Workflow: "wf", DefinitionHash: "h1",
					Definition: []byte("name: wf\n"), Steps: steps}}, storagetest.Plan)
				require.NoError(t, err)
			}
			create("ho-chain", step("a"), step("b", "a"))
			claimed, err := s.ClaimSteps(ctx, storage.ClaimParams{WorkerID: "w", InstanceID: "ho-chain", Limit: 1, Lease: time.Minute})
			require.NoError(t, err)
			require.Len(t, claimed, 1)
			if tc.older {
				create("ho-older", step("x"))
			}

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

			claim := storage.ClaimParams{WorkerID: "w", Limit: 1, Lease: time.Minute}
			if tc.backlog {
				s.claimers.claimed(claim, true, claim.Limit)
			}
			_, next, err := s.FinishAndClaim(ctx, []storage.StepResult{{Claim: claimed[0].Claim, Outcome: storage.OutcomeCompleted,
				Output: json.RawMessage(`1`)}}, storagetest.Plan, claim)
			require.NoError(t, err)
			require.Len(t, next, 1)
			require.Equal(t, tc.want[len(tc.want)-1].Step, next[0].Step)

			rows, err := pool.Query(ctx, `SELECT step, old, new FROM `+q+`.step_writes ORDER BY n`)
			require.NoError(t, err)
			got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[write])
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}
