package app

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"

	"github.com/dagrun/dagrun"
	"github.com/dagrun/dagrun/cmd/dagrun/app/view"
	"github.com/dagrun/dagrun/dag"
	"github.com/dagrun/dagrun/handlers"
	"github.com/dagrun/dagrun/storage"
)

// The bench workflows use the built-in noop handler, so the figures measure
// the engine and the database, not the work.
const (
	benchChain4 = `name: bench-chain4
steps:
  - {name: a, handler: noop}
  - {name: b, handler: noop, dependsOn: [a]}
  - {name: c, handler: noop, dependsOn: [b]}
  - {name: d, handler: noop, dependsOn: [c]}
`
	benchFanout = `name: bench-fanout
steps:
  - {name: root, handler: noop}
  - {name: p1, handler: noop, dependsOn: [root]}
  - {name: p2, handler: noop, dependsOn: [root]}
  - {name: p3, handler: noop, dependsOn: [root]}
  - {name: p4, handler: noop, dependsOn: [root]}
  - {name: p5, handler: noop, dependsOn: [root]}
  - {name: p6, handler: noop, dependsOn: [root]}
  - {name: p7, handler: noop, dependsOn: [root]}
  - {name: p8, handler: noop, dependsOn: [root]}
  - {name: join, handler: noop, dependsOn: [p1, p2, p3, p4, p5, p6, p7, p8]}
`
	// benchMap fans out over its input's n: one item per element of
	// range(0, n), then a fan-in that reads the whole output list.
	benchMap = `name: bench-map
steps:
  - {name: items, handler: noop, forEach: "${{ 0..(input.n - 1) }}"}
  - {name: join, handler: noop, dependsOn: [items], input: {count: "${{ len(steps.items.output) }}"}}
`
)

// benchStartBatch is how many instances one StartMany call creates.
const benchStartBatch = 1000

func (c *cli) benchCommand() *cobra.Command {
	var (
		workload    string
		instances   int
		concurrency int
		cpuProfile  string
		stepLogs    int
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure steps per second and latency with no-op handlers, in process",
		Long: "Bench runs workloads in process with no-op handlers and prints one line of key=value figures per measurement.\n" +
			"Without --db (or DAGRUN_DB) it uses a fresh SQLite file in a temporary folder; with it, the instances stay\n" +
			"there for list and status.\n\n" +
			"  chain4    N instances of a->b->c->d, all started first, then drained by the worker\n" +
			"  fanout    N instances of 1 root -> 8 parallel -> 1 join\n" +
			"  enqueue   starting N instances, one at a time and in batches\n" +
			"  latency4  one 4-step chain at a time on an idle worker, start to completed\n" +
			"  map       one instance whose forEach step has N no-op items (default 10,000), then a fan-in;\n" +
			"            also prints the size of its instance object, as GET /api/instances/{id} returns it",
		Args: exactArgs(0, "bench [--workload chain4|fanout|enqueue|latency4|map] [--instances N] [--concurrency N]"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !slices.Contains([]string{"chain4", "fanout", "enqueue", "latency4", "map"}, workload) {
				return usageError(fmt.Errorf("invalid --workload %q: use chain4, fanout, enqueue, latency4 or map", workload))
			}
			if instances == 0 {
				instances = map[string]int{"chain4": 2000, "fanout": 1000, "enqueue": 5000, "latency4": 100, "map": 10000}[workload]
			}
			if instances < 1 {
				return usageError(fmt.Errorf("invalid --instances %d: must be at least 1", instances))
			}
			if err := checkConcurrency(concurrency); err != nil {
				return err
			}
			if stepLogs < 0 || stepLogs > 10000 {
				return usageError(fmt.Errorf("invalid --step-logs %d: must be from 0 to 10000", stepLogs))
			}
			db := c.db
			if !cmd.Flags().Changed("db") && c.io.Getenv("DAGRUN_DB") == "" {
				dir, err := os.MkdirTemp("", "dagrun-bench-*")
				if err != nil {
					return err
				}
				defer os.RemoveAll(dir)
				db = filepath.Join(dir, "bench.db")
			}
			b, err := c.newBench(cmd.Context(), db, concurrency, stepLogs)
			if err != nil {
				return err
			}
			defer b.close()
			if cpuProfile != "" {
				stopProfile, err := startCPUProfile(cpuProfile)
				if err != nil {
					return err
				}
				defer stopProfile()
			}
			ctx := cmd.Context()
			switch workload {
			case "chain4":
				return b.drain(ctx, "chain4", "bench-chain4", 4, instances)
			case "fanout":
				return b.drain(ctx, "fanout", "bench-fanout", 10, instances)
			case "enqueue":
				return b.enqueue(ctx, instances)
			case "map":
				return b.mapItems(ctx, instances)
			default:
				return b.latency(ctx, instances)
			}
		},
	}
	f := cmd.Flags()
	f.StringVar(&workload, "workload", "chain4", "chain4, fanout, enqueue, latency4 or map")
	f.IntVar(&instances, "instances", 0, "instances to run (default 2000 chain4, 1000 fanout, 5000 enqueue, 100 latency4; for map, its items: 10000)")
	f.IntVar(&concurrency, "concurrency", dagrun.DefaultConcurrency, "worker concurrency")
	f.StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of the run to this file (go tool pprof)")
	f.IntVar(&stepLogs, "step-logs", 0, "records each step's handler logs through handlers.Logger (the cost of step logs)")
	return cmd
}

func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, usageError(fmt.Errorf("create --cpuprofile file: %v", err))
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); _ = f.Close() }, nil
}

// bench is one benchmark run: an engine over the store with the bench
// workflows, and an observer that counts finished instances.
type bench struct {
	c           *cli
	engine      *dagrun.Engine
	store       storage.Store
	backend     string
	concurrency int
	finished    *benchObserver
}

func (c *cli) newBench(ctx context.Context, db string, concurrency, stepLogs int) (*bench, error) {
	registry := c.registry
	if stepLogs > 0 {
		registry = benchLoggingRegistry(stepLogs)
	}
	var workflows []*dag.Workflow
	for _, src := range []string{benchChain4, benchFanout, benchMap} {
		if stepLogs > 0 {
			src = strings.ReplaceAll(src, "handler: noop", "handler: "+benchLogHandler)
		}
		w, err := dag.Parse("", []byte(src), &dag.ParseOptions{HandlerExists: registry.Has})
		if err != nil {
			return nil, fmt.Errorf("bench workflow: %w (the binary must register the built-in noop handler)", err)
		}
		workflows = append(workflows, w)
	}
	store, err := openStore(ctx, db, c.dbSchema, c.logger, followConns)
	if err != nil {
		return nil, err
	}
	obs := &benchObserver{}
	engine, err := dagrun.New(store, registry, &dagrun.Config{Workflows: workflows, Logger: c.logger, Observer: obs, MaxItems: max(c.maxItems, benchMaxItems)})
	if err != nil {
		_ = store.Close()
		return nil, err
	}
	backend := "sqlite"
	if strings.HasPrefix(db, "postgres") {
		backend = "postgres"
	}
	return &bench{c: c, engine: engine, store: store, backend: backend, concurrency: concurrency, finished: obs}, nil
}

func (b *bench) close() { _ = b.store.Close() }

// benchLogHandler replaces noop in the bench workflows under --step-logs.
const benchLogHandler = "bench.log"

// benchLoggingRegistry has the built-ins and a noop that logs n records
// with two attributes each, as a handler reporting its progress would.
func benchLoggingRegistry(n int) *handlers.Registry {
	r := handlers.NewRegistry()
	handlers.RegisterBuiltins(r)
	r.Register(benchLogHandler, func(ctx context.Context, _ json.RawMessage) (json.RawMessage, error) {
		log := handlers.Logger(ctx)
		for i := range n {
			log.Info("working", slog.Int("record", i), slog.String("step", handlers.Info(ctx).Step))
		}
		return json.RawMessage("null"), nil
	})
	return r
}

func (b *bench) print(fields ...any) {
	var sb strings.Builder
	for i := 0; i+1 < len(fields); i += 2 {
		if i > 0 {
			sb.WriteByte(' ')
		}
		fmt.Fprintf(&sb, "%s=%v", fields[i], fields[i+1])
	}
	fmt.Fprintln(b.c.io.Stdout, sb.String())
}

func (b *bench) startMany(ctx context.Context, workflow string, n int) error {
	for done := 0; done < n; done += benchStartBatch {
		reqs := make([]dagrun.StartRequest, min(benchStartBatch, n-done))
		for i := range reqs {
			reqs[i] = dagrun.StartRequest{Workflow: workflow}
		}
		if _, err := b.engine.StartMany(ctx, reqs); err != nil {
			return err
		}
	}
	return nil
}

// runWorker runs a worker with default settings but the bench concurrency
// until stop is called.
func (b *bench) runWorker() (stop func()) {
	worker, err := b.engine.NewWorker(&dagrun.WorkerConfig{Concurrency: b.concurrency})
	if err != nil {
		panic(err) // the config is built here and always valid
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = worker.Run(ctx) }()
	return func() { cancel(); <-done }
}

// drain starts n instances, then measures how fast one worker finishes them.
func (b *bench) drain(ctx context.Context, name, workflow string, stepsPer, n int) error {
	if err := b.startMany(ctx, workflow, n); err != nil {
		return err
	}
	target := b.finished.count.Load() + int64(n)
	began := time.Now()
	stop := b.runWorker()
	err := b.finished.waitFor(ctx, target)
	elapsed := time.Since(began)
	stop()
	if err != nil {
		return err
	}
	secs := elapsed.Seconds()
	b.print("workload", name, "backend", b.backend, "instances", n, "steps", n*stepsPer,
		"seconds", fmt.Sprintf("%.3f", secs), "steps_per_s", fmt.Sprintf("%.0f", float64(n*stepsPer)/secs),
		"instances_per_s", fmt.Sprintf("%.0f", float64(n)/secs), "concurrency", b.concurrency, "failed", b.finished.failed.Load())
	return nil
}

// benchMaxItems lets the map workload go past the default item limit when
// asked to.
const benchMaxItems = 1_000_000

// mapItems starts one instance of n items and measures how fast one worker
// finishes it, from start to completed; then it measures the instance
// object the CLI and the API show for it.
func (b *bench) mapItems(ctx context.Context, n int) error {
	target := b.finished.count.Load() + 1
	stop := b.runWorker()
	defer stop()
	began := time.Now()
	started, err := b.engine.Start(ctx, "bench-map", json.RawMessage(fmt.Sprintf(`{"n": %d}`, n)), nil)
	if err != nil {
		return err
	}
	if err := b.finished.waitFor(ctx, target); err != nil {
		return err
	}
	secs := time.Since(began).Seconds()
	inst, err := b.engine.Get(ctx, started.ID)
	if err != nil {
		return err
	}
	object, err := json.Marshal(view.NewInstance(inst))
	if err != nil {
		return err
	}
	b.print("workload", "map", "backend", b.backend, "items", n, "seconds", fmt.Sprintf("%.3f", secs),
		"items_per_s", fmt.Sprintf("%.0f", float64(n)/secs), "concurrency", b.concurrency,
		"status", inst.Status, "instance_json_bytes", len(object))
	return nil
}

// enqueue measures starting instances one call at a time and in batches.
func (b *bench) enqueue(ctx context.Context, n int) error {
	began := time.Now()
	for range n {
		if _, err := b.engine.Start(ctx, "bench-chain4", nil, nil); err != nil {
			return err
		}
	}
	secs := time.Since(began).Seconds()
	b.print("workload", "enqueue", "mode", "single", "backend", b.backend, "instances", n, "steps", n*4,
		"seconds", fmt.Sprintf("%.3f", secs), "instances_per_s", fmt.Sprintf("%.0f", float64(n)/secs))
	began = time.Now()
	if err := b.startMany(ctx, "bench-chain4", n); err != nil {
		return err
	}
	secs = time.Since(began).Seconds()
	b.print("workload", "enqueue", "mode", "batch", "backend", b.backend, "instances", n, "steps", n*4,
		"seconds", fmt.Sprintf("%.3f", secs), "instances_per_s", fmt.Sprintf("%.0f", float64(n)/secs), "batch", benchStartBatch)
	return nil
}

// latency runs one 4-step chain at a time on an idle worker and reports
// start-to-completed percentiles.
func (b *bench) latency(ctx context.Context, n int) error {
	stop := b.runWorker()
	defer stop()
	// Let the worker go idle first, as a real one would be.
	time.Sleep(200 * time.Millisecond)
	samples := make([]time.Duration, 0, n)
	began := time.Now()
	for range n {
		target := b.finished.count.Load() + 1
		t0 := time.Now()
		if _, err := b.engine.Start(ctx, "bench-chain4", nil, nil); err != nil {
			return err
		}
		if err := b.finished.waitFor(ctx, target); err != nil {
			return err
		}
		samples = append(samples, time.Since(t0))
	}
	secs := time.Since(began).Seconds()
	slices.Sort(samples)
	pct := func(p float64) string {
		i := int(p*float64(len(samples))+0.5) - 1
		i = min(max(i, 0), len(samples)-1)
		return fmt.Sprintf("%.2f", float64(samples[i].Microseconds())/1000)
	}
	b.print("workload", "latency4", "backend", b.backend, "instances", n, "steps", n*4,
		"seconds", fmt.Sprintf("%.3f", secs), "steps_per_s", fmt.Sprintf("%.0f", float64(n*4)/secs),
		"instances_per_s", fmt.Sprintf("%.0f", float64(n)/secs),
		"p50_ms", pct(0.50), "p95_ms", pct(0.95), "p99_ms", pct(0.99))
	return nil
}

// benchObserver counts finished instances so the bench knows when a run is
// done without polling the database.
type benchObserver struct {
	count    atomic.Int64
	failed   atomic.Int64
	attempts atomic.Int64
	mu       sync.Mutex
	wake     chan struct{}
}

func (o *benchObserver) InstanceStarted(string) {}

func (o *benchObserver) InstanceFinished(_ string, status storage.InstanceStatus) {
	o.count.Add(1)
	if status != storage.InstanceCompleted {
		o.failed.Add(1)
	}
	o.mu.Lock()
	if o.wake != nil {
		close(o.wake)
		o.wake = nil
	}
	o.mu.Unlock()
}

func (o *benchObserver) AttemptFinished(dagrun.AttemptReport) { o.attempts.Add(1) }

// waitFor waits until target instances have finished. Ready steps run in
// the order they became ready, so with a large backlog every first step
// runs before any instance finishes: the watchdog watches attempts, not
// finished instances.
func (o *benchObserver) waitFor(ctx context.Context, target int64) error {
	stalled := time.NewTicker(30 * time.Second)
	defer stalled.Stop()
	lastAttempts := o.attempts.Load()
	for {
		o.mu.Lock()
		if o.count.Load() >= target {
			o.mu.Unlock()
			return nil
		}
		if o.wake == nil {
			o.wake = make(chan struct{})
		}
		wake := o.wake
		o.mu.Unlock()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-wake:
		case <-stalled.C:
			n := o.attempts.Load()
			if n == lastAttempts {
				return fmt.Errorf("bench: no step finished here for 30s (%d of %d instances done): if another worker shares the database, it may have taken them; bench counts its own, so give it a database of its own", o.count.Load(), target)
			}
			lastAttempts = n
		}
	}
}
