package web

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/dagrun/dagrun"
	"github.com/dagrun/dagrun/storage"
)

// scrapeTimeout bounds the store query behind the gauges, so a slow
// database makes a scrape report dagrun_store_up 0 rather than hang.
const scrapeTimeout = 5 * time.Second

// Metrics holds dagrun's Prometheus metrics on a registry of its own (no
// global state: two servers in one process do not collide). It is a
// dagrun.Observer: pass it as dagrun.Config.Observer so the engine feeds
// the counters and histograms, and as Config.Metrics so the server serves
// it and adds the gauges read from the store at scrape time.
//
// Counters and histograms count what this process's engine did (starts,
// finishes and attempts seen here); the gauges read the shared store, so
// they are the same whichever server is scraped.
type Metrics struct {
	registry *prometheus.Registry

	started   *prometheus.CounterVec
	finished  *prometheus.CounterVec
	attempts  *prometheus.CounterVec
	duration  *prometheus.HistogramVec
	queueWait *prometheus.HistogramVec

	ticksFired   *prometheus.CounterVec
	ticksSkipped *prometheus.CounterVec
	tickLag      *prometheus.HistogramVec

	mu    sync.Mutex
	store storage.Store
}

var (
	_ dagrun.Observer         = (*Metrics)(nil)
	_ dagrun.ScheduleObserver = (*Metrics)(nil)
)

// NewMetrics returns metrics registered on a new registry, with the
// standard Go runtime and process collectors (their usual go_ and process_
// names, which dashboards expect).
func NewMetrics() *Metrics {
	m := &Metrics{
		registry: prometheus.NewRegistry(),
		started: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dagrun_instances_started_total",
			Help: "Instances this process started, child instances included (an idempotent start that found an existing instance is not counted).",
		}, []string{"workflow"}),
		finished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dagrun_instances_finished_total",
			Help: "Instances that reached a final status in this process's transactions.",
		}, []string{"workflow", "status"}),
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dagrun_step_attempts_total",
			Help: "Step attempts this process ran, by outcome: completed, retry (failed, will run again), failed (for good) or snoozed.",
		}, []string{"handler", "outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "dagrun_step_duration_seconds",
			Help: "How long a step attempt's handler ran.",
			// 5ms to about 2 minutes.
			Buckets: prometheus.ExponentialBuckets(0.005, 2.5, 12),
		}, []string{"handler"}),
		queueWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "dagrun_step_queue_wait_seconds",
			Help: "How long a step waited between becoming ready and being claimed by a worker.",
			// 1ms to about 25 minutes.
			Buckets: prometheus.ExponentialBuckets(0.001, 3, 14),
		}, []string{"queue"}),
		ticksFired: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dagrun_schedule_ticks_fired_total",
			Help: "Schedule ticks that started an instance, by this process's scheduler.",
		}, []string{"workflow"}),
		ticksSkipped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dagrun_schedule_ticks_skipped_total",
			Help: "Schedule ticks that started nothing because the schedule's last instance was unfinished (overlap: skip), by this process's scheduler.",
		}, []string{"workflow"}),
		tickLag: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "dagrun_schedule_tick_lag_seconds",
			Help: "Time from a schedule tick to the creation of its instance; caught-up ticks count their whole age.",
			// 1ms to about 3 hours.
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 13),
		}, []string{"workflow"}),
	}
	m.registry.MustRegister(m.started, m.finished, m.attempts, m.duration, m.queueWait,
		m.ticksFired, m.ticksSkipped, m.tickLag,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Registry returns the registry, for registering more collectors or for
// serving it elsewhere.
func (m *Metrics) Registry() *prometheus.Registry { return m.registry }

// InitWorkflows creates the per-workflow series at zero, so rates and
// alerts work from the first scrape instead of appearing with the first
// event.
func (m *Metrics) InitWorkflows(names ...string) {
	for _, n := range names {
		m.started.WithLabelValues(n)
		for _, s := range []storage.InstanceStatus{storage.InstanceCompleted, storage.InstanceFailed, storage.InstanceCancelled} {
			m.finished.WithLabelValues(n, string(s))
		}
	}
}

// InitSchedules creates the schedule tick counters of workflows at zero,
// for a process whose scheduler runs their schedules: an alert on skipped
// ticks then has a series before the first skip.
func (m *Metrics) InitSchedules(names ...string) {
	for _, n := range names {
		m.ticksFired.WithLabelValues(n)
		m.ticksSkipped.WithLabelValues(n)
	}
}

// InstanceStarted implements dagrun.Observer.
func (m *Metrics) InstanceStarted(workflow string) {
	m.started.WithLabelValues(workflow).Inc()
}

// InstanceFinished implements dagrun.Observer.
func (m *Metrics) InstanceFinished(workflow string, status storage.InstanceStatus) {
	m.finished.WithLabelValues(workflow, string(status)).Inc()
}

// AttemptFinished implements dagrun.Observer.
func (m *Metrics) AttemptFinished(r dagrun.AttemptReport) {
	m.attempts.WithLabelValues(r.Handler, r.Outcome).Inc()
	m.duration.WithLabelValues(r.Handler).Observe(r.Duration.Seconds())
	if r.Outcome != "snoozed" {
		// A snoozed step's wait is its own sleep, not queueing.
		m.queueWait.WithLabelValues(r.Queue).Observe(r.QueueWait.Seconds())
	}
}

// TickFired implements dagrun.ScheduleObserver.
func (m *Metrics) TickFired(workflow string, lag time.Duration) {
	m.ticksFired.WithLabelValues(workflow).Inc()
	m.tickLag.WithLabelValues(workflow).Observe(max(lag, 0).Seconds())
}

// TickSkipped implements dagrun.ScheduleObserver.
func (m *Metrics) TickSkipped(workflow string) {
	m.ticksSkipped.WithLabelValues(workflow).Inc()
}

// watchStore registers the gauges read from store at scrape time. A
// Metrics serves one store; attaching the same store again is a no-op.
func (m *Metrics) watchStore(store storage.Store) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case m.store == store:
		return nil
	case m.store != nil:
		return errors.New("web: these Metrics already report another store; create one Metrics per engine")
	}
	if err := m.registry.Register(&storeCollector{store: store}); err != nil {
		return fmt.Errorf("web: register store metrics: %w", err)
	}
	m.store = store
	return nil
}

// Handler serves the metrics in the Prometheus text format (OpenMetrics
// when the scraper asks for it): a process without the API, a worker,
// serves its own on an address of its own.
func (m *Metrics) Handler(logger *slog.Logger) http.Handler { return m.handler(logger) }

func (m *Metrics) handler(logger *slog.Logger) http.Handler {
	return promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelError),
		ErrorHandling:     promhttp.ContinueOnError,
		Registry:          m.registry,
		EnableOpenMetrics: true,
	})
}

// storeCollector reads storage.Stats at scrape time: gauges per workflow
// (dagrun_instances, dagrun_steps_*, dagrun_steps_waiting among them), per
// queue (dagrun_queue_steps_*) and per handler no live worker has
// (dagrun_steps_unserved).
// The per-queue gauges have names of their own because one metric name
// carries one label set; a queue appears once it has a ready or running
// step, a handler once a step of it is unserved, and both stay.
type storeCollector struct {
	store storage.Store

	// The queues and handlers a scrape has shown: once a series appeared
	// it stays, at 0 when the store has nothing for it, as the
	// per-workflow counters do (InitWorkflows), so that a graph or an
	// alert sees the value drop to 0 rather than the series vanish. The
	// per-workflow gauges (dagrun_instances, dagrun_steps_*) are the
	// store's counts of the instances it holds: a workflow's leave with
	// its last instance, pruned.
	mu       sync.Mutex
	queues   map[string]bool
	handlers map[string]bool
}

var (
	descStoreUp = prometheus.NewDesc("dagrun_store_up",
		"1 when the store answered the last scrape's statistics query, 0 when it did not.", nil, nil)
	descInstances = prometheus.NewDesc("dagrun_instances",
		"Instances in the store by workflow and status.", []string{"workflow", "status"}, nil)
	descReady = prometheus.NewDesc("dagrun_steps_ready",
		"Steps ready to run (pending, due) and not yet claimed, by workflow.", []string{"workflow"}, nil)
	descRunning = prometheus.NewDesc("dagrun_steps_running",
		"Steps claimed by a worker and running (stuck ones included), by workflow.", []string{"workflow"}, nil)
	descStuck = prometheus.NewDesc("dagrun_steps_stuck",
		"Running steps whose lease expired (their worker stopped heartbeating), by workflow.", []string{"workflow"}, nil)
	descWaiting = prometheus.NewDesc("dagrun_steps_waiting",
		"Wait steps waiting for their signal (they hold no worker), by workflow.", []string{"workflow"}, nil)
	descOldestReady = prometheus.NewDesc("dagrun_oldest_ready_step_age_seconds",
		"Age of the oldest ready step, by workflow; 0 when none waits. A growing value means workers cannot keep up.", []string{"workflow"}, nil)
	descQueueReady = prometheus.NewDesc("dagrun_queue_steps_ready",
		"Steps ready to run (pending, due) and not yet claimed, by queue.", []string{"queue"}, nil)
	descQueueRunning = prometheus.NewDesc("dagrun_queue_steps_running",
		"Steps claimed by a worker and running (stuck ones included), by queue.", []string{"queue"}, nil)
	descQueueStuck = prometheus.NewDesc("dagrun_queue_steps_stuck",
		"Running steps whose lease expired (their worker stopped heartbeating), by queue.", []string{"queue"}, nil)
	descUnserved = prometheus.NewDesc("dagrun_steps_unserved",
		"Ready steps no live worker can run (none registered their handler for their queue), by handler. They wait for a worker of a binary that has the handler.", []string{"handler"}, nil)
	descOldestUnserved = prometheus.NewDesc("dagrun_oldest_unserved_step_age_seconds",
		"Age of the oldest ready step no live worker can run, by handler.", []string{"handler"}, nil)
)

func (c *storeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descStoreUp, descInstances, descReady, descRunning, descStuck, descWaiting, descOldestReady,
		descQueueReady, descQueueRunning, descQueueStuck, descUnserved, descOldestUnserved} {
		ch <- d
	}
}

func (c *storeCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	stats, err := c.store.Stats(ctx)
	if err != nil {
		ch <- prometheus.MustNewConstMetric(descStoreUp, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(descStoreUp, prometheus.GaugeValue, 1)
	for _, w := range stats.Workflows {
		for _, s := range []storage.InstanceStatus{storage.InstancePending, storage.InstanceRunning, storage.InstanceCompleted, storage.InstanceFailed, storage.InstanceCancelled} {
			ch <- prometheus.MustNewConstMetric(descInstances, prometheus.GaugeValue, float64(w.Instances[s]), w.Workflow, string(s))
		}
		ch <- prometheus.MustNewConstMetric(descReady, prometheus.GaugeValue, float64(w.ReadySteps), w.Workflow)
		ch <- prometheus.MustNewConstMetric(descRunning, prometheus.GaugeValue, float64(w.RunningSteps), w.Workflow)
		ch <- prometheus.MustNewConstMetric(descStuck, prometheus.GaugeValue, float64(w.StuckSteps), w.Workflow)
		ch <- prometheus.MustNewConstMetric(descWaiting, prometheus.GaugeValue, float64(w.WaitingSteps), w.Workflow)
		ch <- prometheus.MustNewConstMetric(descOldestReady, prometheus.GaugeValue, w.OldestReady.Seconds(), w.Workflow)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.queues == nil {
		c.queues, c.handlers = map[string]bool{}, map[string]bool{}
	}
	queues := maps.Clone(c.queues)
	for _, q := range stats.Queues {
		ch <- prometheus.MustNewConstMetric(descQueueReady, prometheus.GaugeValue, float64(q.Ready), q.Queue)
		ch <- prometheus.MustNewConstMetric(descQueueRunning, prometheus.GaugeValue, float64(q.Running), q.Queue)
		ch <- prometheus.MustNewConstMetric(descQueueStuck, prometheus.GaugeValue, float64(q.Stuck), q.Queue)
		c.queues[q.Queue] = true
		delete(queues, q.Queue)
	}
	for q := range queues {
		for _, d := range []*prometheus.Desc{descQueueReady, descQueueRunning, descQueueStuck} {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, 0, q)
		}
	}
	handlers := maps.Clone(c.handlers)
	for _, h := range stats.Unserved {
		ch <- prometheus.MustNewConstMetric(descUnserved, prometheus.GaugeValue, float64(h.Ready), h.Handler)
		ch <- prometheus.MustNewConstMetric(descOldestUnserved, prometheus.GaugeValue, h.OldestReady.Seconds(), h.Handler)
		c.handlers[h.Handler] = true
		delete(handlers, h.Handler)
	}
	for h := range handlers {
		ch <- prometheus.MustNewConstMetric(descUnserved, prometheus.GaugeValue, 0, h)
		ch <- prometheus.MustNewConstMetric(descOldestUnserved, prometheus.GaugeValue, 0, h)
	}
}
