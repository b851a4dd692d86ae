package dagrun

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/dagrun/dagrun/dag"
	"github.com/dagrun/dagrun/handlers"
	"github.com/dagrun/dagrun/storage"
)

// Defaults for Config fields left zero.
const (
	DefaultMaxInputBytes     = 1 << 20
	DefaultMaxOutputBytes    = 1 << 20
	DefaultMaxPlanInputBytes = 64 << 20
	DefaultMaxPlanExprSteps  = 10 * dag.EvalStepLimit
)

// Config configures an Engine. The zero value is usable.
type Config struct {
	// Workflows are the definitions instances can be started from.
	Workflows []*dag.Workflow
	// InvalidWorkflows are the workflows whose files have errors, by name
	// (the file's), with those errors: a start of one is refused naming
	// them, rather than as an unknown workflow. Optional.
	InvalidWorkflows map[string]error
	// Logger receives the engine's logs. Default: discard.
	Logger *slog.Logger
	// MaxInputBytes bounds a start input, and a step's input once its
	// expressions are resolved (a larger one fails the step for good).
	// Default: DefaultMaxInputBytes (1 MiB).
	MaxInputBytes int
	// MaxOutputBytes bounds one handler output (a larger output fails the
	// attempt permanently) and the workflow's output (a larger one fails
	// the instance). Default: DefaultMaxOutputBytes (1 MiB).
	MaxOutputBytes int
	// MaxPlanInputBytes bounds the step inputs one transition of an
	// instance resolves, in its store transaction: a wide instance whose
	// steps each receive a large input would otherwise build them all at
	// once (10,000 steps of 1 MiB are 10 GB). Ready steps past it wait, still
	// blocked, for the instance's next transition, which the steps made
	// ready in this one bring. Default: DefaultMaxPlanInputBytes (64 MiB).
	MaxPlanInputBytes int
	// MaxPlanExprSteps bounds, in the same way, the work the expressions of
	// one transition do (counted as dag.EvalStepLimit counts it), so that a
	// wide instance whose conditions each loop over a large input holds the
	// store's write lock for a bounded time. Default:
	// DefaultMaxPlanExprSteps (ten evaluations at their own limit).
	MaxPlanExprSteps int
	// MaxItems bounds the items of one forEach step: a longer list fails
	// the step for good. Default: DefaultMaxItems (10,000).
	MaxItems int
	// Observer receives starts, finishes and attempts, for metrics.
	// Default: none.
	Observer Observer
	// TracerProvider, when set, gets a span per instance and per step
	// attempt; build it with sdktrace.WithIDGenerator(TraceIDGenerator()).
	// Default: none, and no cost.
	TracerProvider trace.TracerProvider
	// StepLogBytes bounds what one attempt's handlers.Logger keeps: the
	// last StepLogBytes of it, a marker line saying how much was dropped
	// before. Default: DefaultStepLogBytes (64 KiB).
	StepLogBytes int
	// MaxDepth bounds how deep workflow steps nest: a workflow step of an
	// instance at this depth (a top-level instance is at 0) fails for good
	// instead of starting a child. Default: DefaultMaxDepth (10).
	MaxDepth int
	// Jitter draws the random fraction, in [0, 1), that spreads a retry's
	// backoff (see dag.Retry.Delay). Default: math/rand/v2's Float64.
	// Workflow tests fix it, so that a case runs the same every time.
	Jitter func() float64
	// Now is the clock of now() in expressions. Default: the machine's.
	// Workflow tests give their fake clock.
	Now func() time.Time
}

func (c *Config) withDefaults() *Config {
	out := *c
	out.Logger = cmp.Or(c.Logger, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if out.Jitter == nil {
		out.Jitter = rand.Float64
	}
	out.MaxInputBytes = cmp.Or(c.MaxInputBytes, DefaultMaxInputBytes)
	out.MaxOutputBytes = cmp.Or(c.MaxOutputBytes, DefaultMaxOutputBytes)
	out.MaxPlanInputBytes = cmp.Or(c.MaxPlanInputBytes, DefaultMaxPlanInputBytes)
	out.MaxPlanExprSteps = cmp.Or(c.MaxPlanExprSteps, DefaultMaxPlanExprSteps)
	out.MaxItems = cmp.Or(c.MaxItems, DefaultMaxItems)
	out.StepLogBytes = cmp.Or(c.StepLogBytes, DefaultStepLogBytes)
	out.MaxDepth = cmp.Or(c.MaxDepth, DefaultMaxDepth)
	if out.Observer == nil {
		out.Observer = nopObserver{}
	}
	return &out
}

func (c *Config) validate() error {
	if min(c.MaxInputBytes, c.MaxOutputBytes, c.MaxPlanInputBytes, c.MaxPlanExprSteps, c.MaxItems, c.StepLogBytes, c.MaxDepth) < 0 {
		return errors.New("dagrun: MaxInputBytes, MaxOutputBytes, MaxPlanInputBytes, MaxPlanExprSteps, MaxItems, StepLogBytes and MaxDepth must not be negative")
	}
	_, err := newCatalog(c.Workflows, c.InvalidWorkflows)
	return err
}

// catalog is the workflows an engine starts instances from, by name, and
// the names whose files have errors. It is replaced whole, never changed
// (Engine.SetWorkflows), so a reader sees one folder's load or the next.
type catalog struct {
	workflows map[string]*dag.Workflow
	invalid   map[string]error
}

func newCatalog(workflows []*dag.Workflow, invalid map[string]error) (*catalog, error) {
	c := &catalog{workflows: make(map[string]*dag.Workflow, len(workflows)), invalid: invalid}
	for _, w := range workflows {
		if w == nil {
			return nil, errors.New("dagrun: nil workflow in Config.Workflows")
		}
		if c.workflows[w.Name] != nil {
			return nil, fmt.Errorf("dagrun: workflow %q is defined twice", w.Name)
		}
		c.workflows[w.Name] = w
	}
	return c, nil
}

// Engine starts and controls workflow instances and creates workers.
type Engine struct {
	store    storage.Store
	registry *handlers.Registry
	config   *Config
	logger   *slog.Logger
	observer Observer
	tracing  *tracing // nil: tracing is off
	catalog  atomic.Pointer[catalog]

	// definitions caches parsed definition snapshots by content hash; an
	// instance always runs under the snapshot it was started with.
	definitions sync.Map // hash -> *dag.Workflow
	specs       sync.Map // hash -> []storage.StepSpec, see stepSpecs

	changes changes
	// local are the running workers of this engine, for eager starts.
	local localWorkers
}

// New returns an Engine over store, running handlers from registry.
func New(store storage.Store, registry *handlers.Registry, config *Config) (*Engine, error) {
	if store == nil {
		return nil, errors.New("dagrun: nil store")
	}
	if registry == nil {
		return nil, errors.New("dagrun: nil handler registry")
	}
	if config == nil {
		config = &Config{}
	}
	config = config.withDefaults()
	if err := config.validate(); err != nil {
		return nil, err
	}
	e := &Engine{
		store:    store,
		registry: registry,
		config:   config,
		logger:   config.Logger,
		observer: config.Observer,
		tracing:  newTracing(config.TracerProvider, config.Logger),
	}
	if err := e.SetWorkflows(config.Workflows, config.InvalidWorkflows); err != nil {
		return nil, err
	}
	return e, nil
}

// SetWorkflows replaces the definitions instances are started from (and
// the scheduler started next reads), as Config.Workflows and
// InvalidWorkflows give them: a long-running process calls it when its
// workflows folder changes. Running instances are not affected: each runs
// under the definition it was started with.
func (e *Engine) SetWorkflows(workflows []*dag.Workflow, invalid map[string]error) error {
	c, err := newCatalog(workflows, invalid)
	if err != nil {
		return err
	}
	for _, w := range workflows {
		e.definitions.Store(w.Hash, w)
	}
	e.catalog.Store(c)
	return nil
}

// Store returns the engine's store.
func (e *Engine) Store() storage.Store { return e.store }

// Registry returns the engine's handler registry.
func (e *Engine) Registry() *handlers.Registry { return e.registry }

// Workflow returns the definition named name.
func (e *Engine) Workflow(name string) (*dag.Workflow, bool) {
	w, ok := e.catalog.Load().workflows[name]
	return w, ok
}

// Workflows returns the known definitions sorted by name.
func (e *Engine) Workflows() []*dag.Workflow {
	workflows := e.catalog.Load().workflows
	out := make([]*dag.Workflow, 0, len(workflows))
	for _, w := range workflows {
		out = append(out, w)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// UnknownWorkflowError reports a start of a workflow the engine does not know.
type UnknownWorkflowError struct {
	Name      string
	Available []string
	// Invalid, when set, is why the workflows folder's file of that name
	// is not loaded: its errors (a dag.ErrorList).
	Invalid error
	// LeftOut are the workflows whose files are left out for their errors.
	LeftOut []string
}

// quotedNameBytes is the most of a caller's name an error repeats: a name
// may be anything, 10 KB included.
const quotedNameBytes = 64

// nameStart is name cut to quotedNameBytes at a character's start, marked
// when cut.
func nameStart(name string) string {
	if len(name) <= quotedNameBytes {
		return name
	}
	return textStart(name, quotedNameBytes) + "…"
}

func (e *UnknownWorkflowError) Error() string {
	name := nameStart(e.Name)
	if e.Invalid != nil {
		return fmt.Sprintf("workflow %q is invalid: %s; dagrun validate lists every error", name, dag.Summary(e.Invalid))
	}
	if len(e.Available) == 0 && len(e.LeftOut) > 0 {
		// The folder has files, none valid: "no workflows are loaded"
		// would send the user looking for a missing folder.
		leftOut := "are left out for their errors"
		if len(e.LeftOut) == 1 {
			leftOut = "is left out for its errors"
		}
		return fmt.Sprintf("unknown workflow %q: no workflow is loaded, and %s %s (dagrun validate lists them)",
			name, strings.Join(e.LeftOut, ", "), leftOut)
	}
	if len(e.Available) == 0 {
		return fmt.Sprintf("unknown workflow %q: no workflows are loaded (put WORKFLOW.yaml files in the workflows folder)", name)
	}
	return fmt.Sprintf("unknown workflow %q (available: %s)", name, strings.Join(e.Available, ", "))
}

func (e *Engine) lookupWorkflow(name string) (*dag.Workflow, error) {
	if w, ok := e.Workflow(name); ok {
		return w, nil
	}
	return nil, e.UnknownWorkflow(name)
}

// UnknownWorkflow is the error of a use of name, a workflow the engine does
// not know: the ones it knows, or why name's file was refused.
func (e *Engine) UnknownWorkflow(name string) *UnknownWorkflowError {
	c := e.catalog.Load()
	names := make([]string, 0, len(c.workflows))
	for n := range c.workflows {
		names = append(names, n)
	}
	sort.Strings(names)
	return &UnknownWorkflowError{Name: name, Available: names, Invalid: c.invalid[name], LeftOut: slices.Sorted(maps.Keys(c.invalid))}
}

// definition returns the parsed snapshot with the given hash, parsing the
// stored source on a cache miss (an instance started by another process or
// from an older version of the file).
func (e *Engine) definition(hash string, load func() ([]byte, error)) (*dag.Workflow, error) {
	if w, ok := e.definitions.Load(hash); ok {
		return w.(*dag.Workflow), nil
	}
	if load == nil {
		return nil, fmt.Errorf("definition %s is not loaded", hash)
	}
	src, err := load()
	if err != nil {
		return nil, fmt.Errorf("load definition %s: %w", hash, err)
	}
	w, err := dag.Parse("", src, &dag.ParseOptions{Stored: true})
	if err != nil {
		return nil, &unparsableSnapshotError{hash: hash, err: err}
	}
	e.definitions.Store(hash, w)
	return w, nil
}

// unparsableSnapshotError reports a definition snapshot this binary cannot
// parse, such as one written by a newer version with fields it does not
// know. Unlike a failure to load it, trying again cannot help.
type unparsableSnapshotError struct {
	hash string
	err  error
}

func (e *unparsableSnapshotError) Error() string {
	return fmt.Sprintf("definition snapshot %s cannot be parsed by this version of dagrun (%v): run its instances with a version that can parse it, then retry them", e.hash, e.err)
}

func (e *unparsableSnapshotError) Unwrap() error { return e.err }

// Definition returns the workflow definition an instance runs under.
func (e *Engine) Definition(inst *storage.Instance) (*dag.Workflow, error) {
	return e.definition(inst.DefinitionHash, func() ([]byte, error) {
		if inst.Definition == nil {
			return nil, storage.ErrNotFound
		}
		return inst.Definition, nil
	})
}

// Get returns an instance with its steps and the latest events of its
// history (storage.InstanceEvents of them; Events pages the rest).
func (e *Engine) Get(ctx context.Context, id string) (*storage.Instance, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	return e.store.GetInstance(ctx, id)
}

// Events returns a page of an instance's history: its events after
// p.AfterID in ID order, at most p.Limit (see storage.Store.ListEvents).
func (e *Engine) Events(ctx context.Context, p storage.EventsParams) ([]storage.Event, error) {
	if err := checkID(p.InstanceID); err != nil {
		return nil, err
	}
	return e.store.ListEvents(ctx, p)
}

// List returns instances, newest first.
func (e *Engine) List(ctx context.Context, p storage.ListParams) ([]storage.Instance, error) {
	if err := validateList(p); err != nil {
		return nil, err
	}
	return e.store.ListInstances(ctx, p)
}

// Cancel cancels an unfinished instance and its unfinished descendants
// (child instances). Running handlers see their context cancelled at once
// in this process, and at their worker's next heartbeat in others. A
// cancelled child fails its parent's workflow step.
func (e *Engine) Cancel(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	rec := e.newFinishRecorder()
	if err := e.store.CancelInstance(rec.attach(ctx), id, "cancelled by request", rec.plan); err != nil {
		var refusal *storage.RefusalError
		switch {
		case errors.As(err, &refusal) && errors.Is(err, storage.ErrConflict):
			return storage.Refuse(storage.ErrConflict, "%s; only a pending or running instance can be cancelled", refusal.Reason)
		case errors.Is(err, storage.ErrConflict):
			return fmt.Errorf("instance %s is already finished: %w", id, err)
		}
		return err
	}
	e.stopLocalTree(ctx, id)
	rec.report()
	e.notifyChanged()
	if inst, err := e.store.GetInstance(ctx, id); err == nil {
		e.observer.InstanceFinished(inst.Workflow, storage.InstanceCancelled)
		if e.tracing != nil {
			e.endInstanceSpan(ctx, inst)
		}
	}
	return nil
}

// Retry re-arms a failed or cancelled instance: failed and cancelled steps
// run again with fresh attempts, completed outputs are kept. A failed
// workflow step runs again by retrying its child the same way. A child
// instance is retried only through its parent.
func (e *Engine) Retry(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	rec := e.newFinishRecorder()
	if err := e.store.RetryInstance(rec.attach(ctx), id, rec.plan); err != nil {
		var refusal *storage.RefusalError
		if errors.As(err, &refusal) {
			return err // says why: the instance's status, or the parent to retry
		}
		if errors.Is(err, storage.ErrConflict) {
			return fmt.Errorf("instance %s is not failed or cancelled, so there is nothing to retry: %w", id, err)
		}
		return err
	}
	rec.report()
	e.notifyChanged()
	return nil
}
