package dagruntest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"runtime"
	"slices"
	"strings"
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

	mu   sync.Mutex
	idle []*memStore // emptied stores for the next cases
}

// NewRunner returns a Runner of workflows whose real: true steps run
// registry's handlers. Its RunCase may be called from many goroutines;
// Close releases the in-memory stores it keeps.
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
// filter (nil: every case); see RunFiles.
func (r *Runner) RunFile(ctx context.Context, f *File, filter *regexp.Regexp) []*Result {
	return r.RunFiles(ctx, []*File{f}, filter, nil)
}

// RunFiles runs the cases of files whose full name (WORKFLOW/CASE)
// matches filter (nil: every case), each on a store of its own, as many
// at once as the process has CPUs, and returns their results in file
// order. each, when not nil, gets every result in that order as soon as it
// and those before it are done, so a command can print as it goes.
func (r *Runner) RunFiles(ctx context.Context, files []*File, filter *regexp.Regexp, each func(*Result)) []*Result {
	type job struct {
		f *File
		c *Case
	}
	var jobs []job
	for _, f := range files {
		for _, c := range f.Cases {
			if filter == nil || filter.MatchString(f.Workflow+"/"+c.Name) {
				jobs = append(jobs, job{f, c})
			}
		}
	}
	results := make([]*Result, len(jobs))
	done := make([]chan struct{}, len(jobs))
	for i := range done {
		done[i] = make(chan struct{})
	}
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), len(jobs)) {
		wg.Go(func() {
			for i := range next {
				results[i] = r.RunCase(ctx, jobs[i].f, jobs[i].c)
				close(done[i])
			}
		})
	}
	go func() {
		for i := range jobs {
			next <- i
		}
		close(next)
	}()
	for i := range jobs {
		<-done[i]
		if each != nil {
			each(results[i])
		}
	}
	wg.Wait()
	return results
}

// RunCase runs one case on an empty in-memory store of its own (a fresh
// one, or one an earlier case used, emptied) whose clock is fake: it
// starts the instance, then drives the engine round by round, and when
// nothing is ready jumps the clock to the next time something is due (a
// backoff, a durable sleep, a wait's timeout, a delayed signal), so hours
// of workflow time take microseconds. It stops when nothing is due any
// more, and checks the expectations against the instance as it stands.
func (r *Runner) RunCase(ctx context.Context, f *File, c *Case) *Result {
	began := time.Now()
	res := &Result{File: f.Path, Workflow: f.Workflow, Case: c}
	defer func() { res.Duration = time.Since(began) }()
	mem, err := r.takeStore()
	if err != nil {
		res.Failures = append(res.Failures, err.Error())
		return res
	}
	defer r.giveStore(ctx, mem)
	clock := mem.clock
	clock.set(c.Start)
	problems := &problemLog{}
	engine, err := dagrun.New(mem.store, mockRegistry(r.registry, r.workflows, f.Workflow, c.Mocks, problems), &dagrun.Config{
		Workflows: r.workflows,
		// Retries wait their whole backoff, so that a case runs the same
		// every time and reads as the formula of the reference.
		Jitter: func() float64 { return 0 },
		Now:    clock.Now,
	})
	if err != nil {
		res.Failures = append(res.Failures, err.Error())
		return res
	}
	inst, failures, err := drive(ctx, engine, clock, f.Workflow, c)
	res.Instance = inst
	res.Failures = append(res.Failures, problems.all()...)
	res.Failures = append(res.Failures, failures...)
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
func drive(ctx context.Context, engine *dagrun.Engine, clock *fakeClock, workflow string, c *Case) (inst *storage.Instance, failures []string, err error) {
	var id string
	if c.Scheduled {
		id, err = startScheduled(ctx, engine, clock, workflow, c.Schedule)
	} else {
		var started dagrun.StartResult
		started, err = engine.Start(ctx, workflow, c.Input, nil)
		id = started.ID
	}
	if err != nil {
		return nil, nil, &startError{err}
	}
	// Signals and runFor count from the instance's start: a scheduled
	// instance starts at its tick.
	begin := clock.Now()
	pending := make([]*Signal, len(c.Signals))
	copy(pending, c.Signals)
	opts := &dagrun.DriveOptions{Now: clock.Now}
	for round := 0; ; round++ {
		if round >= MaxRounds {
			return nil, failures, fmt.Errorf("the instance did not settle within %d rounds (by %s of workflow time): does a step retry or sleep for ever?", MaxRounds, clock.Now().Sub(begin))
		}
		var refused []string
		pending, refused = sendDue(ctx, engine, id, begin, clock.Now(), pending)
		failures = append(failures, refused...)
		res, err := engine.Drive(ctx, opts)
		if err != nil {
			return nil, failures, fmt.Errorf("drive the engine: %w", err)
		}
		// Drive ran everything due now: what comes next is due later.
		next := res.NextWake
		for _, s := range pending {
			if at := begin.Add(s.After); next.IsZero() || at.Before(next) {
				next = at
			}
		}
		if next.IsZero() {
			break // settled: finished, or waiting for what the case does not send
		}
		if c.RunFor > 0 && next.After(begin.Add(c.RunFor)) {
			clock.advance(begin.Add(c.RunFor))
			break
		}
		clock.advance(next)
	}
	inst, err = engine.Get(ctx, id)
	if err == nil {
		err = readHistory(ctx, engine, inst)
	}
	return inst, failures, err
}

// historyPage is how many events readHistory reads at a time.
const historyPage = 1000

// readHistory gives inst its whole history, where Get gave only the latest
// events: a case's expected events are looked for in all of it.
func readHistory(ctx context.Context, engine *dagrun.Engine, inst *storage.Instance) error {
	if !inst.EventsTruncated {
		return nil
	}
	var all []storage.Event
	for {
		var after int64
		if len(all) > 0 {
			after = all[len(all)-1].ID
		}
		page, err := engine.Events(ctx, storage.EventsParams{InstanceID: inst.ID, AfterID: after, Limit: historyPage})
		if err != nil {
			return fmt.Errorf("read the history of instance %s: %w", inst.ID, err)
		}
		if len(page) == 0 {
			inst.Events, inst.EventsTruncated = all, false
			return nil
		}
		all = append(all, page...)
	}
}

// startScheduled runs the engine's scheduler on the fake clock, jumping
// it from tick to tick, until the workflow's schedules have started an
// instance, and returns its ID. With index 0 or more only that schedule
// runs: the others are paused in the case's own store. A schedule paused
// or without a future tick starts nothing: that is an error.
func startScheduled(ctx context.Context, engine *dagrun.Engine, clock *fakeClock, workflow string, index int) (string, error) {
	scheduler, err := engine.NewScheduler(&dagrun.SchedulerConfig{Now: clock.Now, Workflows: []string{workflow}})
	if err == nil {
		err = scheduler.Register(ctx)
	}
	if w, ok := engine.Workflow(workflow); err == nil && index >= 0 && ok {
		for other := range w.Schedules {
			if other != index && err == nil {
				err = engine.PauseSchedule(ctx, workflow, other, true)
			}
		}
	}
	for round := 0; err == nil && round < MaxRounds; round++ {
		var next time.Time
		if next, err = scheduler.FireDue(ctx); err != nil {
			break
		}
		var started []storage.Instance
		if started, err = engine.List(ctx, storage.ListParams{Workflow: workflow, Limit: 1}); err != nil {
			break
		}
		if len(started) > 0 {
			return started[0].ID, nil
		}
		if next.IsZero() {
			return "", fmt.Errorf("the schedules of %s start no instance after %s", workflow, clock.Now().Format(time.RFC3339))
		}
		clock.advance(next)
	}
	if err == nil {
		err = fmt.Errorf("the schedules of %s started no instance within %d ticks", workflow, MaxRounds)
	}
	return "", err
}

// sendDue sends the signals whose time has come, in file order, and
// returns the others, and what went otherwise than the case said (a
// signal refused, or one the case expected refused that was taken).
func sendDue(ctx context.Context, engine *dagrun.Engine, id string, start, now time.Time, pending []*Signal) (later []*Signal, failures []string) {
	for _, s := range pending {
		if start.Add(s.After).After(now) {
			later = append(later, s)
			continue
		}
		_, err := engine.Signal(ctx, dagrun.SignalRequest{InstanceID: id, Name: s.Name, ID: s.ID, Data: s.Data})
		switch {
		case err != nil && s.Error == nil:
			failures = append(failures, fmt.Sprintf("signal %s (line %d) was refused: %v", s.Name, s.Line, err))
		case err != nil && !strings.Contains(err.Error(), *s.Error):
			failures = append(failures, fmt.Sprintf("signal %s (line %d): want it refused with %q, got %q", s.Name, s.Line, *s.Error, err.Error()))
		case err == nil && s.Error != nil:
			failures = append(failures, fmt.Sprintf("signal %s (line %d): want it refused with %q, but it was taken", s.Name, s.Line, *s.Error))
		}
	}
	return later, failures
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

func (c *fakeClock) set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
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

// memStore is an in-memory SQLite store on one connection (an in-memory
// database lives as long as its connection) whose clock is a fakeClock.
// Opening and migrating one costs more than running a case, and a new
// connection prepares every statement anew, so a Runner keeps its stores
// and empties them between cases instead.
type memStore struct {
	db    *sql.DB
	store storage.Store
	clock *fakeClock
	// resetSQL empties the tables; built at the first reset.
	resetSQL string
}

func openMemStore() (*memStore, error) {
	db, err := sql.Open("sqlite3", "file::memory:?_foreign_keys=on&_txlock=immediate&_stmt_cache_size=64")
	if err != nil {
		return nil, fmt.Errorf("open the in-memory test database: %w", err)
	}
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	db.SetConnMaxLifetime(0)
	db.SetConnMaxIdleTime(0)
	clock := &fakeClock{}
	store, err := sqlite.New(db, &sqlite.Config{Now: clock.Now})
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("open the in-memory test database: %w", err)
	}
	return &memStore{db: db, store: store, clock: clock}, nil
}

// reset empties every table but the schema's version, so the next case
// starts from a new database as far as the store can tell, in one call.
// It deletes a table's rows before those of the tables it references,
// rather than turning foreign keys off for a moment: changing that pragma
// expires every prepared statement, and preparing them anew (triggers and
// all) would cost more than the case itself.
func (m *memStore) reset(ctx context.Context) error {
	if m.resetSQL == "" {
		order, err := deleteOrder(ctx, m.db)
		if err != nil {
			return fmt.Errorf("empty the test database: %w", err)
		}
		stmts := make([]string, len(order))
		for i, name := range order {
			stmts[i] = `DELETE FROM "` + name + `"`
		}
		m.resetSQL = strings.Join(stmts, ";\n")
	}
	if _, err := m.db.ExecContext(ctx, m.resetSQL); err != nil {
		return fmt.Errorf("empty the test database: %w", err)
	}
	return nil
}

// deleteOrder lists the tables to empty, each before the tables its
// foreign keys reference.
func deleteOrder(ctx context.Context, db *sql.DB) ([]string, error) {
	rows, err := db.QueryContext(ctx, `SELECT m.name, coalesce(f."table", '') FROM sqlite_master m
		LEFT JOIN pragma_foreign_key_list(m.name) f
		WHERE m.type = 'table' AND m.name <> 'schema_migrations'
			AND (m.name NOT LIKE 'sqlite\_%' ESCAPE '\' OR m.name = 'sqlite_sequence')
		ORDER BY m.name`)
	if err != nil {
		return nil, err
	}
	var names []string
	references := map[string][]string{}
	for rows.Next() {
		var name, referenced string
		if err := rows.Scan(&name, &referenced); err != nil {
			_ = rows.Close()
			return nil, err
		}
		if _, seen := references[name]; !seen {
			names = append(names, name)
			references[name] = nil
		}
		if referenced != "" && referenced != name {
			references[name] = append(references[name], referenced)
		}
	}
	if err := rows.Close(); err != nil {
		return nil, err
	}
	// A table goes after every table that references it: emit a table once
	// no remaining table references it.
	var order []string
	emitted := map[string]bool{}
	for len(order) < len(names) {
		progressed := false
		for _, name := range names {
			if emitted[name] || referencedByRemaining(name, names, references, emitted) {
				continue
			}
			order = append(order, name)
			emitted[name] = true
			progressed = true
		}
		if !progressed {
			return nil, errors.New("the schema's foreign keys form a cycle")
		}
	}
	return order, nil
}

func referencedByRemaining(table string, names []string, references map[string][]string, emitted map[string]bool) bool {
	for _, other := range names {
		if !emitted[other] && other != table && slices.Contains(references[other], table) {
			return true
		}
	}
	return false
}

func (m *memStore) close() { _ = m.store.Close(); _ = m.db.Close() }

// takeStore returns an empty store of the runner's, opening one when all
// are in use.
func (r *Runner) takeStore() (*memStore, error) {
	r.mu.Lock()
	if n := len(r.idle); n > 0 {
		m := r.idle[n-1]
		r.idle = r.idle[:n-1]
		r.mu.Unlock()
		return m, nil
	}
	r.mu.Unlock()
	return openMemStore()
}

// giveStore empties a store and keeps it for the next case.
func (r *Runner) giveStore(ctx context.Context, m *memStore) {
	if err := m.reset(context.WithoutCancel(ctx)); err != nil {
		m.close()
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.idle = append(r.idle, m)
}

// Close closes the stores the runner keeps between cases.
func (r *Runner) Close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range r.idle {
		m.close()
	}
	r.idle = nil
}
