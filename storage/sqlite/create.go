package sqlite

import (
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
		results = make([]storage.CreateResult, len(params))
		for i := range params {
			r, err := t.create(&params[i], plan)
			if err != nil {
				return err
			}
			results[i] = r
		}
		return nil
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

func (t *txn) create(p *storage.CreateParams, plan storage.PlanFunc) (storage.CreateResult, error) {
	if p.Key != "" {
		var id string
		err := t.queryRow(`SELECT id FROM instances WHERE workflow = ? AND idem_key = ?`, p.Workflow, p.Key).Scan(&id)
		if err == nil {
			return storage.CreateResult{ID: id, Existed: true}, nil
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return storage.CreateResult{}, err
		}
	}
	// The first snapshot of a hash wins: the same hash is the same source.
	if _, err := t.exec(`INSERT INTO definitions (hash, workflow, source) VALUES (?, ?, ?) ON CONFLICT (hash) DO NOTHING`,
		p.DefinitionHash, p.Workflow, p.Definition); err != nil {
		return storage.CreateResult{}, err
	}
	now := us(t.now)
	runAfter := max(now, us(p.RunAfter))
	var key any
	if p.Key != "" {
		key = p.Key
	}
	if _, err := t.exec(`INSERT INTO instances (id, workflow, definition_hash, status, input, idem_key, priority, run_after, created_at)
		VALUES (?, ?, ?, 'pending', ?, ?, ?, ?, ?)`,
		p.ID, p.Workflow, p.DefinitionHash, jsonArg(p.Input), key, p.Priority, runAfter, now); err != nil {
		return storage.CreateResult{}, fmt.Errorf("instance %s: %w", p.ID, err)
	}
	t.event(p.ID, "", storage.EventInstanceCreated, 0, "")

	// The state the plan sees is built here rather than read back.
	l := &loaded{runAfter: runAfter, ids: make([]int64, len(p.Steps))}
	l.state = storage.InstanceState{
		ID:             p.ID,
		Workflow:       p.Workflow,
		DefinitionHash: p.DefinitionHash,
		Status:         storage.InstancePending,
		Input:          p.Input,
		Steps:          make([]storage.StepState, len(p.Steps)),
	}
	l.state.LoadDefinition = t.definition(p.DefinitionHash)
	for i, st := range p.Steps {
		deps := st.DependsOn
		if deps == nil {
			deps = []string{}
		}
		dj, err := json.Marshal(deps)
		if err != nil {
			return storage.CreateResult{}, err
		}
		queue := st.Queue
		if queue == "" {
			queue = "default"
		}
		err = t.queryRow(`INSERT INTO steps (instance_id, position, name, handler, queue, workflow, priority, depends_on, status,
				max_attempts, backoff_us, max_backoff_us, timeout_us)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'blocked', ?, ?, ?, ?) RETURNING id`,
			p.ID, i, st.Name, st.Handler, queue, p.Workflow, p.Priority, string(dj),
			max(st.Retry.MaxAttempts, 1), st.Retry.Backoff.Microseconds(), st.Retry.MaxBackoff.Microseconds(), st.Timeout.Microseconds(),
		).Scan(&l.ids[i])
		if err != nil {
			return storage.CreateResult{}, err
		}
		l.state.Steps[i] = storage.StepState{Name: st.Name, DependsOn: st.DependsOn, Status: storage.StepBlocked}
	}
	pl, err := plan(&l.state)
	if err != nil {
		return storage.CreateResult{}, fmt.Errorf("plan instance %s: %w", p.ID, err)
	}
	if err := t.apply(l, pl); err != nil {
		return storage.CreateResult{}, err
	}
	return storage.CreateResult{ID: p.ID}, nil
}
