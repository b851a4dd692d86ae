package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// soakWorkflow is a bit of everything a long-running worker does: a
// forEach step with an item cap, a child workflow, a wait step that
// half the instances get a signal for and the rest time out of, and a
// condition.
const soakWorkflow = `name: soak
steps:
  - {name: a, handler: echo, input: {n: "${{ input.n }}", items: [1, 2, 3]}}
  - name: fan
    dependsOn: [a]
    forEach: ${{ steps.a.output.items }}
    concurrency: 2
    handler: echo
    input: {i: "${{ item }}"}
  - {name: child, workflow: soak-child, dependsOn: [a], input: {n: "${{ input.n }}"}}
  - {name: w, dependsOn: [a], wait: {signal: go, timeout: 300ms}, continueOnError: true}
  - {name: z, handler: noop, dependsOn: [fan, child, w], when: "${{ input.n % 7 != 0 }}"}
`

const soakChildWorkflow = `name: soak-child
steps:
  - {name: x, handler: echo, input: {n: "${{ input.n }}"}}
  - {name: y, handler: noop, dependsOn: [x], retry: {maxAttempts: 2, backoff: 1ms}}
`

// TestSoak feeds one `dagrun serve --worker` a steady stream of soak
// instances through the HTTP API, signalling every other one, and then
// requires every instance to have completed, no request to have failed
// and the server to have logged no error. It logs one line of figures per
// backend: the server's CPU per instance and its heap target
// (go_memstats_next_gc_bytes) after the first minute and at the end,
// which a leak shows as growth. CI runs the race-built binary for 10
// seconds at 20 instances a second; DAGRUN_E2E_SOAK sets how long (a
// duration; the plain build, at 50 a second), DAGRUN_E2E_SOAK_RATE the
// instances a second:
//
//	DAGRUN_E2E_NORACE=1 DAGRUN_E2E_SOAK=10m go test -count=1 ./e2e -run TestSoak -v -timeout 30m
func TestSoak(t *testing.T) {
	t.Parallel()
	// By default, CI's: a short run of the race-built binary beside the
	// other e2e tests, for the races of a mixed workload; a soak set by
	// the environment measures the plain build.
	bin, length, rate := binary, 10*time.Second, 20
	if v := os.Getenv("DAGRUN_E2E_SOAK"); v != "" {
		d, err := time.ParseDuration(v)
		require.NoError(t, err, "DAGRUN_E2E_SOAK")
		bin, length, rate = plainBinary, d, 50
	}
	if v := os.Getenv("DAGRUN_E2E_SOAK_RATE"); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err, "DAGRUN_E2E_SOAK_RATE")
		rate = n
	}
	forEachBackend(t, func(t *testing.T, db string) {
		runSoak(t, bin, db, length, rate)
	})
}

func runSoak(t *testing.T, bin, db string, length time.Duration, rate int) {
	backend := "sqlite"
	if strings.HasPrefix(db, "postgres") {
		backend = "postgres"
	}
	e := newEnv(t, db, map[string]string{"soak.yaml": soakWorkflow, "soak-child.yaml": soakChildWorkflow})
	server, base := e.serveAPI(t, bin, "--worker")
	client := &http.Client{Timeout: 30 * time.Second}

	var (
		started, signalled atomic.Int64
		failures           sync.Map // request -> error
		wg                 sync.WaitGroup
	)
	post := func(path, body string, want int) (*http.Response, error) {
		resp, err := client.Post(base+path, "application/json", strings.NewReader(body))
		if err != nil {
			return nil, err
		}
		if resp.StatusCode != want {
			resp.Body.Close()
			return nil, fmt.Errorf("POST %s: status %d", path, resp.StatusCode)
		}
		return resp, nil
	}
	startOne := func(n int) {
		defer wg.Done()
		resp, err := post("/api/workflows/soak/instances", fmt.Sprintf(`{"input": {"n": %d}}`, n), http.StatusCreated)
		if err != nil {
			failures.Store(fmt.Sprint("start ", n), err)
			return
		}
		var inst instance
		err = json.NewDecoder(resp.Body).Decode(&inst)
		resp.Body.Close()
		if err != nil {
			failures.Store(fmt.Sprint("start ", n), err)
			return
		}
		started.Add(1)
		if n%2 == 1 {
			return
		}
		time.Sleep(50 * time.Millisecond)
		// The wait may already have timed out on a loaded machine: a
		// conflict is an answer too.
		resp, err = client.Post(base+"/api/instances/"+inst.ID+"/signals/go", "application/json", strings.NewReader(`{"data": 1}`))
		if err != nil {
			failures.Store(fmt.Sprint("signal ", n), err)
			return
		}
		resp.Body.Close()
		if resp.StatusCode < 300 {
			signalled.Add(1)
		} else if resp.StatusCode != http.StatusConflict {
			failures.Store(fmt.Sprint("signal ", n), fmt.Errorf("status %d", resp.StatusCode))
		}
	}

	began := time.Now()
	cpuBefore, _ := processCPU(t, server.pid())
	var heapAfterAMinute float64
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	n := 0
	for time.Since(began) < length {
		<-tick.C
		n++
		wg.Add(1)
		go startOne(n)
		if heapAfterAMinute == 0 && time.Since(began) > time.Minute {
			heapAfterAMinute = soakMetric(t, client, base, "go_memstats_next_gc_bytes")
		}
	}
	wg.Wait()
	failures.Range(func(k, v any) bool {
		t.Errorf("%s: %v", k, v)
		return true
	})
	require.Equal(t, int64(n), started.Load(), "instances started")

	total := int(started.Load())
	waitFor(t, 2*time.Minute, "every soak instance to finish", func() bool {
		return dbInt(t, db, `SELECT count(*) FROM instances WHERE workflow = 'soak' AND status IN ('completed', 'failed', 'cancelled')`) == total
	})
	elapsed := time.Since(began)
	require.Equal(t, total, dbInt(t, db, `SELECT count(*) FROM instances WHERE workflow = 'soak' AND status = 'completed'`),
		"every soak instance completes")
	cpuAfter, _ := processCPU(t, server.pid())
	heapAtEnd := soakMetric(t, client, base, "go_memstats_next_gc_bytes")
	rss := soakMetric(t, client, base, "process_resident_memory_bytes")
	require.NotContains(t, server.stderr.String(), "level=ERROR", "the server logged an error")
	server.stop(t)

	t.Logf("soak backend=%s seconds=%.0f rate=%d instances=%d signalled=%d cpu_ms_per_instance=%.2f next_gc_mb_after_1m=%.0f next_gc_mb_at_end=%.0f rss_mb=%.0f",
		backend, elapsed.Seconds(), rate, total, signalled.Load(), float64((cpuAfter-cpuBefore).Microseconds())/1000/float64(total),
		heapAfterAMinute/1e6, heapAtEnd/1e6, rss/1e6)
}

// soakMetric reads one unlabelled metric of the server's /metrics.
func soakMetric(t *testing.T, client *http.Client, base, name string) float64 {
	t.Helper()
	resp, err := client.Get(base + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if value, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			v, err := strconv.ParseFloat(value, 64)
			require.NoError(t, err, "%s %q", name, value)
			return v
		}
	}
	require.NoError(t, sc.Err())
	t.Fatalf("no %s in /metrics", name)
	return 0
}
