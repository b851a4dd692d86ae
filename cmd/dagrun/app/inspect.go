package app

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/dagrun/dagrun"
	"github.com/dagrun/dagrun/cmd/dagrun/app/view"
	"github.com/dagrun/dagrun/storage"
)

func (c *cli) statusCommand() *cobra.Command {
	var (
		jsonOut bool
		items   storage.ItemsParams
		status  string
	)
	cmd := &cobra.Command{
		Use:   "status ID",
		Short: "Show an instance and a table of its steps, or with --step a page of a forEach step's items",
		Args:  exactArgs(1, "status ID [--step STEP [--offset N] [--limit N] [--status S]] [--json]"),
		RunE: func(cmd *cobra.Command, args []string) error {
			flags := cmd.Flags()
			if items.Step == "" && (flags.Changed("offset") || flags.Changed("limit") || flags.Changed("status")) {
				return usageError(errors.New("--offset, --limit and --status page the items of one step: add --step STEP"))
			}
			if items.Step != "" {
				if err := view.CheckItemPaging(items.Offset, items.Limit, "--"); err != nil {
					return usageError(err)
				}
				var err error
				if items.Status, err = view.ParseItemStatus(status); err != nil {
					return usageError(fmt.Errorf("invalid --status %q: use pending, running, completed, failed or cancelled", status))
				}
			}
			ctx := cmd.Context()
			engine, err := c.engine(ctx)
			if err != nil {
				return err
			}
			if items.Step != "" {
				items.InstanceID = args[0]
				return c.writeItems(ctx, items, jsonOut, engine)
			}
			inst, err := engine.Get(ctx, args[0])
			if err != nil {
				return c.instanceError(args[0], err)
			}
			if jsonOut {
				return writeJSON(c.io.Stdout, view.NewInstance(inst))
			}
			return writeStatus(c.io.Stdout, inst, time.Now())
		},
	}
	f := cmd.Flags()
	f.BoolVar(&jsonOut, "json", false, "print the instance object (with --step, the page of items) as JSON")
	f.StringVar(&items.Step, "step", "", "show a page of this forEach step's items instead of the step table")
	f.IntVar(&items.Offset, "offset", 0, "with --step: skip this many items")
	f.IntVar(&items.Limit, "limit", view.DefaultItemLimit, fmt.Sprintf("with --step: at most this many items (1 to %d)", view.MaxItemLimit))
	f.StringVar(&status, "status", "", "with --step: only items in this status (pending, running, completed, failed or cancelled)")
	return cmd
}

// writeItems prints a page of a forEach step's items.
func (c *cli) writeItems(ctx context.Context, p storage.ItemsParams, jsonOut bool, engine *dagrun.Engine) error {
	id := p.InstanceID
	page, err := view.LoadItems(ctx, engine.Store(), p, view.ForEachOf(engine))
	var (
		noStep     *view.StepNotFoundError
		notForEach *view.NotForEachError
	)
	switch {
	case errors.As(err, &noStep), errors.As(err, &notForEach):
		return usageError(err)
	case err != nil:
		return c.instanceError(id, err)
	case jsonOut:
		return writeJSON(c.io.Stdout, page.Page())
	}
	return writeItemTable(c.io.Stdout, id, page, time.Now())
}

// writeItemTable prints a step's item counts and a page of its items, with
// the flags that show the next page.
func writeItemTable(w io.Writer, id string, page *view.StepItems, now time.Time) error {
	step := page.Step
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "Instance:\t%s\n", id)
	fmt.Fprintf(tw, "Step:\t%s\n", step.Name)
	fmt.Fprintf(tw, "Status:\t%s\n", step.Status)
	if step.Items == nil {
		fmt.Fprintf(tw, "Items:\tnone yet (the step has not expanded)\n")
		return tw.Flush()
	}
	fmt.Fprintf(tw, "Items:\t%s\n", itemCounts(step.Items))
	switch {
	case len(page.Items) == 0:
		fmt.Fprintf(tw, "Showing:\tnone of %d\n", page.Total)
	default:
		first, last := page.Offset, page.Offset+len(page.Items)
		more := ""
		if last < page.Total {
			more = fmt.Sprintf(" (next page: --offset %d)", last)
		}
		fmt.Fprintf(tw, "Showing:\t%d to %d of %d%s\n", first+1, last, page.Total, more)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(page.Items) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	// The items of a forEach workflow step each run as a child instance.
	children := step.Workflow != ""
	if children {
		fmt.Fprintln(tw, "INDEX\tSTATUS\tCHILD\tDURATION\tERROR")
	} else {
		fmt.Fprintln(tw, "INDEX\tSTATUS\tATTEMPTS\tDURATION\tERROR")
	}
	for _, it := range page.Items {
		third := strconv.Itoa(it.Attempts)
		if children {
			third = cmp.Or(it.Child, "-")
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", it.Index, it.Status, third,
			runDuration(it.StartedAt, it.FinishedAt, it.Status == storage.StepRunning, now), truncate(oneLineString(it.Error), 80))
	}
	return tw.Flush()
}

// itemCounts is a forEach step's counts on one line, e.g.
// "9,990/10,000 completed, 2 failed, 8 running", or "no items" for an
// empty list and for a step that failed before its list was read: "0/0
// completed" beside a failed step reads as a success.
func itemCounts(c *storage.ItemCounts) string {
	if c.Total == 0 {
		return "no items"
	}
	out := fmt.Sprintf("%d/%d completed", c.Completed, c.Total)
	for _, n := range []struct {
		count int
		name  string
	}{{c.Running, "running"}, {c.Pending, "pending"}, {c.Failed, "failed"}, {c.Cancelled, "cancelled"}} {
		if n.count > 0 {
			out += fmt.Sprintf(", %d %s", n.count, n.name)
		}
	}
	return out
}

// writeStatus prints an instance as a header and a step table. A forEach
// step shows its item counts in an ITEMS column, present only when some
// step has items, with a hint at the command that pages them.
func writeStatus(w io.Writer, inst *storage.Instance, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "Instance:\t%s\n", inst.ID)
	fmt.Fprintf(tw, "Workflow:\t%s\n", inst.Workflow)
	if inst.Parent != nil {
		fmt.Fprintf(tw, "Parent:\t%s\n", parentLine(inst.Parent))
	}
	fmt.Fprintf(tw, "Status:\t%s\n", statusText(inst))
	fmt.Fprintf(tw, "Created:\t%s\n", view.Time(inst.CreatedAt))
	writeTimeout(tw, inst, now)
	if inst.FinishedAt != nil {
		fmt.Fprintf(tw, "Finished:\t%s (took %s)\n", view.Time(*inst.FinishedAt), roundDuration(inst.FinishedAt.Sub(inst.CreatedAt)))
	}
	if inst.Key != "" {
		fmt.Fprintf(tw, "Key:\t%s\n", oneLineText(inst.Key))
	}
	if inst.Error != "" {
		fmt.Fprintf(tw, "Error:\t%s\n", oneLineString(inst.Error))
	}
	if inst.FailedStep != "" {
		fmt.Fprintf(tw, "Failed step:\t%s\n", inst.FailedStep)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	forEach := ""
	for _, s := range inst.Steps {
		if s.Items != nil && forEach == "" {
			forEach = s.Name
		}
	}
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if forEach == "" {
		fmt.Fprintln(tw, "STEP\tHANDLER\tSTATUS\tATTEMPTS\tDURATION\tERROR")
	} else {
		fmt.Fprintln(tw, "STEP\tHANDLER\tSTATUS\tATTEMPTS\tDURATION\tITEMS\tERROR")
	}
	for _, s := range inst.Steps {
		// A forEach step never runs a handler itself: its items have the attempts.
		attempts := strconv.Itoa(s.Attempts)
		if s.Items != nil || s.Workflow != "" {
			attempts = "-" // a workflow step's child has the attempts
		}
		handler := s.Handler
		switch {
		case s.Workflow != "": // see writeChildren
			handler = "workflow:" + s.Workflow
		case handler == "": // a wait step: see writeWakes
			handler = "-"
		}
		row := []any{stepLabel(s), handler, s.Status, attempts, stepDuration(s, now)}
		format := "%s\t%s\t%s\t%s\t%s\t"
		if forEach != "" {
			counts := "-"
			if s.Items != nil && s.Status != storage.StepBlocked { // not expanded yet
				counts = itemCounts(s.Items)
			}
			row = append(row, counts)
			format += "%s\t"
		}
		fmt.Fprintf(tw, format+"%s\n", append(row, truncate(oneLineString(s.Error), 80))...)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if forEach != "" {
		fmt.Fprintf(w, "\nItems of a forEach step: dagrun status %s --step %s\n", inst.ID, forEach)
	}
	writeChildren(w, inst)
	writeWakes(w, inst, now)
	writeOperations(w, inst)
	writeHistory(w, inst)
	return nil
}

// historyLines is how many of an instance's latest events status prints.
const historyLines = 20

// writeHistory prints the latest of what happened to the instance, oldest
// first: its steps' attempts, their errors and retries, what was skipped or
// cancelled, and what was done by hand, marked with who did it (also listed
// on their own, see writeOperations), so that the history reads through a
// repair. The whole history is in the JSON and the API.
func writeHistory(w io.Writer, inst *storage.Instance) {
	events := inst.Events
	if len(events) == 0 {
		return
	}
	if len(events) > historyLines || inst.EventsTruncated {
		events = events[max(0, len(events)-historyLines):]
		fmt.Fprintf(w, "\nHistory (the latest %d events; GET /api/instances/%s/events has them all, dagrun status %s --json the latest %d):\n",
			len(events), inst.ID, inst.ID, storage.InstanceEvents)
	} else {
		fmt.Fprintln(w, "\nHistory:")
	}
	for _, e := range events {
		what := string(e.Type)
		if e.Step != "" {
			what += " " + e.Step
			if e.Attempt > 0 {
				what += fmt.Sprintf("#%d", e.Attempt)
			}
		}
		if e.Message != "" {
			what += ": " + truncate(oneLineString(e.Message), 120)
		}
		if byHand(e) {
			what += " (by " + oneLineString(e.Actor) + ")"
		}
		fmt.Fprintf(w, "  %s  %s\n", view.Time(e.At), what)
	}
}

// parentLine names the step (and item) that started a child instance, with
// the command that shows it.
func parentLine(p *storage.ParentRef) string {
	step := "step " + p.Step
	if p.Item >= 0 {
		step += fmt.Sprintf(", item %d", p.Item)
	}
	return fmt.Sprintf("%s (%s): dagrun status %s", p.InstanceID, step, p.InstanceID)
}

// maxChildrenShown bounds the child IDs status prints for one step; a
// forEach workflow step may have thousands, which list --parent pages.
const maxChildrenShown = 5

// writeChildren names the child instances of the workflow steps, with the
// command that shows them.
func writeChildren(w io.Writer, inst *storage.Instance) {
	first := true
	for _, s := range inst.Steps {
		if len(s.Children) == 0 {
			continue
		}
		if first {
			fmt.Fprintln(w)
			first = false
		}
		if len(s.Children) == 1 && s.Items == nil {
			fmt.Fprintf(w, "%s runs workflow %s as child instance %s: dagrun status %s\n", s.Name, s.Workflow, s.Children[0], s.Children[0])
			continue
		}
		shown, more := s.Children, ""
		if len(shown) > maxChildrenShown {
			shown, more = shown[:maxChildrenShown], fmt.Sprintf(" and %d more", len(s.Children)-maxChildrenShown)
		}
		fmt.Fprintf(w, "%s runs workflow %s as %s: %s%s (dagrun list --parent %s)\n",
			s.Name, s.Workflow, view.Count(len(s.Children), "child instance"), strings.Join(shown, ", "), more, inst.ID)
	}
}

// timeLeft writes a time to come as a person reads it: to the second, or
// to the minute past an hour.
func timeLeft(d time.Duration) string {
	switch {
	case d <= 0:
		return "0s"
	case d >= time.Hour:
		d = d.Round(time.Minute)
	case d >= time.Second:
		d = d.Round(time.Second)
	default:
		return roundDuration(d)
	}
	return storage.FormatDuration(d)
}

// writeWakes says when the steps that wait for a time or a signal go on:
// a pending step not yet due, a waiting step's signal and deadline.
func writeWakes(w io.Writer, inst *storage.Instance, now time.Time) {
	first := true
	line := func(format string, args ...any) {
		if first {
			fmt.Fprintln(w)
			first = false
		}
		fmt.Fprintf(w, format+"\n", args...)
	}
	if inst.Held {
		line("the instance waits for a slot of its workflow's concurrency limit (key %s): it starts when an instance of that key finishes",
			view.QuoteShort(inst.ConcurrencyKey))
	}
	if inst.Status == storage.InstancePending && inst.RunAfter.After(now) &&
		!slices.ContainsFunc(inst.Steps, func(s storage.Step) bool { return s.Status == storage.StepPending }) {
		// Its first steps start only with it (a wait, forEach or workflow
		// step), blocked until then with no time of their own.
		line("the instance starts at %s (in %s)", view.Time(inst.RunAfter), timeLeft(inst.RunAfter.Sub(now)))
	}
	for _, s := range inst.Steps {
		switch {
		case s.Held():
			line("%s waits for a slot of its concurrency limit (see dagrun queues)", s.Name)
		case s.Status == storage.StepPending && s.RunAfter.After(now):
			line("%s runs at %s (in %s)", s.Name, view.Time(s.RunAfter), timeLeft(s.RunAfter.Sub(now)))
		case s.Status == storage.StepWaiting && s.Deadline != nil:
			line("%s waits for signal %s until %s (%s left): dagrun signal %s %s --data JSON",
				s.Name, s.Signal, view.Time(*s.Deadline), timeLeft(s.Deadline.Sub(now)), inst.ID, s.Signal)
		case s.Status == storage.StepWaiting:
			line("%s waits for signal %s: dagrun signal %s %s --data JSON", s.Name, s.Signal, inst.ID, s.Signal)
		}
	}
}

// stepDuration is how long a step ran, or has been running, waiting for
// its signal or asleep ("…").
func stepDuration(s storage.Step, now time.Time) string {
	// A pending step that started and waits for a time is asleep (sleep)
	// or waits for its retry: its time goes on. One that may run now was
	// handed back by a worker that stopped (or its sleep is over) and
	// waits for a worker: nothing runs it, and its time does not go on.
	going := s.Status == storage.StepRunning || s.Status == storage.StepWaiting ||
		s.Status == storage.StepPending && s.RunAfter.After(now)
	return runDuration(s.StartedAt, s.FinishedAt, going, now)
}

// runDuration is how long a step or item ran, or has been running ("…").
func runDuration(started, finished *time.Time, running bool, now time.Time) string {
	switch {
	case started == nil:
		return "-"
	case finished != nil:
		return roundDuration(finished.Sub(*started))
	case running:
		return roundDuration(now.Sub(*started)) + "…"
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
		all     bool
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List instances, newest first",
		Long: "List lists the instances started from outside (by start, the API or a schedule); --all adds the child\n" +
			"instances that workflow steps started, and --parent ID lists the children of one instance.",
		Args: exactArgs(0, "list [--workflow W [--key K]] [--status S] [--all | --parent ID] [--limit N] [--json]"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if p.Status, err = parseStatusFlag(status); err != nil {
				return err
			}
			if p.Limit < 1 || p.Limit > dagrun.MaxListLimit {
				return usageError(fmt.Errorf("invalid --limit %d: use a number from 1 to %d", p.Limit, dagrun.MaxListLimit))
			}
			if p.Key != "" && p.Workflow == "" {
				return usageError(errors.New("--key needs --workflow: an idempotency key names one instance of one workflow"))
			}
			if all && p.Parent != "" {
				return usageError(errors.New("--all and --parent exclude each other: --parent ID lists the children of one instance, --all every instance"))
			}
			p.TopLevel = !all && p.Parent == ""
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
			// Only a list that may mix children and others says whose each is.
			withParent := all || p.Parent != ""
			tw := tabwriter.NewWriter(c.io.Stdout, 0, 4, 2, ' ', 0)
			if withParent {
				fmt.Fprintln(tw, "ID\tWORKFLOW\tSTATUS\tSTEPS\tCREATED\tDURATION\tPARENT")
			} else {
				fmt.Fprintln(tw, "ID\tWORKFLOW\tSTATUS\tSTEPS\tCREATED\tDURATION")
			}
			for _, inst := range list {
				dur := "-"
				if inst.FinishedAt != nil {
					dur = roundDuration(inst.FinishedAt.Sub(inst.CreatedAt))
				}
				row := fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s", inst.ID, inst.Workflow, statusText(&inst), stepCounts(inst.Steps), view.Time(inst.CreatedAt), dur)
				if withParent {
					parent := "-"
					if inst.Parent != nil {
						parent = inst.Parent.InstanceID + " " + inst.Parent.Step
						if inst.Parent.Item >= 0 {
							parent += fmt.Sprintf("[%d]", inst.Parent.Item)
						}
					}
					row += "\t" + parent
				}
				fmt.Fprintln(tw, row)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			if len(list) == 0 && p.TopLevel && p.Workflow != "" {
				// A sub-workflow's instances are all children, which a
				// plain list leaves out: an empty table would say none ran.
				children := p
				children.TopLevel, children.Limit = false, 1
				if some, err := engine.List(ctx, children); err == nil && len(some) > 0 {
					fmt.Fprintf(c.io.Stdout, "No top-level instance of %s: its child instances (started by workflow steps) show with --all.\n", p.Workflow)
				}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&p.Workflow, "workflow", "", "only instances of this workflow")
	f.StringVar(&p.Key, "key", "", "with --workflow: only the instance started with this idempotency key")
	f.StringVar(&status, "status", "", "only instances with this status")
	f.IntVar(&p.Limit, "limit", 50, "at most this many instances")
	f.BoolVar(&jsonOut, "json", false, "print a JSON array of instance objects")
	f.BoolVar(&all, "all", false, "list child instances (started by workflow steps) too")
	f.StringVar(&p.Parent, "parent", "", "list only the child instances of this instance")
	return cmd
}

// stepCounts sums up an instance's steps as DONE/TOTAL, where done are the
// steps that ran to an end (completed, failed or skipped), with the failed
// ones named so that a failed run does not read as a complete one;
// cancelled steps never ran to an end, so they are counted apart: "3/4, 1
// failed, 1 cancelled".
func stepCounts(steps []storage.Step) string {
	done, failed, cancelled := 0, 0, 0
	for _, s := range steps {
		switch {
		case s.Status == storage.StepCancelled:
			cancelled++
		case s.Status.Finished():
			done++
			if s.Status == storage.StepFailed {
				failed++
			}
		}
	}
	out := fmt.Sprintf("%d/%d", done, len(steps))
	if failed > 0 {
		out += fmt.Sprintf(", %d failed", failed)
	}
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
		Long: `Per workflow: instance counts by status, steps stuck past their lease, the oldest ready step's age,
and the p50/p95 duration of its completed steps over the ` + strconv.Itoa(storage.StatsWindow) + ` most recently finished instances
(recent behaviour: "-" when none of them completed a step); then the ready steps of handlers no live worker serves.`,
		Args: exactArgs(0, "stats [--json]"),
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
			fmt.Fprintln(tw, "WORKFLOW\tPENDING\tRUNNING\tCOMPLETED\tFAILED\tCANCELLED\tREADY\tSTUCK\tWAITING\tOLDEST READY\tSTEP P50\tSTEP P95")
			for _, w := range stats.Workflows {
				n := w.Instances
				fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s\n", w.Workflow,
					n[storage.InstancePending], n[storage.InstanceRunning], n[storage.InstanceCompleted], n[storage.InstanceFailed], n[storage.InstanceCancelled],
					w.ReadySteps, w.StuckSteps, w.WaitingSteps, durOrDash(w.OldestReady), p50OrDash(w), durOrDash(w.StepP95))
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
	WaitingSteps  int            `json:"waitingSteps"`
	OldestReadyMs float64        `json:"oldestReadyMs"`
	// StepP50Ms and StepP95Ms are null, as the table's "-", while no
	// attempt of the workflow completed: a duration of 0 would be a
	// figure nobody measured.
	StepP50Ms *float64 `json:"stepP50Ms"`
	StepP95Ms *float64 `json:"stepP95Ms"`
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
			WaitingSteps:  w.WaitingSteps,
			OldestReadyMs: ms(w.OldestReady), StepP50Ms: p50OrNull(w), StepP95Ms: msOrNull(w.StepP95),
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

// msOrNull is ms, or nil for a zero duration: a figure the store has not got.
func msOrNull(d time.Duration) *float64 {
	if d == 0 {
		return nil
	}
	v := ms(d)
	return &v
}

// p50Measured reports whether a workflow's step p50 is a figure: the store
// gives zero for both percentiles when no attempt completed, but a p50 of
// zero beside a p95 is measured (wait steps whose signal came first
// complete in no time).
func p50Measured(w storage.WorkflowStats) bool { return w.StepP50 > 0 || w.StepP95 > 0 }

func p50OrDash(w storage.WorkflowStats) string {
	if p50Measured(w) {
		return roundDuration(w.StepP50)
	}
	return "-"
}

func p50OrNull(w storage.WorkflowStats) *float64 {
	if !p50Measured(w) {
		return nil
	}
	v := ms(w.StepP50)
	return &v
}

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

// statusText is an instance's status as status and list show it: a paused
// one says so, and a failed instance whose running steps finish, or whose
// onFailure steps run, is still running, and says why.
func statusText(inst *storage.Instance) string {
	text := string(inst.Status)
	if inst.Failing {
		text += " (" + failingText(inst) + ")"
	}
	if inst.Paused {
		text += " (paused)"
	}
	return text
}

// failingText says why a failing instance still runs: a step failed for
// good while others ran a handler, which finish their attempt first (a
// snoozed or released one is pending again), or its onFailure steps run.
// A follower reads the instance after the failure, when its onFailure
// steps may have run already, so their being there is what counts; an
// instance with none, whose other steps finished meanwhile, says only
// "failed".
func failingText(inst *storage.Instance) string {
	onFailure := false
	for _, s := range inst.Steps {
		switch {
		case !s.OnFailure && (s.Status == storage.StepRunning || s.Status == storage.StepPending):
			return "failed; its running steps finish first"
		case s.OnFailure:
			onFailure = true
		}
	}
	switch {
	case onFailure && inst.Paused:
		return "failed; its onFailure steps run once resumed"
	case onFailure:
		return "failed; running its onFailure steps"
	}
	return "failed"
}

// parseStatusFlag reads an instance status given as --status; "" is none.
func parseStatusFlag(status string) (storage.InstanceStatus, error) {
	switch s := storage.InstanceStatus(status); s {
	case "", storage.InstancePending, storage.InstanceRunning, storage.InstanceCompleted, storage.InstanceFailed, storage.InstanceCancelled:
		return s, nil
	}
	return "", usageError(fmt.Errorf("invalid --status %q: use pending, running, completed, failed or cancelled", status))
}
