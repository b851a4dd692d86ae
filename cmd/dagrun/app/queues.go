package app

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/dagrun/dagrun"
	"github.com/dagrun/dagrun/cmd/dagrun/app/view"
	"github.com/dagrun/dagrun/dag"
)

func (c *cli) queuesCommand() *cobra.Command {
	var jsonOut bool
	cmd := &cobra.Command{
		Use:   "queues",
		Short: "List the queues: depth (ready steps), held, running, scheduled (pending, not due yet), oldest wait and limits",
		Args:  exactArgs(0, "queues [--json]"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			engine, err := c.engine(ctx)
			if err != nil {
				return err
			}
			list, err := engine.Queues(ctx)
			if err != nil {
				return err
			}
			if jsonOut {
				return writeJSON(c.io.Stdout, view.NewQueues(list))
			}
			return writeQueues(c.io.Stdout, list)
		},
	}
	cmd.Flags().BoolVar(&jsonOut, "json", false, "print a JSON array of queue objects")
	return cmd
}

// writeQueues prints one row per queue.
func writeQueues(w io.Writer, list []dagrun.QueueInfo) error {
	if len(list) == 0 {
		_, err := fmt.Fprintln(w, "No queues: no step is ready, running or scheduled, and no queue has a limit.")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "QUEUE\tDEPTH\tHELD\tRUNNING\tSCHEDULED\tOLDEST WAIT\tCONCURRENCY\tRATE")
	for _, q := range list {
		wait := "-"
		if q.Ready > 0 {
			wait = q.OldestWait.Round(time.Millisecond).String()
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\t%s\t%s\n", q.Queue, q.Ready, q.Held, q.Running, q.Scheduled, wait,
			concurrencyText(q.Concurrency), rateText(q.QueueLimit))
	}
	return tw.Flush()
}

func concurrencyText(n int) string {
	if n == 0 {
		return "none"
	}
	return fmt.Sprint(n)
}

func rateText(l dagrun.QueueLimit) string {
	if l.Rate == 0 {
		return "none"
	}
	return fmt.Sprintf("%d/%s", l.Rate, dag.FormatDuration(l.Per))
}

func (c *cli) queueCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "queue",
		Short: "Set a queue's limits (stored in the database: every worker obeys them at once)",
		Args:  subcommandArgs("queue set NAME [--concurrency N] [--rate N/DUR]"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return usageError(fmt.Errorf("usage: dagrun queue set NAME [--concurrency N] [--rate N/DUR]"))
		},
	}
	var (
		concurrency string
		rate        string
	)
	set := &cobra.Command{
		Use:   "set NAME [--concurrency N] [--rate N/DUR]",
		Short: "Limit a queue's running steps (--concurrency N) and starts (--rate N/DUR, e.g. 10/s); 0 or none clears a limit, an unnamed one is kept",
		Args:  exactArgs(1, "queue set NAME [--concurrency N] [--rate N/DUR]"),
		RunE: func(cmd *cobra.Command, args []string) error {
			flags := cmd.Flags()
			if !flags.Changed("concurrency") && !flags.Changed("rate") {
				return usageError(fmt.Errorf("queue set %s: give --concurrency N, --rate N/DUR or both (0 or none clears one)", args[0]))
			}
			n, per, err := dagrun.ParseRate(rate)
			if err != nil {
				return err
			}
			most := 0
			if flags.Changed("concurrency") {
				if most, err = parseConcurrency(concurrency); err != nil {
					return err
				}
			}
			ctx := cmd.Context()
			engine, err := c.engine(ctx)
			if err != nil {
				return err
			}
			// A limit not named is kept.
			change := dagrun.QueueLimitChange{Queue: args[0]}
			if flags.Changed("concurrency") {
				change.Concurrency = &most
			}
			if flags.Changed("rate") {
				change.Rate = &dagrun.QueueRate{Rate: n, Per: per}
			}
			known, err := c.queueKnown(ctx, engine, args[0])
			if err != nil {
				return err
			}
			l, err := engine.ChangeQueueLimit(ctx, change)
			if err != nil {
				return err
			}
			if !known {
				// Most likely a typo, which would leave the real queue as
				// it was; the limit is kept for a workflow still to come.
				msg := fmt.Sprintf("no workflow of %s puts steps in queue %s, nor has the database any of its steps (the workflows' queues: %s); the limit is stored anyway",
					c.workflowsDir, args[0], strings.Join(workflowQueues(engine), ", "))
				if !c.jsonStderr() {
					msg = "warning: " + msg // a record says so by its level
				}
				c.say(slog.LevelWarn, msg)
			}
			_, err = fmt.Fprintf(c.io.Stdout, "queue %s: concurrency %s, rate %s\n", l.Queue, concurrencyText(l.Concurrency), rateText(l))
			return err
		},
	}
	set.Flags().StringVar(&concurrency, "concurrency", "", "most steps of the queue running at once, across every worker (0 or none: no limit)")
	set.Flags().StringVar(&rate, "rate", "", "most steps of the queue started per duration, e.g. 10/s, 100/1m or 1000/1d (none: no limit)")
	set.SetFlagErrorFunc(flagError)
	cmd.AddCommand(set)
	return cmd
}

// parseConcurrency reads --concurrency: a whole number, or none (as 0)
// for no limit, as --rate takes none.
func parseConcurrency(s string) (int, error) {
	if s == "none" {
		return 0, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, usageError(fmt.Errorf("--concurrency %q: want a whole number, or 0 or none for no limit", s))
	}
	return n, nil
}

// queueKnown reports whether a loaded workflow puts steps in queue, or
// the database knows it (its steps, or a limit set before).
func (c *cli) queueKnown(ctx context.Context, engine *dagrun.Engine, queue string) (bool, error) {
	if slices.Contains(workflowQueues(engine), queue) {
		return true, nil
	}
	stored, err := engine.Queues(ctx)
	if err != nil {
		return false, err
	}
	return slices.ContainsFunc(stored, func(q dagrun.QueueInfo) bool { return q.Queue == queue }), nil
}

// workflowQueues lists the queues the loaded workflows' steps go to,
// sorted.
func workflowQueues(engine *dagrun.Engine) []string {
	seen := map[string]bool{}
	for _, w := range engine.Workflows() {
		for _, s := range append(slices.Clip(w.Steps), w.OnFailure...) {
			seen[s.Queue] = true
		}
	}
	return slices.Sorted(maps.Keys(seen))
}
