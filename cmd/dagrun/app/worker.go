package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"regexp"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/dagrun/dagrun"
	"github.com/dagrun/dagrun/cmd/dagrun/app/web"
)

func (c *cli) workerCommand() *cobra.Command {
	var (
		flags       workerFlags
		noSchedules bool
		metricsAddr string
	)
	cmd := &cobra.Command{
		Use:   "worker",
		Short: "Run steps until SIGINT or SIGTERM, then finish running steps within a grace period and release the rest",
		Args:  exactArgs(0, "worker [--concurrency N] [--queues a,b] [--lease DUR] [--poll DUR] [--grace DUR] [--no-schedules] [--metrics-addr ADDR]"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			config, err := flags.config(cmd, c)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			c.conns = workerConns
			c.longRunning = true
			var metrics *web.Metrics
			if metricsAddr != "" {
				// The engine reports to the metrics, so they must exist
				// before it.
				metrics = web.NewMetrics()
				c.observer = metrics
			}
			engine, err := c.engine(ctx)
			if err != nil {
				return err
			}
			if metrics != nil {
				stop, err := c.serveMetrics(ctx, metrics, engine, metricsAddr, !noSchedules)
				if err != nil {
					return err
				}
				defer stop()
			}
			worker, err := engine.NewWorker(&config)
			if err != nil {
				return usageError(err)
			}
			c.logger.Info("dagrun worker started", append([]any{"id", worker.ID(), "concurrency", config.Concurrency, "queues", config.Queues}, c.storeAttrs(engine)...)...)
			scheduler := c.startScheduler(ctx, engine, noSchedules)
			stopFollowing := c.followWorkflowsFolder(ctx, engine, scheduler.Restart)
			ran := make(chan struct{})
			go func() {
				select {
				case <-ctx.Done():
					c.logger.Info("dagrun worker stopping; a second SIGINT or SIGTERM exits at once", "id", worker.ID())
				case <-ran:
				}
			}()
			err = worker.Run(ctx)
			close(ran)
			stopFollowing()
			scheduler.Stop()
			c.logger.Info("dagrun worker stopped", "id", worker.ID())
			return err
		},
	}
	flags.register(cmd, "the worker")
	f := cmd.Flags()
	f.BoolVar(&noSchedules, "no-schedules", false, "do not run the scheduler, which starts the workflows' scheduled instances")
	f.StringVar(&metricsAddr, "metrics-addr", "", "serve this worker's Prometheus /metrics (its attempts, instances and scheduler) on this address, e.g. 127.0.0.1:9464")
	c.addPlanLimitFlags(cmd)
	return cmd
}

// serveMetrics serves a worker's /metrics on addr until the returned stop
// is called. They count what this process does: the counts of what the
// database holds are serve's, read from the store, the same for every
// process.
func (c *cli) serveMetrics(ctx context.Context, metrics *web.Metrics, engine *dagrun.Engine, addr string, schedules bool) (stop func(), err error) {
	for _, w := range engine.Workflows() {
		metrics.InitWorkflows(w.Name)
		if schedules && len(w.Schedules) > 0 {
			metrics.InitSchedules(w.Name)
		}
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, usageError(fmt.Errorf("--metrics-addr %s: %v: use a free host:port, e.g. 127.0.0.1:9464", addr, err))
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", metrics.Handler(c.logger))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			c.logger.Error("dagrun worker: metrics server stopped", "error", err)
		}
	}()
	c.logger.Info("dagrun worker serves metrics", "url", "http://"+ln.Addr().String()+"/metrics")
	return func() {
		shutdown, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
		<-done
	}, nil
}

// checkConcurrency checks a --concurrency flag against the engine's bound.
func checkConcurrency(n int) error {
	if n < 1 || n > dagrun.MaxConcurrency {
		return usageError(fmt.Errorf("invalid --concurrency %d: use a number from 1 to %d", n, dagrun.MaxConcurrency))
	}
	return nil
}

// parseDurationFlag parses a duration flag into a usage error that says what
// a valid value looks like. Zero is allowed only when zeroOK.
func parseDurationFlag(name, value string, zeroOK bool) (time.Duration, error) {
	d, err := time.ParseDuration(value)
	switch {
	case err != nil:
		return 0, usageError(fmt.Errorf("invalid --%s %q: use a duration such as 500ms, 30s or 5m", name, value))
	case d < 0 || (d == 0 && !zeroOK):
		return 0, usageError(fmt.Errorf("invalid --%s %q: must be a positive duration such as 500ms, 30s or 5m", name, value))
	}
	return d, nil
}

// redactDSN hides a password in a postgres URL before it is logged.
// storeAttrs name the database a worker's start log line is about: the
// URL without its password, and on PostgreSQL the schema of the tables,
// which a mistyped --db-schema would otherwise make new without a word.
func (c *cli) storeAttrs(engine *dagrun.Engine) []any {
	attrs := []any{"db", redactDSN(c.db)}
	if s, ok := engine.Store().(interface{ Schema() string }); ok {
		attrs = append(attrs, "schema", s.Schema())
	}
	return attrs
}

func redactDSN(dsn string) string {
	at := strings.LastIndex(dsn, "@")
	scheme := strings.Index(dsn, "://")
	if at > scheme && scheme >= 0 {
		userinfo := dsn[scheme+3 : at]
		if i := strings.IndexByte(userinfo, ':'); i >= 0 {
			dsn = dsn[:scheme+3] + userinfo[:i] + ":***" + dsn[at:]
		}
	}
	// libpq also takes the password as a parameter, password=..., in a
	// URL's query as in a keyword/value string.
	return passwordParam.ReplaceAllString(dsn, "${1}password=***")
}

// passwordParam matches a password parameter, up to the next separator.
var passwordParam = regexp.MustCompile(`(^|[?&\s])password=[^&\s]*`)

// shortLease is the lease under which a worker warns: two workers on one
// SQLite file with --lease 100ms lost 14 claims of 40 while both ran (a
// heartbeat every 33 ms), one of 40 at 300ms, none at 1s.
const shortLease = time.Second
