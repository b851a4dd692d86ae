package app

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/dagrun/dagrun"
)

func (c *cli) workerCommand() *cobra.Command {
	var (
		config dagrun.WorkerConfig
		queues string
	)
	cmd := &cobra.Command{
		Use:   "worker",
		Short: "Run steps until SIGINT or SIGTERM, then finish running steps within a grace period and release the rest",
		Args:  exactArgs(0, "worker [--concurrency N] [--queues a,b] [--lease DUR] [--poll DUR]"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if config.Concurrency < 1 {
				return usageError(fmt.Errorf("invalid --concurrency %d: must be at least 1", config.Concurrency))
			}
			if config.Lease <= 0 || config.Poll <= 0 || config.ShutdownGrace < 0 {
				return usageError(fmt.Errorf("--lease and --poll must be positive durations and --grace not negative"))
			}
			if queues != "" {
				for _, q := range strings.Split(queues, ",") {
					if q = strings.TrimSpace(q); q != "" {
						config.Queues = append(config.Queues, q)
					}
				}
			}
			ctx := cmd.Context()
			engine, err := c.engine(ctx)
			if err != nil {
				return err
			}
			worker, err := engine.NewWorker(&config)
			if err != nil {
				return usageError(err)
			}
			c.logger.Info("dagrun worker started", "id", worker.ID(), "concurrency", config.Concurrency, "queues", config.Queues, "db", redactDSN(c.db))
			err = worker.Run(ctx)
			c.logger.Info("dagrun worker stopped", "id", worker.ID())
			return err
		},
	}
	f := cmd.Flags()
	f.IntVar(&config.Concurrency, "concurrency", dagrun.DefaultConcurrency, "steps run at once")
	f.StringVar(&queues, "queues", "", "comma-separated queues to take steps from (default all)")
	f.DurationVar(&config.Lease, "lease", dagrun.DefaultLease, "claim lease; the worker heartbeats every third of it")
	f.DurationVar(&config.Poll, "poll", dagrun.DefaultPoll, "fallback polling interval")
	f.DurationVar(&config.ShutdownGrace, "grace", dagrun.DefaultShutdownGrace, "how long running steps may finish after SIGINT/SIGTERM")
	return cmd
}

// redactDSN hides a password in a postgres URL before it is logged.
func redactDSN(dsn string) string {
	at := strings.LastIndex(dsn, "@")
	scheme := strings.Index(dsn, "://")
	if at < 0 || scheme < 0 || at < scheme {
		return dsn
	}
	userinfo := dsn[scheme+3 : at]
	if i := strings.IndexByte(userinfo, ':'); i >= 0 {
		return dsn[:scheme+3] + userinfo[:i] + ":***" + dsn[at:]
	}
	return dsn
}
