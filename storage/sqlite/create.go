package sqlite

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/dagrun/dagrun/storage"
)

// CreateInstances implements storage.Store. tx is nil or the caller's
// *sql.Tx, begun on a pool opened with DSN (so it is BEGIN IMMEDIATE).
func (s *Store) CreateInstances(ctx context.Context, tx any, params []storage.CreateParams, plan storage.PlanFunc) ([]storage.CreateResult, error) {
	if plan == nil {
		return nil, errors.New("sqlite: create instances: nil PlanFunc")
	}
	for i := range params {
		if err := validateCreate(&params[i]); err != nil {
			return nil, fmt.Errorf("sqlite: create instances: %w", err)
		}
	}
	var results []storage.CreateResult
	run := func(t *txn) error {
		var err error
		results, err = t.createMany(params, plan)
		return err
	}
	if tx == nil {
		if err := s.write(ctx, "create instances", run); err != nil {
			return nil, err
		}
	} else {
		stx, ok := tx.(*sql.Tx)
		if !ok || stx == nil {
			return nil, fmt.Errorf("sqlite: create instances: caller transaction is %T, want a non-nil *sql.Tx", tx)
		}
		t := &txn{ctx: ctx, tx: stx, now: s.now()}
		if err := run(t); err != nil {
			return nil, s.fail("create instances", err)
		}
		if err := t.flushEvents(); err != nil {
			return nil, s.fail("create instances", err)
		}
		// The caller has not committed yet; a worker woken now may find
		// nothing, and then its polling finds the steps after the commit.
	}
	s.notify()
	return results, nil
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

// createMany creates the instances of one call with a handful of
// multi-row statements whatever their number: each instance is planned in
// memory (every step blocked, then the plan applied), so each row is
// inserted once in its initial state instead of being inserted and updated.
func (t *txn) createMany(params []storage.CreateParams, plan storage.PlanFunc) ([]storage.CreateResult, error) {
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
		n, err := storage.PlanNew(p, plan, t.newDefinition(p))
		if err != nil {
			return nil, err
		}
		instances = append(instances, n)
		results[i] = storage.CreateResult{ID: p.ID}
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
	return results, nil
}

// newDefinition loads the definition of a new instance: one stored by
// this very call is not in the table yet.
func (t *txn) newDefinition(p *storage.CreateParams) func() ([]byte, error) {
	return func() ([]byte, error) {
		if len(p.Definition) > 0 {
			return p.Definition, nil
		}
		return t.definition(p.DefinitionHash)()
	}
}

const (
	insertInstancesSQL = `INSERT INTO instances (id, workflow, definition_hash, status, input, idem_key, priority,
		run_after, created_at, output, error, finished_at) VALUES `
	insertStepsSQL = `INSERT INTO steps (instance_id, position, name, handler, queue, workflow, priority, depends_on,
		status, max_attempts, backoff_us, max_backoff_us, timeout_us, input, error, run_after, ready_at, finished_at) VALUES `
)

// insertInstances inserts the instance rows, their step rows and their
// creation events.
func (t *txn) insertInstances(instances []*storage.NewInstance) error {
	if len(instances) == 0 {
		return nil
	}
	now := us(t.now)
	rows := make([]any, 0, 12*len(instances))
	var steps []any
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
		rows = append(rows, p.ID, p.Workflow, p.DefinitionHash, string(n.Status), jsonArg(p.Input), key, p.Priority,
			runAfter, now, jsonArg(n.Output), n.Error, finishedAt)
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
			var stepRunAfter, readyAt, finishedAt any = 0, nil, nil
			if st.Status == storage.StepPending {
				stepRunAfter, readyAt = runAfter, now
			} else if st.Finished() {
				finishedAt = now
			}
			steps = append(steps, p.ID, i, spec.Name, spec.Handler, cmp.Or(spec.Queue, "default"), p.Workflow, p.Priority, deps,
				string(st.Status), max(spec.Retry.MaxAttempts, 1), spec.Retry.Backoff.Microseconds(), spec.Retry.MaxBackoff.Microseconds(),
				spec.Timeout.Microseconds(), jsonArg(st.Input), st.Error, stepRunAfter, readyAt, finishedAt)
		}
		for _, e := range n.Events {
			t.event(p.ID, e.Step, e.Type, 0, e.Message)
		}
	}
	if err := t.insertRows(insertInstancesSQL, 12, rows); err != nil {
		return fmt.Errorf("insert instances: %w", err)
	}
	if err := t.insertRows(insertStepsSQL, 18, steps); err != nil {
		return fmt.Errorf("insert steps: %w", err)
	}
	return nil
}
