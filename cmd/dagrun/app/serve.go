package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/dagrun/dagrun"
	"github.com/dagrun/dagrun/cmd/dagrun/app/web"
)

// HTTP server timeouts: generous for the API's small requests, and short
// enough that a slow or stalled client cannot hold connections forever.
const (
	serveReadHeaderTimeout = 10 * time.Second
	serveReadTimeout       = 30 * time.Second
	serveWriteTimeout      = 60 * time.Second
	serveIdleTimeout       = 2 * time.Minute
	serveShutdownTimeout   = 10 * time.Second
)

func (c *cli) serveCommand() *cobra.Command {
	var (
		addr        string
		token       string
		namedTokens []string
		withWorker  bool
		workerFlags workerFlags
		noSchedules bool
		tlsCert     string
		tlsKey      string
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve the HTTP JSON API, the web UI and Prometheus /metrics; --worker also runs steps",
		Long: "Serve the HTTP JSON API under /api/, the web UI at /, Prometheus metrics at /metrics and a health check at /healthz.\n" +
			"With --worker it also runs a worker in the same process, so `dagrun serve --worker` alone is a complete\n" +
			"single-machine deployment. With a token (--token or DAGRUN_TOKEN) every route but /healthz needs\n" +
			"Authorization: Bearer <token>; a browser signs in on the page the server shows it, which sets a cookie.\n" +
			"A non-loopback --addr is refused without a token. With --tls-cert and --tls-key it serves HTTPS, and reads\n" +
			"the files again when they change. SIGINT or SIGTERM stop serving, then the worker finishes its running steps.",
		Args: exactArgs(0, "serve [--addr 127.0.0.1:8080] [--token T] [--worker [--concurrency N] [--queues a,b] [--lease DUR] [--poll DUR] [--grace DUR]] [--no-schedules] [--tls-cert FILE --tls-key FILE]"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			// The environment is read here rather than as the flag's
			// default, so --help never prints the token.
			if token == "" {
				token = c.io.Getenv("DAGRUN_TOKEN")
			}
			if err := web.CheckTokenSecret(token); err != nil {
				return usageError(fmt.Errorf("invalid --token (or DAGRUN_TOKEN): %w", err))
			}
			tokens, err := parseNamedTokens(namedTokens, c.io.Getenv("DAGRUN_TOKENS"), token)
			if err != nil {
				return err
			}
			host, _, err := net.SplitHostPort(addr)
			if err != nil {
				return usageError(fmt.Errorf("invalid --addr %q: use HOST:PORT, e.g. 127.0.0.1:8080", addr))
			}
			if token == "" && len(tokens) == 0 && !web.IsLoopbackHost(host) {
				return usageError(fmt.Errorf("refusing to serve on %s without a token: anyone who can reach it could start and cancel workflows; set --token or DAGRUN_TOKEN, or bind a loopback address such as 127.0.0.1:8080", addr))
			}
			var workerConfig *dagrun.WorkerConfig
			if withWorker {
				config, err := workerFlags.config(cmd, c)
				if err != nil {
					return err
				}
				workerConfig = &config
			} else if err := refuseWithoutWorker(cmd); err != nil {
				return err
			}
			if tlsCert == "" {
				tlsCert = c.io.Getenv("DAGRUN_TLS_CERT")
			}
			if tlsKey == "" {
				tlsKey = c.io.Getenv("DAGRUN_TLS_KEY")
			}
			certs, err := loadServeTLS(tlsCert, tlsKey, c.logger)
			if err != nil {
				return err
			}
			return c.serve(cmd.Context(), addr, web.Config{Token: token, Tokens: tokens}, certs, workerConfig, noSchedules)
		},
	}
	f := cmd.Flags()
	f.StringVar(&addr, "addr", "127.0.0.1:8080", "address to listen on; a non-loopback address needs a token")
	f.StringVar(&token, "token", "", "bearer token required by the API, the UI and /metrics (env DAGRUN_TOKEN); the history names it api")
	f.StringArrayVar(&namedTokens, "named-token", nil, "NAME=SECRET: another accepted token, whose operations the history records as done by NAME; repeat for more (env DAGRUN_TOKENS, comma-separated)")
	f.BoolVar(&withWorker, "worker", false, "also run a worker in this process")
	workerFlags.register(cmd, "the embedded worker (with --worker)")
	f.BoolVar(&noSchedules, "no-schedules", false, "do not run the scheduler, which starts the workflows' scheduled instances")
	f.StringVar(&tlsCert, "tls-cert", "", "PEM certificate (chain) file: serve HTTPS, with --tls-key (env DAGRUN_TLS_CERT)")
	f.StringVar(&tlsKey, "tls-key", "", "PEM private key file of --tls-cert (env DAGRUN_TLS_KEY)")
	c.addPlanLimitFlags(cmd)
	return cmd
}

// serve serves the API on addr, with a worker of workerConfig in the
// same process unless it is nil.
func (c *cli) serve(ctx context.Context, addr string, auth web.Config, certs *serveTLS, workerConfig *dagrun.WorkerConfig, noSchedules bool) error {
	withWorker := workerConfig != nil
	// The engine reports to the metrics, so they must exist before it.
	metrics := web.NewMetrics()
	c.observer = metrics
	c.conns = serveConns
	if withWorker {
		c.conns += workerConns
	}
	c.longRunning = true
	engine, err := c.engine(ctx)
	if err != nil {
		return err
	}
	// The per-workflow series start at zero, those of workflows added to
	// the folder later too.
	initMetrics := func() {
		for _, w := range engine.Workflows() {
			metrics.InitWorkflows(w.Name)
			if !noSchedules && len(w.Schedules) > 0 {
				metrics.InitSchedules(w.Name)
			}
		}
	}
	initMetrics()
	handler, err := web.NewServer(engine, &web.Config{Token: auth.Token, Tokens: auth.Tokens, Logger: c.logger, Metrics: metrics})
	if err != nil {
		return err
	}

	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		// An address this host cannot listen on is the user's to change
		// (exit 2); anything else (no file descriptors left, say) is not.
		var (
			addrErr *net.AddrError
			dnsErr  *net.DNSError
			hint    string
		)
		switch {
		case errors.Is(err, syscall.EADDRINUSE):
			hint = "is another dagrun serve running? choose another port with --addr"
		case errors.Is(err, syscall.EACCES):
			hint = "ports below 1024 need privileges: choose another port with --addr"
		case errors.Is(err, syscall.EADDRNOTAVAIL):
			hint = "that address is not one of this host's: give --addr one of its addresses, such as 127.0.0.1:8080"
		case errors.As(err, &addrErr), errors.As(err, &dnsErr):
			hint = "give --addr as HOST:PORT, such as 127.0.0.1:8080"
		default:
			return fmt.Errorf("listen on %s: %v", addr, err)
		}
		return usageError(fmt.Errorf("listen on %s: %v (%s)", addr, err, hint))
	}
	server := &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: serveReadHeaderTimeout,
		ReadTimeout:       serveReadTimeout,
		WriteTimeout:      serveWriteTimeout,
		IdleTimeout:       serveIdleTimeout,
		ErrorLog:          slog.NewLogLogger(c.logger.Handler(), slog.LevelWarn),
	}

	// The worker outlives the HTTP server by the time it needs to finish
	// its running steps: it stops only once serving has stopped.
	workerCtx, stopWorker := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWorker()
	workerDone := make(chan error, 1)
	if withWorker {
		worker, err := engine.NewWorker(workerConfig)
		if err != nil {
			_ = ln.Close()
			return usageError(err)
		}
		c.logger.Info("dagrun worker started", append([]any{"id", worker.ID(), "concurrency", workerConfig.Concurrency, "queues", workerConfig.Queues}, c.storeAttrs(engine)...)...)
		go func() { workerDone <- worker.Run(workerCtx) }()
	} else {
		workerDone <- nil
	}

	scheduler := c.startScheduler(ctx, engine, noSchedules)
	defer scheduler.Stop()
	stopFollowing := c.followWorkflowsFolder(ctx, engine, func() {
		scheduler.Restart()
		initMetrics()
	})
	defer stopFollowing()
	serveDone := make(chan error, 1)
	scheme := "http"
	if certs != nil {
		// ServeTLS with no files: the certificate comes from the
		// config's GetCertificate, and net/http offers HTTP/2.
		server.TLSConfig, scheme = certs.config(), "https"
		go func() { serveDone <- server.ServeTLS(ln, "", "") }()
	} else {
		go func() { serveDone <- server.Serve(ln) }()
	}
	c.logger.Info("dagrun serve listening", "url", scheme+"://"+ln.Addr().String()+"/",
		"workflows", len(engine.Workflows()), "worker", withWorker, "token", auth.Token != "" || len(auth.Tokens) > 0)

	// The worker stops by itself only when its database is lost; serving
	// then stops too, so the process exits with the worker's error instead
	// of answering 503 with no one running steps.
	var workerStopped <-chan error
	if withWorker {
		workerStopped = workerDone
	}
	var serveErr, workerErr error
	workerReturned := !withWorker
	select {
	case <-ctx.Done():
		c.logger.Info("dagrun serve shutting down")
		c.shutdown(ctx, server)
		<-serveDone
	case err := <-serveDone:
		if !errors.Is(err, http.ErrServerClosed) {
			serveErr = fmt.Errorf("serve HTTP: %w", err)
		}
	case workerErr = <-workerStopped:
		workerReturned = true
		c.logger.Error("dagrun serve shutting down: its worker stopped", slog.Any("error", workerErr))
		c.shutdown(ctx, server)
		<-serveDone
	}
	stopWorker()
	if !workerReturned {
		workerErr = <-workerDone
	}
	if workerErr != nil && serveErr == nil {
		serveErr = workerErr
	}
	c.logger.Info("dagrun serve stopped")
	return serveErr
}

// shutdown stops serving, letting open requests finish for a while.
func (c *cli) shutdown(ctx context.Context, server *http.Server) {
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), serveShutdownTimeout)
	defer cancel()
	if err := server.Shutdown(shutdownCtx); err != nil {
		c.logger.Warn("dagrun serve: requests still open at shutdown were cut", slog.Any("error", err))
		_ = server.Close()
	}
}
