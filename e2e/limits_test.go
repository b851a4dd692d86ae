package e2e

// Contention tests of the concurrency limits: four worker processes at
// --concurrency 50 race for steps under a workflow key, a step key, a queue
// concurrency and a queue rate: the handlers never overlap beyond a limit
// (counted by the server they call), the history's start times keep a
// rate, and every instance completes.

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

const (
	contentionWorkers     = 4
	contentionConcurrency = 50
	contentionInstances   = 120
	contentionKeys        = 5
)

// slowServer answers every request after d, so that a step using the http
// handler against it runs for at least d, and counts the requests in flight
// at once for each value of their key parameter: the handlers that really
// overlapped. The history cannot tell that as exactly: PostgreSQL stamps an
// event with its transaction's start, and a claim that waited for another
// worker's completion records a start from before that completion.
type slowServer struct {
	url string

	mu             sync.Mutex
	inFlight, most map[string]int
}

func newSlowServer(t *testing.T, d time.Duration) *slowServer {
	t.Helper()
	s := &slowServer{inFlight: map[string]int{}, most: map[string]int{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.URL.Query().Get("key")
		s.mu.Lock()
		s.inFlight[key]++
		s.most[key] = max(s.most[key], s.inFlight[key])
		s.mu.Unlock()
		time.Sleep(d)
		s.mu.Lock()
		s.inFlight[key]--
		s.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{}`)
	}))
	t.Cleanup(srv.Close)
	s.url = srv.URL
	return s
}

// mostAtOnce gives, for each key, the most requests that were in flight at
// once, and forgets them.
func (s *slowServer) mostAtOnce() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	most := s.most
	s.most = map[string]int{}
	return most
}

// historyStarts reads the started and completed events of every step and
// returns, in the order the attempts completed, the time each one started
// (unix microseconds): the starts the rate tests space.
func historyStarts(t *testing.T, db string) []int64 {
	t.Helper()
	const where = ` WHERE type IN ('step.started', 'step.completed') ORDER BY id`
	type event struct {
		instance, step, typ string
		at                  int64
	}
	var events []event
	if strings.HasPrefix(db, "postgres") {
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, db)
		require.NoError(t, err)
		defer conn.Close(ctx)
		rows, err := conn.Query(ctx, `SELECT instance_id, step, type, (extract(epoch FROM at) * 1000000)::bigint FROM dagrun.events`+where)
		require.NoError(t, err)
		var e event
		_, err = pgx.ForEachRow(rows, []any{&e.instance, &e.step, &e.typ, &e.at}, func() error {
			events = append(events, e)
			return nil
		})
		require.NoError(t, err)
	} else {
		conn, err := sql.Open("sqlite3", "file:"+strings.TrimPrefix(db, "sqlite:")+"?_busy_timeout=10000")
		require.NoError(t, err)
		defer conn.Close()
		rows, err := conn.Query(`SELECT instance_id, step, type, at FROM events` + where)
		require.NoError(t, err)
		defer rows.Close()
		for rows.Next() {
			var e event
			require.NoError(t, rows.Scan(&e.instance, &e.step, &e.typ, &e.at))
			events = append(events, e)
		}
		require.NoError(t, rows.Err())
	}
	open := map[[2]string]int64{}
	var starts []int64
	for _, e := range events {
		k := [2]string{e.instance, e.step}
		if e.typ == "step.started" {
			open[k] = e.at
			continue
		}
		start, ok := open[k]
		require.True(t, ok, "step %s of %s completed without starting", e.step, e.instance)
		starts = append(starts, start)
		delete(open, k)
	}
	return starts
}

// contend runs the instances (instance i has input {"n": i}) on four worker
// processes and waits until they all completed.
func contend(t *testing.T, e *env, bin, workflow string, n int, timeout time.Duration) {
	t.Helper()
	startContenders(t, e, bin)
	server, base := e.serveAPI(t, bin)
	enqueue(t, base, workflow, n, 16)
	awaitCompleted(t, e, workflow, n, timeout)
	server.stop(t)
}

// startContenders starts the four worker processes and waits until every
// one announced itself, so that none joins late and starts a backlog at
// once.
func startContenders(t *testing.T, e *env, bin string) {
	t.Helper()
	for range contentionWorkers {
		e.spawnBinary(t, bin, "worker", "--concurrency", fmt.Sprint(contentionConcurrency), "--poll", "200ms")
	}
	waitFor(t, 30*time.Second, "the workers to announce themselves", func() bool {
		out := e.mustRun(t, "handlers", "--workers").stdout
		return strings.Count(out, "\n") == contentionWorkers+1 // the header and one line per worker
	})
}

// awaitCompleted waits until n instances of workflow completed, and fails
// at once if one failed or was cancelled.
func awaitCompleted(t *testing.T, e *env, workflow string, n int, timeout time.Duration) {
	t.Helper()
	waitFor(t, timeout, fmt.Sprintf("%d instances of %s to complete", n, workflow), func() bool {
		st := e.statsOf(t, workflow)
		require.Zero(t, st.Instances["failed"]+st.Instances["cancelled"], "instances failed: %+v", st)
		return st.Instances["completed"] >= n
	})
}

// TestConcurrencyLimitsUnderContention checks a workflow key, a step key
// (120 instances over 5 keys, limit 1) and a queue concurrency (limit 3)
// under four workers at concurrency 50: the handlers of one key, or of the
// queue, never run more at once than the limit, the limit is reached, and
// every instance completes. Each limited step calls a slow HTTP server with
// its key (URL in the YAML is the server's address), which counts the
// requests in flight per key.
func TestConcurrencyLimitsUnderContention(t *testing.T) {
	t.Parallel()
	bin := plainBinary
	cases := []struct {
		name, yaml string
		more       map[string]string // other workflow files
		setup      []string
		limit      int
		keys       int // the key values the steps call the server with
		// hold is how long the server holds each request. A limit above
		// one is reached only when that many requests overlap at the
		// server, so it must outlast the time from a finish to the next
		// claim's request: 20 ms did not on a loaded 2-core VM, where a
		// queue limit of 3 saw at most 2 at once over 120 steps.
		hold time.Duration
	}{
		{name: "WorkflowKey", limit: 1, hold: 20 * time.Millisecond, keys: contentionKeys, yaml: `name: limited
concurrency: {key: "${{ input.n % 5 }}", limit: 1}
steps:
  - {name: a, handler: http, input: {url: "URL?key=${{ input.n % 5 }}"}}
  - {name: b, handler: http, input: {url: "URL?key=${{ input.n % 5 }}"}, dependsOn: [a]}
`},
		// The first step starts a child, so that each instance is
		// deferred: held behind its key (parked once its key is found
		// full), admitted by a finish, and started by a sweep.
		{name: "WorkflowKeyDeferred", limit: 1, hold: 20 * time.Millisecond, keys: contentionKeys, yaml: `name: limited
concurrency: {key: "${{ input.n % 5 }}", limit: 1}
steps:
  - {name: call, workflow: calls, input: {n: "${{ input.n }}"}}
`, more: map[string]string{"calls.yaml": `name: calls
steps:
  - {name: a, handler: http, input: {url: "URL?key=${{ input.n % 5 }}"}}
`}},
		{name: "StepKey", limit: 1, hold: 20 * time.Millisecond, keys: contentionKeys, yaml: `name: limited
steps:
  - {name: a, handler: http, input: {url: "URL?key=${{ input.n % 5 }}"}, concurrency: {key: "${{ input.n % 5 }}", limit: 1}}
  - {name: b, handler: noop, dependsOn: [a]}
`},
		{name: "QueueConcurrency", limit: 3, hold: 250 * time.Millisecond, keys: 1, setup: []string{"queue", "set", "narrow", "--concurrency", "3"}, yaml: `name: limited
steps:
  - {name: a, handler: http, queue: narrow, input: {url: "URL?key=queue"}}
`},
	}
	for _, b := range backends(t) {
		for _, tc := range cases {
			t.Run(b.name+"/"+tc.name, func(t *testing.T) {
				server := newSlowServer(t, tc.hold)
				db := b.newDB(t)
				files := map[string]string{"limited.yaml": strings.ReplaceAll(tc.yaml, "URL", server.url)}
				for name, yaml := range tc.more {
					files[name] = strings.ReplaceAll(yaml, "URL", server.url)
				}
				e := newEnv(t, db, files)
				e.mustRun(t, "validate")
				if tc.setup != nil {
					e.mustRun(t, tc.setup...)
				} else {
					e.mustRun(t, "list") // creates the schema before the processes start
				}
				contend(t, e, bin, "limited", contentionInstances, 3*time.Minute)
				most := server.mostAtOnce()
				require.Len(t, most, tc.keys, "keys the steps called the server with: %v", most)
				for key, n := range most {
					t.Logf("key %s: at most %d handlers at once (limit %d)", key, n, tc.limit)
					require.LessOrEqual(t, n, tc.limit, "key %s ran more steps at once than its limit", key)
					require.Equal(t, tc.limit, n, "key %s never used its limit: the test would not see a breach", key)
				}
			})
		}
	}
}

// fitRate is the slope, in starts a second, of the least-squares line
// through the starts (the i-th start at its time): the rate the starts
// kept over the whole run, which a late first claim that starts a few
// steps at once does not skew the way first-to-last does.
func fitRate(starts []int64) float64 {
	n := float64(len(starts))
	var sx, sy, sxx, sxy float64
	for i, at := range starts {
		x := float64(at-starts[0]) / 1e6 // seconds
		y := float64(i)
		sx, sy, sxx, sxy = sx+x, sy+y, sxx+x*x, sxy+x*y
	}
	return (n*sxy - sx*sy) / (n*sxx - sx*sx)
}

// gaps lists the times between consecutive starts, in milliseconds.
func gaps(starts []int64) []int64 {
	var out []int64
	for i := 1; i < len(starts); i++ {
		out = append(out, (starts[i]-starts[i-1])/1000)
	}
	return out
}

// TestQueueRateUnderContention checks a queue rate of 25 steps a second
// under four workers at concurrency 50: the starts the history records over
// more than 8 seconds come at that rate, within 10% (the slope of a
// least-squares fit of the starts over time).
//
// The steps are all ready before the rate that is measured applies, so
// that only the rate spaces them: a rate spaces steps as they become
// ready, and starting 220 instances one request at a time may take longer
// than 8.8 s on a loaded machine. They wait under a rate of one an hour
// while the workers start; the new rate then spaces them from the moment
// it is set.
func TestQueueRateUnderContention(t *testing.T) {
	t.Parallel()
	bin := plainBinary
	const (
		rate      = 25.0
		instances = 220 // 8.8 s of starts at 25/s
	)
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			db := b.newDB(t)
			e := newEnv(t, db, map[string]string{"rated.yaml": `name: rated
steps:
  - {name: a, handler: echo, queue: rated, input: {n: "${{ input.n }}"}}
`})
			e.mustRun(t, "queue", "set", "rated", "--rate", "1/1h")
			server, base := e.serveAPI(t, bin)
			enqueue(t, base, "rated", instances, 16)
			server.stop(t)
			startContenders(t, e, bin)
			rated := time.Now()
			e.mustRun(t, "queue", "set", "rated", "--rate", "25/s")
			awaitCompleted(t, e, "rated", instances, 2*time.Minute)
			var starts []int64
			for _, start := range historyStarts(t, db) {
				if start >= rated.UnixMicro() {
					starts = append(starts, start)
				}
			}
			// The first step was due at once under the slow rate: a worker
			// may have started it before the new rate was set.
			require.GreaterOrEqual(t, len(starts), instances-1, "one start per step, all but the first after the new rate")
			slices.Sort(starts)
			span := time.Duration(starts[len(starts)-1]-starts[0]) * time.Microsecond
			overall := float64(len(starts)-1) / span.Seconds()
			measured := fitRate(starts)
			t.Logf("%d starts over %s: %.2f a second fitted, %.2f first to last (limit %.0f); first gaps %v ms",
				len(starts), span, measured, overall, rate, gaps(starts[:6]))
			// At the rate, the last of them cannot start before 8 s have
			// passed since it was set, however late the first claim came.
			require.Greater(t, time.UnixMicro(starts[len(starts)-1]).Sub(rated), 8*time.Second)
			require.InEpsilon(t, rate, measured, 0.10)
			// The rate spaces the start times as steps become ready; a
			// worker that claims late starts the steps that came due
			// meanwhile together. Reported, not asserted.
			busiest := 0
			for i := range starts {
				j := i
				for j < len(starts) && starts[j]-starts[i] < time.Second.Microseconds() {
					j++
				}
				busiest = max(busiest, j-i)
			}
			t.Logf("busiest second: %d starts", busiest)
		})
	}
}

// TestQueueRateAfterAnIdleSpell starts instances of a rated queue while no
// worker runs, and a worker only after their slots have passed: the
// starts keep the rate's interval from the first one rather than coming
// together.
func TestQueueRateAfterAnIdleSpell(t *testing.T) {
	t.Parallel()
	const (
		instances = 4
		interval  = 500 * time.Millisecond // --rate 2/s
		idle      = 1500 * time.Millisecond
	)
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			db := b.newDB(t)
			e := newEnv(t, db, map[string]string{"paced.yaml": `name: paced
steps:
  - {name: a, handler: noop, queue: paced}
`})
			e.mustRun(t, "queue", "set", "paced", "--rate", "2/s")
			first := time.Now()
			for range instances {
				e.mustRun(t, "start", "paced", "--detach")
			}
			// The scenario is a spell with no worker: only time passing
			// makes it, so this waits rather than awaits a condition.
			time.Sleep(time.Until(first.Add(idle)))
			e.spawnBinary(t, plainBinary, "worker")
			awaitCompleted(t, e, "paced", instances, time.Minute)
			starts := historyStarts(t, db)
			require.Len(t, starts, instances)
			slices.Sort(starts)
			// The first claim gives the waiting steps slots an interval
			// apart from its own time, on the store's clock; a claim may
			// come a little after its slot, never before, and the next
			// slot stays where it was. Together they would start within
			// milliseconds.
			for i := 1; i < len(starts); i++ {
				since := time.Duration(starts[i]-starts[0]) * time.Microsecond
				require.GreaterOrEqual(t, since, time.Duration(i)*interval, "start %d came %s after the first: gaps %v ms", i, since, gaps(starts))
				require.Greater(t, starts[i]-starts[i-1], (interval / 2).Microseconds(), "start %d came with the one before it: gaps %v ms", i, gaps(starts))
			}
		})
	}
}
