package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/mattn/go-sqlite3"
	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/storagetest"
)

// TestStatementsStayPrepared: the store's statements are prepared once per
// connection, not at each call. SQLite prepares a statement anew at each
// run when its plan read the value of a bound parameter (a LIMIT ?, an
// equality an ORDER BY relies on, as col = ? ORDER BY the index's next
// column): binding the parameter again expires it. Preparing a statement
// that writes steps compiles every trigger of the table (about a
// millisecond); a serve --worker of forEach, wait and child workflows
// prepared five such statements per instance. Such parameters are
// written as expressions (+?1, CAST(?2 AS INTEGER)), which SQLite does not
// plan around.
//
// A workload of every kind of call runs twice; then no statement the
// driver keeps prepared on any connection may have been prepared again.
// The driver does not tell its statements' counts, so they are read from
// its cache by reflection: a change of the driver's fields fails here.
func TestStatementsStayPrepared(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "dagrun.db"), nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })

	for round := range 2 {
		preparedWorkload(t, s, round)
	}
	var reprepared []string
	for _, db := range []*sql.DB{s.w, s.r} {
		for _, st := range cachedStatements(t, db) {
			if st.repreps > 0 {
				reprepared = append(reprepared, fmt.Sprintf("%d× %s", st.repreps, strings.Join(strings.Fields(st.sql), " ")))
			}
		}
	}
	require.Empty(t, reprepared, "statements prepared again at a call")
}

// preparedWorkload makes every kind of call the engine makes on a store.
func preparedWorkload(t *testing.T, s *Store, round int) {
	t.Helper()
	ctx := t.Context()
	plan := storagetest.ItemsPlan
	step := func(name, queue string, deps ...string) storage.StepSpec {
		return storage.StepSpec{Name: name, Handler: "h." + name, Queue: queue, DependsOn: deps,
			Retry: storage.RetryPolicy{MaxAttempts: 2, Backoff: time.Millisecond}, Timeout: time.Minute}
	}
	each := step("each", "q.each", "a")
	each.ForEach = true
	wait := storage.StepSpec{Name: "w", Queue: "default", Wait: &storage.WaitSpec{Signal: "go", Timeout: time.Millisecond}}
	var ids []string
	for i := range 3 {
		p := storage.CreateParams{ID: fmt.Sprintf("i-%d-%d", round, i), Workflow: "wf", DefinitionHash: "h1",
			Definition: []byte("name: wf\n"), Input: json.RawMessage(`{"items": [1, 2, 3]}`), Priority: i,
			Steps: []storage.StepSpec{step("a", "q.a"), each, wait, step("z", "q.z", "each")}}
		if i == 2 {
			p.RunAfter = time.Now().Add(-time.Second)
		}
		_, err := s.CreateInstances(ctx, nil, []storage.CreateParams{p}, plan)
		require.NoError(t, err)
		ids = append(ids, p.ID)
	}
	_, _, err := s.CreateAndClaim(ctx, []storage.CreateParams{{ID: fmt.Sprintf("e-%d", round), Workflow: "wf", DefinitionHash: "h1",
		Definition: []byte("name: wf\n"), Steps: []storage.StepSpec{step("a", "q.a")}}}, plan,
		storage.ClaimParams{WorkerID: "w1", Limit: 4, Lease: time.Minute})
	require.NoError(t, err)
	_, err = s.SetQueueLimit(ctx, storage.SetAll(storage.QueueLimit{Queue: "q.z", Concurrency: 1 + round, Rate: 100, Per: time.Second}))
	require.NoError(t, err)

	claim := func(p storage.ClaimParams) []storage.ClaimedStep {
		t.Helper()
		p.WorkerID, p.Lease = "w1", time.Minute
		if p.Limit == 0 {
			p.Limit = 2 + round
		}
		got, err := s.ClaimSteps(ctx, p)
		require.NoError(t, err)
		return got
	}
	finish := func(claimed []storage.ClaimedStep, outcome storage.Outcome) {
		t.Helper()
		var rs []storage.StepResult
		for _, c := range claimed {
			rs = append(rs, storage.StepResult{Claim: c.Claim, Outcome: outcome, Output: json.RawMessage(`1`), Error: "boom"})
		}
		if len(rs) > 0 {
			_, _, err := s.FinishAndClaim(ctx, rs, plan, storage.ClaimParams{WorkerID: "w1", Limit: len(rs), Lease: time.Minute})
			require.NoError(t, err)
		}
	}
	for range 4 {
		finish(claim(storage.ClaimParams{Queues: []string{"q.a"}}), storage.OutcomeCompleted)
		finish(claim(storage.ClaimParams{Queues: []string{"q.each", "q.z"}, Handlers: []string{"h.each", "h.z"}}), storage.OutcomeCompleted)
		finish(claim(storage.ClaimParams{InstanceID: ids[0]}), storage.OutcomeFailed)
		got, _, err := s.ClaimStepsAndWake(ctx, storage.ClaimParams{WorkerID: "w1", Limit: 3, Lease: time.Minute})
		require.NoError(t, err)
		lost, err := s.ExtendLeases(ctx, claimsOf(got), time.Minute)
		require.NoError(t, err)
		require.Empty(t, lost)
		require.NoError(t, s.ReleaseSteps(ctx, claimsOf(got)))
	}
	_, err = s.NextWake(ctx, storage.ClaimParams{WorkerID: "w1", Limit: 3})
	require.NoError(t, err)
	for _, sweep := range []func(context.Context, int, storage.PlanFunc) (int, error){
		s.ExpireWaits, s.StartDeferred, s.RecoverExpired, s.ExpireInstances,
	} {
		_, err := sweep(ctx, 10+round, plan)
		require.NoError(t, err)
	}
	_, err = s.SendSignal(ctx, storage.SignalParams{InstanceID: ids[1], Name: "go", ID: fmt.Sprint("sig-", round), Payload: json.RawMessage(`1`)}, plan)
	if err != nil {
		require.ErrorIs(t, err, storage.ErrConflict)
	}
	require.NoError(t, s.AppendLogs(ctx, nil, []storage.LogRecord{{InstanceID: ids[0], Step: "a", Item: -1, Attempt: 1, Level: "INFO", Message: "m"}}))

	for _, id := range ids {
		_, err := s.GetInstance(ctx, id)
		require.NoError(t, err)
		_, err = s.ListEvents(ctx, storage.EventsParams{InstanceID: id, Limit: 5 + round})
		require.NoError(t, err)
		_, _, err = s.FollowEvents(ctx, id, "")
		require.NoError(t, err)
		_, err = s.ListItems(ctx, storage.ItemsParams{InstanceID: id, Step: "each", Offset: round, Limit: 2 + round})
		require.NoError(t, err)
		_, err = s.ListLogs(ctx, storage.LogsParams{InstanceID: id, Limit: 5 + round})
		require.NoError(t, err)
	}
	_, err = s.ListInstances(ctx, storage.ListParams{Workflow: "wf", Limit: 2 + round})
	require.NoError(t, err)
	_, err = s.ListInstances(ctx, storage.ListParams{Status: storage.InstanceRunning, Limit: 2 + round, Parent: ids[0]})
	require.NoError(t, err)
	_, err = s.MatchInstances(ctx, storage.InstanceFilter{Workflow: "wf", Limit: 2 + round})
	require.NoError(t, err)
	_, err = s.Stats(ctx)
	require.NoError(t, err)
	_, err = s.Queues(ctx)
	require.NoError(t, err)
	require.NoError(t, s.CancelInstance(ctx, ids[2], "by test", plan))
	require.NoError(t, s.RetryInstance(ctx, ids[2], plan))
	_, err = s.Prune(ctx, time.Now().Add(time.Hour), true)
	require.NoError(t, err)
}

func claimsOf(steps []storage.ClaimedStep) []storage.Claim {
	out := make([]storage.Claim, len(steps))
	for i, c := range steps {
		out[i] = c.Claim
	}
	return out
}

// cachedStatement is a statement the driver keeps prepared on a
// connection, and how many times SQLite prepared it again.
type cachedStatement struct {
	sql     string
	repreps int64
}

// cachedStatements reads the prepared-statement caches of every open
// connection of db, holding them all at once so that none is in use.
func cachedStatements(t *testing.T, db *sql.DB) []cachedStatement {
	t.Helper()
	ctx := t.Context()
	var (
		conns []*sql.Conn
		out   []cachedStatement
	)
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for range db.Stats().OpenConnections {
		c, err := db.Conn(ctx)
		require.NoError(t, err)
		conns = append(conns, c)
		require.NoError(t, c.Raw(func(dc any) error {
			conn, ok := dc.(*sqlite3.SQLiteConn)
			require.True(t, ok, "driver connection %T", dc)
			cache := reflect.ValueOf(conn).Elem().FieldByName("stmtCache")
			require.True(t, cache.IsValid(), "the driver has no stmtCache field any more")
			for i := range cache.Len() {
				st := cache.Index(i).Elem()
				key, repreps := st.FieldByName("cacheKey"), st.FieldByName("repreps")
				require.True(t, key.IsValid() && repreps.IsValid(), "the driver's statements have no cacheKey or repreps field any more")
				out = append(out, cachedStatement{sql: key.String(), repreps: repreps.Int()})
			}
			return nil
		}))
	}
	require.NotEmpty(t, out, "no statement kept prepared")
	return out
}
