package sqlite

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/mattn/go-sqlite3"

	"github.com/dagrun/dagrun/storage"
)

// CreateInstances implements storage.Store. tx is nil or the caller's
// *sql.Tx, begun on a pool opened with DSN (so it is BEGIN IMMEDIATE).
func (s *Store) CreateInstances(ctx context.Context, tx any, params []storage.CreateParams, plan storage.PlanFunc) ([]storage.CreateResult, error) {
	if err := checkCreate(params, plan); err != nil {
		return nil, err
	}
	if tx == nil {
		results, _, err := s.createAndClaim(ctx, params, plan, nil)
		return results, err
	}
	stx, ok := tx.(*sql.Tx)
	if !ok || stx == nil {
		return nil, fmt.Errorf("sqlite: create instances: caller transaction is %T, want a non-nil *sql.Tx", tx)
	}
	if err := s.checkCallerFile(ctx, stx); err != nil {
		return nil, err
	}
	storage.AttemptStarted(ctx)
	t := &txn{ctx: ctx, tx: stx, now: s.now()}
	var results []storage.CreateResult
	err := t.savepoint(func() error {
		var err error
		if results, err = t.createMany(params, plan); err != nil {
			return err
		}
		return t.flushEvents()
	})
	if err != nil {
		return nil, s.fail("create instances", err)
	}
	// The caller has not committed yet; a worker woken now may find
	// nothing, and then its polling finds the steps after the commit.
	s.notify()
	return results, nil
}

// CreateAndClaim implements storage.CreateClaimer.
func (s *Store) CreateAndClaim(ctx context.Context, params []storage.CreateParams, plan storage.PlanFunc, p storage.ClaimParams) ([]storage.CreateResult, []storage.ClaimedStep, error) {
	if err := checkCreate(params, plan); err != nil {
		return nil, nil, err
	}
	if p.Lease <= 0 {
		return nil, nil, errors.New("sqlite: create and claim: lease must be positive")
	}
	return s.createAndClaim(ctx, params, plan, &p)
}

func (s *Store) createAndClaim(ctx context.Context, params []storage.CreateParams, plan storage.PlanFunc, claim *storage.ClaimParams) ([]storage.CreateResult, []storage.ClaimedStep, error) {
	var (
		results   []storage.CreateResult
		claimed   []storage.ClaimedStep
		madeReady []readyStep
	)
	err := s.write(ctx, "create instances", func(t *txn) error {
		var err error
		if results, err = t.createMany(params, plan); err != nil || claim == nil {
			return err
		}
		claimed, err = t.claim(*claim)
		madeReady = t.madeReady
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	if !claimedAll(claim, claimed, madeReady) {
		s.notify()
	}
	return results, claimed, nil
}

func checkCreate(params []storage.CreateParams, plan storage.PlanFunc) error {
	if plan == nil {
		return errors.New("sqlite: create instances: nil PlanFunc")
	}
	for i := range params {
		if err := validateCreate(&params[i]); err != nil {
			return fmt.Errorf("sqlite: create instances: %w", err)
		}
	}
	return nil
}

func validateCreate(p *storage.CreateParams) error {
	switch {
	case p.ID == "":
		return errors.New("instance without ID")
	case p.Workflow == "":
		return fmt.Errorf("instance %s: empty workflow", p.ID)
	case p.DefinitionHash == "":
		return fmt.Errorf("instance %s: empty definition hash", p.ID)
	}
	seen := make(map[string]bool, len(p.Steps))
	for _, st := range p.Steps {
		if st.Name == "" || seen[st.Name] {
			return fmt.Errorf("instance %s: empty or duplicate step name %q", p.ID, st.Name)
		}
		seen[st.Name] = true
	}
	return nil
}

// createMany creates the instances of one call, then plans the parents
// whose children finished at once (see create).
func (t *txn) createMany(params []storage.CreateParams, plan storage.PlanFunc) ([]storage.CreateResult, error) {
	results, err := t.create(params, plan)
	if err != nil {
		return nil, err
	}
	return results, t.planReplan(plan)
}

// create creates instances with a handful of multi-row statements whatever
// their number: each instance is planned in memory (every step blocked,
// then the plan applied), so each row is inserted once in its initial
// state instead of being inserted and updated. The children a plan starts
// are created the same way, recursively; a parent whose child finished at
// once is left in t.replan for the caller to plan, when no plan of it is
// under way.
func (t *txn) create(params []storage.CreateParams, plan storage.PlanFunc) ([]storage.CreateResult, error) {
	t.planFn = plan
	results := make([]storage.CreateResult, len(params))
	keys := map[[2]string]string{} // (workflow, key) -> ID created in this call
	definitions := map[string]*storage.CreateParams{}
	var instances []*storage.NewInstance
	for i := range params {
		p := &params[i]
		if p.Key != "" {
			if id, ok := keys[[2]string{p.Workflow, p.Key}]; ok {
				results[i] = storage.CreateResult{ID: id, Existed: true}
				continue
			}
			var id string
			err := t.queryRow(`SELECT id FROM instances WHERE workflow = ? AND idem_key = ?`, p.Workflow, p.Key).Scan(&id)
			if err == nil {
				results[i] = storage.CreateResult{ID: id, Existed: true}
				continue
			}
			if !errors.Is(err, sql.ErrNoRows) {
				return nil, err
			}
			keys[[2]string{p.Workflow, p.Key}] = p.ID
		}
		if definitions[p.DefinitionHash] == nil {
			definitions[p.DefinitionHash] = p
		}
		n, err := storage.PlanNew(p, plan, t.definition(p.DefinitionHash))
		if err != nil {
			return nil, err
		}
		instances = append(instances, n)
		results[i] = storage.CreateResult{ID: p.ID}
		for j, ns := range n.Steps {
			if ns.Status == storage.StepPending {
				t.madeReady = append(t.madeReady, readyStep{p.ID, n.Params.Steps[j].Name})
			}
		}
	}
	for hash, p := range definitions {
		// The first snapshot of a hash wins: the same hash is the same source.
		if _, err := t.exec(`INSERT INTO definitions (hash, workflow, source) VALUES (?, ?, ?) ON CONFLICT (hash) DO NOTHING`,
			hash, p.Workflow, p.Definition); err != nil {
			return nil, err
		}
	}
	if err := t.insertInstances(instances); err != nil {
		return nil, err
	}
	for _, n := range instances {
		if n.Params.Parent != nil && n.Status.Finished() {
			if err := t.childFinished(n.Params.ID, n.Params.Parent, n.Status, n.Output, n.Error); err != nil {
				return nil, err
			}
		}
	}
	return results, nil
}

const (
	insertInstancesSQL = `INSERT INTO instances (id, workflow, definition_hash, status, input, idem_key, priority,
		run_after, created_at, output, error, finished_at, timeout_us, failing, failed_step,
		concurrency_key, concurrency_limit, held, parked, traceparent, trace_caller, parent_id, parent_step, parent_item, depth, deferred) VALUES `
	insertStepsSQL = `INSERT INTO steps (instance_id, position, name, handler, queue, workflow, priority, depends_on,
		status, max_attempts, backoff_us, max_backoff_us, timeout_us, input, error, run_after, ready_at, finished_at,
		output, for_each, item_concurrency, continue_on_error, wait_signal, wait_timeout_us, deadline, on_failure,
		concurrency_key, concurrency_limit, held_by_instance, child_workflow, started_at) VALUES `
	instanceInsertColumns = 26
	stepInsertColumns     = 31
)

// insertInstances inserts the instance rows, their step rows and their
// creation events.
func (t *txn) insertInstances(instances []*storage.NewInstance) error {
	if len(instances) == 0 {
		return nil
	}
	now := us(t.now)
	held, err := t.admit(instances)
	if err != nil {
		return err
	}
	if err := storage.StartAdmitted(instances, held, t.planFn, t.definition); err != nil {
		return err
	}
	rows := make([]any, 0, instanceInsertColumns*len(instances))
	var (
		steps    []any
		expanded []expansion
	)
	for _, n := range instances {
		p := n.Params
		runAfter := max(now, us(p.RunAfter))
		var key, finishedAt any
		if p.Key != "" {
			key = p.Key
		}
		if n.Status.Finished() {
			finishedAt = now
		}
		var concurrencyKey any
		if p.ConcurrencyLimit > 0 {
			concurrencyKey = p.ConcurrencyKey
		}
		var parentID, parentStep, parentItem any = nil, "", -1
		if p.Parent != nil {
			parentID, parentStep, parentItem = p.Parent.InstanceID, p.Parent.Step, p.Parent.Item
		}
		rows = append(rows, p.ID, p.Workflow, p.DefinitionHash, string(n.Status), jsonArg(p.Input), key, p.Priority,
			runAfter, now, jsonArg(n.Output), n.Error, finishedAt, p.Timeout.Microseconds(), n.Failing, n.FailedStep,
			concurrencyKey, p.ConcurrencyLimit, held[p.ID], n.Parked, nullIfEmpty(p.TraceParent), nullIfEmpty(p.TraceCaller),
			parentID, parentStep, parentItem, p.Depth, n.Deferred)
		for i, st := range n.Steps {
			spec := &p.Steps[i]
			deps := "[]"
			if len(spec.DependsOn) > 0 {
				b, err := json.Marshal(spec.DependsOn)
				if err != nil {
					return err
				}
				deps = string(b)
			}
			var stepRunAfter, readyAt, startedAt, finishedAt, deadline any = 0, nil, nil, nil, nil
			status := st.Status
			signal, waitTimeout := waitColumns(spec.Wait)
			if st.Status == storage.StepPending {
				stepRunAfter, readyAt = runAfter, now
			} else if st.Status == storage.StepWaiting {
				// A wait step starts when it begins to wait.
				readyAt, startedAt, deadline = now, now, deadlineUS(runAfter, waitTimeout)
			} else if st.Status == storage.StepRunning {
				// Inserted blocked, expanded once its row has an ID.
				status = storage.StepBlocked
				expanded = append(expanded, expansion{n, i, runAfter})
			} else if st.Finished() {
				finishedAt = now
			}
			steps = append(steps, p.ID, i, spec.Name, spec.Handler, cmp.Or(spec.Queue, "default"), p.Workflow, p.Priority, deps,
				string(status), max(spec.Retry.MaxAttempts, 1), spec.Retry.Backoff.Microseconds(), spec.Retry.MaxBackoff.Microseconds(),
				spec.Timeout.Microseconds(), jsonArg(st.Input), st.Error, stepRunAfter, readyAt, finishedAt,
				jsonArg(st.Output), spec.ForEach, spec.ItemConcurrency, spec.ContinueOnError, signal, waitTimeout, deadline, spec.OnFailure,
				stepKey(spec, st.ConcurrencyKey), spec.ConcurrencyLimit, held[p.ID], spec.Workflow, startedAt)
		}
		for _, e := range n.Events {
			t.event(p.ID, e.Step, e.Type, 0, e.Message)
		}
	}
	if err := t.insertRows(insertInstancesSQL, instanceInsertColumns, rows); err != nil {
		var se sqlite3.Error
		if errors.As(err, &se) && se.Code == sqlite3.ErrConstraint && strings.Contains(se.Error(), "instances.id") {
			return fmt.Errorf("%w: an instance with this ID already exists (%v)", storage.ErrConflict, err)
		}
		return fmt.Errorf("insert instances: %w", err)
	}
	if err := t.insertRows(insertStepsSQL, stepInsertColumns, steps); err != nil {
		return fmt.Errorf("insert steps: %w", err)
	}
	for _, n := range instances {
		switch n.Status {
		case storage.InstanceRunning:
			// A workflow timeout counts from here, unless the instance
			// failed at once and only runs its onFailure steps.
			if _, err := t.exec(`UPDATE instances SET started_at = ?1,
				deadline = CASE WHEN timeout_us > 0 AND NOT failing THEN ?1 + timeout_us END WHERE id = ?2`, us(t.now), n.Params.ID); err != nil {
				return err
			}
		case storage.InstanceCompleted, storage.InstanceFailed:
			// Done without a step claimed (every step skipped, an empty
			// forEach): it started as it finished.
			if _, err := t.exec(`UPDATE instances SET started_at = ?1 WHERE id = ?2`, us(t.now), n.Params.ID); err != nil {
				return err
			}
		}
	}
	for _, x := range expanded {
		p, st := x.n.Params, &x.n.Steps[x.position]
		var id int64
		if err := t.queryRow(`SELECT id FROM steps WHERE instance_id = ? AND item_index = -1 AND position = ?`, p.ID, x.position).Scan(&id); err != nil {
			return err
		}
		var err error
		if len(st.Children) > 0 {
			change := storage.StepChange{Name: p.Steps[x.position].Name, Status: storage.StepRunning, Input: st.Input, Items: st.Items, Children: st.Children}
			err = t.startChildren(p.ID, p.Depth, id, change, x.runAfter)
		} else {
			err = t.expand(id, st.Items, x.runAfter)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// expansion is a forEach step a creation's plan expanded at once, or a
// workflow step it started.
type expansion struct {
	n        *storage.NewInstance
	position int
	runAfter int64
}

// nullIfEmpty stores an absent text as NULL, which costs a reader nothing
// to scan.
func nullIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// checkCallerFile refuses a caller's transaction on another database file
// than the store's: the instance would commit where none of the engine's
// workers look (another file with dagrun's tables takes it without an
// error). An in-memory store has no file to compare.
func (s *Store) checkCallerFile(ctx context.Context, tx *sql.Tx) error {
	if s.file == nil {
		return nil
	}
	var file string
	if err := tx.QueryRowContext(ctx, `SELECT file FROM pragma_database_list WHERE name = 'main'`).Scan(&file); err != nil {
		return s.fail("create instances", err)
	}
	if fi, err := os.Stat(file); file == "" || err != nil || !os.SameFile(fi, s.file) {
		return fmt.Errorf("sqlite: create instances: the caller's transaction is on database %q, not on the store's %q: begin it on the pool the store was built on (sqlite.New)", file, s.name)
	}
	return nil
}
