package e2e

// Crash tests: dagrun processes are SIGKILLed in the middle of steps and of
// writes, as a power cut, an OOM kill or `kill -9` would do, and the tests
// check what the README's Guarantees section promises: every instance still completes, every step
// is completed exactly once in storage, handlers run again only for the
// steps the dead process held, and a SQLite file stays sound.
//
// Handlers are observed from outside the processes: the steps use the
// built-in http handler against a relProbe server in the test process,
// which counts every request per instance and step, and can hold requests
// to keep steps mid-flight.

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	_ "github.com/mattn/go-sqlite3" // to check SQLite files after crashes
	"github.com/stretchr/testify/require"
)

var serveListening = regexp.MustCompile(`url=(http://127\.0\.0\.1:\d+)/`)

// serveAPI starts `dagrun serve` (no worker unless args say --worker) on
// a free loopback port and returns the process and its base URL.
func (e *env) serveAPI(t *testing.T, bin string, args ...string) (*process, string) {
	t.Helper()
	p := e.spawnBinary(t, bin, append([]string{"serve", "--addr", "127.0.0.1:0"}, args...)...)
	var base string
	waitFor(t, 30*time.Second, "dagrun serve to listen", func() bool {
		if m := serveListening.FindStringSubmatch(p.stderr.String()); m != nil {
			base = m[1]
			return true
		}
		require.True(t, p.running(), "dagrun serve exited:\n%s", p.stderr.String())
		return false
	})
	return p, base
}

// relRequest is one request the probe received.
type relRequest struct {
	Key string // instance/step
	N   int    // how many requests this key has had, this one included
	Seq int    // how many requests the probe has had, this one included
}

// relProbe is the HTTP server the test workflows' steps call. It counts
// requests per instance and step, can delay or hold them, and answers
// {"seq": N, "n": N, "key": "..."} so that outputs tell which execution
// produced them.
type relProbe struct {
	srv      *httptest.Server
	delay    time.Duration
	arrivals chan relRequest
	closed   chan struct{}

	mu       sync.Mutex
	seq      int
	counts   map[string]int
	inflight int
	// hold, when set, returns a channel to wait on before answering a
	// request (nil answers at once).
	hold func(r relRequest) <-chan struct{}
}

func newRelProbe(t *testing.T, delay time.Duration) *relProbe {
	t.Helper()
	p := &relProbe{delay: delay, arrivals: make(chan relRequest, 100000), closed: make(chan struct{}), counts: map[string]int{}}
	p.srv = httptest.NewServer(http.HandlerFunc(p.serve))
	t.Cleanup(func() {
		close(p.closed)
		p.srv.Close()
	})
	return p
}

func (p *relProbe) serve(w http.ResponseWriter, r *http.Request) {
	var body struct {
		ID   string `json:"id"`
		Step string `json:"step"`
	}
	data, _ := io.ReadAll(r.Body)
	if err := json.Unmarshal(data, &body); err != nil || body.ID == "" {
		http.Error(w, "want a JSON body with id and step", http.StatusBadRequest)
		return
	}
	p.mu.Lock()
	p.seq++
	p.counts[body.ID+"/"+body.Step]++
	req := relRequest{Key: body.ID + "/" + body.Step, N: p.counts[body.ID+"/"+body.Step], Seq: p.seq}
	p.inflight++
	hold := p.hold
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.inflight--
		p.mu.Unlock()
	}()
	select {
	case p.arrivals <- req:
	default:
	}
	if hold != nil {
		if ch := hold(req); ch != nil {
			select {
			case <-ch:
			case <-r.Context().Done(): // the caller died
				return
			case <-p.closed:
				return
			}
		}
	}
	if p.delay > 0 {
		select {
		case <-time.After(p.delay):
		case <-r.Context().Done():
			return
		case <-p.closed:
			return
		}
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"seq": %d, "n": %d, "key": %q}`, req.Seq, req.N, req.Key)
}

func (p *relProbe) setHold(hold func(r relRequest) <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.hold = hold
}

// snapshot returns the request count per key and in total.
func (p *relProbe) snapshot() (map[string]int, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]int, len(p.counts))
	for k, v := range p.counts {
		out[k] = v
	}
	return out, p.seq
}

func (p *relProbe) inFlight() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.inflight
}

// next waits for the next request the probe receives.
func (p *relProbe) next(t *testing.T, timeout time.Duration, what string) relRequest {
	t.Helper()
	select {
	case r := <-p.arrivals:
		return r
	case <-time.After(timeout):
		t.Fatalf("timed out after %s waiting for %s", timeout, what)
	}
	return relRequest{}
}

// input is a start input pointing the steps at the probe.
func (p *relProbe) input() string { return fmt.Sprintf(`{"url": %q}`, p.srv.URL) }

// probeStep is one step of a probe workflow.
type probeStep struct {
	name      string
	dependsOn []string
}

// probeWorkflow is a workflow whose every step POSTs {"id", "step"} to the
// probe. Failed attempts (an expired lease counts as one) retry quickly.
func probeWorkflow(name string, steps ...probeStep) string {
	var b strings.Builder
	fmt.Fprintf(&b, `name: %s
input:
  type: object
  required: [url]
defaults:
  retry: {maxAttempts: 50, backoff: 50ms, maxBackoff: 200ms}
steps:
`, name)
	for _, s := range steps {
		fmt.Fprintf(&b, "  - name: %s\n    handler: http\n", s.name)
		if len(s.dependsOn) > 0 {
			fmt.Fprintf(&b, "    dependsOn: [%s]\n", strings.Join(s.dependsOn, ", "))
		}
		fmt.Fprintf(&b, `    input:
      method: POST
      url: ${{ input.url }}
      body:
        id: ${{ workflow.id }}
        step: %s
`, s.name)
	}
	last := steps[len(steps)-1].name
	fmt.Fprintf(&b, "output:\n  seq: ${{ steps.%s.output.body.seq }}\n", last)
	return b.String()
}

// diamond is a -> (b, c) -> d.
var diamond = []probeStep{{name: "a"}, {"b", []string{"a"}}, {"c", []string{"a"}}, {"d", []string{"b", "c"}}}

// startDetachedMany starts n instances with --detach, a few at a time, and
// returns their IDs.
func (e *env) startDetachedMany(t *testing.T, workflow, input string, n int) []string {
	t.Helper()
	ids := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4)
	for i := range ids {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cmd := e.command(ctx, "start", workflow, "--input", input, "--detach")
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				errs[i] = fmt.Errorf("start --detach: %v: %s", err, stderr.String())
				return
			}
			ids[i] = strings.TrimSpace(string(out))
		}()
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	return ids
}

// waitAllFinished polls `list --json` until every instance is finished.
func (e *env) waitAllFinished(t *testing.T, timeout time.Duration, n int) []instance {
	t.Helper()
	var list []instance
	waitFor(t, timeout, fmt.Sprintf("%d instances to finish", n), func() bool {
		res := e.mustRun(t, "list", "--json", "--limit", fmt.Sprint(n+10))
		list = nil
		require.NoError(t, json.Unmarshal([]byte(res.stdout), &list))
		if len(list) < n {
			return false
		}
		for _, inst := range list {
			switch inst.Status {
			case "completed", "failed", "cancelled":
			default:
				return false
			}
		}
		return true
	})
	return list
}

// requireExactlyOnce checks an instance's status --json: completed, every
// step completed with exactly one step.completed event, and never more
// handler executions (probe requests) than claimed attempts. It returns the
// instance and how many step.lease_expired events it has.
func requireExactlyOnce(t *testing.T, e *env, id string, requests map[string]int) (instance, int) {
	t.Helper()
	inst := e.status(t, id)
	require.Equal(t, "completed", inst.Status, "instance %s: %+v", id, inst)
	completed := map[string]int{}
	expired := 0
	for _, ev := range inst.Events {
		switch ev.Type {
		case "step.completed":
			completed[ev.Step]++
		case "step.lease_expired":
			expired++
		}
	}
	for _, s := range inst.Steps {
		require.Equal(t, "completed", s.Status, "instance %s step %s", id, s.Name)
		require.Equal(t, 1, completed[s.Name], "instance %s step %s: step.completed events", id, s.Name)
		if requests != nil {
			n := requests[id+"/"+s.Name]
			require.GreaterOrEqual(t, n, 1, "instance %s step %s never reached the handler", id, s.Name)
			require.LessOrEqual(t, n, s.Attempts, "instance %s step %s: more executions than attempts", id, s.Name)
		}
	}
	return inst, expired
}

// TestCrashWorkersKilledMidStep runs diamond workflows on three worker
// processes and SIGKILLs a worker three times while steps are in flight,
// starting a replacement each time. Every instance completes, every step
// is completed exactly once in storage, and the handler executions beyond
// one per step are bounded by the slots the killed workers held.
func TestCrashWorkersKilledMidStep(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, db string) {
		const (
			instances   = 30
			concurrency = 4
			kills       = 3
		)
		probe := newRelProbe(t, 250*time.Millisecond)
		e := newEnv(t, db, map[string]string{"crash.yaml": probeWorkflow("crash", diamond...)})
		e.mustRun(t, "validate")
		workerArgs := []string{"worker", "--concurrency", fmt.Sprint(concurrency), "--lease", "1s", "--poll", "100ms"}
		var workers []*process
		for range 3 {
			workers = append(workers, e.spawnPlain(t, workerArgs...))
		}
		ids := e.startDetachedMany(t, "crash", probe.input(), instances)
		began := time.Now()

		// Kill the oldest live worker while requests are in flight, once a
		// quarter, a half and three quarters of the steps have started, and
		// start a replacement at once.
		steps := instances * len(diamond)
		for k := range kills {
			waitFor(t, 60*time.Second, "steps in flight", func() bool {
				_, total := probe.snapshot()
				return total >= (k+1)*steps/(kills+1) && probe.inFlight() > 0
			})
			victim := workers[k]
			t.Logf("kill %d: SIGKILL worker pid %d with %d requests in flight at the probe", k+1, victim.pid(), probe.inFlight())
			victim.kill(t)
			workers = append(workers, e.spawnPlain(t, workerArgs...))
		}

		e.waitAllFinished(t, 90*time.Second, instances)
		elapsed := time.Since(began)
		requests, total := probe.snapshot()
		leaseExpired := 0
		for _, id := range ids {
			_, n := requireExactlyOnce(t, e, id, requests)
			leaseExpired += n
		}
		reexecutions := total - steps
		t.Logf("%d instances, %d steps, %d kills, %d handler executions, %d re-executions (bound %d), %d expired leases, %s",
			instances, steps, kills, total, reexecutions, kills*concurrency, leaseExpired, elapsed.Round(time.Millisecond))
		require.LessOrEqual(t, reexecutions, kills*concurrency, "re-executions beyond the slots the killed workers held")
		require.LessOrEqual(t, leaseExpired, kills*concurrency, "expired leases beyond the slots the killed workers held")
		require.Positive(t, leaseExpired, "no kill hit a running step")
		for _, w := range workers[kills:] {
			w.stop(t)
		}
	})
}

// TestCrashStartFollowerKilled SIGKILLs a `dagrun start` while its
// in-process worker runs the instance's step. The instance lives on in the
// database: once the dead follower's lease (10s, see followLease) expires, a
// worker runs the step again and finishes the instance.
func TestCrashStartFollowerKilled(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, db string) {
		probe := newRelProbe(t, 0)
		release := make(chan struct{})
		// The first execution of each step waits until the follower is dead.
		probe.setHold(func(r relRequest) <-chan struct{} {
			if r.N == 1 {
				return release
			}
			return nil
		})
		e := newEnv(t, db, map[string]string{"follow.yaml": probeWorkflow("follow", probeStep{name: "a"}, probeStep{"b", []string{"a"}})})
		start := e.spawnPlain(t, "start", "follow", "--input", probe.input())
		first := probe.next(t, 30*time.Second, "the follower to run step a")
		id := strings.TrimSuffix(first.Key, "/a")
		start.kill(t)
		close(release)
		require.Empty(t, start.stdout.String(), "a killed start prints no output")

		worker := e.spawnPlain(t, "worker", "--lease", "1s", "--poll", "100ms")
		began := time.Now()
		waitFor(t, 60*time.Second, "a worker to finish the instance", func() bool {
			return e.status(t, id).Status == "completed"
		})
		t.Logf("instance finished by a worker %s after the follower was killed", time.Since(began).Round(100*time.Millisecond))
		requests, _ := probe.snapshot()
		inst, expired := requireExactlyOnce(t, e, id, requests)
		require.Equal(t, 1, expired, "the follower's claim expired once")
		require.Equal(t, 2, requests[id+"/a"], "step a ran again after the follower died")
		require.Equal(t, 1, requests[id+"/b"])
		require.Equal(t, 2, inst.Steps[inst.step(t, "a")].Attempts)
		worker.stop(t)
	})
}

// TestCrashSQLiteIntegrity SIGKILLs a worker and the API server (the
// process that starts instances) again and again while they write to one
// SQLite file. Afterwards the file passes PRAGMA integrity_check, every
// start the API acknowledged is there, and every instance completes with
// each step completed exactly once.
func TestCrashSQLiteIntegrity(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := dir + "/dagrun.db"
	e := newEnv(t, path, map[string]string{"quick.yaml": `name: quick
defaults:
  retry: {maxAttempts: 20, backoff: 10ms}
steps:
  - {name: a, handler: echo, input: {n: "${{ input.n }}"}}
  - {name: b, handler: echo, dependsOn: [a], input: {n: "${{ steps.a.output.n }}"}}
  - {name: c, handler: noop, dependsOn: [b]}
`})
	workerArgs := []string{"worker", "--concurrency", "8", "--lease", "1s", "--poll", "50ms"}
	worker := e.spawnPlain(t, workerArgs...)
	server, base := e.serveAPI(t, binary)

	// Four clients start instances through the API until told to stop.
	var (
		mu       sync.Mutex
		acked    []string
		refused  int
		baseURL  = base
		stop     = make(chan struct{})
		clientWG sync.WaitGroup
	)
	client := &http.Client{Timeout: 10 * time.Second}
	for c := range 4 {
		clientWG.Add(1)
		go func() {
			defer clientWG.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				mu.Lock()
				url := baseURL
				mu.Unlock()
				resp, err := client.Post(url+"/api/workflows/quick/instances", "application/json",
					strings.NewReader(fmt.Sprintf(`{"input": {"n": %d}}`, c*100000+i)))
				if err != nil {
					mu.Lock()
					refused++
					mu.Unlock()
					time.Sleep(20 * time.Millisecond)
					continue
				}
				var inst instance
				err = json.NewDecoder(resp.Body).Decode(&inst)
				resp.Body.Close()
				mu.Lock()
				if err == nil && resp.StatusCode == http.StatusCreated {
					acked = append(acked, inst.ID)
				} else {
					refused++
				}
				mu.Unlock()
			}
		}()
	}

	const rounds = 6
	for k := range rounds {
		time.Sleep(time.Duration(200+50*k) * time.Millisecond)
		worker.kill(t)
		worker = e.spawnPlain(t, workerArgs...)
		if k%2 == 1 {
			server.kill(t)
			var next string
			server, next = e.serveAPI(t, binary)
			mu.Lock()
			baseURL = next
			mu.Unlock()
		}
	}
	close(stop)
	clientWG.Wait()
	server.stop(t)
	mu.Lock()
	t.Logf("%d rounds of SIGKILL (worker each round, API server every other); %d starts acknowledged, %d refused or cut", rounds, len(acked), refused)
	require.NotEmpty(t, acked)
	mu.Unlock()

	waitFor(t, 60*time.Second, "every instance to complete", func() bool {
		return sqliteInt(t, path, `SELECT count(*) FROM instances WHERE status <> 'completed'`) == 0
	})
	worker.stop(t)

	var check string
	require.NoError(t, openSQLite(t, path).QueryRow(`PRAGMA integrity_check`).Scan(&check))
	require.Equal(t, "ok", check)
	require.Zero(t, sqliteInt(t, path, `SELECT count(*) FROM pragma_foreign_key_check`))
	all := sqliteInt(t, path, `SELECT count(*) FROM instances`)
	require.GreaterOrEqual(t, all, len(acked), "acknowledged starts are missing")
	for _, id := range acked {
		require.Equal(t, 1, sqliteInt(t, path, `SELECT count(*) FROM instances WHERE status = 'completed' AND id = '`+id+`'`), "acknowledged instance %s", id)
	}
	require.Equal(t, 3*all, sqliteInt(t, path, `SELECT count(*) FROM steps WHERE status = 'completed'`))
	require.Equal(t, 3*all, sqliteInt(t, path, `SELECT count(*) FROM events WHERE type = 'step.completed'`), "a step completed twice")
	require.Zero(t, duplicateCompletions(t, path))
	t.Logf("integrity_check ok; %d instances, all completed once", all)
}

// duplicatesQuery counts steps with more than one step.completed event.
const duplicatesQuery = `SELECT count(*) FROM (SELECT instance_id, step FROM events WHERE type = 'step.completed'
	GROUP BY instance_id, step HAVING count(*) > 1) d`

func duplicateCompletions(t *testing.T, db string) int { return dbInt(t, db, duplicatesQuery) }

// openSQLite opens a dagrun SQLite file directly, as an operator would with
// the sqlite3 shell.
func openSQLite(t *testing.T, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite3", "file:"+path+"?_busy_timeout=10000")
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func sqliteInt(t *testing.T, path, query string) int {
	t.Helper()
	db, err := sql.Open("sqlite3", "file:"+path+"?_busy_timeout=10000")
	require.NoError(t, err)
	defer db.Close()
	var n int
	require.NoError(t, db.QueryRow(query).Scan(&n), query)
	return n
}

// dbInt runs a query returning one integer on either backend (--db value).
func dbInt(t *testing.T, db, query string) int {
	t.Helper()
	n, err := dbIntErr(db, query)
	require.NoError(t, err, query)
	return n
}

// dbIntErr is dbInt for a goroutine other than the test's.
func dbIntErr(db, query string) (int, error) {
	var n int
	if !strings.HasPrefix(db, "postgres") {
		conn, err := sql.Open("sqlite3", "file:"+strings.TrimPrefix(db, "sqlite:")+"?_busy_timeout=10000")
		if err != nil {
			return 0, err
		}
		defer conn.Close()
		return n, conn.QueryRow(query).Scan(&n)
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, db)
	if err != nil {
		return 0, err
	}
	defer conn.Close(ctx)
	// dagrun's tables live in their own schema.
	if _, err := conn.Exec(ctx, "SET search_path TO dagrun"); err != nil {
		return 0, err
	}
	return n, conn.QueryRow(ctx, query).Scan(&n)
}
