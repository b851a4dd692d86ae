package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/dagrun/dagrun"
	"github.com/dagrun/dagrun/cmd/dagrun/app/view"
	"github.com/dagrun/dagrun/cmd/dagrun/app/web"
	"github.com/dagrun/dagrun/storage"
)

// cliActor is the actor the history records for what the command line did.
const cliActor = "cli"

// byCLI is ctx with the command line as the actor of its operations.
func byCLI(ctx context.Context) context.Context { return storage.WithActor(ctx, cliActor) }

// writeOperations lists what was done to an instance by hand, and by whom,
// among the latest events Get returned (a long history's older ones are
// not read).
func writeOperations(w io.Writer, inst *storage.Instance) {
	first := true
	for _, e := range inst.Events {
		if !byHand(e) {
			continue
		}
		if first {
			if inst.EventsTruncated {
				fmt.Fprintf(w, "\nBy hand (in the latest %d events):\n", len(inst.Events))
			} else {
				fmt.Fprintln(w, "\nBy hand:")
			}
			first = false
		}
		what := string(e.Type)
		if e.Step != "" {
			what += " " + e.Step
		}
		if e.Message != "" {
			what += ": " + oneLineString(e.Message)
		}
		fmt.Fprintf(w, "  %s  %s (by %s)\n", view.Time(e.At), what, e.Actor)
	}
}

// byHand reports whether e is an operation's own event: the transitions
// it caused (a step a skip or a signal made ready, or skipped by its
// when) carry the operation's actor too, but nobody did them by hand. A
// signal is by hand both as stored for later (signal.received) and as
// delivered to its waiting step (that step's completion).
func byHand(e storage.Event) bool {
	if e.Actor == "" {
		return false
	}
	switch e.Type {
	case storage.EventInstanceCancelled, storage.EventInstanceRetried,
		storage.EventInstancePaused, storage.EventInstanceResumed, storage.EventSignalReceived:
		return true
	case storage.EventStepCompleted:
		return e.Message == storage.SkippedByHand || storage.IsDeliveredMessage(e.Message)
	}
	return false
}

// operationError turns the engine's refusals into one line and exit 2.
func operationError(id string, err error) error {
	var (
		argErr  *dagrun.ArgumentError
		refusal *storage.RefusalError
	)
	switch {
	case errors.As(err, &refusal):
		return usageError(errors.New(refusal.Reason))
	case errors.As(err, &argErr):
		return usageError(err)
	}
	return instanceError(id, err)
}

// selectionFlags are the flags that pick instances for a bulk cancel or
// retry instead of an ID.
type selectionFlags struct {
	workflow, status, olderThan string
	children                    bool
}

func (f *selectionFlags) register(cmd *cobra.Command, verb string) {
	fl := cmd.Flags()
	fl.StringVar(&f.workflow, "workflow", "", verb+" every instance of this workflow (with --status, those in it)")
	fl.StringVar(&f.status, "status", "", verb+" every instance in this status")
	fl.StringVar(&f.olderThan, "older-than", "", "with --workflow or --status: only instances created longer ago than this: 30d, 2w, 12h")
	all := "with --workflow or --status: child instances (of workflow steps) too, as list --all shows them; by default only top-level ones, whose children go with them"
	if verb == "retry" {
		all += " (retry leaves a child as it is: it runs again with its parent)"
	}
	fl.BoolVar(&f.children, "all", false, all)
}

func (f *selectionFlags) set() bool {
	return f.workflow != "" || f.status != "" || f.olderThan != "" || f.children
}

// selection parses the flags, or explains in one line what is wrong.
func (f *selectionFlags) selection(verb string) (dagrun.Selection, error) {
	if f.workflow == "" && f.status == "" {
		return dagrun.Selection{}, usageError(fmt.Errorf("%s needs an instance ID, or --workflow and/or --status to pick instances", verb))
	}
	status, err := parseStatusFlag(f.status)
	if err != nil {
		return dagrun.Selection{}, err
	}
	sel := dagrun.Selection{Workflow: f.workflow, Status: status, Children: f.children}
	if f.olderThan != "" {
		d, err := parseAge(f.olderThan)
		if err != nil {
			return sel, usageError(view.AgeError("--older-than", f.olderThan, err))
		}
		sel.OlderThan = d
	}
	if err := sel.Validate(); err != nil {
		return sel, usageError(err)
	}
	return sel, nil
}

// bulk runs a bulk cancel or retry and prints how many instances it
// changed.
func (c *cli) bulk(ctx context.Context, f *selectionFlags, verb, done string, jsonOut bool, run func(*dagrun.Engine, context.Context, dagrun.Selection) (int, error)) error {
	sel, err := f.selection(verb)
	if err != nil {
		return err
	}
	engine, err := c.engine(ctx)
	if err != nil {
		return err
	}
	n, err := run(engine, byCLI(ctx), sel)
	if err != nil && n > 0 {
		return fmt.Errorf("%s %s, then: %w", done, view.Count(n, "instance"), err)
	}
	if err != nil {
		return err
	}
	if jsonOut {
		// The API's answer to the same selection.
		return writeJSON(c.io.Stdout, struct {
			Count int `json:"count"`
		}{n})
	}
	fmt.Fprintf(c.io.Stdout, "%s %s\n", done, view.Count(n, "instance"))
	return nil
}

func (c *cli) skipCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "skip ID STEP [--output JSON]",
		Short: "Complete a blocked, pending, waiting, failed or cancelled step by hand; its dependents proceed",
		Long: "Skip marks STEP completed with --output (default null), as if its handler had returned it, and\n" +
			"records who did it in the history. On a failed instance the steps the failure stopped run again.",
		Args: exactArgs(2, "skip ID STEP [--output JSON]"),
		RunE: func(cmd *cobra.Command, args []string) error {
			var out []byte
			if output != "" {
				raw, err := c.readJSONFlag("--output", output)
				if err != nil {
					return usageError(err)
				}
				out = raw
			}
			ctx := cmd.Context()
			engine, err := c.engine(ctx)
			if err != nil {
				return err
			}
			if err := engine.Skip(byCLI(ctx), args[0], args[1], out); err != nil {
				return operationError(args[0], withJSONHint("--output", err))
			}
			fmt.Fprintf(c.io.Stdout, "skipped step %s of %s\n", args[1], args[0])
			return nil
		},
	}
	cmd.Flags().StringVar(&output, "output", "", "the step's output: inline JSON, @FILE, or - for standard input (default null)")
	return cmd
}

func (c *cli) pauseCommand() *cobra.Command {
	return c.pauseOrResume("pause", "paused", "Hold back an instance's steps: none is claimed until resume; running ones finish",
		func(e *dagrun.Engine, ctx context.Context, id string) error { return e.Pause(ctx, id) })
}

func (c *cli) resumeCommand() *cobra.Command {
	return c.pauseOrResume("resume", "resumed", "Let a paused instance's steps be claimed again",
		func(e *dagrun.Engine, ctx context.Context, id string) error { return e.Resume(ctx, id) })
}

func (c *cli) pauseOrResume(verb, done, short string, run func(*dagrun.Engine, context.Context, string) error) *cobra.Command {
	return &cobra.Command{
		Use:   verb + " ID",
		Short: short,
		Args:  exactArgs(1, verb+" ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			engine, err := c.engine(ctx)
			if err != nil {
				return err
			}
			if err := run(engine, byCLI(ctx), args[0]); err != nil {
				return operationError(args[0], err)
			}
			fmt.Fprintf(c.io.Stdout, "%s %s\n", done, args[0])
			return nil
		},
	}
}

// idOrSelection accepts one instance ID, or none with selection flags,
// never both.
func idOrSelection(sel *selectionFlags, usage string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		switch {
		case len(args) == 1 && sel.set():
			return usageError(fmt.Errorf("give an instance ID or --workflow/--status/--older-than/--all, not both: dagrun %s", usage))
		case len(args) > 1:
			return usageError(fmt.Errorf("usage: dagrun %s (got %s)", usage, argumentCount(len(args))))
		}
		return nil
	}
}

// parseNamedTokens reads --named-token NAME=SECRET flags and DAGRUN_TOKENS
// (NAME=SECRET,NAME=SECRET) into names and secrets.
func parseNamedTokens(flags []string, env, plain string) (map[string]string, error) {
	specs := flags
	if len(specs) == 0 && env != "" {
		specs = strings.Split(env, ",")
	}
	if len(specs) == 0 {
		return nil, nil
	}
	out := make(map[string]string, len(specs))
	for _, spec := range specs {
		name, secret, ok := strings.Cut(strings.TrimSpace(spec), "=")
		if !ok || secret == "" {
			return nil, usageError(errors.New("invalid named token: use NAME=SECRET (--named-token, or DAGRUN_TOKENS=NAME=SECRET,NAME=SECRET)"))
		}
		if err := web.CheckTokenName(name); err != nil {
			return nil, usageError(err)
		}
		if err := web.CheckTokenSecret(secret); err != nil {
			return nil, usageError(fmt.Errorf("invalid named token %s: %w", name, err))
		}
		if _, dup := out[name]; dup {
			return nil, usageError(fmt.Errorf("token name %s is given twice", name))
		}
		// The history names who did an operation: a name must tell one
		// token from every other, and from the command line.
		if name == web.PlainTokenName || name == cliActor {
			return nil, usageError(fmt.Errorf("token name %s is taken: the history names --token's operations %s and the command line's %s; choose another name",
				name, web.PlainTokenName, cliActor))
		}
		if secret == plain {
			return nil, usageError(fmt.Errorf("named token %s has the secret of --token: the history could not tell them apart; give each its own secret", name))
		}
		for other, s := range out {
			if s == secret {
				return nil, usageError(fmt.Errorf("named tokens %s and %s have the same secret: the history could not tell them apart; give each its own secret", other, name))
			}
		}
		out[name] = secret
	}
	return out, nil
}
