package postgres

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dagrun/dagrun/storage"
)

// createSQL inserts definitions, instances, their steps (all blocked) and
// the instance.created events in one statement: steps and events join the
// instances the INSERT actually returned, so an instance skipped for its
// idempotency key gets nothing. Foreign keys are checked at the end of the
// statement, after all the CTEs ran. depends_on travels as one JSON array
// per step, since unnest cannot take an array of arrays.
const createSQL = `
WITH d AS (
	INSERT INTO {s}definitions (hash, workflow, source)
	SELECT * FROM unnest($2::text[], $3::text[], $4::bytea[])
	ON CONFLICT (hash) DO NOTHING
),
ins AS (
	INSERT INTO {s}instances (id, workflow, definition_hash, status, input, idempotency_key, priority, run_after, created_at)
	SELECT r.id, r.workflow, r.hash, 'pending', r.input, r.key, r.priority, greatest($1::timestamptz, r.run_after), $1::timestamptz
	FROM unnest($5::text[], $6::text[], $7::text[], $8::json[], $9::text[], $10::int[], $11::timestamptz[])
		WITH ORDINALITY AS r(id, workflow, hash, input, key, priority, run_after, ord)
	ORDER BY r.ord
	ON CONFLICT (workflow, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
	RETURNING id, workflow, priority
),
st AS (
	INSERT INTO {s}steps (instance_id, position, name, handler, queue, workflow, depends_on, status,
		max_attempts, backoff_us, max_backoff_us, timeout_us, priority)
	SELECT x.instance_id, x.position, x.name, x.handler, x.queue, ins.workflow,
		ARRAY(SELECT json_array_elements_text(x.depends_on)), 'blocked',
		x.max_attempts, x.backoff_us, x.max_backoff_us, x.timeout_us, ins.priority
	FROM unnest($12::text[], $13::int[], $14::text[], $15::text[], $16::text[], $17::json[],
			$18::int[], $19::bigint[], $20::bigint[], $21::bigint[])
		AS x(instance_id, position, name, handler, queue, depends_on, max_attempts, backoff_us, max_backoff_us, timeout_us)
	JOIN ins ON ins.id = x.instance_id
	ORDER BY x.instance_id, x.position
),
ev AS (
	INSERT INTO {s}events (instance_id, type, at)
	SELECT ins.id, 'instance.created', $1::timestamptz FROM ins ORDER BY ins.id
)
SELECT id FROM ins`

// existingSQL finds the instances that own idempotency keys.
const existingSQL = `
SELECT i.id, i.workflow, i.idempotency_key
FROM {s}instances i JOIN unnest($1::text[], $2::text[]) AS k(workflow, key)
	ON i.workflow = k.workflow AND i.idempotency_key = k.key`

// CreateInstances implements storage.Store. All instances go in with one
// multi-row statement; tx, when non-nil, must be a pgx.Tx (a *pgxpool.Tx
// is one), and the store writes inside a savepoint of it.
func (s *Store) CreateInstances(ctx context.Context, tx any, params []storage.CreateParams, plan storage.PlanFunc) ([]storage.CreateResult, error) {
	if plan == nil {
		return nil, errors.New("postgres: create instances: nil PlanFunc")
	}
	if err := validateCreate(params); err != nil {
		return nil, err
	}
	if len(params) == 0 {
		return []storage.CreateResult{}, nil
	}
	var results []storage.CreateResult
	fn := func(tx pgx.Tx, st *txState) error {
		var err error
		results, err = s.create(ctx, tx, st, s.now(), params, plan)
		return err
	}
	var err error
	if tx == nil {
		err = s.inTx(ctx, fn)
	} else {
		err = s.inCallerTx(ctx, tx, fn)
	}
	if err != nil {
		return nil, err
	}
	return results, nil
}

func validateCreate(params []storage.CreateParams) error {
	for i, p := range params {
		if p.ID == "" || p.Workflow == "" || p.DefinitionHash == "" {
			return fmt.Errorf("postgres: CreateParams[%d]: ID, Workflow and DefinitionHash are required", i)
		}
		seen := make(map[string]bool, len(p.Steps))
		for _, sp := range p.Steps {
			if sp.Name == "" || seen[sp.Name] {
				return fmt.Errorf("postgres: CreateParams[%d]: step names must be non-empty and unique, got %q", i, sp.Name)
			}
			seen[sp.Name] = true
		}
	}
	return nil
}

func (s *Store) create(ctx context.Context, tx pgx.Tx, st *txState, now time.Time, params []storage.CreateParams, plan storage.PlanFunc) ([]storage.CreateResult, error) {
	var (
		defHashes, defWorkflows []string
		defSources              [][]byte
		seenDef                 = make(map[string]bool)

		ids, workflows, hashes []string
		keys                   []*string
		inputs                 []json.RawMessage
		priorities             []int32
		runAfters              []*time.Time

		stInst, stNames, stHandlers, stQueues []string
		stPos, stMax                          []int32
		stDeps                                []json.RawMessage
		stBackoff, stMaxBackoff, stTimeout    []int64
	)
	for _, p := range params {
		if !seenDef[p.DefinitionHash] {
			seenDef[p.DefinitionHash] = true
			defHashes = append(defHashes, p.DefinitionHash)
			defWorkflows = append(defWorkflows, p.Workflow)
			src := p.Definition
			if src == nil {
				src = []byte{}
			}
			defSources = append(defSources, src)
		}
		ids = append(ids, p.ID)
		workflows = append(workflows, p.Workflow)
		hashes = append(hashes, p.DefinitionHash)
		inputs = append(inputs, jsonOrNil(p.Input))
		if p.Key != "" {
			key := p.Key
			keys = append(keys, &key)
		} else {
			keys = append(keys, nil)
		}
		priorities = append(priorities, int32(p.Priority))
		if p.RunAfter.IsZero() {
			runAfters = append(runAfters, nil)
		} else {
			runAfter := p.RunAfter
			runAfters = append(runAfters, &runAfter)
		}
		for i, sp := range p.Steps {
			dependsOn := sp.DependsOn
			if dependsOn == nil {
				dependsOn = []string{}
			}
			deps, err := json.Marshal(dependsOn)
			if err != nil {
				return nil, err
			}
			stInst = append(stInst, p.ID)
			stPos = append(stPos, int32(i))
			stNames = append(stNames, sp.Name)
			stHandlers = append(stHandlers, sp.Handler)
			stQueues = append(stQueues, queueOf(sp))
			stDeps = append(stDeps, deps)
			stMax = append(stMax, int32(max(1, sp.Retry.MaxAttempts)))
			stBackoff = append(stBackoff, sp.Retry.Backoff.Microseconds())
			stMaxBackoff = append(stMaxBackoff, sp.Retry.MaxBackoff.Microseconds())
			stTimeout = append(stTimeout, sp.Timeout.Microseconds())
		}
	}

	rows, err := tx.Query(ctx, s.q(createSQL), now,
		defHashes, defWorkflows, defSources,
		ids, workflows, hashes, inputs, keys, priorities, runAfters,
		stInst, stPos, stNames, stHandlers, stQueues, stDeps, stMax, stBackoff, stMaxBackoff, stTimeout)
	if err != nil {
		return nil, err
	}
	inserted, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "23505" && pe.ConstraintName == "instances_pkey" {
			return nil, fmt.Errorf("%w: an instance with this ID already exists (%s)", storage.ErrConflict, pe.Detail)
		}
		return nil, err
	}
	created := make(map[string]bool, len(inserted))
	for _, id := range inserted {
		created[id] = true
	}

	// Params not inserted lost to an idempotency key: an earlier instance,
	// committed or made by an earlier params of this same call.
	results := make([]storage.CreateResult, len(params))
	var lookW, lookK []string
	for i, p := range params {
		if created[p.ID] {
			results[i] = storage.CreateResult{ID: p.ID}
			delete(created, p.ID) // a repeated ID is created once
			continue
		}
		if p.Key == "" {
			return nil, fmt.Errorf("%w: instance %s was not created", storage.ErrConflict, p.ID)
		}
		lookW, lookK = append(lookW, p.Workflow), append(lookK, p.Key)
	}
	if len(lookW) > 0 {
		rows, err := tx.Query(ctx, s.q(existingSQL), lookW, lookK)
		if err != nil {
			return nil, err
		}
		owner := make(map[[2]string]string)
		var id, w, k string
		if _, err := pgx.ForEachRow(rows, []any{&id, &w, &k}, func() error {
			owner[[2]string{w, k}] = id
			return nil
		}); err != nil {
			return nil, err
		}
		for i, p := range params {
			if results[i].ID != "" {
				continue
			}
			id, ok := owner[[2]string{p.Workflow, p.Key}]
			if !ok {
				return nil, fmt.Errorf("postgres: instance with key %q of %s neither created nor found", p.Key, p.Workflow)
			}
			results[i] = storage.CreateResult{ID: id, Existed: true}
		}
	}

	// The state of a new instance is known without reading it back.
	var ls []*loaded
	for i, p := range params {
		if results[i].Existed || results[i].ID != p.ID {
			continue
		}
		l := &loaded{
			state: storage.InstanceState{
				ID:             p.ID,
				Workflow:       p.Workflow,
				DefinitionHash: p.DefinitionHash,
				Status:         storage.InstancePending,
				Input:          jsonOrNil(p.Input),
				Steps:          make([]storage.StepState, len(p.Steps)),
				// The first snapshot of a hash wins: read what is stored.
				LoadDefinition: s.definitionLoader(ctx, tx, p.DefinitionHash),
			},
			queues: make([]string, len(p.Steps)),
		}
		for j, sp := range p.Steps {
			l.state.Steps[j] = storage.StepState{Name: sp.Name, DependsOn: sp.DependsOn, Status: storage.StepBlocked}
			l.queues[j] = queueOf(sp)
		}
		ls = append(ls, l)
	}
	if err := s.planAndApply(st, now, ls, plan); err != nil {
		return nil, err
	}
	return results, nil
}

// queueOf is a step's queue; "default" when unset.
func queueOf(sp storage.StepSpec) string { return cmp.Or(sp.Queue, "default") }
