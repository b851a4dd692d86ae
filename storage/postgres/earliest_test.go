package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
)

// TestEarliestReadsStopAtTheFirstEntry: the next wake and the capped
// parents' skip-scan each want the first entry of a partial index: the
// earliest delayed step, waiting step's deadline, instance deadline and
// deferred start; the next capped parent. The sweeps every idle worker
// runs (deferred starts; expired leases, waits and instances) want the
// due entries of one. Written as min(), whether a
// statement read one entry or every one was the planner's choice, made
// from the tables' statistics once per connection: a worker that first
// claimed on a young database aggregated three of the next wake's four
// indexes whole at each claim that came back short, for the connection's
// life, so an idle worker's every poll read every delayed step, every
// wait and every deadline (with 200,000 instances delayed, 195 ms a read:
// BenchmarkHotPaths/NextWakePastFuture). Planned on empty tables and run
// over a few hundred rows of each kind, no scan of those statements may
// read more than one row a loop, those its filter removed included (the
// capped parents' min() is planned as a read of one entry); nor more
// than wakeWalk when every delayed step is of a handler the claimer
// lacks. Nor may the next wake or the sweep read the instances a full key
// holds and parked, or those paused, due though they are: a count of the key's admitted
// instances for each of them made a backlog of 5,000 cost every sweep
// 2.3 s (BenchmarkHotPaths/StartDeferredPastHeld).
func TestEarliestReadsStopAtTheFirstEntry(t *testing.T) {
	t.Parallel()
	s := openTestStore(t, nil)
	walk, err := strconv.ParseFloat(wakeWalk, 64)
	require.NoError(t, err)
	statements := map[string]struct {
		sql, args string
		most      float64 // rows a scan may return a loop
	}{
		"next wake":      {nextWakeSQL, `(now(), '{}', '{}')`, 1},
		"capped parents": {cappedParentsSQL, `(now(), '', '{}', '{}')`, 1},
		// Every delayed step is another handler's: the walk stops after
		// wakeWalk of them.
		"next wake of another handler": {nextWakeSQL, `(now(), '{}', '{other}')`, walk},
		// The sweep of deferred starts reads held instances not parked.
		"admissible deferred": {admissibleDeferredSQL, `(now(), 100)`, 1},
		"startable deferred":  {startableDeferredSQL, `(now(), 100)`, 1},
		// So do the other sweeps, of expired leases, waits and instances.
		"expired leases":    {expiredSQL, `(now(), 100)`, 1},
		"expired waits":     {expiredWaitsSQL, `(now(), 100)`, 1},
		"expired instances": {expiredInstancesSQL, `(now(), 100)`, 1},
	}
	conn := genericPlanConn(t, s, slices.Collect(maps.Keys(statements))...)
	for name, st := range statements {
		// The generic plan is made at the first execution, on empty tables.
		_, err := conn.Exec(t.Context(), fmt.Sprintf(`PREPARE %q AS %s`, name, s.q(st.sql)))
		require.NoError(t, err)
		_, err = conn.Exec(t.Context(), fmt.Sprintf(`EXPLAIN EXECUTE %q%s`, name, st.args))
		require.NoError(t, err)
	}

	const rows = 300
	for _, fill := range []string{`
		INSERT INTO {s}steps (instance_id, position, name, handler, queue, workflow, status, run_after, ready_at)
		SELECT 'delayed-' || g, 0, 's', 'h', 'default', 'wf', 'pending', now() + g * interval '1 minute', now()
		FROM generate_series(1, $1::int) g`, `
		INSERT INTO {s}steps (instance_id, position, name, handler, queue, workflow, status, run_after, lease_until)
		SELECT 'leased-' || g, 0, 's', 'h', 'default', 'wf', 'running', now(), now() + g * interval '1 minute'
		FROM generate_series(1, $1::int) g`, `
		INSERT INTO {s}steps (instance_id, position, name, handler, queue, workflow, status, run_after, deadline)
		SELECT 'waiting-' || g, 0, 's', 'h', 'default', 'wf', 'waiting', now(), now() + g * interval '1 minute'
		FROM generate_series(1, $1::int) g`, `
		INSERT INTO {s}instances (id, workflow, definition_hash, status, run_after, created_at, deadline)
		SELECT 'running-' || g, 'wf', 'h1', 'running', now(), now(), now() + g * interval '1 minute'
		FROM generate_series(1, $1::int) g`, `
		INSERT INTO {s}instances (id, workflow, definition_hash, status, run_after, created_at, deferred)
		SELECT 'deferred-' || g, 'wf', 'h1', 'pending', now() + g * interval '1 minute', now(), true
		FROM generate_series(1, $1::int) g`, `
		INSERT INTO {s}instances (id, workflow, definition_hash, status, run_after, created_at, deferred,
			concurrency_key, concurrency_limit, held, parked)
		SELECT 'parked-' || g, 'wf', 'h1', 'pending', now() - g * interval '1 minute', now(), true, 'a', 1, true, true
		FROM generate_series(1, $1::int) g`, `
		INSERT INTO {s}instances (id, workflow, definition_hash, status, run_after, created_at, deferred, paused)
		SELECT 'paused-' || g, 'wf', 'h1', 'pending', now() - g * interval '1 minute', now(), true, true
		FROM generate_series(1, $1::int) g`, `
		INSERT INTO {s}steps (instance_id, position, name, handler, queue, workflow, status, run_after,
			parent_id, item_index, item_concurrency)
		SELECT 'capped-' || g / 10, 1, 's', 'h', 'default', 'wf', 'pending', now(), 1000000 + g / 10, g % 10, 2
		FROM generate_series(1, $1::int) g`,
	} {
		_, err := s.pool.Exec(t.Context(), s.q(fill), rows)
		require.NoError(t, err)
	}

	for name, st := range statements {
		var plan []struct{ Plan planNode }
		require.NoError(t, conn.QueryRow(t.Context(),
			fmt.Sprintf(`EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE %q%s`, name, st.args)).Scan(&plan))
		require.Len(t, plan, 1)
		scans := 0
		plan[0].Plan.walk(func(n planNode) {
			if n.Relation == "" || n.Index == "steps_pkey" || n.Loops == 0 {
				return // the capped parents' lock takes the steps it found by key
			}
			scans++
			read := n.Rows + n.Removed
			require.LessOrEqual(t, read, st.most, "%s: %s using %s read %v rows a loop:\n%s", name, n.Type, n.Index, read, plan[0].Plan.dump())
		})
		require.NotZero(t, scans, "%s read no table", name)
	}
}

// TestClaimReadsOnlyItsHandlersHeads: with thousands of ready steps of
// another handler ahead of a claimer's own in claim order, the store's
// look ahead finds them, and its claims read no more than their limit of
// entries a loop of any index of steps (see candidatesSQL, lookAhead):
// they used to walk every one of them, at every claim of every worker.
// The look and the claim are planned on an empty table, as a worker's
// connection plans them on a young database, and run after.
func TestClaimReadsOnlyItsHandlersHeads(t *testing.T) {
	t.Parallel()
	s := openTestStore(t, nil)
	conn := genericPlanConn(t, s, "claim", "look")
	const limit = 10
	statements := map[string]struct{ sql, args string }{
		// now (none: the server's), lease, worker, limit, handlers
		"claim": {claimQueries.of(claimShape{byHandler: true, heads: true}),
			fmt.Sprintf(`(NULL, %d, 'w', %d, '{mine,none}')`, time.Minute.Microseconds(), limit)},
		// now, limit, handlers
		"look": {headProbeQueries.of(claimShape{byHandler: true}), fmt.Sprintf(`(NULL, %d, '{mine,none}')`, limit)},
	}
	for name, st := range statements {
		_, err := conn.Exec(t.Context(), fmt.Sprintf(`PREPARE %s AS %s`, name, s.q(st.sql)))
		require.NoError(t, err)
		_, err = conn.Exec(t.Context(), fmt.Sprintf(`EXPLAIN EXECUTE %s%s`, name, st.args))
		require.NoError(t, err)
	}

	_, err := s.pool.Exec(t.Context(), s.q(`
		INSERT INTO {s}steps (instance_id, position, name, handler, queue, workflow, status, run_after, ready_at)
		SELECT 'i-' || g, 0, 's', CASE WHEN g > 3000 THEN 'mine' ELSE 'theirs' END, 'default', 'wf', 'pending',
			now() - interval '1 hour' + g * interval '1 ms', now() - interval '1 hour' + g * interval '1 ms'
		FROM generate_series(1, 3030) g`))
	require.NoError(t, err)

	for _, name := range []string{"look", "claim"} {
		var plan []struct{ Plan planNode }
		require.NoError(t, conn.QueryRow(t.Context(), fmt.Sprintf(`EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE %s%s`, name, statements[name].args)).Scan(&plan))
		require.Len(t, plan, 1)
		scans := 0
		plan[0].Plan.walk(func(n planNode) {
			if n.Relation != "steps" || n.Index == "steps_pkey" || n.Loops == 0 {
				return
			}
			scans++
			read := n.Rows + n.Removed
			require.LessOrEqual(t, read, float64(limit), "%s: %s using %s read %v rows a loop:\n%s", name, n.Type, n.Index, read, plan[0].Plan.dump())
		})
		require.NotZero(t, scans, "%s read no index of steps", name)
	}
	require.Equal(t, []string{"i-3001", "i-3002", "i-3003", "i-3004", "i-3005", "i-3006", "i-3007", "i-3008", "i-3009", "i-3010"},
		runningSteps(t, s), "the claim took the first of its own steps in claim order")

	// The store looks ahead before a claim, and its claims then read heads.
	p := storage.ClaimParams{WorkerID: "w", Limit: limit, Lease: time.Minute, Handlers: []string{"mine", "none"}}
	require.False(t, s.heads.Heads(p), "no look yet")
	claimed, err := s.ClaimSteps(t.Context(), p)
	require.NoError(t, err)
	require.Len(t, claimed, limit)
	require.True(t, s.heads.Heads(p), "the look found another handler's steps ahead")
	require.EqualValues(t, 1, s.headClaims.Load(), "and the claim read its handlers' heads")
	require.Len(t, runningSteps(t, s), 2*limit)
}

// runningSteps returns the instances of the running steps of s, by
// run_after.
func runningSteps(t *testing.T, s *Store) []string {
	t.Helper()
	rows, err := s.pool.Query(t.Context(), s.q(`SELECT instance_id FROM {s}steps WHERE status = 'running' ORDER BY run_after`))
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return ids
}

// genericPlanConn returns a connection of s's pool that plans prepared
// statements generically and without sequential scans, as a connection
// that first ran them on a young database keeps planning them. names are
// the statements the caller PREPAREs on it, deallocated when the test
// ends (not DEALLOCATE ALL: the pool's statement cache holds others).
func genericPlanConn(t *testing.T, s *Store, names ...string) *pgxpool.Conn {
	t.Helper()
	conn, err := s.pool.Acquire(t.Context())
	require.NoError(t, err)
	t.Cleanup(conn.Release)
	_, err = conn.Exec(t.Context(), `SET plan_cache_mode = force_generic_plan; SET enable_seqscan = off`)
	require.NoError(t, err)
	t.Cleanup(func() {
		for _, name := range names {
			_, err := conn.Exec(context.Background(), fmt.Sprintf(`DEALLOCATE %q`, name))
			require.NoError(t, err)
		}
		_, err := conn.Exec(context.Background(), `RESET plan_cache_mode; RESET enable_seqscan`)
		require.NoError(t, err)
	})
	return conn
}

// planNode is a node of EXPLAIN (ANALYZE, FORMAT JSON).
type planNode struct {
	Type     string     `json:"Node Type"`
	Relation string     `json:"Relation Name"`
	Index    string     `json:"Index Name"`
	Rows     float64    `json:"Actual Rows"`
	Removed  float64    `json:"Rows Removed by Filter"`
	Loops    float64    `json:"Actual Loops"`
	Plans    []planNode `json:"Plans"`
}

func (n planNode) walk(visit func(planNode)) {
	visit(n)
	for _, child := range n.Plans {
		child.walk(visit)
	}
}

func (n planNode) dump() string {
	b, _ := json.MarshalIndent(n, "", "  ")
	return string(b)
}
