package app

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/dagrun/dagrun"
	"github.com/dagrun/dagrun/cmd/dagrun/app/view"
)

func (c *cli) schedulesCommand() *cobra.Command {
	var (
		jsonOut bool
		next    int
	)
	cmd := &cobra.Command{
		Use:   "schedules",
		Short: "List the workflows' schedules: next fire times, last instance, paused",
		Args:  exactArgs(0, "schedules [--next N] [--json]"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if next < 1 || next > 100 {
				return usageError(fmt.Errorf("invalid --next %d: must be from 1 to 100", next))
			}
			ctx := cmd.Context()
			engine, err := c.engine(ctx)
			if err != nil {
				return err
			}
			list, err := engine.Schedules(ctx, time.Now(), next)
			if err != nil {
				return err
			}
			c.warnInvalidWorkflows() // their schedules are not listed
			if jsonOut {
				return writeJSON(c.io.Stdout, view.NewSchedules(list))
			}
			return writeSchedules(c.io.Stdout, list)
		},
	}
	cmd.Flags().BoolVar(&jsonOut, "json", false, "print a JSON array of schedule objects")
	cmd.Flags().IntVar(&next, "next", 3, "how many next fire times --json lists (the table shows the first)")
	return cmd
}

// writeSchedules prints one row per schedule, its next fire time in its
// own zone.
func writeSchedules(w io.Writer, list []dagrun.ScheduleInfo) error {
	if len(list) == 0 {
		_, err := fmt.Fprintln(w, "No schedules: add a schedule: list to a workflow file (see workflows/README.md).")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "WORKFLOW\tINDEX\tCRON\tTIMEZONE\tNEXT\tPAUSED\tLAST INSTANCE\tSTATUS")
	for _, s := range list {
		next := "-"
		if len(s.Next) > 0 {
			loc, err := time.LoadLocation(s.Timezone)
			if err != nil {
				loc = time.UTC
			}
			next = s.Next[0].In(loc).Format("2006-01-02 15:04:05 MST")
		}
		last, status := "-", "-"
		if s.LastInstanceID != "" {
			last, status = s.LastInstanceID, string(s.LastInstanceStatus)
			if status == "" {
				status = "pruned"
			}
		}
		paused := "no"
		if s.Paused {
			paused = "yes"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", s.Workflow, s.Index, s.Cron, s.Timezone, next, paused, last, status)
	}
	return tw.Flush()
}

func (c *cli) scheduleCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "schedule",
		Short: "Pause or resume a workflow's schedules (stored in the database: every scheduler obeys, restarts keep it)",
		Args:  subcommandArgs("schedule pause|resume WORKFLOW [INDEX]"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return usageError(fmt.Errorf("usage: dagrun schedule pause|resume WORKFLOW [INDEX]"))
		},
	}
	for _, paused := range []bool{true, false} {
		verb, short := "pause", "Pause a workflow's schedule INDEX (from 0, as `dagrun schedules` lists it), or all of them: no tick fires until it is resumed"
		if !paused {
			verb, short = "resume", "Resume a paused schedule, or all of a workflow's: it fires from the next tick on, without catching up the pause"
		}
		sub := &cobra.Command{
			Use:   verb + " WORKFLOW [INDEX]",
			Short: short,
			Args: func(_ *cobra.Command, args []string) error {
				if len(args) < 1 || len(args) > 2 {
					return usageError(fmt.Errorf("usage: dagrun schedule %s WORKFLOW [INDEX] (got %s)", verb, argumentCount(len(args))))
				}
				return nil
			},
			RunE: func(cmd *cobra.Command, args []string) error {
				index := -1
				if len(args) == 2 {
					n, err := strconv.Atoi(args[1])
					if err != nil || n < 0 {
						return usageError(fmt.Errorf("invalid INDEX %q: use the schedule's number from `dagrun schedules` (0 for the first)", args[1]))
					}
					index = n
				}
				ctx := cmd.Context()
				engine, err := c.engine(ctx)
				if err != nil {
					return err
				}
				if err := engine.PauseSchedule(ctx, args[0], index, paused); err != nil {
					return err
				}
				which := "every schedule of " + args[0]
				if index >= 0 {
					which = fmt.Sprintf("schedule %d of %s", index, args[0])
				}
				_, err = fmt.Fprintf(c.io.Stdout, "%sd %s\n", verb, which)
				return err
			},
		}
		sub.SetFlagErrorFunc(flagError)
		cmd.AddCommand(sub)
	}
	return cmd
}

// schedulerRun is the scheduler beside a worker or a server.
type schedulerRun struct {
	mu      sync.Mutex
	stopRun func() // stops the scheduler running now, and waits for it
	stopped bool
	start   func()
}

// startScheduler runs the engine's scheduler beside a worker or a server,
// unless disabled. A scheduler that cannot register its schedules is
// logged, not fatal: the worker beside it still has steps to run.
func (c *cli) startScheduler(ctx context.Context, engine *dagrun.Engine, disabled bool) *schedulerRun {
	r := &schedulerRun{stopRun: func() {}}
	if disabled {
		c.logger.Info("dagrun scheduler off (--no-schedules): this process starts no scheduled instances")
		r.stopped = true
		return r
	}
	r.start = func() {
		s, err := engine.NewScheduler(nil)
		if err != nil {
			c.logger.Error("dagrun scheduler not started", slog.Any("error", err))
			r.stopRun = func() {}
			return
		}
		ctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			if err := s.Run(ctx); err != nil {
				c.logger.Error("dagrun scheduler stopped", slog.Any("error", err))
			}
		}()
		r.stopRun = func() { cancel(); <-done }
	}
	r.start()
	return r
}

// Restart runs the scheduler again over the engine's workflows as they
// are now (their folder was reloaded). The store keeps each schedule's
// last tick, so an unchanged schedule goes on where it was, and a new or
// changed one fires only ticks after now.
func (r *schedulerRun) Restart() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped {
		return
	}
	r.stopRun()
	r.start()
}

// Stop stops the scheduler and waits for it to return.
func (r *schedulerRun) Stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stopRun()
	r.stopped = true
}
