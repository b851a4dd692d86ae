package e2e

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// BenchmarkWakeupLatency measures how long a newly started instance waits
// for an idle worker in another process: the time from the instance's
// creation to its first step starting, both as recorded in the database.
// On SQLite the worker polls at the default interval and must hear the
// other process's commit through the file (PRAGMA data_version); on
// PostgreSQL (when DAGRUN_TEST_POSTGRES is set) it polls every 5 s and
// hears LISTEN/NOTIFY. Both should take milliseconds, not a poll. Each also
// reports the CPU the idle worker used over 10 s, as a percentage of one
// core.
//
//	DAGRUN_E2E_NORACE=1 [DAGRUN_TEST_POSTGRES=postgres://...] go test ./e2e -run '^$' -bench WakeupLatency -benchtime 100x
func BenchmarkWakeupLatency(b *testing.B) {
	benchBackends(b, func(b *testing.B, db string, postgres bool) {
		if postgres {
			benchWakeup(b, db, "--poll", "5s")
		} else {
			benchWakeup(b, db)
		}
	})
}

// benchBackends runs bench as sub-benchmarks: on a SQLite file, and on a
// PostgreSQL database of its own when DAGRUN_TEST_POSTGRES is set.
func benchBackends(b *testing.B, bench func(b *testing.B, db string, postgres bool)) {
	b.Run("sqlite", func(b *testing.B) {
		bench(b, filepath.Join(b.TempDir(), "dagrun.db"), false)
	})
	b.Run("postgres", func(b *testing.B) {
		if os.Getenv("DAGRUN_TEST_POSTGRES") == "" {
			b.Skip("DAGRUN_TEST_POSTGRES is not set")
		}
		bench(b, newPostgresDB(b), true)
	})
}

func benchWakeup(b *testing.B, db string, workerArgs ...string) {
	e := benchEnv(b, db)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	worker := e.command(ctx, append([]string{"worker"}, workerArgs...)...)
	if err := worker.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { cancel(); _ = worker.Wait() }()
	// Let the worker migrate, subscribe and go idle.
	time.Sleep(time.Second)
	idle := idleCPU(b, worker.Process.Pid, 10*time.Second)

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
	b.ReportMetric(idle, "idle_cpu_%")
	b.ReportMetric(0, "ns/op")
}

// benchEnv returns an environment on db with one workflow, wake: a
// single noop step.
func benchEnv(b *testing.B, db string) *env {
	b.Helper()
	e := &env{dir: b.TempDir(), db: db}
	e.workflows = e.dir + "/workflows"
	if err := os.MkdirAll(e.workflows, 0o755); err != nil {
		b.Fatal(err)
	}
	const wf = "name: wake\nsteps:\n  - {name: first, handler: noop}\n"
	if err := os.WriteFile(e.workflows+"/wake.yaml", []byte(wf), 0o644); err != nil {
		b.Fatal(err)
	}
	return e
}

// idleCPU returns the CPU time process pid used over d (user plus system,
// from /proc/pid/stat) as a percentage of d.
func idleCPU(b *testing.B, pid int, d time.Duration) float64 {
	b.Helper()
	before := mustProcessCPU(b, pid)
	time.Sleep(d)
	return float64(mustProcessCPU(b, pid)-before) / float64(d) * 100
}

// mustProcessCPU is processCPU, failing the benchmark where there is no
// /proc to read it from.
func mustProcessCPU(b *testing.B, pid int) time.Duration {
	b.Helper()
	cpu, ok := processCPU(b, pid)
	if !ok {
		b.Fatalf("cannot read the CPU time of process %d from /proc", pid)
	}
	return cpu
}
