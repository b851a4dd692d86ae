package e2e

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

// BenchmarkWakeupLatency measures, on PostgreSQL, how long a newly started
// instance waits for an idle worker in another process whose fallback
// polling is 5 s: the time from the instance's creation to its first step
// starting, both as recorded in the database. LISTEN/NOTIFY should make it
// milliseconds, not seconds.
//
//	DAGRUN_TEST_POSTGRES=postgres://... go test ./e2e -run '^$' -bench WakeupLatency -benchtime 100x
func BenchmarkWakeupLatency(b *testing.B) {
	if os.Getenv("DAGRUN_TEST_POSTGRES") == "" {
		b.Skip("DAGRUN_TEST_POSTGRES is not set")
	}
	db := newPostgresDB(b)
	e := &env{dir: b.TempDir(), db: db}
	e.workflows = e.dir + "/workflows"
	if err := os.MkdirAll(e.workflows, 0o755); err != nil {
		b.Fatal(err)
	}
	const wf = "name: wake\nsteps:\n  - {name: first, handler: noop}\n"
	if err := os.WriteFile(e.workflows+"/wake.yaml", []byte(wf), 0o644); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	worker := e.command(ctx, "worker", "--poll", "5s")
	if err := worker.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { cancel(); _ = worker.Wait() }()
	// Let the worker subscribe and go idle.
	time.Sleep(time.Second)

	var samples []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		out, err := e.command(ctx, "start", "wake", "--detach").Output()
		if err != nil {
			b.Fatal(err)
		}
		id := strings.TrimSpace(string(out))
		var inst instance
		deadline := time.Now().Add(10 * time.Second)
		for {
			inst = e.status(b, id)
			if inst.Steps[0].StartedAt != nil || time.Now().After(deadline) {
				break
			}
			time.Sleep(2 * time.Millisecond)
		}
		if inst.Steps[0].StartedAt == nil {
			b.Fatalf("step of %s did not start within 10s", id)
		}
		created, _ := time.Parse(time.RFC3339Nano, inst.CreatedAt)
		started, _ := time.Parse(time.RFC3339Nano, *inst.Steps[0].StartedAt)
		samples = append(samples, started.Sub(created))
	}
	b.StopTimer()
	slices.Sort(samples)
	pct := func(p float64) float64 {
		i := min(max(int(p*float64(len(samples))+0.5)-1, 0), len(samples)-1)
		return float64(samples[i].Microseconds()) / 1000
	}
	b.ReportMetric(pct(0.50), "p50_ms")
	b.ReportMetric(pct(0.95), "p95_ms")
	b.ReportMetric(0, "ns/op")
}
