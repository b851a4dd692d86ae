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

// newStep is one step row to insert, in its initial state.
type newStep struct {
	instanceID string
	position   int
	spec       *storage.StepSpec
	dependsOn  string
	status     storage.StepStatus
	input      json.RawMessage
	errText    string
	runAfter   int64
	readyAt    any
	finishedAt any
}

// newInstance is one instance row to insert.
type newInstance struct {
	p          *storage.CreateParams
	status     storage.InstanceStatus
	output     json.RawMessage
	errText    string
	runAfter   int64
	finishedAt any
}

// createMany creates the instances of one call with a handful of
// set-based statements whatever their number: the plan runs on the state
// built in memory (every step blocked), so each step row is inserted
// directly in its initial state instead of being inserted and updated.
func (t *txn) createMany(params []storage.CreateParams, plan storage.PlanFunc) ([]storage.CreateResult, error) {
	results := make([]storage.CreateResult, len(params))
	now := us(t.now)
	keys := map[[2]string]string{} // (workflow, key) -> ID created in this call
	definitions := map[string]*storage.CreateParams{}
	var (
		instances []newInstance
		steps     []newStep
	)
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
		inst, rows, err := t.initialState(p, plan, now)
		if err != nil {
			return nil, err
		}
		instances = append(instances, inst)
		steps = append(steps, rows...)
		results[i] = storage.CreateResult{ID: p.ID}
	}
	for hash, p := range definitions {
		// The first snapshot of a hash wins: the same hash is the same source.
		if _, err := t.exec(`INSERT INTO definitions (hash, workflow, source) VALUES (?, ?, ?) ON CONFLICT (hash) DO NOTHING`,
			hash, p.Workflow, p.Definition); err != nil {
			return nil, err
		}
	}
	if err := t.insertInstances(instances, now); err != nil {
		return nil, err
	}
	if err := t.insertSteps(steps); err != nil {
		return nil, err
	}
	return results, nil
}

// initialState plans a new instance in memory and returns its rows.
func (t *txn) initialState(p *storage.CreateParams, plan storage.PlanFunc, now int64) (newInstance, []newStep, error) {
	runAfter := max(now, us(p.RunAfter))
	inst := newInstance{p: p, status: storage.InstancePending, runAfter: runAfter}
	rows := make([]newStep, len(p.Steps))
	state := storage.InstanceState{
		ID:             p.ID,
		Workflow:       p.Workflow,
		DefinitionHash: p.DefinitionHash,
		Status:         storage.InstancePending,
		Input:          p.Input,
		Steps:          make([]storage.StepState, len(p.Steps)),
	}
	// A definition stored by this very call is not in the table yet.
	state.LoadDefinition = func() ([]byte, error) {
		if len(p.Definition) > 0 {
			return p.Definition, nil
		}
		return t.definition(p.DefinitionHash)()
	}
	index := make(map[string]int, len(p.Steps))
	for i := range p.Steps {
		st := &p.Steps[i]
		deps := "[]"
		if len(st.DependsOn) > 0 {
			b, err := json.Marshal(st.DependsOn)
			if err != nil {
				return inst, nil, err
			}
			deps = string(b)
		}
		rows[i] = newStep{instanceID: p.ID, position: i, spec: st, dependsOn: deps, status: storage.StepBlocked}
		state.Steps[i] = storage.StepState{Name: st.Name, DependsOn: st.DependsOn, Status: storage.StepBlocked}
		index[st.Name] = i
	}
	t.event(p.ID, "", storage.EventInstanceCreated, 0, "")
	pl, err := plan(&state)
	if err != nil {
		return inst, nil, fmt.Errorf("plan instance %s: %w", p.ID, err)
	}
	if pl == nil {
		return inst, rows, nil
	}
	for _, c := range pl.Steps {
		i, ok := index[c.Name]
		if !ok {
			return inst, nil, fmt.Errorf("plan for instance %s names unknown step %q", p.ID, c.Name)
		}
		r := &rows[i]
		if r.status != storage.StepBlocked {
			return inst, nil, fmt.Errorf("plan for instance %s moves step %q to %s, but it is %s, not blocked", p.ID, c.Name, c.Status, r.status)
		}
		switch c.Status {
		case storage.StepPending:
			r.input, r.runAfter, r.readyAt = c.Input, runAfter, now
			t.event(p.ID, c.Name, storage.EventStepReady, 0, "")
		case storage.StepSkipped:
			r.input, r.finishedAt = c.Input, now
			t.event(p.ID, c.Name, storage.EventStepSkipped, 0, "")
		case storage.StepFailed:
			r.errText, r.finishedAt = c.Error, now
			t.event(p.ID, c.Name, storage.EventStepFailed, 0, c.Error)
		default:
			return inst, nil, fmt.Errorf("plan for instance %s moves step %q to %q: only pending, skipped or failed are allowed", p.ID, c.Name, c.Status)
		}
		r.status = c.Status
	}
	if ic := pl.Instance; ic != nil {
		if !ic.Status.Finished() {
			return inst, nil, fmt.Errorf("plan for instance %s sets status %q: only completed, failed or cancelled are allowed", p.ID, ic.Status)
		}
		inst.status, inst.output, inst.errText, inst.finishedAt = ic.Status, ic.Output, ic.Error, now
		for i := range rows {
			if r := &rows[i]; r.status == storage.StepBlocked || r.status == storage.StepPending {
				r.status, r.finishedAt = storage.StepCancelled, now
				t.event(p.ID, r.spec.Name, storage.EventStepCancelled, 0, ic.Error)
			}
		}
		t.event(p.ID, "", instanceEvent[ic.Status], 0, ic.Error)
	}
	return inst, rows, nil
}

// insertInstances inserts instance rows with one statement; the rows travel
// as one JSON array so the statement text stays constant and prepared.
func (t *txn) insertInstances(instances []newInstance, now int64) error {
	if len(instances) == 0 {
		return nil
	}
	rows := make([][]any, len(instances))
	for i, in := range instances {
		var key any
		if in.p.Key != "" {
			key = in.p.Key
		}
		rows[i] = []any{in.p.ID, in.p.Workflow, in.p.DefinitionHash, string(in.status), jsonArg(in.p.Input), key,
			in.p.Priority, in.runAfter, jsonArg(in.output), in.errText, in.finishedAt}
	}
	b, err := json.Marshal(rows)
	if err != nil {
		return err
	}
	_, err = t.exec(`INSERT INTO instances (id, workflow, definition_hash, status, input, idem_key, priority, run_after,
			created_at, output, error, finished_at)
		SELECT r.value->>0, r.value->>1, r.value->>2, r.value->>3, r.value->>4, r.value->>5, r.value->>6, r.value->>7,
			?1, r.value->>8, r.value->>9, r.value->>10
		FROM json_each(?2) AS r`, now, string(b))
	if err != nil {
		return fmt.Errorf("insert instances: %w", err)
	}
	return nil
}

// insertSteps inserts step rows with one statement.
func (t *txn) insertSteps(steps []newStep) error {
	if len(steps) == 0 {
		return nil
	}
	rows := make([][]any, len(steps))
	for i, s := range steps {
		queue := s.spec.Queue
		if queue == "" {
			queue = "default"
		}
		rows[i] = []any{s.instanceID, s.position, s.spec.Name, s.spec.Handler, queue, s.dependsOn, string(s.status),
			max(s.spec.Retry.MaxAttempts, 1), s.spec.Retry.Backoff.Microseconds(), s.spec.Retry.MaxBackoff.Microseconds(),
			s.spec.Timeout.Microseconds(), jsonArg(s.input), s.errText, s.runAfter, s.readyAt, s.finishedAt}
	}
	b, err := json.Marshal(rows)
	if err != nil {
		return err
	}
	_, err = t.exec(`INSERT INTO steps (instance_id, position, name, handler, queue, workflow, priority, depends_on, status,
			max_attempts, backoff_us, max_backoff_us, timeout_us, input, error, run_after, ready_at, finished_at)
		SELECT r.value->>0, r.value->>1, r.value->>2, r.value->>3, r.value->>4, i.workflow, i.priority, r.value->>5, r.value->>6,
			r.value->>7, r.value->>8, r.value->>9, r.value->>10, r.value->>11, r.value->>12, r.value->>13, r.value->>14, r.value->>15
		FROM json_each(?1) AS r JOIN instances i ON i.id = r.value->>0`, string(b))
	if err != nil {
		return fmt.Errorf("insert steps: %w", err)
	}
	return nil
}
