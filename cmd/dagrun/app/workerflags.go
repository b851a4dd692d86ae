package app

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/dagrun/dagrun"
	"github.com/dagrun/dagrun/dag"
)

// workerFlags are the flags of a worker: those of `dagrun worker`, and of
// the worker `dagrun serve --worker` runs in its process.
type workerFlags struct {
	concurrency        int
	queues             string
	lease, poll, grace string
}

// register adds the flags to cmd; what names the worker in their help
// ("the embedded worker" for serve).
func (wf *workerFlags) register(cmd *cobra.Command, what string) {
	f := cmd.Flags()
	f.IntVar(&wf.concurrency, "concurrency", dagrun.DefaultConcurrency, "steps "+what+" runs at once")
	f.StringVar(&wf.queues, "queues", "", "comma-separated queues "+what+" takes steps from (default all)")
	f.StringVar(&wf.lease, "lease", dagrun.DefaultLease.String(), "claim lease; "+what+" heartbeats every third of it")
	f.StringVar(&wf.poll, "poll", dagrun.DefaultPoll.String(), "fallback polling interval of "+what)
	f.StringVar(&wf.grace, "grace", dagrun.DefaultShutdownGrace.String(), "how long running steps of "+what+" may finish after SIGINT/SIGTERM")
}

// workerFlagNames are the flags register adds.
var workerFlagNames = []string{"concurrency", "queues", "lease", "poll", "grace"}

// config checks the flags, before the database is opened (bad flags
// touch nothing), and returns the worker's configuration.
func (wf *workerFlags) config(cmd *cobra.Command, c *cli) (dagrun.WorkerConfig, error) {
	config := dagrun.WorkerConfig{Concurrency: wf.concurrency}
	if err := checkConcurrency(config.Concurrency); err != nil {
		return config, err
	}
	var err error
	if config.Lease, err = parseDurationFlag("lease", wf.lease, false); err != nil {
		return config, err
	}
	if config.Poll, err = parseDurationFlag("poll", wf.poll, false); err != nil {
		return config, err
	}
	if config.ShutdownGrace, err = parseDurationFlag("grace", wf.grace, true); err != nil {
		return config, err
	}
	if cmd.Flags().Changed("queues") {
		for _, q := range strings.Split(wf.queues, ",") {
			if q = strings.TrimSpace(q); q != "" {
				// A name no workflow could give would wait for ever
				// (bytes that are not UTF-8 are Validate's).
				if err := dag.CheckName("queue", q); err != nil && utf8.ValidString(q) {
					return config, usageError(fmt.Errorf("--queues: %w", err))
				}
				config.Queues = append(config.Queues, q)
			}
		}
		if len(config.Queues) == 0 {
			// Not every queue: whoever wrote it meant some.
			return config, usageError(fmt.Errorf("--queues %q names no queue: give comma-separated names, or leave it out for every queue", wf.queues))
		}
	}
	if err := config.Validate(); err != nil {
		return config, usageError(err)
	}
	if config.Lease < shortLease {
		c.logger.Warn("dagrun worker: a lease this short can run out while a busy machine or database delays a heartbeat; "+
			"another worker then runs the step again, as for a crash", "lease", config.Lease, "heartbeat_every", config.Lease/3)
	}
	return config, nil
}

// refuseWithoutWorker refuses serve's worker flags without --worker: they
// would change nothing.
func refuseWithoutWorker(cmd *cobra.Command) error {
	for _, name := range workerFlagNames {
		if cmd.Flags().Changed(name) {
			return usageError(errors.New("--" + name + " sets the embedded worker: add --worker, or leave it out"))
		}
	}
	return nil
}
