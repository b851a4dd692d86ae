package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// defaultLoadInstances is how many instances TestLoad runs per backend
// under go test. DAGRUN_LOAD_INSTANCES overrides it; the figures in the
// README are from DAGRUN_LOAD_INSTANCES=10000.
const defaultLoadInstances = 1000

// enqueue starts n instances of workflow through the HTTP API of a
// `dagrun serve`, parallel requests at a time, and returns the IDs the API
// acknowledged (201 Created).
func enqueue(t *testing.T, base, workflow string, n, parallel int) []string {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: parallel}, Timeout: time.Minute}
	ids := make([]string, n)
	errs := make(chan error, parallel)
	next := make(chan int)
	var wg sync.WaitGroup
	for range parallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				resp, err := client.Post(base+"/api/workflows/"+workflow+"/instances", "application/json",
					strings.NewReader(fmt.Sprintf(`{"input": {"n": %d}}`, i)))
				if err != nil {
					errs <- err
					return
				}
				var inst instance
				err = json.NewDecoder(resp.Body).Decode(&inst)
				resp.Body.Close()
				if err != nil || resp.StatusCode != http.StatusCreated {
					errs <- fmt.Errorf("start %d: status %d, %v", i, resp.StatusCode, err)
					return
				}
				ids[i] = inst.ID
			}
		}()
	}
feed:
	for i := range n {
		select {
		case next <- i:
		case err := <-errs:
			close(next)
			wg.Wait()
			require.NoError(t, err)
			break feed
		}
	}
	close(next)
	wg.Wait()
	select {
	case err := <-errs:
		require.NoError(t, err)
	default:
	}
	return ids
}

// TestLoad runs many two-step instances (echo, then noop) on four worker
// processes per backend, built without the race detector, and checks that
// none is lost, no step completes twice, no process ever reports its
// database locked, and reports the time and the workers' peak RSS. Instances
// are started through `dagrun serve` while the workers run. Run the full
// measurement with
//
//	DAGRUN_LOAD_INSTANCES=10000 go test ./e2e -run TestLoad -v
func TestLoad(t *testing.T) {
	t.Parallel()
	n := defaultLoadInstances
	if v := os.Getenv("DAGRUN_LOAD_INSTANCES"); v != "" {
		var err error
		n, err = strconv.Atoi(v)
		require.NoError(t, err, "DAGRUN_LOAD_INSTANCES")
		require.Positive(t, n, "DAGRUN_LOAD_INSTANCES")
	}
	bin := plainBinary
	// The backends run one after the other, so that each one's figures
	// are its own.
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			runLoad(t, bin, b.newDB(t), n)
		})
	}
}

// echoNoop is the load workflows' YAML: echo the input's n, then a noop.
func echoNoop(name string) string {
	return "name: " + name + `
steps:
  - {name: a, handler: echo, input: {n: "${{ input.n }}"}}
  - {name: b, handler: noop, dependsOn: [a]}
`
}

func runLoad(t *testing.T, bin, db string, n int) {
	const (
		workers     = 4
		concurrency = 10
	)
	e := newEnv(t, db, map[string]string{"load.yaml": echoNoop("load")})
	e.mustRun(t, "list") // creates the schema before the processes start

	var procs []*process
	for range workers {
		procs = append(procs, e.spawnBinary(t, bin, "worker", "--concurrency", strconv.Itoa(concurrency), "--poll", "200ms"))
	}
	server, base := e.serveAPI(t, bin)
	began := time.Now()
	ids := enqueue(t, base, "load", n, 16)
	enqueued := time.Since(began)
	completed := 0
	waitFor(t, time.Duration(n)*20*time.Millisecond+time.Minute, fmt.Sprintf("%d instances to complete", n), func() bool {
		st := e.statsOf(t, "load")
		completed = st.Instances["completed"]
		require.Zero(t, st.Instances["failed"]+st.Instances["cancelled"], "instances failed: %+v", st)
		return completed >= n
	})
	elapsed := time.Since(began)
	var peak int64
	rss := make([]string, 0, workers)
	for _, p := range procs {
		p.stop(t)
		peak = max(peak, p.peakRSSKiB())
		rss = append(rss, fmt.Sprintf("%.1f", float64(p.peakRSSKiB())/1024))
	}
	server.stop(t)

	// Zero lost: every acknowledged start is there, completed, each step
	// run by one attempt.
	res := e.mustRun(t, "list", "--json", "--limit", strconv.Itoa(n+100))
	var list []instance
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &list))
	require.Len(t, list, n)
	byID := make(map[string]instance, n)
	for _, inst := range list {
		byID[inst.ID] = inst
	}
	lost, retried := 0, 0
	for _, id := range ids {
		inst, ok := byID[id]
		if !ok || inst.Status != "completed" {
			lost++
			continue
		}
		for _, s := range inst.Steps {
			if s.Status != "completed" || s.Attempts != 1 {
				retried++
			}
		}
	}
	// Zero duplicated transitions: one step.completed per step.
	completions := dbInt(t, db, `SELECT count(*) FROM events WHERE type = 'step.completed'`)
	duplicates := duplicateCompletions(t, db)
	locked := 0
	for _, p := range append(procs, server) {
		// SQLite's "database is locked", and dagrun's own words for it.
		locked += strings.Count(p.stderr.String(), " is locked")
		require.NotContains(t, p.stderr.String(), "level=ERROR", "dagrun %v logged an error", p.args)
	}
	t.Logf("instances=%d steps=%d workers=%dx%d enqueue_s=%.1f total_s=%.1f instances_per_s=%.0f steps_per_s=%.0f lost=%d duplicates=%d retried_steps=%d locked=%d peak_rss_mib=%s",
		n, 2*n, workers, concurrency, enqueued.Seconds(), elapsed.Seconds(), float64(n)/elapsed.Seconds(), float64(2*n)/elapsed.Seconds(),
		lost, duplicates, retried, locked, strings.Join(rss, "/"))
	require.Zero(t, lost, "lost instances")
	require.Zero(t, duplicates, "steps completed twice")
	require.Equal(t, 2*n, completions)
	require.Zero(t, retried, "steps that needed more than one attempt")
	require.Zero(t, locked, `"is locked" in a process's stderr`)
	require.Less(t, peak, int64(512*1024), "a worker's peak RSS (a guard against runaway growth, not a budget)")
}
