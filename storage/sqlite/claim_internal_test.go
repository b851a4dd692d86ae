package sqlite

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/storagetest"
)

func explain(t *testing.T, s *Store, q string, args ...any) string {
	t.Helper()
	rows, err := s.w.QueryContext(t.Context(), `EXPLAIN QUERY PLAN `+q, args...)
	require.NoError(t, err)
	var lines []string
	for rows.Next() {
		var id, parent, unused int
		var detail string
		require.NoError(t, rows.Scan(&id, &parent, &unused, &detail))
		lines = append(lines, detail)
	}
	require.NoError(t, rows.Err())
	return strings.Join(lines, "\n")
}

// TestClaimUsesPartialIndex checks that every claim shape finds its steps
// through an index, never by scanning the steps table, on a file holding
// many finished steps and statistics that show it.
func TestClaimUsesPartialIndex(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "dagrun.db"), nil)
	require.NoError(t, err)
	defer s.Close()

	plan := func(st *storage.InstanceState) (*storage.Plan, error) {
		p := &storage.Plan{}
		for _, step := range st.Steps {
			p.Steps = append(p.Steps, storage.StepChange{Name: step.Name, Status: storage.StepPending})
		}
		return p, nil
	}
	var ps []storage.CreateParams
	for i := range 300 {
		ps = append(ps, storage.CreateParams{
			ID: fmt.Sprintf("i%05d", i), Workflow: "wf", DefinitionHash: "h", Definition: []byte("x"),
			Steps: []storage.StepSpec{{Name: "a", Queue: "q"}, {Name: "b", Queue: "r"}},
		})
	}
	_, err = s.CreateInstances(ctx, nil, ps, plan)
	require.NoError(t, err)
	claimed, err := s.ClaimSteps(ctx, storage.ClaimParams{Limit: 590, Lease: time.Minute})
	require.NoError(t, err)
	var rs []storage.StepResult
	for _, c := range claimed {
		rs = append(rs, storage.StepResult{Claim: c.Claim, Outcome: storage.OutcomeCompleted})
	}
	_, err = s.FinishSteps(ctx, rs, func(*storage.InstanceState) (*storage.Plan, error) { return nil, nil })
	require.NoError(t, err)
	_, err = s.w.ExecContext(ctx, `ANALYZE`)
	require.NoError(t, err)

	for shape, q := range claimQueries() {
		args := []any{0, 0, "w", 1, nil, nil, nil}
		switch shape.queues {
		case 1:
			args[4] = "q"
		case 2:
			args[4] = `["q","r"]`
		}
		if shape.byInstance {
			args[5] = "i00001"
		}
		if shape.byHandler {
			args[6] = `["h1","h2"]`
		}
		args = shape.trim(args)
		plan := explain(t, s, q, args...)
		lines := strings.Split(plan, "\n")
		t.Logf("shape %v:\n%s", shape, plan)
		for _, l := range lines {
			if strings.HasPrefix(l, "SCAN steps") || strings.HasPrefix(l, "SEARCH steps") {
				require.Contains(t, l, " USING ", "shape %v reads steps without an index:\n%s", shape, plan)
			}
		}
		switch {
		case shape.picked:
			// pickByHandler chose the steps: each is taken by its id.
			require.Contains(t, plan, "USING INTEGER PRIMARY KEY", "shape %v", shape)
			require.NotContains(t, plan, "steps_ready", "shape %v", shape)
			continue
		case shape.byInstance:
			require.Regexp(t, `steps_instance|steps_ready`, plan, "shape %v", shape)
		case shape.queues == 1:
			require.Contains(t, plan, "steps_ready_queue", "shape %v", shape)
		default:
			require.Contains(t, plan, "steps_ready", "shape %v", shape)
		}
		if !shape.byInstance {
			// The handler is in the index too: picking reads no table row.
			require.Contains(t, plan, "COVERING INDEX steps_ready", "shape %v", shape)
		}
	}
}

// TestClaimLooksAheadPastOtherHandlers: with ready steps of another
// handler ahead of a claimer's own, the store's look ahead finds them and
// its claims read their handlers' heads (pickByHandler), taking the first
// of their own steps in claim order; a claim of the other handler walks.
func TestClaimLooksAheadPastOtherHandlers(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "dagrun.db"), nil)
	require.NoError(t, err)
	defer s.Close()
	var ps []storage.CreateParams
	for i := range 60 {
		handler := "theirs"
		if i >= 50 {
			handler = "mine"
		}
		ps = append(ps, storage.CreateParams{ID: fmt.Sprintf("i%05d", i), Workflow: "wf", DefinitionHash: "h", Definition: []byte("x"),
			Steps: []storage.StepSpec{{Name: "a", Handler: handler, Queue: "q"}}})
	}
	_, err = s.CreateInstances(ctx, nil, ps, func(st *storage.InstanceState) (*storage.Plan, error) {
		return &storage.Plan{Steps: []storage.StepChange{{Name: "a", Status: storage.StepPending}}}, nil
	})
	require.NoError(t, err)

	claim := func(p storage.ClaimParams) []string {
		t.Helper()
		got, err := s.ClaimSteps(ctx, p)
		require.NoError(t, err)
		var ids []string
		for _, c := range got {
			ids = append(ids, c.InstanceID)
		}
		return ids
	}
	mine := storage.ClaimParams{WorkerID: "w", Limit: 3, Lease: time.Minute, Handlers: []string{"mine", "none"}}
	require.Equal(t, []string{"i00050", "i00051", "i00052"}, claim(mine))
	require.True(t, s.heads.Heads(mine), "the look found the other handler's steps ahead")
	require.Equal(t, []string{"i00053", "i00054", "i00055"}, claim(mine))
	require.EqualValues(t, 2, s.headClaims.Load(), "both claims read their handlers' heads")

	theirs := storage.ClaimParams{WorkerID: "w", Limit: 3, Lease: time.Minute, Handlers: []string{"theirs"}}
	require.Equal(t, []string{"i00000", "i00001", "i00002"}, claim(theirs))
	require.False(t, s.heads.Heads(theirs))
	require.EqualValues(t, 2, s.headClaims.Load(), "a claim whose own steps come first walks")
}

// TestPickByHandlerReadsIndexes checks that a claim's look at the steps
// ahead of its own and its reads of its handlers' heads read indexes in
// claim order, never the table, and that each head is read through
// steps_ready_handler (see pickByHandler).
func TestPickByHandlerReadsIndexes(t *testing.T) {
	t.Parallel()
	s, err := Open(t.Context(), filepath.Join(t.TempDir(), "dagrun.db"), nil)
	require.NoError(t, err)
	defer s.Close()
	for _, c := range []struct {
		name    string
		queries map[claimShape]string
		handler any
		index   string
	}{
		{"served head", servedHeadQueries(), `["h1","h2"]`, "COVERING INDEX steps_ready"},
		{"handler head", handlerHeadQueries(), "h1", "INDEX steps_ready_handler"},
	} {
		for shape, q := range c.queries {
			args := []any{0, 0, "w", 10, nil, nil, c.handler}
			switch shape.queues {
			case 1:
				args[4] = "q"
			case 2:
				args[4] = `["q","r"]`
			}
			plan := explain(t, s, q, args...)
			require.Contains(t, plan, c.index, "%s %v:\n%s", c.name, shape, plan)
			require.NotContains(t, plan, "USE TEMP B-TREE FOR ORDER BY", "%s %v:\n%s", c.name, shape, plan)
			for _, l := range strings.Split(plan, "\n") {
				if strings.HasPrefix(l, "SCAN steps") || strings.HasPrefix(l, "SEARCH steps") {
					require.Contains(t, l, " USING ", "%s %v reads steps without an index:\n%s", c.name, shape, plan)
				}
			}
		}
	}
}

// TestPromoteReadsDelayedIndex checks that moving due steps into the claim
// indexes reads only the index of delayed steps, never the ready ones nor
// the table.
func TestPromoteReadsDelayedIndex(t *testing.T) {
	t.Parallel()
	s, err := Open(t.Context(), filepath.Join(t.TempDir(), "dagrun.db"), nil)
	require.NoError(t, err)
	defer s.Close()
	plan := explain(t, s, dueSQL, 0)
	t.Log(plan)
	require.Contains(t, plan, "steps_delayed")
	require.NotContains(t, plan, "SCAN steps\n")
	require.NotContains(t, plan, "steps_ready")
	require.Contains(t, explain(t, s, promoteSQL, 0), "USING INTEGER PRIMARY KEY", "each due step is promoted by its id")
}

// TestReadyStepsReadIndexes checks that the figures' ready counts (Stats,
// unserved handlers) read the indexes of pending steps, never the table.
func TestReadyStepsReadIndexes(t *testing.T) {
	t.Parallel()
	s, err := Open(t.Context(), filepath.Join(t.TempDir(), "dagrun.db"), nil)
	require.NoError(t, err)
	defer s.Close()
	for _, q := range []string{`SELECT workflow, queue, count(*) FROM ` + readySteps + ` GROUP BY workflow, queue`, unservedSQL} {
		plan := explain(t, s, q, 0, 0)
		t.Log(plan)
		for _, l := range strings.Split(plan, "\n") {
			if strings.HasPrefix(l, "SCAN steps") || strings.HasPrefix(l, "SEARCH steps") {
				require.Contains(t, l, " USING ", "reads steps without an index:\n%s", plan)
			}
		}
		require.Contains(t, plan, "steps_ready")
		require.Contains(t, plan, "steps_delayed")
		require.Contains(t, plan, "steps_capped_pending")
	}
}

// TestScheduledStepsReadDelayedIndex checks that Queues' count of the
// steps not due yet reads the index of delayed steps, never the table.
func TestScheduledStepsReadDelayedIndex(t *testing.T) {
	t.Parallel()
	s, err := Open(t.Context(), filepath.Join(t.TempDir(), "dagrun.db"), nil)
	require.NoError(t, err)
	defer s.Close()
	plan := explain(t, s, scheduledSQL, 0)
	t.Log(plan)
	require.Contains(t, plan, "steps_delayed")
	for _, l := range strings.Split(plan, "\n") {
		if strings.HasPrefix(l, "SCAN steps") || strings.HasPrefix(l, "SEARCH steps") {
			require.Contains(t, l, " USING ", "reads steps without an index:\n%s", plan)
		}
	}
}

// fillFinishedHistory inserts n finished instances with 4 completed steps
// each, then analyzes the file: the history a busy store's statements must
// not walk.
func fillFinishedHistory(t testing.TB, s *Store, n int) {
	t.Helper()
	_, err := s.w.ExecContext(t.Context(), `INSERT OR IGNORE INTO definitions (hash, workflow, source) VALUES ('h', 'wf', 'x');
		WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < ?1)
		INSERT INTO instances (id, workflow, definition_hash, status, run_after, created_at, started_at, finished_at)
		SELECT printf('old-%08d', i), 'wf', 'h', 'completed', i, i, i, i + 1 FROM c;
		WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < ?1), p(p) AS (VALUES (0), (1), (2), (3))
		INSERT INTO steps (instance_id, position, name, handler, queue, workflow, priority, status, max_attempts,
			run_after, ready_at, started_at, finished_at)
		SELECT printf('old-%08d', i), p, 's' || p, 'h', 'default', 'wf', 0, 'completed', 1, i, i, i, i + 1 FROM c, p;
		ANALYZE`, n, n) // each statement takes its own arguments
	require.NoError(t, err)
}

// TestQueuesReadIndexes checks that Queues' counts of ready, held and
// running steps read the indexes of unfinished steps, never the table's
// finished history. The items' indexes serve only the lookup of a capped
// step's running items by parent_id.
func TestQueuesReadIndexes(t *testing.T) {
	t.Parallel()
	s, err := Open(t.Context(), filepath.Join(t.TempDir(), "dagrun.db"), nil)
	require.NoError(t, err)
	defer s.Close()
	fillFinishedHistory(t, s, 5000)
	plan := explain(t, s, queueLoadsSQL, 0)
	t.Log(plan)
	// Every table the statement reads is steps, under one alias or another.
	read := regexp.MustCompile(`^(SCAN|SEARCH) \w+`)
	for _, l := range strings.Split(plan, "\n") {
		if !read.MatchString(l) {
			continue
		}
		require.Contains(t, l, " USING ", "reads steps without an index:\n%s", plan)
		if strings.Contains(l, "steps_items") {
			require.Regexp(t, `^SEARCH \w+ USING (COVERING )?INDEX steps_items\w* \(parent_id=`, l, "reads items beyond one step's:\n%s", plan)
			continue
		}
		require.Regexp(t, ` INDEX (steps_ready|steps_ready_queue|steps_delayed|steps_capped_pending|steps_running_lease)\b`, l,
			"reads an index of finished steps too:\n%s", plan)
	}
	for _, index := range []string{"steps_ready_queue", "steps_delayed", "steps_capped_pending", "steps_running_lease"} {
		require.Contains(t, plan, index)
	}
}

// BenchmarkQueues measures Queues with 200,000 finished steps in the
// file: go test -run '^$' -bench Queues ./storage/sqlite
func BenchmarkQueues(b *testing.B) {
	storagetest.BenchmarkQueues(b, func(b *testing.B) storage.Store {
		s, err := Open(b.Context(), filepath.Join(b.TempDir(), "dagrun.db"), nil)
		require.NoError(b, err)
		b.Cleanup(func() { require.NoError(b, s.Close()) })
		return s
	}, func(b *testing.B, s storage.Store, n int) { fillFinishedHistory(b, s.(*Store), n) })
}

// TestGroupCompleteLooksUpByRowID checks that a group commit finds each
// step by its primary key rather than scanning.
func TestGroupCompleteLooksUpByRowID(t *testing.T) {
	t.Parallel()
	s, err := Open(t.Context(), filepath.Join(t.TempDir(), "dagrun.db"), nil)
	require.NoError(t, err)
	defer s.Close()
	plan := explain(t, s, completeManyQuery, 0, `[[1,1,null]]`)
	t.Log(plan)
	require.Contains(t, plan, "SEARCH steps USING INTEGER PRIMARY KEY")
}
