package app

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/dagrun/dagrun"
	"github.com/dagrun/dagrun/cmd/dagrun/app/view"
	"github.com/dagrun/dagrun/storage"
)

func (c *cli) statusCommand() *cobra.Command {
	var jsonOut bool
	cmd := &cobra.Command{
		Use:   "status ID",
		Short: "Show an instance and a table of its steps",
		Args:  exactArgs(1, "status ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			engine, err := c.engine(ctx)
			if err != nil {
				return err
			}
			inst, err := engine.Get(ctx, args[0])
			if err != nil {
				return instanceError(args[0], err)
			}
			if jsonOut {
				return writeJSON(c.io.Stdout, view.NewInstance(inst))
			}
			return writeStatus(c.io.Stdout, inst, time.Now())
		},
	}
	cmd.Flags().BoolVar(&jsonOut, "json", false, "print the instance object as JSON")
	return cmd
}

// writeStatus prints an instance as a header and a step table.
func writeStatus(w io.Writer, inst *storage.Instance, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "Instance:\t%s\n", inst.ID)
	fmt.Fprintf(tw, "Workflow:\t%s\n", inst.Workflow)
	fmt.Fprintf(tw, "Status:\t%s\n", inst.Status)
	fmt.Fprintf(tw, "Created:\t%s\n", view.Time(inst.CreatedAt))
	if inst.FinishedAt != nil {
		fmt.Fprintf(tw, "Finished:\t%s (took %s)\n", view.Time(*inst.FinishedAt), roundDuration(inst.FinishedAt.Sub(inst.CreatedAt)))
	}
	if inst.Key != "" {
		fmt.Fprintf(tw, "Key:\t%s\n", inst.Key)
	}
	if inst.Error != "" {
		fmt.Fprintf(tw, "Error:\t%s\n", oneLineString(inst.Error))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STEP\tHANDLER\tSTATUS\tATTEMPTS\tDURATION\tERROR")
	for _, s := range inst.Steps {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", s.Name, s.Handler, s.Status, s.Attempts, stepDuration(s, now), truncate(oneLineString(s.Error), 80))
	}
	return tw.Flush()
}

func stepDuration(s storage.Step, now time.Time) string {
	switch {
	case s.StartedAt == nil:
		return "-"
	case s.FinishedAt != nil:
		return roundDuration(s.FinishedAt.Sub(*s.StartedAt))
	case s.Status == storage.StepRunning:
		return roundDuration(now.Sub(*s.StartedAt)) + "…"
	default:
		return "-"
	}
}

func truncate(s string, n int) string {
	if len([]rune(s)) <= n {
		return s
	}
	return string([]rune(s)[:n-1]) + "…"
}

func (c *cli) listCommand() *cobra.Command {
	var (
		p       storage.ListParams
		status  string
		jsonOut bool
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List instances, newest first",
		Args:  exactArgs(0, "list [--workflow W] [--status S] [--limit N] [--json]"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if status != "" {
				s := storage.InstanceStatus(status)
				switch s {
				case storage.InstancePending, storage.InstanceRunning, storage.InstanceCompleted, storage.InstanceFailed, storage.InstanceCancelled:
					p.Status = s
				default:
					return usageError(fmt.Errorf("invalid --status %q: use pending, running, completed, failed or cancelled", status))
				}
			}
			if p.Limit < 1 || p.Limit > dagrun.MaxListLimit {
				return usageError(fmt.Errorf("invalid --limit %d: use a number from 1 to %d", p.Limit, dagrun.MaxListLimit))
			}
			ctx := cmd.Context()
			engine, err := c.engine(ctx)
			if err != nil {
				return err
			}
			list, err := engine.List(ctx, p)
			if err != nil {
				return err
			}
			if jsonOut {
				out := make([]view.Instance, len(list))
				for i := range list {
					out[i] = view.NewInstance(&list[i])
				}
				return writeJSON(c.io.Stdout, out)
			}
			tw := tabwriter.NewWriter(c.io.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tWORKFLOW\tSTATUS\tSTEPS\tCREATED\tDURATION")
			for _, inst := range list {
				dur := "-"
				if inst.FinishedAt != nil {
					dur = roundDuration(inst.FinishedAt.Sub(inst.CreatedAt))
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", inst.ID, inst.Workflow, inst.Status, stepCounts(inst.Steps), view.Time(inst.CreatedAt), dur)
			}
			return tw.Flush()
		},
	}
	f := cmd.Flags()
	f.StringVar(&p.Workflow, "workflow", "", "only instances of this workflow")
	f.StringVar(&status, "status", "", "only instances with this status")
	f.IntVar(&p.Limit, "limit", 50, "at most this many instances")
	f.BoolVar(&jsonOut, "json", false, "print a JSON array of instance objects")
	return cmd
}

// stepCounts sums up an instance's steps as DONE/TOTAL, where done are the
// steps that ran to an end (completed, failed or skipped); cancelled steps
// never ran to one, so they are counted apart: "1/4, 3 cancelled".
func stepCounts(steps []storage.Step) string {
	done, cancelled := 0, 0
	for _, s := range steps {
		switch {
		case s.Status == storage.StepCancelled:
			cancelled++
		case s.Status.Finished():
			done++
		}
	}
	out := fmt.Sprintf("%d/%d", done, len(steps))
	if cancelled > 0 {
		out += fmt.Sprintf(", %d cancelled", cancelled)
	}
	return out
}

func (c *cli) statsCommand() *cobra.Command {
	var jsonOut bool
	cmd := &cobra.Command{
		Use:   "stats",
		Short: "Per workflow: instance counts by status, stuck steps, oldest ready step, step duration p50/p95; ready steps no live worker can run",
		Args:  exactArgs(0, "stats [--json]"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			engine, err := c.engine(ctx)
			if err != nil {
				return err
			}
			stats, err := engine.Store().Stats(ctx)
			if err != nil {
				return err
			}
			if jsonOut {
				return writeJSON(c.io.Stdout, newStatsJSON(stats))
			}
			tw := tabwriter.NewWriter(c.io.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "WORKFLOW\tPENDING\tRUNNING\tCOMPLETED\tFAILED\tCANCELLED\tREADY\tSTUCK\tOLDEST READY\tSTEP P50\tSTEP P95")
			for _, w := range stats.Workflows {
				n := w.Instances
				fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s\n", w.Workflow,
					n[storage.InstancePending], n[storage.InstanceRunning], n[storage.InstanceCompleted], n[storage.InstanceFailed], n[storage.InstanceCancelled],
					w.ReadySteps, w.StuckSteps, durOrDash(w.OldestReady), durOrDash(w.StepP50), durOrDash(w.StepP95))
			}
			if len(stats.Unserved) > 0 {
				fmt.Fprintln(tw, "\nREADY STEPS NO LIVE WORKER CAN RUN (run a worker of a binary with these handlers)")
				fmt.Fprintln(tw, "HANDLER\tREADY\tOLDEST READY")
				for _, h := range stats.Unserved {
					fmt.Fprintf(tw, "%s\t%d\t%s\n", h.Handler, h.Ready, durOrDash(h.OldestReady))
				}
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&jsonOut, "json", false, "print the figures as JSON")
	return cmd
}

type statsJSON struct {
	Workflows []workflowStatsJSON `json:"workflows"`
	Queues    []queueStatsJSON    `json:"queues"`
	// Unserved lists, per handler, the ready steps no live worker can run.
	Unserved []handlerStatsJSON `json:"unserved"`
}

type handlerStatsJSON struct {
	Handler       string  `json:"handler"`
	Ready         int     `json:"ready"`
	OldestReadyMs float64 `json:"oldestReadyMs"`
}

type workflowStatsJSON struct {
	Workflow      string         `json:"workflow"`
	Instances     map[string]int `json:"instances"`
	ReadySteps    int            `json:"readySteps"`
	RunningSteps  int            `json:"runningSteps"`
	StuckSteps    int            `json:"stuckSteps"`
	OldestReadyMs float64        `json:"oldestReadyMs"`
	StepP50Ms     float64        `json:"stepP50Ms"`
	StepP95Ms     float64        `json:"stepP95Ms"`
}

type queueStatsJSON struct {
	Queue   string `json:"queue"`
	Ready   int    `json:"ready"`
	Running int    `json:"running"`
	Stuck   int    `json:"stuck"`
}

func newStatsJSON(s *storage.Stats) statsJSON {
	out := statsJSON{Workflows: []workflowStatsJSON{}, Queues: []queueStatsJSON{}, Unserved: []handlerStatsJSON{}}
	for _, h := range s.Unserved {
		out.Unserved = append(out.Unserved, handlerStatsJSON{Handler: h.Handler, Ready: h.Ready, OldestReadyMs: ms(h.OldestReady)})
	}
	for _, w := range s.Workflows {
		counts := map[string]int{}
		for _, st := range []storage.InstanceStatus{storage.InstancePending, storage.InstanceRunning, storage.InstanceCompleted, storage.InstanceFailed, storage.InstanceCancelled} {
			counts[string(st)] = w.Instances[st]
		}
		out.Workflows = append(out.Workflows, workflowStatsJSON{
			Workflow: w.Workflow, Instances: counts, ReadySteps: w.ReadySteps, RunningSteps: w.RunningSteps, StuckSteps: w.StuckSteps,
			OldestReadyMs: ms(w.OldestReady), StepP50Ms: ms(w.StepP50), StepP95Ms: ms(w.StepP95),
		})
	}
	sort.Slice(out.Workflows, func(i, j int) bool { return out.Workflows[i].Workflow < out.Workflows[j].Workflow })
	for _, q := range s.Queues {
		out.Queues = append(out.Queues, queueStatsJSON{Queue: q.Queue, Ready: q.Ready, Running: q.Running, Stuck: q.Stuck})
	}
	sort.Slice(out.Queues, func(i, j int) bool { return out.Queues[i].Queue < out.Queues[j].Queue })
	return out
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func durOrDash(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	return roundDuration(d)
}

func (c *cli) handlersCommand() *cobra.Command {
	var workers bool
	cmd := &cobra.Command{
		Use:   "handlers",
		Short: "List the handler names registered in this binary, or with --workers the live workers' handlers",
		Args:  exactArgs(0, "handlers [--workers]"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !workers {
				_, err := fmt.Fprintln(c.io.Stdout, strings.Join(c.registry.Names(), "\n"))
				return err
			}
			ctx := cmd.Context()
			engine, err := c.engine(ctx)
			if err != nil {
				return err
			}
			live, err := engine.Store().ListWorkers(ctx)
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(c.io.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "WORKER\tQUEUES\tSTARTED\tLAST SEEN\tHANDLERS")
			for _, w := range live {
				queues := "all"
				if len(w.Queues) > 0 {
					queues = strings.Join(w.Queues, ",")
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", w.ID, queues, view.Time(w.StartedAt), view.Time(w.LastSeen), strings.Join(w.Handlers, ","))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&workers, "workers", false, "list the live workers of the database (any binary) with the handlers each registered")
	return cmd
}
