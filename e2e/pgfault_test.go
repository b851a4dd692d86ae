package e2e

// PostgreSQL fault tests: the server drops every connection of the worker
// processes again and again while they run steps, as a server restart, a
// failover or an administrator's pg_terminate_backend does. The workers must
// reconnect (pgxpool replaces broken connections, the listener dials again),
// lose no transition and duplicate none, and stay up.
//
// The server itself is not restarted here: it is shared with every other
// test running in parallel. Terminating every backend of the test's
// database is what a restart looks like from the client side (each
// connection fails at its next use or while it waits for a reply), without
// the seconds during which a restarting server refuses new connections.

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// requirePostgres returns a --db value for a fresh PostgreSQL database, or
// skips the test without DAGRUN_TEST_POSTGRES (fails under CI=true).
func requirePostgres(t *testing.T) string {
	t.Helper()
	skipWithoutPostgres(t)
	return newPostgresDB(t)
}

// skipWithoutPostgres skips the test without DAGRUN_TEST_POSTGRES (fails
// it under CI=true).
func skipWithoutPostgres(t *testing.T) {
	t.Helper()
	if os.Getenv("DAGRUN_TEST_POSTGRES") == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("DAGRUN_TEST_POSTGRES is not set; Postgres e2e tests are required under CI=true")
		}
		t.Skip("DAGRUN_TEST_POSTGRES is not set")
	}
}

// TestPGFaultConnectionsKilled runs 40 three-step chains on two workers
// (lease 2s) and, while their steps run, terminates every backend connected
// to the database, every 200ms, at least ten times: pool connections in the
// middle of claims, commits and heartbeats, idle ones, and the listeners.
// Every instance completes, every step has exactly one step.completed
// event, no handler ran more often than its step was claimed, and both
// workers are still up and exit 0 on SIGTERM.
//
// A third worker, restricted to a queue no phase-1 step uses, polls only
// once an hour: afterwards, with the other two stopped, it runs new
// instances promptly, which only its reconnected listener can wake it for.
func TestPGFaultConnectionsKilled(t *testing.T) {
	t.Parallel()
	db := requirePostgres(t)
	const (
		instances   = 40
		concurrency = 8
		minRounds   = 10
		maxRounds   = 30
		every       = 200 * time.Millisecond
	)
	chain := []probeStep{{name: "a"}, {"b", []string{"a"}}, {"c", []string{"b"}}}
	wake := strings.Replace(probeWorkflow("pgwake", chain...), "defaults:\n", "defaults:\n  queue: wake\n", 1)
	probe := newRelProbe(t, 300*time.Millisecond)
	e := newEnv(t, db, map[string]string{
		"pgfault.yaml": probeWorkflow("pgfault", chain...),
		"pgwake.yaml":  wake,
	})
	e.mustRun(t, "validate")

	ctx := context.Background()
	admin, err := pgx.Connect(ctx, os.Getenv("DAGRUN_TEST_POSTGRES"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = admin.Close(context.WithoutCancel(ctx)) })
	u, err := url.Parse(db)
	require.NoError(t, err)
	dbName := strings.TrimPrefix(u.Path, "/")
	listening := func() int {
		var n int
		require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = $1 AND application_name = 'dagrun listener' AND query ILIKE 'LISTEN %'`, dbName).Scan(&n))
		return n
	}

	workers := []*process{
		e.spawnPlain(t, "worker", "--concurrency", fmt.Sprint(concurrency), "--lease", "2s", "--poll", "100ms"),
		e.spawnPlain(t, "worker", "--concurrency", fmt.Sprint(concurrency), "--lease", "2s", "--poll", "100ms"),
	}
	waker := e.spawnPlain(t, "worker", "--queues", "wake", "--lease", "1m", "--poll", "1h")
	t.Cleanup(func() {
		if t.Failed() {
			for _, w := range append(workers, waker) {
				t.Logf("dagrun %v stderr:\n%s", w.args, w.stderr.String())
			}
		}
	})
	waitFor(t, 30*time.Second, "three listeners", func() bool { return listening() == 3 })

	// Hold every step until the first kill, so that the whole run overlaps
	// the faults.
	storm := make(chan struct{})
	probe.setHold(func(relRequest) <-chan struct{} { return storm })
	ids := e.startDetachedMany(t, "pgfault", probe.input(), instances)
	waitFor(t, 30*time.Second, "steps in flight", func() bool { return probe.inFlight() >= 2*concurrency })

	steps := instances * len(chain)
	began := time.Now()
	killed, rounds := 0, 0
	for ; rounds < maxRounds; rounds++ {
		if _, total := probe.snapshot(); rounds >= minRounds && total >= steps {
			break
		}
		var n int
		require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM (
			SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE datname = $1 AND pid <> pg_backend_pid()) k`, dbName).Scan(&n))
		killed += n
		if rounds == 0 {
			close(storm)
		}
		time.Sleep(every)
	}
	stormTook := time.Since(began)
	_, during := probe.snapshot()
	for _, w := range append(workers, waker) {
		require.True(t, w.running(), "dagrun %v exited during the faults (code %d):\n%s", w.args, w.code, w.stderr.String())
	}

	e.waitAllFinished(t, 60*time.Second, instances)
	elapsed := time.Since(began)
	requests, total := probe.snapshot()
	leaseExpired := 0
	for _, id := range ids {
		_, n := requireExactlyOnce(t, e, id, requests)
		leaseExpired += n
	}
	require.Zero(t, duplicateCompletions(t, db))
	require.Equal(t, steps, dbInt(t, db, `SELECT count(*) FROM events WHERE type = 'step.completed'`))
	require.Equal(t, steps, dbInt(t, db, `SELECT count(*) FROM steps WHERE status = 'completed'`))
	errorLines := 0
	for _, w := range append(workers, waker) {
		errorLines += strings.Count(w.stderr.String(), "level=ERROR") + strings.Count(w.stderr.String(), "level=WARN")
	}
	t.Logf("%d rounds of pg_terminate_backend over %s (%d backends terminated; %d of %d steps had reached the handler by the last); "+
		"%d instances done in %s; %d handler executions for %d steps, %d expired leases; %d error/warning log lines",
		rounds, stormTook.Round(time.Millisecond), killed, during, steps, instances, elapsed.Round(time.Millisecond),
		total, steps, leaseExpired, errorLines)

	for _, w := range workers {
		w.stop(t)
	}

	// Only the listener can wake the remaining worker now: its poll is an
	// hour and its lease recovery ticks every 30s.
	waitFor(t, 15*time.Second, "the listener to be connected again", func() bool { return listening() == 1 })
	probe.setHold(nil)
	wakeBegan := time.Now()
	wakeIDs := e.startDetachedMany(t, "pgwake", probe.input(), 2)
	// The wait covers the CLI's own start-ups (race-built, beside other
	// tests); how soon the worker woke is read from the database below.
	e.waitAllFinished(t, 25*time.Second, instances+len(wakeIDs))
	requests, _ = probe.snapshot()
	for _, id := range wakeIDs {
		requireExactlyOnce(t, e, id, requests)
	}
	// Each first step started within seconds of its instance's creation:
	// woken by the listener, not by a lease recovery tick.
	wokeMs := dbInt(t, db, `SELECT max(extract(epoch FROM s.first_started_at - i.created_at) * 1000)::int
		FROM instances i JOIN steps s ON s.instance_id = i.id WHERE i.workflow = 'pgwake' AND s.name = 'a'`)
	require.Less(t, wokeMs, 5000, "ms from an instance's creation to its first step's start on the idle worker")
	t.Logf("after the faults, the listener woke the idle worker: first steps started at most %d ms after their instances were created; %d instances done in %s",
		wokeMs, len(wakeIDs), time.Since(wakeBegan).Round(time.Millisecond))
	waker.stop(t)
}

// roleDB creates a login role limited to limit connections at once and a
// fresh database it owns, both dropped after the test, and returns the
// database's URL as the role and as the test's superuser.
func roleDB(t *testing.T, limit int) (asRole, asAdmin, role string) {
	t.Helper()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, os.Getenv("DAGRUN_TEST_POSTGRES"))
	require.NoError(t, err)
	role = fmt.Sprintf("dagrun_e2e_role_%d", time.Now().UnixNano())
	_, err = admin.Exec(ctx, fmt.Sprintf("CREATE ROLE %s LOGIN CONNECTION LIMIT %d", role, limit))
	require.NoError(t, err)
	// Registered before the database's cleanup, so it runs after it.
	t.Cleanup(func() {
		ctx := context.WithoutCancel(ctx)
		_, _ = admin.Exec(ctx, "DROP ROLE IF EXISTS "+role)
		_ = admin.Close(ctx)
	})
	asAdmin = newPostgresDB(t)
	u, err := url.Parse(asAdmin)
	require.NoError(t, err)
	_, err = admin.Exec(ctx, "ALTER DATABASE "+strings.TrimPrefix(u.Path, "/")+" OWNER TO "+role)
	require.NoError(t, err)
	u.User = url.User(role)
	return u.String(), asAdmin, role
}

// TestPGFaultConnectionsRefused: a server with no connection slot left.
// A worker that cannot get its first connection exits 3 with one line
// that names the problem and the ways out. A running worker whose
// connections are cut while the server refuses new ones stays up, retries
// at a bounded, jittered pace instead of in a storm, and once it is let
// back in runs the instances started meanwhile, each step once.
//
// The role's CONNECTION LIMIT stands in for max_connections: the same
// SQLSTATE 53300, without filling a server other tests share.
func TestPGFaultConnectionsRefused(t *testing.T) {
	t.Parallel()
	skipWithoutPostgres(t)
	db, adminDB, role := roleDB(t, 2) // a worker's pool connection and its listener
	e := newEnv(t, db, map[string]string{"refused.yaml": echoNoop("refused")})
	operator := *e
	operator.db = adminDB // a superuser, whom the role's limit does not bind
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, adminDB)
	require.NoError(t, err)
	t.Cleanup(func() { _ = admin.Close(context.WithoutCancel(ctx)) })
	setLimit := func(n int) {
		t.Helper()
		_, err := admin.Exec(ctx, fmt.Sprintf("ALTER ROLE %s CONNECTION LIMIT %d", role, n))
		require.NoError(t, err)
	}
	connected := func() int {
		var n int
		require.NoError(t, admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE usename = $1", role).Scan(&n))
		return n
	}

	e.mustRun(t, "list") // migrates, as the role
	setLimit(0)
	refused := e.run(t, "worker")
	require.Equal(t, 3, refused.code, "stderr:\n%s", refused.stderr)
	line := strings.TrimSpace(refused.stderr)
	require.NotContains(t, line, "\n", "one line")
	for _, want := range []string{"dagrun: storage unavailable: ", `too many connections for role "` + role + `"`, "run fewer workers", "pool_max_conns=N", "pgbouncer=true"} {
		require.Contains(t, line, want)
	}

	setLimit(2)
	worker := e.spawnPlain(t, "worker", "--concurrency", "4")
	waitFor(t, 30*time.Second, "the worker's pool connection and listener", func() bool { return connected() == 2 })

	// Cut its connections while no new one is allowed, and start work
	// meanwhile.
	setLimit(0)
	require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM (SELECT pg_terminate_backend(pid)
		FROM pg_stat_activity WHERE usename = $1) k`, role).Scan(new(int)))
	before := strings.Count(worker.stderr.String(), "SQLSTATE 53300")
	ids := operator.startDetachedMany(t, "refused", `{"n": 1}`, 5)
	const outage = 4 * time.Second
	time.Sleep(outage)
	require.True(t, worker.running(), "the worker exited while refused (code %d):\n%s", worker.code, worker.stderr.String())
	attempts := strings.Count(worker.stderr.String(), "SQLSTATE 53300") - before
	t.Logf("%d refused connection attempts logged in %s", attempts, outage)
	require.Positive(t, attempts, "the worker never tried to reconnect")
	// Doubling from 50ms (claims) and 100ms (the listener) to 5s, each
	// wait drawn from its upper half: about a dozen tries in all; a loop
	// without backoff would make hundreds.
	require.Less(t, attempts, 30, "the worker retried in a storm:\n%s", worker.stderr.String())

	setLimit(2)
	operator.waitAllFinished(t, 30*time.Second, len(ids))
	for _, id := range ids {
		inst := operator.status(t, id)
		require.Equal(t, "completed", inst.Status)
		for _, s := range inst.Steps {
			require.Equal(t, 1, s.Attempts, "step %s of %s", s.Name, id)
		}
	}
	require.Zero(t, duplicateCompletions(t, adminDB))
	waitFor(t, 30*time.Second, "the listener to be back", func() bool { return connected() == 2 })
	worker.stop(t)
}
