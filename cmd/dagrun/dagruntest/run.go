package dagruntest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"sync"
	"time"

	"github.com/dagrun/dagrun"
	"github.com/dagrun/dagrun/dag"
	"github.com/dagrun/dagrun/handlers"
	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/sqlite"
)

// MaxRounds bounds the Drive rounds of one case: a workflow that keeps
// retrying or sleeping for ever fails its case instead of hanging the run.
const MaxRounds = 10_000

// Runner runs test cases against workflows with a binary's handlers.
type Runner struct {
	registry  *handlers.Registry
	workflows []*dag.Workflow
}

// NewRunner returns a Runner of workflows whose real: true steps run
// registry's handlers.
func NewRunner(registry *handlers.Registry, workflows []*dag.Workflow) (*Runner, error) {
	if registry == nil {
		return nil, errors.New("dagruntest: nil handler registry")
	}
	return &Runner{registry: registry, workflows: workflows}, nil
}

// Result is the outcome of one case.
type Result struct {
	File     string
	Workflow string
	Case     *Case
	Duration time.Duration
	// Failures say what differed from the expectations, or what kept the
	// case from running; none means it passed.
	Failures []string
	// Instance is the instance as it settled, with its steps and events;
	// nil when it was never started.
	Instance *storage.Instance
}

// Passed reports whether the case met every expectation.
func (r *Result) Passed() bool { return len(r.Failures) == 0 }

// Name is the case's full name, WORKFLOW/CASE.
func (r *Result) Name() string { return r.Workflow + "/" + r.Case.Name }

// RunFile runs the cases of f whose full name (WORKFLOW/CASE) matches
// filter (nil: every case), one after another, each on a store of its own.
func (r *Runner) RunFile(ctx context.Context, f *File, filter *regexp.Regexp) []*Result {
	var out []*Result
	for _, c := range f.Cases {
		if filter != nil && !filter.MatchString(f.Workflow+"/"+c.Name) {
			continue
		}
		out = append(out, r.RunCase(ctx, f, c))
	}
	return out
}

// RunCase runs one case on a throwaway in-memory store whose clock is fake:
// it starts the instance, then drives the engine round by round, and when
// nothing is ready jumps the clock to the next time something is due (a
// backoff, a durable sleep, a wait's timeout, a delayed signal), so hours
// of workflow time take microseconds. It stops when nothing is due any
// more, and checks the expectations against the instance as it stands.
func (r *Runner) RunCase(ctx context.Context, f *File, c *Case) *Result {
	began := time.Now()
	res := &Result{File: f.Path, Workflow: f.Workflow, Case: c}
	defer func() { res.Duration = time.Since(began) }()
	clock := &fakeClock{now: c.Start}
	store, closeStore, err := openStore(clock.Now)
	if err != nil {
		res.Failures = append(res.Failures, err.Error())
		return res
	}
	defer closeStore()
	problems := &problemLog{}
	engine, err := dagrun.New(store, mockRegistry(r.registry, r.workflows, f.Workflow, c.Mocks, problems), &dagrun.Config{Workflows: r.workflows})
	if err != nil {
		res.Failures = append(res.Failures, err.Error())
		return res
	}
	inst, err := drive(ctx, engine, clock, f.Workflow, c)
	res.Instance = inst
	res.Failures = append(res.Failures, problems.all()...)
	if err != nil {
		res.Failures = append(res.Failures, checkStartError(c, err)...)
		return res
	}
	res.Failures = append(res.Failures, check(f, c, inst)...)
	return res
}

// startError marks an error of the start itself, which a case may expect.
type startError struct{ err error }

func (e *startError) Error() string { return e.err.Error() }

// drive starts the case's instance and runs it until nothing is due, on
// the fake clock.
func drive(ctx context.Context, engine *dagrun.Engine, clock *fakeClock, workflow string, c *Case) (*storage.Instance, error) {
	started, err := engine.Start(ctx, workflow, c.Input, nil)
	if err != nil {
		return nil, &startError{err}
	}
	pending := make([]*Signal, len(c.Signals))
	copy(pending, c.Signals)
	opts := &dagrun.DriveOptions{Now: clock.Now}
	for round := 0; ; round++ {
		if round >= MaxRounds {
			return nil, fmt.Errorf("the instance did not settle within %d rounds (by %s of workflow time): does a step retry or sleep for ever?", MaxRounds, clock.Now().Sub(c.Start))
		}
		pending, err = sendDue(ctx, engine, started.ID, c.Start, clock.Now(), pending)
		if err != nil {
			return nil, err
		}
		res, err := engine.Drive(ctx, opts)
		if err != nil {
			return nil, fmt.Errorf("drive the engine: %w", err)
		}
		if res.Ran+res.Expired > 0 {
			continue
		}
		next := res.NextWake
		for _, s := range pending {
			if at := c.Start.Add(s.After); next.IsZero() || at.Before(next) {
				next = at
			}
		}
		if next.IsZero() {
			break // settled: finished, or waiting for what the case does not send
		}
		clock.advance(next)
	}
	return engine.Get(ctx, started.ID)
}

// sendDue sends the signals whose time has come, in file order, and
// returns the others.
func sendDue(ctx context.Context, engine *dagrun.Engine, id string, start, now time.Time, pending []*Signal) ([]*Signal, error) {
	var later []*Signal
	for _, s := range pending {
		if start.Add(s.After).After(now) {
			later = append(later, s)
			continue
		}
		if _, err := engine.Signal(ctx, dagrun.SignalRequest{InstanceID: id, Name: s.Name, ID: s.ID, Data: s.Data}); err != nil {
			return nil, fmt.Errorf("signal %s (line %d): %w", s.Name, s.Line, err)
		}
	}
	return later, nil
}

// fakeClock is the store's and the handlers' clock: it moves only when the
// runner advances it.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// advance moves the clock to t, or by a millisecond when t is not ahead
// (a store that keeps times to the millisecond may report a wake time a
// hair before now).
func (c *fakeClock) advance(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !t.After(c.now) {
		t = c.now.Add(time.Millisecond)
	}
	c.now = t
}

// openStore opens an empty SQLite database in memory, on one connection
// (an in-memory database lives as long as its connection), with clock as
// the store's clock.
func openStore(clock func() time.Time) (storage.Store, func(), error) {
	db, err := sql.Open("sqlite3", "file::memory:?_foreign_keys=on&_txlock=immediate")
	if err != nil {
		return nil, nil, fmt.Errorf("open the in-memory test database: %w", err)
	}
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	db.SetConnMaxLifetime(0)
	db.SetConnMaxIdleTime(0)
	store, err := sqlite.New(db, &sqlite.Config{Now: clock})
	if err != nil {
		_ = db.Close()
		return nil, nil, fmt.Errorf("open the in-memory test database: %w", err)
	}
	return store, func() { _ = store.Close(); _ = db.Close() }, nil
}
