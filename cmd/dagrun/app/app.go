// Package app is the dagrun command line as an importable package, so that
// a user's own binary registers its handlers and reuses every verb, flag,
// output format and exit code:
//
//	func main() {
//		registry := handlers.NewRegistry()
//		handlers.RegisterBuiltins(registry)
//		registry.Register("billing.invoice", handlers.Typed(invoice))
//		os.Exit(app.Main(registry))
//	}
//
// It holds no business logic and no package-level state: it parses flags,
// opens the backend the --db URL names, calls the engine, and formats what
// comes back. It is the only package besides examples that imports a
// storage backend.
package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/dagrun/dagrun"
	"github.com/dagrun/dagrun/dag"
	"github.com/dagrun/dagrun/handlers"
	"github.com/dagrun/dagrun/storage"
)

// Exit codes, as the README's Command line section documents them.
const (
	ExitOK          = 0
	ExitFailed      = 1 // the instance failed or was cancelled
	ExitUsage       = 2 // usage or validation error
	ExitUnavailable = 3 // storage unavailable
	// ExitInterrupted is a command stopped by SIGINT or SIGTERM before it
	// was done (a following start, a load of the workflows, a query):
	// 128+SIGINT, as a shell reports an interrupted command.
	ExitInterrupted = 130
)

// Main runs the CLI with the process's arguments and standard streams, and
// returns the exit code. SIGINT and SIGTERM cancel the command's context,
// and a second one ends the process at once, as Go's default handling
// does: a worker whose steps take long to finish can be stopped without
// waiting for its grace period (their leases bring them back).
// Unless GOGC is set, it sets the collector's target to defaultGCPercent.
func Main(registry *handlers.Registry) int {
	tuneGC(os.Getenv)
	ctx, stop := interruptible()
	defer stop()
	return Run(ctx, os.Args[1:], &IO{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr, Getenv: os.Getenv}, registry)
}

// interruptible gives a context that the first SIGINT or SIGTERM cancels;
// the second ends the process. Once the first has come, each signal gets
// back the handling it had when the process started, so the default one
// kills the process as a shell expects. But a process that started with
// the signal ignored (a background job of a non-interactive shell starts
// with SIGINT ignored) would then ignore the second one and run on until
// its steps end: such a signal is still caught, and a second one exits
// with 128 plus its number, as a shell reports a process it killed.
func interruptible() (context.Context, func()) {
	stopSignals := []os.Signal{os.Interrupt, syscall.SIGTERM}
	var ignoredAtStart []os.Signal
	for _, sig := range stopSignals {
		if signal.Ignored(sig) {
			ignoredAtStart = append(ignoredAtStart, sig)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), stopSignals...)
	again := make(chan os.Signal, 1)
	go func() {
		<-ctx.Done()
		if len(ignoredAtStart) > 0 {
			signal.Notify(again, ignoredAtStart...)
		}
		stop()
		if len(ignoredAtStart) > 0 {
			sig := <-again
			os.Exit(128 + int(sig.(syscall.Signal)))
		}
	}()
	return ctx, func() {
		stop()
		signal.Stop(again)
	}
}

// IO is what a CLI run reads and writes; tests pass buffers.
type IO struct {
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	// Getenv reads environment variables; nil means none are set.
	Getenv func(string) string
}

// Run executes one CLI invocation and returns its exit code.
func Run(ctx context.Context, args []string, streams *IO, registry *handlers.Registry) int {
	c := &cli{io: *streams, registry: registry}
	if c.io.Getenv == nil {
		c.io.Getenv = func(string) string { return "" }
	}
	if c.io.Stdin == nil {
		c.io.Stdin = strings.NewReader("")
	}
	// The logger, a worker's goroutines and the progress lines write to
	// stderr at once: one write at a time, whatever writer the caller gave
	// (a file is safe so, a bytes.Buffer is not).
	c.io.Stdout, c.io.Stderr = &syncWriter{w: controlEscaper{c.io.Stdout}}, &syncWriter{w: controlEscaper{c.io.Stderr}}
	root := c.rootCommand()
	root.SetArgs(args)
	root.SetIn(c.io.Stdin)
	root.SetOut(c.io.Stdout)
	root.SetErr(c.io.Stderr)
	err := root.ExecuteContext(ctx)
	if c.cleanup != nil {
		c.cleanup()
	}
	if err == nil {
		return ExitOK
	}
	var exit *exitError
	if errors.As(err, &exit) {
		if exit.err != nil {
			c.say(slog.LevelError, exit.err.Error(), slog.Int("exit", exit.code))
		}
		return exit.code
	}
	code := exitCode(err)
	msg := oneLine(err)
	if errors.Is(err, context.Canceled) && ctx.Err() != nil {
		msg = fmt.Sprintf("interrupted (%v): %s", context.Cause(ctx), msg)
		code = ExitInterrupted
	}
	c.say(slog.LevelError, msg, slog.Int("exit", code))
	return code
}

// jsonStderr reports whether stderr carries JSON records (--log-format
// json, once the flags were read).
func (c *cli) jsonStderr() bool { return c.logFormat == "json" && c.logger != nil }

// say tells the user msg on stderr: as the line "dagrun: MSG" with
// --log-format text, as a record of level with its attrs with --log-format
// json, so that stderr keeps one format whatever writes to it. It is
// written whatever --log-level says, as the line is.
func (c *cli) say(level slog.Level, msg string, attrs ...slog.Attr) {
	if !c.jsonStderr() {
		fmt.Fprintln(c.io.Stderr, "dagrun: "+msg)
		return
	}
	c.record(level, msg, attrs...)
}

// record writes a JSON record whatever --log-level says: what the text
// format prints as a line the JSON format prints as a record.
func (c *cli) record(level slog.Level, msg string, attrs ...slog.Attr) {
	r := slog.NewRecord(time.Now(), level, msg, 0)
	r.AddAttrs(attrs...)
	_ = c.logger.Handler().Handle(context.Background(), r)
}

// progressRecord writes a progress line as a record: the line without its
// step name, which goes in an attribute with the instance and the event.
func (c *cli) progressRecord(inst *storage.Instance, ev storage.Event, line string) {
	level := slog.LevelInfo
	switch ev.Type {
	case storage.EventStepFailed, storage.EventStepLeaseExpired, storage.EventInstanceFailing,
		storage.EventInstanceFailed, storage.EventInstanceCancelled:
		level = slog.LevelWarn
	}
	attrs := []slog.Attr{slog.String("instance", inst.ID)}
	if ev.Step != "" {
		line = strings.TrimSpace(strings.TrimPrefix(line, ev.Step))
		attrs = append(attrs, slog.String("step", ev.Step))
	}
	attrs = append(attrs, slog.String("event", string(ev.Type)))
	c.record(level, line, attrs...)
}

// cli is one invocation's state: the global flags and what they opened.
type cli struct {
	io       IO
	registry *handlers.Registry

	db           string
	dbSchema     string
	workflowsDir string
	logFormat    string
	logLevel     string

	// maxItems and maxDepth are --max-items and --max-depth of the
	// commands that plan steps (worker, serve, start). Their flags share
	// them, so registering them sets the default for every command.
	maxItems, maxDepth int

	logger  *slog.Logger
	cleanup func()
	// observer, when set before engine() is called, receives the engine's
	// metrics events (serve sets it to its Prometheus metrics).
	observer dagrun.Observer
	// conns, when set before engine() is called, sizes a PostgreSQL pool
	// (see openStore); zero is a one-off command's store, of commandConns.
	conns int32
	// longRunning, set by worker and serve before engine() is called,
	// makes workflow files with errors a warning in the log: a one-shot
	// command keeps stderr to its own error, and starting a bad workflow
	// names its errors anyway. It also has engine() note loadedFolder.
	longRunning bool
	// loadedFolder describes the workflows folder as engine() found it
	// (folderFingerprint), for watchWorkflows.
	loadedFolder string
	// invalid are the errors of the workflow files engine() left out, by
	// workflow name.
	invalid map[string]error
	// newDatabase names the SQLite file this command made, empty, as it
	// opened it (see openCommandStore): a "not found" then says why.
	newDatabase string
}

func (c *cli) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "dagrun",
		Short:         "Durable declarative DAG workflows on SQLite or PostgreSQL",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			return c.setupLogging(cmd)
		},
		// Without Args and RunE, cobra reports an unknown command as a plain
		// error, which would exit 1 and print its suggestions on extra lines.
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return cmd.Help()
			}
			return unknownCommand("unknown command", args[0], cmd, args[0])
		},
	}
	root.CompletionOptions.DisableDefaultCmd = true
	root.SuggestionsMinimumDistance = 2
	// cobra's help command answers an unknown topic with the root's help
	// and exit 0; this one says what it does not know.
	root.SetHelpCommand(&cobra.Command{
		Use:   "help [command]",
		Short: "Help about any command",
		Args:  cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			target, rest, err := root.Find(args)
			if err != nil || len(args) > 0 && (target == root || len(rest) > 0) {
				if target == nil || len(rest) == 0 {
					target, rest = root, args
				}
				target.SuggestionsMinimumDistance = root.SuggestionsMinimumDistance
				return unknownCommand("unknown help topic", strings.Join(args, " "), target, rest[0])
			}
			return target.Help()
		},
	})
	flags := root.PersistentFlags()
	flags.StringVar(&c.db, "db", c.env("DAGRUN_DB", "dagrun.db"), "database: a SQLite path, sqlite:PATH, or postgres://... (env DAGRUN_DB)")
	flags.StringVar(&c.dbSchema, "db-schema", c.env("DAGRUN_DB_SCHEMA", ""), "PostgreSQL schema of dagrun's tables (env DAGRUN_DB_SCHEMA; default the URL's dagrun_schema, else dagrun)")
	flags.StringVar(&c.workflowsDir, "workflows", c.env("DAGRUN_WORKFLOWS", "./workflows"), "folder of workflow YAML files (env DAGRUN_WORKFLOWS)")
	flags.StringVar(&c.logFormat, "log-format", "text", "log format on stderr: text or json")
	flags.StringVar(&c.logLevel, "log-level", "", "log level: debug, info, warn or error (default info for worker and serve, warn otherwise)")
	root.SetFlagErrorFunc(flagError)

	root.AddCommand(
		c.startCommand(),
		c.workerCommand(),
		c.statusCommand(),
		c.listCommand(),
		c.cancelCommand(),
		c.retryCommand(),
		c.skipCommand(),
		c.pauseCommand(),
		c.resumeCommand(),
		c.validateCommand(),
		c.graphCommand(),
		c.statsCommand(),
		c.pruneCommand(),
		c.handlersCommand(),
		c.benchCommand(),
		c.serveCommand(),
		c.schedulesCommand(),
		c.scheduleCommand(),
		c.signalCommand(),
		c.queuesCommand(),
		c.queueCommand(),
		c.testCommand(),
		c.logsCommand(),
		c.versionCommand(),
	)
	// --version prints what the version command prints.
	root.Version = readBuildVersion().String()
	root.SetVersionTemplate("{{.Version}}\n")
	for _, cmd := range root.Commands() {
		cmd.SetFlagErrorFunc(flagError)
	}
	return root
}

// flagError makes a flag parsing error a usage error that says where to
// look for the valid flags.
func flagError(cmd *cobra.Command, err error) error {
	msg := err.Error()
	var num *strconv.NumError
	if errors.As(err, &num) {
		// "strconv.ParseInt: parsing "high": invalid syntax" means nothing
		// to a user.
		want := "want a whole number"
		if errors.Is(num.Err, strconv.ErrRange) {
			want = "the number is out of range"
		}
		msg = strings.Replace(msg, num.Error(), want, 1)
	}
	return usageError(fmt.Errorf("%s (see %s --help)", msg, cmd.CommandPath()))
}

func (c *cli) env(name, fallback string) string {
	if v := c.io.Getenv(name); v != "" {
		return v
	}
	return fallback
}

func (c *cli) setupLogging(cmd *cobra.Command) error {
	level := c.logLevel
	if level == "" {
		level = "warn"
		if cmd.Name() == "worker" || cmd.Name() == "serve" {
			level = "info"
		}
	}
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return usageError(fmt.Errorf("invalid --log-level %q: use debug, info, warn or error", level))
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch c.logFormat {
	case "text":
		c.logger = slog.New(slog.NewTextHandler(c.io.Stderr, opts))
	case "json":
		opts.ReplaceAttr = durationsAsText
		c.logger = slog.New(slog.NewJSONHandler(c.io.Stderr, opts))
	default:
		return usageError(fmt.Errorf("invalid --log-format %q: use text or json", c.logFormat))
	}
	return nil
}

// loadWorkflows reads the workflows folder, checking handler names against
// this binary's registry. It returns the good definitions and the errors of
// the bad files. A signal stops the wait (see whileRunning).
func (c *cli) loadWorkflows(ctx context.Context) ([]*dag.Workflow, error) {
	switch fi, err := os.Stat(c.workflowsDir); {
	case errors.Is(err, os.ErrNotExist):
		return nil, nil
	case err != nil:
		return nil, usageError(fmt.Errorf("read workflows folder: %v", err))
	case !fi.IsDir():
		return nil, usageError(fmt.Errorf("--workflows %s is a file, not a folder: give the folder of the workflow files", c.workflowsDir))
	}
	return whileRunning(ctx, func() ([]*dag.Workflow, error) {
		return dag.LoadDir(c.workflowsDir, &dag.ParseOptions{HandlerExists: c.registry.Has, HandlerNames: c.registry.Names})
	})
}

// whileRunning runs load, a parse that cannot be interrupted, and returns
// its result, or an interruption error as soon as ctx ends (SIGINT or
// SIGTERM): the command then stops at once instead of after the parse. The
// abandoned parse only reads files; it ends with the process.
func whileRunning[T any](ctx context.Context, load func() (T, error)) (T, error) {
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := load()
		done <- result{v, err}
	}()
	select {
	case r := <-done:
		if ctx.Err() == nil {
			return r.v, r.err
		}
		// The signal came as the load ended: it wins, whichever the
		// select saw first, as nothing was done yet.
	case <-ctx.Done():
	}
	var zero T
	return zero, errInterrupted(ctx)
}

// errInterrupted reports a command stopped by a signal before it did
// anything.
func errInterrupted(ctx context.Context) error {
	return &exitError{code: ExitInterrupted, err: fmt.Errorf("interrupted while reading workflows; nothing was done (%v)", context.Cause(ctx))}
}

// engine opens the store and builds an engine over it. The store is closed
// when the command returns.
func (c *cli) engine(ctx context.Context) (*dagrun.Engine, error) {
	if c.maxItems < 1 {
		return nil, usageError(fmt.Errorf("invalid --max-items %d: must be at least 1", c.maxItems))
	}
	if c.maxDepth < 1 {
		return nil, usageError(fmt.Errorf("invalid --max-depth %d: must be at least 1", c.maxDepth))
	}
	if c.longRunning {
		// Read before the files, so that a change made while they are
		// read is seen as one (watchWorkflows).
		c.loadedFolder = folderFingerprint(c.workflowsDir)
	}
	workflows, invalid, err := c.loadCatalog(ctx)
	if err != nil {
		return nil, err
	}
	c.invalid = invalid
	store, err := c.openCommandStore(ctx, c.conns)
	if err != nil {
		return nil, err
	}
	c.cleanup = func() { _ = store.Close() }
	tp := c.tracerProvider(ctx)
	if tp != nil {
		closeStore := c.cleanup
		c.cleanup = func() {
			// Spans still batched go out before the process exits.
			shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := tp.Shutdown(shutdownCtx); err != nil {
				c.logger.Warn("tracing: spans not exported at exit", slog.Any("error", err))
			}
			closeStore()
		}
	}
	config := &dagrun.Config{Workflows: workflows, InvalidWorkflows: invalid, Logger: c.logger, Observer: c.observer, MaxItems: c.maxItems, MaxDepth: c.maxDepth}
	if tp != nil {
		config.TracerProvider = tp
	}
	return dagrun.New(store, c.registry, config)
}

// loadCatalog reads the workflows folder: the workflows that load, and
// the errors of the files that do not, by workflow name. Bad files do not
// stop the others from being used; a process that runs on says so once
// per read, and a start of one says why it is refused. Any other error
// (the folder cannot be read) is returned.
func (c *cli) loadCatalog(ctx context.Context) ([]*dag.Workflow, map[string]error, error) {
	workflows, err := c.loadWorkflows(ctx)
	if err == nil {
		return workflows, nil, nil
	}
	var list dag.ErrorList
	if !errors.As(err, &list) {
		return nil, nil, err
	}
	invalid := invalidByName(list, workflows)
	if c.longRunning {
		// A process that runs on logs each at every read: a file saved
		// with a mistake under a running worker is named where its
		// operator looks, with its first error.
		for _, left := range leftOut(invalid, c.workflowsDir) {
			c.logger.Warn("workflow left out: its file has errors", "workflow", left.name, "error", left.summary, "fix", "dagrun validate "+left.file)
		}
	}
	return workflows, invalid, nil
}

// leftOutWorkflow is a workflow whose file has errors: its name, its file
// and its first error.
type leftOutWorkflow struct{ name, file, summary string }

// leftOut lists the workflows of invalid by name, each with its file
// (dir when an error names none) and first error.
func leftOut(invalid map[string]error, dir string) []leftOutWorkflow {
	var out []leftOutWorkflow
	for _, name := range slices.Sorted(maps.Keys(invalid)) {
		err := invalid[name]
		file := dir // invalidByName's errors each name their file
		var list dag.ErrorList
		if errors.As(err, &list) && len(list) > 0 && list[0].File != "" {
			file = list[0].File
		}
		out = append(out, leftOutWorkflow{name: name, file: file, summary: dag.Summary(err)})
	}
	return out
}

// invalidByName groups a folder's load errors by the workflow each file is
// named for, leaving out the workflows that loaded (an error of a call to a
// broken one is the caller's, whose file is named for the caller).
func invalidByName(list dag.ErrorList, loaded []*dag.Workflow) map[string]error {
	out := map[string]error{}
	for _, e := range list {
		base := filepath.Base(e.File)
		name := strings.TrimSuffix(base, filepath.Ext(base))
		if slices.ContainsFunc(loaded, func(w *dag.Workflow) bool { return w.Name == name }) {
			continue
		}
		mine, _ := out[name].(dag.ErrorList)
		out[name] = append(mine, e)
	}
	return out
}

// warnInvalidWorkflows names on stderr each workflow whose file engine()
// left out for its errors, for a command whose output would otherwise
// hide it (no schedules listed, say).
func (c *cli) warnInvalidWorkflows() {
	for _, left := range leftOut(c.invalid, c.workflowsDir) {
		msg := fmt.Sprintf("workflow %s is left out: %s; list every error with: dagrun validate %s", left.name, left.summary, left.file)
		if !c.jsonStderr() {
			msg = "warning: " + msg // a record says so by its level
		}
		c.say(slog.LevelWarn, msg)
	}
}

// addPlanLimitFlags adds --max-items and --max-depth to a command whose
// process plans steps, where a forEach step's list and a workflow step's
// depth are checked against them. Every such process of one database
// should use the same limits.
func (c *cli) addPlanLimitFlags(cmd *cobra.Command) {
	cmd.Flags().IntVar(&c.maxItems, "max-items", dagrun.DefaultMaxItems, "most items one forEach step may have; a longer list fails the step")
	cmd.Flags().IntVar(&c.maxDepth, "max-depth", dagrun.DefaultMaxDepth, "most levels of child instances under a top-level one; a workflow step deeper fails")
}

// exitError carries an exit code; err, when set, is printed on stderr.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

func usageError(err error) error { return &exitError{code: ExitUsage, err: err} }

// unknownCommand is the usage error of a name that is not a command:
// what was not found, with parent's subcommands that resemble word.
func unknownCommand(what, name string, parent *cobra.Command, word string) error {
	msg := fmt.Sprintf("%s %q", what, name)
	if s := parent.SuggestionsFor(word); len(s) > 0 {
		msg += fmt.Sprintf(" (did you mean %s?)", strings.Join(s, " or "))
	}
	return usageError(errors.New(msg + "; run dagrun --help for the list of commands"))
}

// hasExitCode reports whether err already decides the command's exit, as
// an interruption does: it is returned as it is, not described further.
func hasExitCode(err error) bool {
	var exit *exitError
	return errors.As(err, &exit)
}

// exitCode maps an error to the documented exit codes.
func exitCode(err error) int {
	var (
		inputErr    *dagrun.InputError
		argErr      *dagrun.ArgumentError
		unknownWf   *dagrun.UnknownWorkflowError
		validateErr dag.ErrorList
	)
	switch {
	case errors.Is(err, storage.ErrUnavailable):
		return ExitUnavailable
	case errors.Is(err, storage.ErrNotFound), errors.Is(err, storage.ErrConflict),
		errors.As(err, &inputErr), errors.As(err, &argErr), errors.As(err, &unknownWf), errors.As(err, &validateErr):
		return ExitUsage
	case errors.Is(err, context.Canceled):
		return ExitFailed
	default:
		return ExitFailed
	}
}

// oneLine keeps an error on one line: the first line is the message, the
// rest (a stack trace, say) belongs in logs.
func oneLine(err error) string {
	msg := err.Error()
	if i := strings.IndexByte(msg, '\n'); i >= 0 {
		return msg[:i]
	}
	return msg
}

// syncWriter serialises the writes of concurrent goroutines to w.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// durationsAsText writes a duration in a JSON log as the text log does
// ("2.89ms"): slog's JSON handler writes a bare count of nanoseconds,
// which no reader of the log can tell from any other number.
func durationsAsText(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		return slog.String(a.Key, a.Value.Duration().String())
	}
	return a
}
