package app

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/dagrun/dagrun"
	"github.com/dagrun/dagrun/cmd/dagrun/app/view"
	"github.com/dagrun/dagrun/dag"
	"github.com/dagrun/dagrun/storage"
)

func (c *cli) startCommand() *cobra.Command {
	var (
		input    string
		opts     dagrun.StartOptions
		detach   bool
		jsonOut  bool
		delayStr string
		parent   string
	)
	cmd := &cobra.Command{
		Use:   "start WORKFLOW",
		Short: "Start an instance of a workflow and follow it to the end",
		Long: "Start validates the input, starts an instance and, unless --detach, runs an in-process worker for it,\n" +
			"printing one progress line per step transition on stderr and the instance output as JSON on stdout.\n" +
			"Exit code 0 when the instance completed, 1 when it failed or was cancelled.",
		Args: exactArgs(1, "start WORKFLOW"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.Flags().Changed("input") && strings.TrimSpace(input) == "" {
				return usageError(errors.New("--input is empty: pass a JSON value, such as --input '{}', or leave --input out for {}"))
			}
			raw, err := c.readInput(input)
			if err != nil {
				return usageError(err)
			}
			if delayStr != "" {
				// Days and weeks as --older-than takes them: a delay of a
				// few days is what a user writes.
				if opts.Delay, err = view.ParseDuration(delayStr); err != nil {
					return usageError(fmt.Errorf("invalid --delay %q: use a duration such as 30s, 5m or 2d", delayStr))
				}
				if opts.Delay < 0 || opts.Delay > dagrun.MaxDelay {
					// Naming the flag and the value as the user wrote
					// them (53w, where the engine would say 371d).
					return usageError(fmt.Errorf("invalid --delay %q: out of range: use a duration from 0s to %dd", delayStr, dagrun.MaxDelay/(24*time.Hour)))
				}
			}
			// Checked before the database is opened: bad flags touch nothing.
			if err := opts.Validate(); err != nil {
				return usageError(err)
			}
			ctx := cmd.Context()
			startCtx := ctx
			if parent != "" {
				if startCtx, err = dagrun.ContextWithTraceParent(ctx, parent); err != nil {
					return usageError(fmt.Errorf("--traceparent: %v", err))
				}
			}
			if !detach {
				c.conns = followConns // a worker runs the instance here
			}
			engine, err := c.engine(ctx)
			if err != nil {
				return err
			}
			res, err := engine.Start(startCtx, args[0], raw, &opts)
			if err != nil {
				var syntaxErr *json.SyntaxError
				if errors.As(err, &syntaxErr) {
					return usageError(withJSONHint("--input", err))
				}
				if input == "" && errors.Is(err, dag.ErrInvalidInput) {
					// The workflow wants an input the user may not know
					// the flag for: name it.
					return usageError(fmt.Errorf("%w (no --input was given: pass the input as --input JSON, --input @FILE or --input -)", err))
				}
				var unknown *dagrun.UnknownWorkflowError
				if errors.As(err, &unknown) {
					// The file may be there but invalid: say so rather
					// than "unknown workflow".
					if _, findErr := c.findWorkflow(ctx, args[0]); findErr != nil {
						return findErr
					}
				}
				return err
			}
			if detach {
				return c.printDetached(ctx, engine, res.ID, jsonOut)
			}
			if res.Existed {
				msg := fmt.Sprintf("instance %s already exists for key %q; following it", res.ID, opts.Key)
				if c.jsonStderr() {
					c.record(slog.LevelInfo, msg)
				} else {
					fmt.Fprintln(c.io.Stderr, msg) // news, not an error: no "dagrun:" before it
				}
			}
			skip := skipNone
			if res.Existed {
				skip = skipExisting
			}
			return c.follow(ctx, engine, res.ID, jsonOut, skip)
		},
	}
	f := cmd.Flags()
	f.StringVar(&input, "input", "", "instance input: JSON, @FILE, or - for standard input (default {})")
	f.StringVar(&opts.Key, "key", "", "idempotency key: a second start with the same workflow and key returns the first instance, and its own input, priority and delay are dropped")
	f.IntVar(&opts.Priority, "priority", 0, fmt.Sprintf("priority from %d to %d: higher runs first", dagrun.MinPriority, dagrun.MaxPriority))
	f.StringVar(&delayStr, "delay", "", "delay before the first steps run, e.g. 10m or 2d (at most a year)")
	f.BoolVar(&detach, "detach", false, "print only the instance ID (with --json, the instance object) and return; workers run it")
	f.BoolVar(&jsonOut, "json", false, "print the whole instance object instead of its output, whatever the outcome (with --detach: as it stands once started)")
	f.StringVar(&parent, "traceparent", "", "W3C traceparent of a span the instance's span joins as a child (when OTEL_* variables turn tracing on)")
	c.addPlanLimitFlags(cmd)
	return cmd
}

func (c *cli) retryCommand() *cobra.Command {
	var (
		detach, jsonOut bool
		from            string
		sel             selectionFlags
	)
	cmd := &cobra.Command{
		Use:   "retry ID [--from STEP] | retry --workflow W --status S [--older-than D] [--all]",
		Short: "Re-run the failed and cancelled steps of an instance (or of every instance a filter picks), keeping completed outputs",
		Long: "Retry re-runs the failed and cancelled steps of an instance, keeping completed outputs.\n" +
			"With --from STEP it re-runs STEP and every step downstream of it, also in a completed instance.\n" +
			"With --workflow, --status and --older-than instead of an ID it retries every failed or cancelled\n" +
			"instance they pick, asks nothing, and prints how many.",
		Args: idOrSelection(&sel, "retry ID [--from STEP], or retry --workflow W --status S [--older-than D] [--all]"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if len(args) == 0 {
				if from != "" {
					return usageError(errors.New("--from needs an instance ID: dagrun retry ID --from STEP"))
				}
				return c.bulk(ctx, &sel, "retry", "retried", jsonOut, (*dagrun.Engine).RetrySelected)
			}
			if !detach {
				c.conns = followConns // a worker runs the re-armed steps here
			}
			engine, err := c.engine(ctx)
			if err != nil {
				return err
			}
			if from != "" {
				err = engine.RetryFrom(byCLI(ctx), args[0], from)
				if err != nil {
					return operationError(args[0], err)
				}
			} else if err := engine.Retry(byCLI(ctx), args[0]); err != nil {
				if errors.Is(err, storage.ErrConflict) {
					rule := "only a failed or cancelled instance can be retried"
					if inst, getErr := engine.Get(ctx, args[0]); getErr == nil {
						if inst.Parent != nil {
							// A child is retried through its parent; the error says which.
							return operationError(args[0], err)
						}
						if inst.Status == storage.InstanceCompleted {
							rule += ", or with --from STEP a completed one"
						}
					}
					return conflictError(ctx, engine, args[0], "", rule, err)
				}
				return c.instanceError(args[0], err)
			}
			if detach {
				return c.printDetached(ctx, engine, args[0], jsonOut)
			}
			return c.follow(ctx, engine, args[0], jsonOut, skipUntilRetried)
		},
	}
	cmd.Flags().BoolVar(&detach, "detach", false, "return at once; workers run the re-armed steps")
	cmd.Flags().BoolVar(&jsonOut, "json", false, "print the whole instance object instead of its output (with --detach: as it stands once re-armed); with a filter, {\"count\": N}")
	cmd.Flags().StringVar(&from, "from", "", "re-run this step and every step downstream of it, keeping the other outputs")
	sel.register(cmd, "retry")
	return cmd
}

// printDetached prints what a --detach start or retry returns: the
// instance ID, or with --json the instance object as it stands now, so a
// script gets the same object as without --detach, only earlier.
func (c *cli) printDetached(ctx context.Context, engine *dagrun.Engine, id string, jsonOut bool) error {
	if !jsonOut {
		_, err := fmt.Fprintln(c.io.Stdout, id)
		return err
	}
	inst, err := engine.Get(ctx, id)
	if err != nil {
		return c.instanceError(id, err)
	}
	return writeJSON(c.io.Stdout, view.NewInstance(inst))
}

// readInput reads --input: inline JSON, @FILE, or - for standard input.
func (c *cli) readInput(spec string) (json.RawMessage, error) {
	return c.readJSONFlag("--input", spec)
}

// jsonFlagReadBytes bounds what a JSON flag reads from a file or the
// standard input: above the engine's limits, which then refuse a value too
// large in their own words, and far below what /dev/zero or a huge file
// would take of the machine's memory.
const jsonFlagReadBytes = 4 * max(dagrun.DefaultMaxInputBytes, dagrun.DefaultMaxOutputBytes)

// errTooLarge is readCapped's error for a value past jsonFlagReadBytes.
var errTooLarge = fmt.Errorf("it holds more than %d bytes, and a JSON value may have at most %d: store large data elsewhere and pass a reference",
	jsonFlagReadBytes, max(dagrun.DefaultMaxInputBytes, dagrun.DefaultMaxOutputBytes))

// readCapped reads r to its end, or fails with errTooLarge once it has
// more than jsonFlagReadBytes.
func readCapped(r io.Reader) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(r, jsonFlagReadBytes+1))
	if err == nil && len(data) > jsonFlagReadBytes {
		err = errTooLarge
	}
	return data, err
}

// utf8BOM is the byte order mark Windows editors and PowerShell's
// redirections put before UTF-8 text; JSON readers may skip it (RFC 8259
// §8.1), and the JSON decoder does not.
var utf8BOM = []byte("\ufeff")

// readJSONFlag reads a JSON flag's value: inline JSON, @FILE, or - for
// standard input, without a leading byte order mark.
func (c *cli) readJSONFlag(flag, spec string) (json.RawMessage, error) {
	data, err := c.readJSONFlagText(flag, spec)
	return bytes.TrimPrefix(data, utf8BOM), err
}

func (c *cli) readJSONFlagText(flag, spec string) (json.RawMessage, error) {
	switch {
	case spec == "-":
		data, err := readCapped(c.io.Stdin)
		if err != nil {
			return nil, fmt.Errorf("read %s from standard input: %v", flag, err)
		}
		if len(bytes.TrimSpace(data)) == 0 {
			return nil, fmt.Errorf("%s -: the standard input was empty: pipe a JSON value into it", flag)
		}
		return data, nil
	case strings.HasPrefix(spec, "@"):
		data, err := readFileCapped(spec[1:])
		if err != nil {
			var pathErr *os.PathError
			if errors.As(err, &pathErr) {
				err = pathErr.Err
			}
			return nil, fmt.Errorf("cannot read %s file %q: %v", flag, spec[1:], err)
		}
		if len(bytes.TrimSpace(data)) == 0 {
			return nil, fmt.Errorf("%s file %q is empty: write a JSON value in it", flag, spec[1:])
		}
		return data, nil
	default:
		return json.RawMessage(spec), nil
	}
}

// readFileCapped reads a JSON flag's @FILE through readCapped.
func readFileCapped(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readCapped(f)
}

// withJSONHint adds to err, when it is a JSON syntax error in the value of
// flag, how to write JSON on a command line: mostly a shell ate the
// quotes, or keys were left unquoted.
func withJSONHint(flag string, err error) error {
	var syntaxErr *json.SyntaxError
	if !errors.As(err, &syntaxErr) {
		return err
	}
	return fmt.Errorf("%w (write JSON with double-quoted keys and strings, in single quotes for the shell: %s '{\"key\": \"value\"}')", err, flag)
}

// followLease is the claim lease of a following start's in-process worker.
const followLease = 10 * time.Second

// follow runs in-process workers for one instance (and its child
// instances) and reports its progress until it finishes. Other workers may
// run its steps too.
func (c *cli) follow(ctx context.Context, engine *dagrun.Engine, id string, jsonOut bool, skip skipMode) error {
	// A shorter lease than a long-lived worker's: if this process is killed
	// while following, another worker takes the step over within seconds.
	workers := newFamilyWorkers(context.WithoutCancel(ctx), engine, followLease)
	if err := workers.serve(id, false); err != nil {
		return err
	}
	// The instance's children, and theirs, get workers of their own.
	watchCtx, stopWatch := context.WithCancel(ctx)
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		if inst, err := engine.Get(watchCtx, id); err == nil && hasWorkflowSteps(inst) {
			workers.watch(watchCtx, id)
		}
	}()
	defer func() {
		stopWatch()
		<-watchDone
		workers.stopAll()
	}()

	progress := newProgress(c.io.Stderr, skip)
	if c.jsonStderr() {
		progress.record = c.progressRecord
	}
	inst, err := engine.Follow(ctx, id, progress.observe)
	if err != nil {
		if errors.Is(err, context.Canceled) && ctx.Err() != nil {
			// Interrupted: the instance lives on in the database and any
			// worker finishes it. Said at once, before this process's
			// workers let their running steps finish.
			c.say(slog.LevelWarn, fmt.Sprintf("stopped following instance %s; it continues with any running worker (dagrun status %s). "+
				"Steps this process runs get up to %s to finish; interrupt again to exit now.", id, id, dagrun.DefaultShutdownGrace))
			return &exitError{code: ExitInterrupted}
		}
		return err
	}
	if jsonOut {
		if err := writeJSON(c.io.Stdout, view.NewInstance(inst)); err != nil {
			return err
		}
	} else if inst.Status == storage.InstanceCompleted {
		if err := writeJSON(c.io.Stdout, json.RawMessage(view.RawOrNull(inst.Output))); err != nil {
			return err
		}
	}
	switch inst.Status {
	case storage.InstanceCompleted:
		return nil
	case storage.InstanceCancelled:
		return &exitError{code: ExitFailed, err: fmt.Errorf("instance %s was cancelled", id)}
	default:
		return &exitError{code: ExitFailed, err: fmt.Errorf("instance %s failed: %s (retry it with: dagrun retry %s)", id, oneLineString(inst.Error), id)}
	}
}

// argumentCount says how many arguments a usage error got: "1 argument",
// "3 arguments".
func argumentCount(n int) string {
	if n == 1 {
		return "1 argument"
	}
	return fmt.Sprintf("%d arguments", n)
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func oneLineString(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// instanceError turns store errors about one instance into CLI errors.
func instanceError(id string, err error) error {
	if errors.Is(err, storage.ErrNotFound) {
		return usageError(fmt.Errorf("no instance with ID %s (list instances with: dagrun list)", view.QuoteShort(id)))
	}
	return err
}

// instanceError is instanceError of a command that may have made its
// database as it opened it (see openCommandStore): its "not found" says so.
func (c *cli) instanceError(id string, err error) error {
	if errors.Is(err, storage.ErrNotFound) && c.newDatabase != "" {
		return usageError(fmt.Errorf("no instance with ID %s: there was no database at %s, and this command made an empty one (run where yours is, or pass --db or DAGRUN_DB)", view.QuoteShort(id), c.newDatabase))
	}
	return instanceError(id, err)
}

// subcommandArgs refuses arguments to a command that only groups
// sub-commands: cobra passes a mistyped sub-command on as an argument,
// which a count of arguments would not name.
func subcommandArgs(usage string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) == 0 {
			return nil
		}
		hint := ""
		cmd.SuggestionsMinimumDistance = cmd.Root().SuggestionsMinimumDistance
		if suggestions := cmd.SuggestionsFor(args[0]); len(suggestions) > 0 {
			hint = " (did you mean " + strings.Join(suggestions, " or ") + "?)"
		}
		return usageError(fmt.Errorf("unknown sub-command %q of dagrun %s%s; usage: dagrun %s", args[0], cmd.Name(), hint, usage))
	}
}

func exactArgs(n int, usage string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if len(args) != n {
			return usageError(fmt.Errorf("usage: dagrun %s (got %s)", usage, argumentCount(len(args))))
		}
		return nil
	}
}
