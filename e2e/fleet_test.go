package e2e

// Fleet tests: many worker processes on one PostgreSQL server whose
// max_connections is the default 100, connected directly and through a
// PgBouncer in transaction-pooling mode that the test starts itself. Every
// instance of a queued backlog completes, no worker exits, no transition is
// recorded twice, and an operator's psql and dagrun CLI still get in while
// the fleet runs.

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

const (
	// fleetConcurrency is each worker's --concurrency.
	fleetConcurrency = 10
)

// fleetRun is one fleet: its size and how it reaches the server.
type fleetRun struct {
	via     string // "direct" or "pgbouncer"
	workers int
}

func (r fleetRun) String() string { return fmt.Sprintf("%s-%d", r.via, r.workers) }

// fleetPlan reads DAGRUN_E2E_FLEET: unset, small fleets on a small backlog
// (CI's run, seconds long); "1", the full size: a 4,000-instance backlog
// drained by 40 workers connected directly and by 60 through PgBouncer; a
// list such as "direct:2,direct:4,pgbouncer:60", those fleets, one after
// the other, each on a 4,000-instance backlog of its own.
// DAGRUN_E2E_FLEET_INSTANCES sets another backlog size, and
// DAGRUN_E2E_FLEET_DUE=1 has each backlog wait for its fleet (fleetDue).
func fleetPlan(t *testing.T) (runs []fleetRun, instances int) {
	t.Helper()
	runs, instances = fleetRuns(t)
	if v := os.Getenv("DAGRUN_E2E_FLEET_INSTANCES"); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err, "DAGRUN_E2E_FLEET_INSTANCES")
		require.Positive(t, n, "DAGRUN_E2E_FLEET_INSTANCES")
		instances = n
	}
	return runs, instances
}

// fleetDue reports whether DAGRUN_E2E_FLEET_DUE asks for backlogs that fall
// due together once their fleet is up, as the first steps of instances
// started with one delay do, rather than wait for the fleet as it starts:
// the fleet's work then counts from that moment, its start left out, and
// the due steps go through the claims' promotion of delayed work.
func fleetDue(t *testing.T) bool {
	t.Helper()
	switch v := os.Getenv("DAGRUN_E2E_FLEET_DUE"); v {
	case "":
		return false
	case "1":
		return true
	default:
		t.Fatalf("DAGRUN_E2E_FLEET_DUE=%q: use 1, or leave it unset", v)
		return false
	}
}

func fleetRuns(t *testing.T) (runs []fleetRun, instances int) {
	t.Helper()
	switch v := os.Getenv("DAGRUN_E2E_FLEET"); v {
	case "":
		return []fleetRun{{"direct", 4}, {"pgbouncer", 6}}, 300
	case "1":
		return []fleetRun{{"direct", 40}, {"pgbouncer", 60}}, 4000
	default:
		for _, item := range strings.Split(v, ",") {
			via, n, ok := strings.Cut(strings.TrimSpace(item), ":")
			workers, err := strconv.Atoi(n)
			if !ok || err != nil || workers < 1 || (via != "direct" && via != "pgbouncer") {
				t.Fatalf("DAGRUN_E2E_FLEET=%q: use 1, or a list of direct:N and pgbouncer:N", v)
			}
			runs = append(runs, fleetRun{via, workers})
		}
		return runs, 4000
	}
}

// TestFleet drains a backlog of two-step instances (echo, then noop) with
// each fleet of fleetPlan, one after the other, with the binary built
// without the race detector, and logs one line of figures per fleet. The
// full size, whose figures the README quotes:
//
//	DAGRUN_E2E_FLEET=1 go test -count=1 ./e2e -run TestFleet -v -timeout 30m
func TestFleet(t *testing.T) {
	skipWithoutPostgres(t)
	runs, instances := fleetPlan(t)
	bin := plainBinary
	for _, run := range runs {
		t.Run(run.String(), func(t *testing.T) {
			runFleet(t, bin, run, instances)
		})
	}
}

func runFleet(t *testing.T, bin string, run fleetRun, n int) {
	db := newPostgresDB(t)
	e := newEnv(t, db, map[string]string{"fleet.yaml": echoNoop("fleet")})
	e.mustRun(t, "list") // creates the schema before the processes start

	// The backlog, queued before any worker runs.
	server, base := e.serveAPI(t, bin)
	enqueue(t, base, "fleet", n, 16)
	server.stop(t)

	ctx := context.Background()
	admin, err := pgx.Connect(ctx, db)
	require.NoError(t, err)
	t.Cleanup(func() { _ = admin.Close(context.WithoutCancel(ctx)) })
	var due time.Time // when a due run's backlog falls due
	if fleetDue(t) {
		// Time for the fleet to come up: 40 workers took over 4 s on a
		// slow 2-core VM.
		due = time.Now().Add(2*time.Second + time.Duration(run.workers)*150*time.Millisecond).Truncate(time.Millisecond)
		_, err := admin.Exec(ctx, `UPDATE dagrun.steps SET run_after = $1 WHERE status = 'pending'`, due)
		require.NoError(t, err)
	}
	var maxConns, reserved int
	require.NoError(t, admin.QueryRow(ctx, `SELECT current_setting('max_connections')::int,
		current_setting('superuser_reserved_connections')::int`).Scan(&maxConns, &reserved))

	statements := resetStatementStats(ctx, admin)
	workBefore := readDatabaseWork(ctx, t, admin)

	// The workers' connections go by a name of their own.
	fleet := *e
	fleet.db = withParam(t, db, "application_name", "dagrun-fleet")
	if run.via == "pgbouncer" {
		fleet.db = withParam(t, startPgBouncer(t, db), "application_name", "dagrun-fleet")
	}
	began, busyBefore := time.Now(), machineBusy(t)
	workers := make([]*process, run.workers)
	for i := range workers {
		workers[i] = fleet.spawnBinary(t, bin, "worker", "--concurrency", strconv.Itoa(fleetConcurrency))
	}
	if !due.IsZero() {
		require.Eventually(t, func() bool { return workersUp(workers) }, time.Until(due), 10*time.Millisecond,
			"the fleet was not up when its backlog fell due")
		time.Sleep(time.Until(due))
		began, busyBefore = due, machineBusy(t)
	}
	var checks *operatorChecks
	var (
		completed                     int
		peakServer, peakDB, peakFleet int
		allUp                         time.Time
		completedWhenUp               int
		stepsWhenUp                   int // steps completed when the last worker came up
		busyWhenUp                    time.Duration
		workersCPUWhenUp              time.Duration
		waits                         fleetWaits // summed over the samples taken once all were up
	)
	deadline := time.Now().Add(time.Duration(n)*25*time.Millisecond + 2*time.Minute)
	for completed < n {
		require.False(t, time.Now().After(deadline), "%d of %d instances completed after %s", completed, n, time.Since(began))
		for _, w := range workers {
			require.True(t, w.running(), "a worker exited (code %d):\n%s", w.code, w.stderr.String())
		}
		if allUp.IsZero() && workersUp(workers) {
			allUp, completedWhenUp, busyWhenUp = time.Now(), completed, machineBusy(t)
			workersCPUWhenUp = processesCPU(t, workers)
			require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM dagrun.steps WHERE status = 'completed'`).Scan(&stepsWhenUp))
			checks = startOperatorChecks(e, bin)
		}
		var server, inDB, ofFleet int
		var now fleetWaits
		require.NoError(t, admin.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE datname = current_database()),
			count(*) FILTER (WHERE application_name LIKE 'dagrun-fleet%'),
			count(*) FILTER (WHERE datname = current_database() AND state = 'active' AND wait_event_type IS NULL),
			count(*) FILTER (WHERE datname = current_database() AND state = 'active' AND wait_event_type IN ('Lock', 'LWLock') AND wait_event <> 'WALWrite'),
			count(*) FILTER (WHERE datname = current_database() AND state = 'active' AND wait_event IN ('WALWrite', 'WALSync')),
			count(*) FILTER (WHERE datname = current_database() AND (state LIKE 'idle in transaction%'
				OR state = 'active' AND wait_event = 'ClientRead')),
			coalesce(max(age(backend_xmin)) FILTER (WHERE datname = current_database()), 0)
			FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()`).Scan(&server, &inDB, &ofFleet,
			&now.running, &now.locks, &now.flush, &now.inTx, &now.snapshotAge))
		peakServer, peakDB, peakFleet = max(peakServer, server), max(peakDB, inDB), max(peakFleet, ofFleet)
		if !allUp.IsZero() {
			waits.add(now)
		}
		require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM dagrun.instances WHERE status = 'completed'`).Scan(&completed))
		time.Sleep(100 * time.Millisecond)
	}
	elapsed := time.Since(began)
	busyAtEnd, workersCPUAtEnd := machineBusy(t), processesCPU(t, workers)
	require.NotNil(t, checks, "the instances completed before every worker had started")
	checks.stop()

	// Every worker is still up and stops cleanly.
	for _, w := range workers {
		w.signal(t, syscall.SIGTERM)
	}
	for _, w := range workers {
		require.Equal(t, 0, w.wait(t, 30*time.Second), "worker exit code; stderr:\n%s", w.stderr.String())
		require.NotContains(t, w.stderr.String(), "level=ERROR", "a worker logged an error")
		require.NotContains(t, w.stderr.String(), "too many clients", "the server refused a worker")
	}
	work := "unavailable" // PgBouncer's server connections outlive the workers, their counts unflushed
	if run.via == "direct" {
		work = readDatabaseWork(ctx, t, admin).since(workBefore, n)
	}

	// Each transition once: one attempt per step, one step.started and one
	// step.completed per step, one instance.completed per instance.
	require.Equal(t, n, dbInt(t, db, `SELECT count(*) FROM instances WHERE status = 'completed'`))
	require.Zero(t, dbInt(t, db, `SELECT count(*) FROM steps WHERE status <> 'completed' OR attempts <> 1`), "steps run more than once")
	require.Zero(t, dbInt(t, db, `SELECT count(*) FROM (SELECT 1 FROM events
		WHERE type IN ('step.started', 'step.completed', 'instance.started', 'instance.completed')
		GROUP BY instance_id, step, type, attempt HAVING count(*) > 1) d`), "transitions recorded twice")
	require.Equal(t, 2*n, dbInt(t, db, `SELECT count(*) FROM events WHERE type = 'step.completed'`))
	require.Zero(t, dbInt(t, db, `SELECT count(*) FROM events
		WHERE type IN ('step.lease_expired', 'step.released', 'step.retrying', 'step.failed')`), "attempts lost or failed")

	// steps_done_when_up tells what the fleet did while it started (of
	// 2n steps): instances complete late whatever the fleet, since every
	// first step is claimed before any second one. The CPU figures are the
	// whole machine's (the server, the workers, the operator's checks) per
	// instance: a larger fleet that costs more of it per instance does more
	// work for the same result, one that does not only waits longer. The
	// workers' own share, once all were up, tells the worker processes'
	// cost from the server's.
	pool := "-"
	if run.via == "pgbouncer" {
		pool = strconv.Itoa(pgbouncerPool(t))
	}
	t.Logf("fleet=%s workers=%d concurrency=%d pgbouncer_pool=%s instances=%d due=%t seconds=%.1f instances_per_s=%.0f all_up_s=%.1f steps_done_when_up=%d after_all_up_per_s=%.0f "+
		"machine_cpu_ms_per_instance=%.2f after_all_up_cpu_ms_per_instance=%.2f after_all_up_workers_cpu_ms_per_instance=%.2f "+
		"peak_server_conns=%d peak_db_conns=%d peak_fleet_conns=%d max_connections=%d server_backends_once_up=%s database_work=%s statements=%s operator_checks=%s",
		run.via, run.workers, fleetConcurrency, pool, n, !due.IsZero(), elapsed.Seconds(), float64(n)/elapsed.Seconds(),
		allUp.Sub(began).Seconds(), stepsWhenUp, float64(n-completedWhenUp)/(elapsed-allUp.Sub(began)).Seconds(),
		msPer(busyAtEnd-busyBefore, n), msPer(busyAtEnd-busyWhenUp, n-completedWhenUp), msPer(workersCPUAtEnd-workersCPUWhenUp, n-completedWhenUp),
		peakServer, peakDB, peakFleet, maxConns, waits, work, statements.read(ctx, admin), checks)

	// A worker holds one pool connection and its listener; through
	// PgBouncer the database sees PgBouncer's pool and the operator's few.
	if run.via == "direct" {
		require.LessOrEqual(t, peakFleet, 2*run.workers, "connections of the fleet's workers")
	} else {
		const others = 3 + 1 // the operator's checks, each one connection, and the test's own
		require.LessOrEqual(t, peakDB, pgbouncerPool(t)+others, "connections to the database")
	}
	// An ordinary role still finds a free slot at the fleet's peak.
	require.LessOrEqual(t, peakServer+2, maxConns-reserved, "the fleet left no connection for anyone else")
	checks.require(t)
}

// fleetWaits counts the database's server backends (the fleet's, and the
// operator's checks') by what they are doing, summed over the loop's
// samples: running, waiting on a lock or a lightweight lock (another
// transaction's row, a page, the lock table), waiting for a commit's WAL
// flush (its own or the one it joined), or inside a transaction waiting
// on its client for the next statement (idle in transaction, or, as the
// store's pipelined transactions wait between their round trips, active
// and reading from the client). Their means over a run tell a fleet whose
// server works from one whose transactions wait on one another or on
// worker processes starved of CPU.
//
// snapshotAge is the age, in transactions, of the oldest snapshot a
// backend of the database held: row versions that transactions since
// then replaced stay visible to it, so every claim's walk of the ready
// index passes the entries of the steps claimed since, unable to mark
// them dead (database_work's index entries per instance count the walk).
type fleetWaits struct {
	samples                     int
	running, locks, flush, inTx int
	snapshotAge                 int
}

func (w *fleetWaits) add(now fleetWaits) {
	w.samples++
	w.running += now.running
	w.locks += now.locks
	w.flush += now.flush
	w.inTx += now.inTx
	w.snapshotAge += now.snapshotAge
}

// String gives the mean backends of each kind per sample.
func (w fleetWaits) String() string {
	mean := func(v int) float64 { return float64(v) / float64(max(w.samples, 1)) }
	return fmt.Sprintf("running:%.1f,lock_wait:%.1f,commit_flush:%.1f,in_tx_awaiting_client:%.1f,oldest_snapshot_xids:%.0f,samples:%d",
		mean(w.running), mean(w.locks), mean(w.flush), mean(w.inTx), mean(w.snapshotAge), w.samples)
}

// databaseWork is what pg_stat_database counted of the fleet's database:
// commits, index entries and sequential-scan rows read (tup_returned),
// rows fetched, and buffers found in the cache. A backend adds its counts
// when it exits at the latest, so the figures are complete once the
// workers' connections are gone.
type databaseWork struct {
	commits, returned, fetched, bufferHits int64
}

// readDatabaseWork reads the database's counts once every other backend
// of it (the workers', the operator's checks', the backlog's server's) has
// exited, and so added its own.
func readDatabaseWork(ctx context.Context, t *testing.T, admin *pgx.Conn) databaseWork {
	t.Helper()
	require.Eventually(t, func() bool {
		var left int
		require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid()`).Scan(&left))
		return left == 0
	}, 30*time.Second, 20*time.Millisecond, "the database's other backends exit")
	var w databaseWork
	require.NoError(t, admin.QueryRow(ctx, `SELECT xact_commit, tup_returned, tup_fetched, blks_hit
		FROM pg_stat_database WHERE datname = current_database()`).Scan(&w.commits, &w.returned, &w.fetched, &w.bufferHits))
	return w
}

// since gives the counts added since before, per instance of n.
func (w databaseWork) since(before databaseWork, n int) string {
	per := func(now, then int64) float64 { return float64(now-then) / float64(n) }
	return fmt.Sprintf("commits:%.2f,index_entries:%.0f,rows_fetched:%.0f,buffer_hits:%.0f (per instance)",
		per(w.commits, before.commits), per(w.returned, before.returned), per(w.fetched, before.fetched), per(w.bufferHits, before.bufferHits))
}

// statementStats reads what pg_stat_statements saw of the fleet's
// database since resetStatementStats, where the server preloads it
// (shared_preload_libraries); elsewhere it says unavailable. Its figures
// tell which statement a slow fleet spends its server time in: the
// backlog claim's and the finish's calls and mean time (lock and buffer
// waits included), and all the database's statements' time.
type statementStats struct {
	available bool
}

// resetStatementStats creates pg_stat_statements in the fleet's database
// and forgets what it counted there so far (the backlog's enqueueing).
// The sessions opened after it also count the statements run inside
// functions: through PgBouncer a claim is the body of a statement
// function (storage/postgres, plans.go).
func resetStatementStats(ctx context.Context, admin *pgx.Conn) statementStats {
	var db string
	if err := admin.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
		return statementStats{}
	}
	// The reset fails where the server does not preload the library,
	// before the database's setting is touched.
	for _, sql := range []string{
		`CREATE EXTENSION IF NOT EXISTS pg_stat_statements`,
		`SELECT pg_stat_statements_reset(0, (SELECT oid FROM pg_database WHERE datname = current_database()), 0)`,
		`ALTER DATABASE ` + pgx.Identifier{db}.Sanitize() + ` SET pg_stat_statements.track = 'all'`,
	} {
		if _, err := admin.Exec(ctx, sql); err != nil {
			return statementStats{}
		}
	}
	return statementStats{available: true}
}

// read gives the claims' calls and mean milliseconds (claimSQL's
// statements, whose first CTE is cand, wherever they ran), the same of the
// finishes (finishSQL's, whose first CTE is r, as is that of the lease
// recovery, which alone names terminal outcomes), and the seconds of
// every statement the database's clients sent.
func (s statementStats) read(ctx context.Context, admin *pgx.Conn) string {
	if !s.available {
		return "unavailable"
	}
	var claims, finishes int64
	var claimMS, finishMS, allMS float64
	err := admin.QueryRow(ctx, `SELECT coalesce(sum(calls) FILTER (WHERE query LIKE '%WITH cand AS%'), 0)::bigint,
		coalesce(sum(total_exec_time) FILTER (WHERE query LIKE '%WITH cand AS%'), 0),
		coalesce(sum(calls) FILTER (WHERE query LIKE '%WITH r AS%' AND query NOT LIKE '%terminal%'), 0)::bigint,
		coalesce(sum(total_exec_time) FILTER (WHERE query LIKE '%WITH r AS%' AND query NOT LIKE '%terminal%'), 0),
		coalesce(sum(total_exec_time) FILTER (WHERE toplevel), 0)
		FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(
		&claims, &claimMS, &finishes, &finishMS, &allMS)
	if err != nil {
		return "unavailable"
	}
	return fmt.Sprintf("claims:%d,claim_mean_ms:%.2f,finishes:%d,finish_mean_ms:%.2f,all_s:%.1f",
		claims, claimMS/float64(max(claims, 1)), finishes, finishMS/float64(max(finishes, 1)), allMS/1000)
}

// machineBusy is the CPU time every core of the machine has spent busy
// since boot (/proc/stat: all but idle and iowait), or zero where there is
// no /proc/stat: the fleet's figures include it to tell a fleet that does
// more work per instance from one that waits longer.
func machineBusy(t *testing.T) time.Duration {
	t.Helper()
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(data), "\n")
	fields := strings.Fields(line)
	require.Greater(t, len(fields), 8, "/proc/stat: %q", line)
	var ticks int64
	for i, f := range fields[1:9] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		v, err := strconv.ParseInt(f, 10, 64)
		require.NoError(t, err, "/proc/stat: %q", line)
		ticks += v
	}
	return time.Duration(ticks) * time.Second / userHZ
}

// processesCPU is the CPU time (user and system) the running processes
// have used so far (/proc/PID/stat), or zero where there is no /proc.
func processesCPU(t *testing.T, processes []*process) time.Duration {
	t.Helper()
	var sum time.Duration
	for _, p := range processes {
		cpu, ok := processCPU(t, p.cmd.Process.Pid)
		if !ok {
			return 0
		}
		sum += cpu
	}
	return sum
}

// processCPU is the CPU time (user and system) process pid has used so
// far, from /proc/PID/stat; false where it cannot be read.
func processCPU(tb testing.TB, pid int) (time.Duration, bool) {
	tb.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	// The fields after the command name, which is in parentheses and may
	// hold spaces: utime and stime are the 12th and 13th.
	i := strings.LastIndexByte(string(data), ')')
	require.Positive(tb, i, "/proc/%d/stat: %q", pid, data)
	fields := strings.Fields(string(data[i+1:]))
	require.Greater(tb, len(fields), 12, "/proc/%d/stat: %q", pid, data)
	var ticks int64
	for _, f := range fields[11:13] {
		v, err := strconv.ParseInt(f, 10, 64)
		require.NoError(tb, err, "/proc/%d/stat: %q", pid, data)
		ticks += v
	}
	return time.Duration(ticks) * time.Second / userHZ, true
}

// userHZ is the clock ticks a second /proc counts CPU time in: USER_HZ,
// 100 on x86 and ARM Linux.
const userHZ = 100

// msPer is d in milliseconds per one of n.
func msPer(d time.Duration, n int) float64 {
	return float64(d.Microseconds()) / 1000 / float64(max(n, 1))
}

// workersUp reports whether every worker logged that it started.
func workersUp(workers []*process) bool {
	for _, w := range workers {
		if !strings.Contains(w.stderr.String(), "dagrun worker started") {
			return false
		}
	}
	return true
}

// operatorChecks connects as an operator would once every worker is up,
// over and over until the fleet is done: psql directly, and `dagrun stats`
// and `dagrun list` with the direct URL.
type operatorChecks struct {
	done chan struct{}
	wg   sync.WaitGroup

	mu       sync.Mutex
	passed   map[string]int
	failures []string
}

func startOperatorChecks(e *env, bin string) *operatorChecks {
	c := &operatorChecks{done: make(chan struct{}), passed: map[string]int{}}
	checks := map[string]func(ctx context.Context) *exec.Cmd{
		"psql": func(ctx context.Context) *exec.Cmd {
			return exec.CommandContext(ctx, "psql", e.db, "-XAtc", "SELECT 1")
		},
		"stats": func(ctx context.Context) *exec.Cmd { return e.binaryCommand(ctx, bin, "stats", "--json") },
		"list":  func(ctx context.Context) *exec.Cmd { return e.binaryCommand(ctx, bin, "list", "--limit", "5") },
	}
	for name, build := range checks {
		c.wg.Go(func() {
			for pause := time.Duration(0); ; pause = 500 * time.Millisecond {
				select {
				case <-c.done:
					return
				case <-time.After(pause):
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				out, err := build(ctx).CombinedOutput()
				cancel()
				c.mu.Lock()
				if err != nil {
					c.failures = append(c.failures, fmt.Sprintf("%s: %v: %s", name, err, strings.TrimSpace(string(out))))
				} else {
					c.passed[name]++
				}
				c.mu.Unlock()
			}
		})
	}
	return c
}

// stop ends the checks and waits for the ones running.
func (c *operatorChecks) stop() *operatorChecks {
	close(c.done)
	c.wg.Wait()
	return c
}

func (c *operatorChecks) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return fmt.Sprintf("psql:%d,stats:%d,list:%d,failed:%d", c.passed["psql"], c.passed["stats"], c.passed["list"], len(c.failures))
}

// require checks that no check failed and that each passed at least once.
func (c *operatorChecks) require(t *testing.T) {
	t.Helper()
	require.Empty(t, c.failures, "an operator could not connect while the fleet ran")
	for _, name := range []string{"psql", "stats", "list"} {
		require.Positive(t, c.passed[name], "no %s check passed while the fleet ran", name)
	}
}

// startPgBouncer runs a PgBouncer in transaction-pooling mode in front of
// the server of db, on a free port, for the test's duration, and returns
// the URL of db through it with pgbouncer=true. It skips the test when
// PgBouncer is not installed (fails under CI=true).
func startPgBouncer(t *testing.T, db string) string {
	t.Helper()
	path, err := exec.LookPath("pgbouncer")
	if err != nil {
		path, err = exec.LookPath("/usr/sbin/pgbouncer")
	}
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("pgbouncer is not installed; CI needs it (apt-get install pgbouncer)")
		}
		t.Skip("pgbouncer is not installed (apt-get install pgbouncer)")
	}
	server, err := url.Parse(db)
	require.NoError(t, err)
	port := freePort(t)
	dir := t.TempDir()
	require.NoError(t, os.Chmod(dir, 0o755)) // PgBouncer may run as another user
	password, _ := server.User.Password()
	auth := fmt.Sprintf("%q %q\n", server.User.Username(), password)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "userlist.txt"), []byte(auth), 0o644))
	config := fmt.Sprintf(`[databases]
* = host=%s port=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = transaction
default_pool_size = %d
max_db_connections = %d
max_client_conn = 1000
`, server.Hostname(), cmp.Or(server.Port(), "5432"), port, filepath.Join(dir, "userlist.txt"), pgbouncerPool(t), pgbouncerPool(t))
	configPath := filepath.Join(dir, "pgbouncer.ini")
	require.NoError(t, os.WriteFile(configPath, []byte(config), 0o644))
	args := []string{configPath}
	if os.Geteuid() == 0 {
		// PgBouncer refuses to run as root.
		account := "postgres"
		if _, err := user.Lookup(account); err != nil {
			account = "nobody"
		}
		args = append([]string{"-u", account}, args...)
	}
	cmd := exec.Command(path, args...)
	var logs syncBuffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("pgbouncer log:\n%s", logs.String())
		}
	})
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	waitFor(t, 10*time.Second, "pgbouncer to listen", func() bool {
		select {
		case <-exited:
			t.Fatalf("pgbouncer exited:\n%s", logs.String())
		default:
		}
		conn, err := net.Dial("tcp", addr)
		if err == nil {
			_ = conn.Close()
		}
		return err == nil
	})
	through := *server
	through.Host = addr
	return withParam(t, through.String(), "pgbouncer", "true")
}

// pgbouncerPool is how many server connections PgBouncer opens to the
// database at most, whatever the number of its clients: twice the
// server's cores, as the README advises (the test's server runs on this
// machine; PgBouncer's own default of 20 put more transactions at once on
// two cores than they can run, and a 60-worker fleet spent more of the
// machine per instance than a 4-worker one), or DAGRUN_E2E_PGBOUNCER_POOL.
func pgbouncerPool(t *testing.T) int {
	t.Helper()
	v := os.Getenv("DAGRUN_E2E_PGBOUNCER_POOL")
	if v == "" {
		return 2 * runtime.NumCPU()
	}
	n, err := strconv.Atoi(v)
	require.NoError(t, err, "DAGRUN_E2E_PGBOUNCER_POOL")
	require.Positive(t, n, "DAGRUN_E2E_PGBOUNCER_POOL")
	return n
}

// withParam returns rawURL with the query parameter name set to value.
func withParam(t *testing.T, rawURL, name, value string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	require.NoError(t, err)
	q := u.Query()
	q.Set(name, value)
	u.RawQuery = q.Encode()
	return u.String()
}

// freePort returns a TCP port of 127.0.0.1 that nothing listened on a
// moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
