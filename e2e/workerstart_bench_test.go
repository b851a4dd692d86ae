package e2e

import (
	"bufio"
	"context"
	"io"
	"strings"
	"testing"
	"time"
)

// BenchmarkWorkerStart measures what starting one worker process costs:
// the time from exec to its "dagrun worker started" line, and the CPU it
// used by then (/proc/PID/stat, in ticks of 10 ms, so read the mean of
// many), against a migrated database with nothing to do. A fleet's
// workers each pay it as they come up, on cores the ones already up are
// working on. PostgreSQL's runs when DAGRUN_TEST_POSTGRES is set.
//
//	DAGRUN_E2E_NORACE=1 [DAGRUN_TEST_POSTGRES=postgres://...] go test ./e2e -run '^$' -bench WorkerStart -benchtime 20x
func BenchmarkWorkerStart(b *testing.B) {
	benchBackends(b, func(b *testing.B, db string, _ bool) { benchWorkerStart(b, db) })
}

func benchWorkerStart(b *testing.B, db string) {
	e := benchEnv(b, db)
	ctx := context.Background()
	if out, err := e.command(ctx, "list").CombinedOutput(); err != nil { // migrates
		b.Fatalf("dagrun list: %v\n%s", err, out)
	}
	var cpu time.Duration
	b.ResetTimer()
	for range b.N {
		cpu += startWorkerOnce(b, e)
	}
	b.ReportMetric(float64(cpu.Microseconds())/1000/float64(b.N), "cpu_ms/op")
}

// startWorkerOnce starts a worker, waits for its "started" line, reads
// the CPU it used so far, and stops it outside the benchmark's timer.
func startWorkerOnce(b *testing.B, e *env) time.Duration {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := e.command(ctx, "worker", "--concurrency", "10")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	lines := bufio.NewScanner(stderr)
	for !strings.Contains(lines.Text(), "dagrun worker started") {
		if !lines.Scan() {
			b.Fatalf("the worker exited before it started: %v", cmd.Wait())
		}
	}
	cpu := mustProcessCPU(b, cmd.Process.Pid)
	b.StopTimer()
	cancel()
	go func() { _, _ = io.Copy(io.Discard, stderr) }() // drained, or the worker blocks writing its last lines
	_ = cmd.Wait()
	b.StartTimer()
	return cpu
}
