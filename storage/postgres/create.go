package postgres

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dagrun/dagrun/storage"
)

// createSQL inserts definitions, instances, their steps and their creation
// events in one statement, every row in its initial state (the plans ran
// in memory first). Steps and events join the instances the INSERT
// actually returned, so an instance skipped for its idempotency key (a
// concurrent start won the key) gets nothing. Foreign keys are checked at
// the end of the statement, after all the CTEs ran. depends_on travels as
// one array literal per step, since unnest cannot take an array of arrays.
// run_after is the time the caller asked for, NULL for none; the store
// makes it no earlier than {now}, which greatest does as it ignores NULL.
// claimingCreateSQL is createSQL that also claims the steps marked in $60
// as it inserts them ("Claims at insert", below), with the lease $61 and the
// worker $62; a start that claims nothing so runs createSQL, whose rows
// pay nothing for it.
var (
	createSQL         = createStatement(false)
	claimingCreateSQL = createStatement(true)
)

func createStatement(claiming bool) string {
	var (
		claims      string
		started     = `(SELECT r.status AS status)`
		claimed     = `(SELECT false AS claimed)`
		claimCols   string
		claimValues string
		claimEvents string
	)
	if claiming {
		claims = `
cs AS MATERIALIZED (
	-- The steps marked, but for those of a queue under a limit, which
	-- take their slot as a claim of theirs is promoted.
	SELECT c.instance_id, c.position, c.name, c.ord
	FROM unnest($15::text[], $16::int[], $17::text[], $19::text[], $60::bool[])
		WITH ORDINALITY AS c(instance_id, position, name, queue, claim, ord)
	WHERE c.claim AND NOT EXISTS (SELECT 1 FROM {s}queue_limits q WHERE q.queue = c.queue)
),`
		// An instance a step of which is claimed starts with the claim.
		started = `(SELECT CASE WHEN EXISTS (SELECT 1 FROM cs WHERE cs.instance_id = r.id)
			THEN 'running' ELSE r.status END AS status)`
		claimed = `(SELECT EXISTS (SELECT 1 FROM cs WHERE cs.instance_id = x.instance_id AND cs.position = x.position) AS claimed)`
		claimCols = `,
		attempts, fence, first_started_at, lease_until, worker_id`
		// What a claim writes (claimArgs.claimSet), but for started_at,
		// which the statement writes for a waiting step too.
		claimValues = `,
		CASE WHEN c.claimed THEN 1 ELSE 0 END, CASE WHEN c.claimed THEN 1 ELSE 0 END,
		CASE WHEN c.claimed THEN {now} END,
		CASE WHEN c.claimed THEN {clock} + $61::bigint * interval '1 microsecond' END,
		CASE WHEN c.claimed THEN $62::text ELSE '' END`
		// A claim's events, after the creation's.
		claimEvents = `
		UNION ALL
		SELECT cs.instance_id, cs.name, 'step.started', 1, $62::text, 1, cs.ord FROM cs
		UNION ALL
		SELECT cs.instance_id, '', 'instance.started', 0, $62::text, 2, min(cs.ord) FROM cs GROUP BY cs.instance_id`
	}
	return `
WITH d AS (
	INSERT INTO {s}definitions (hash, workflow, source)
	SELECT * FROM unnest($2::text[], $3::text[], $4::bytea[])
	ON CONFLICT (hash) DO NOTHING
),` + claims + `
ins AS (
	INSERT INTO {s}instances (id, workflow, definition_hash, status, input, output, error, idempotency_key, priority,
		run_after, created_at, started_at, finished_at, timeout_us, failing, failed_step, deadline,
		concurrency_key, concurrency_limit, held, parked, traceparent, trace_caller, parent_id, parent_step, parent_item, depth, deferred)
	SELECT r.id, r.workflow, r.hash, k.status, r.input, r.output, r.error, r.key, r.priority,
		greatest({now}, r.run_after), {now},
		CASE WHEN k.status IN ('running', 'completed', 'failed') THEN {now} END,
		CASE WHEN k.status IN ('completed', 'failed', 'cancelled') THEN {now} END,
		r.timeout_us, r.failing, r.failed_step,
		-- A workflow timeout counts from the start, unless the instance
		-- failed at once and only runs its onFailure steps.
		CASE WHEN k.status = 'running' AND r.timeout_us > 0 AND NOT r.failing
			THEN {now} + r.timeout_us * interval '1 microsecond' END,
		r.ckey, r.climit, r.held, r.parked, r.traceparent, r.trace_caller, r.parent_id, r.parent_step, r.parent_item, r.depth, r.deferred
	FROM unnest($5::text[], $6::text[], $7::text[], $8::text[], $9::json[], $10::json[], $11::text[], $12::text[],
			$13::int[], $14::timestamptz[], $41::bigint[], $42::bool[], $43::text[], $44::text[], $45::int[], $46::bool[],
			$59::bool[], $51::text[], $52::text[], $53::text[], $54::text[], $55::int[], $56::int[], $58::bool[])
		WITH ORDINALITY AS r(id, workflow, hash, status, input, output, error, key, priority, run_after,
			timeout_us, failing, failed_step, ckey, climit, held, parked, traceparent, trace_caller,
			parent_id, parent_step, parent_item, depth, deferred, ord)
		CROSS JOIN LATERAL ` + started + ` k
	ORDER BY r.ord
	ON CONFLICT (workflow, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
	RETURNING id
),
st AS (
	INSERT INTO {s}steps (instance_id, position, name, handler, queue, workflow, depends_on, status,
		max_attempts, backoff_us, max_backoff_us, timeout_us, priority, input, error, run_after, ready_at, finished_at,
		output, for_each, item_concurrency, continue_on_error, wait_signal, wait_timeout_us, deadline, on_failure,
		concurrency_key, concurrency_limit, held_by_instance, queue_limited, child_workflow, started_at` + claimCols + `)
	SELECT x.instance_id, x.position, x.name, x.handler, x.queue, x.workflow, x.depends_on::text[],
		CASE WHEN c.claimed THEN 'running' ELSE x.status END,
		x.max_attempts, x.backoff_us, x.max_backoff_us, x.timeout_us, x.priority, x.input, x.error,
		CASE WHEN x.status = 'pending' THEN greatest({now}, x.run_after) END,
		CASE WHEN x.status IN ('pending', 'waiting') THEN {now} END,
		CASE WHEN x.status NOT IN ('pending', 'blocked', 'waiting') THEN {now} END,
		x.output, x.for_each, x.item_concurrency, x.continue_on_error, x.wait_signal, x.wait_timeout_us,
		CASE WHEN x.status = 'waiting' AND x.wait_timeout_us > 0
			THEN greatest({now}, x.run_after) + x.wait_timeout_us * interval '1 microsecond' END,
		x.on_failure,
		x.ckey, x.climit, x.held,
		NOT x.for_each AND x.child_workflow = '' AND EXISTS (SELECT 1 FROM {s}queue_limits q WHERE q.queue = x.queue),
		x.child_workflow,
		-- A step claimed as it is inserted starts now, and so does one that
		-- waits for a signal from the start.
		CASE WHEN c.claimed OR x.status = 'waiting' THEN {now} END` + claimValues + `
	FROM unnest($15::text[], $16::int[], $17::text[], $18::text[], $19::text[], $20::text[], $21::text[], $22::text[],
			$23::int[], $24::bigint[], $25::bigint[], $26::bigint[], $27::int[], $28::json[], $29::text[], $30::timestamptz[],
			$35::json[], $36::bool[], $37::int[], $38::bool[], $39::text[], $40::bigint[], $47::bool[],
			$48::text[], $49::int[], $50::bool[], $57::text[])
		AS x(instance_id, position, name, handler, queue, workflow, depends_on, status,
			max_attempts, backoff_us, max_backoff_us, timeout_us, priority, input, error, run_after,
			output, for_each, item_concurrency, continue_on_error, wait_signal, wait_timeout_us, on_failure,
			ckey, climit, held, child_workflow)
	JOIN ins ON ins.id = x.instance_id
	CROSS JOIN LATERAL ` + claimed + ` c
	ORDER BY x.instance_id, x.position
),
ev AS (
	INSERT INTO {s}events (instance_id, step, type, attempt, message, at)
	SELECT e.instance_id, e.step, e.type, e.attempt, e.message, {now} FROM (
		SELECT e.instance_id, e.step, e.type, 0 AS attempt, e.message, 0 AS part, e.ord
		FROM unnest($31::text[], $32::text[], $33::text[], $34::text[]) WITH ORDINALITY AS e(instance_id, step, type, message, ord)` + claimEvents + `
	) e
	JOIN ins ON ins.id = e.instance_id
	ORDER BY e.part, e.ord
)
SELECT id FROM ins`
}

// definitionLockClass is the first key of the advisory locks that keep
// Prune from deleting a definition a start is about to use; the second is
// a hash of the definition's hash.
const definitionLockClass = 0x64656673 // "defs"

// lockDefinitionsSQL takes lock (pg_advisory_xact_lock_shared or
// pg_advisory_xact_lock) on each definition hash in $1, in hash order so
// that no two transactions wait for each other in a cycle. Without foreign
// keys (migration 2), a start that found a definition row, and has not
// committed its instances yet, would not stop a concurrent Prune from
// deleting that row: a start holds the shared lock until it commits, and
// Prune takes the exclusive one before it looks for instances still using
// a definition, so it sees the start's instances or the start sees the
// definition gone and inserts it again. Shared locks do not conflict, so
// concurrent starts of one workflow do not wait for each other, and
// advisory locks live in memory only.
var (
	lockDefinitionsShared    = lockDefinitionsSQL("pg_advisory_xact_lock_shared")
	lockDefinitionsExclusive = lockDefinitionsSQL("pg_advisory_xact_lock")
)

func lockDefinitionsSQL(lock string) string {
	return `SELECT ` + lock + `(` + strconv.Itoa(definitionLockClass) + `, hashtext(h))
	FROM (SELECT DISTINCT h FROM unnest($1::text[]) AS u(h) ORDER BY h) l`
}

// existingSQL finds the instances that own idempotency keys, each by its
// key (the LIMIT keeps the lookup from becoming a join that reads every
// keyed instance: see appendLogsSQL).
const existingSQL = `
SELECT i.id, i.workflow, i.idempotency_key
FROM unnest($1::text[], $2::text[]) AS k(workflow, key)
	CROSS JOIN LATERAL (SELECT id, workflow, idempotency_key FROM {s}instances
		WHERE workflow = k.workflow AND idempotency_key = k.key LIMIT 1) i`

// CreateInstances implements storage.Store. All instances go in with one
// multi-row statement; tx, when non-nil, must be a pgx.Tx (a *pgxpool.Tx
// is one), and the store writes inside a savepoint of it.
func (s *Store) CreateInstances(ctx context.Context, tx any, params []storage.CreateParams, plan storage.PlanFunc) ([]storage.CreateResult, error) {
	if err := checkCreate(params, plan); err != nil {
		return nil, err
	}
	if len(params) == 0 {
		return []storage.CreateResult{}, nil
	}
	var results []storage.CreateResult
	fn := func(tx pgx.Tx, st *txState) error {
		var err error
		results, err = s.create(ctx, tx, st, s.now(), params, plan, true)
		return err
	}
	var err error
	if tx == nil {
		err = s.inTx(ctx, fn)
	} else {
		err = s.inCallerTx(ctx, tx, fn)
	}
	if err != nil {
		return nil, s.fail("create instances", createError(err))
	}
	return results, nil
}

// CreateAndClaim implements storage.CreateClaimer: the claim goes on the
// transaction's tail, after the creating statement.
func (s *Store) CreateAndClaim(ctx context.Context, params []storage.CreateParams, plan storage.PlanFunc, p storage.ClaimParams) ([]storage.CreateResult, []storage.ClaimedStep, error) {
	if err := checkCreate(params, plan); err != nil {
		return nil, nil, err
	}
	if p.Lease <= 0 {
		return nil, nil, errors.New("postgres: create and claim: lease must be positive")
	}
	s.lookAhead(ctx, p)
	var (
		results []storage.CreateResult
		claimed []storage.ClaimedStep
		created []*storage.NewInstance
		ids     map[string][]int64
		txid    string
	)
	atInsert := false
	err := s.inTx(ctx, func(tx pgx.Tx, st *txState) error {
		now := s.now()
		if len(params) == 1 && (p.InstanceID == "" || p.InstanceID == params[0].ID) && s.settled(p) {
			st.insertClaim = &p
		}
		var err error
		if results, err = s.create(ctx, tx, st, now, params, plan, true); err != nil {
			return err
		}
		created, ids, txid = st.created, nil, ""
		if atInsert = len(st.insertClaimed) > 0; atInsert {
			s.queueInsertClaimed(st, p, now, &claimed, &ids, &txid)
			return nil
		}
		s.queueClaim(st, p, now, &claimed, nil, nil)
		s.queueCreatedSteps(st, created, &ids, &txid)
		return nil
	})
	if err != nil {
		return nil, nil, createError(err)
	}
	if atInsert {
		s.insertClaims.Add(1)
	}
	s.snapshots.put(deriveCreated(created, ids, claimed, txid, time.Now()))
	return results, claimed, nil
}

func checkCreate(params []storage.CreateParams, plan storage.PlanFunc) error {
	if plan == nil {
		return errors.New("postgres: create instances: nil PlanFunc")
	}
	return validateCreate(params)
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

// create inserts the instances of params, planned by plan. onTail lets it
// put its statement on the transaction's tail when nothing needs it sooner
// (the callers that create nothing else in the transaction).
func (s *Store) create(ctx context.Context, tx pgx.Tx, st *txState, now *time.Time, params []storage.CreateParams, plan storage.PlanFunc, onTail bool) ([]storage.CreateResult, error) {
	st.plan = plan
	results := make([]storage.CreateResult, len(params))
	owners, err := s.keyOwners(ctx, tx, params)
	if err != nil {
		return nil, err
	}
	var (
		rows        createRows
		planned     []*storage.NewInstance
		seenDef     = make(map[string]bool)
		createdKeys = make(map[[2]string]string) // (workflow, key) -> ID created by this call
	)
	for i := range params {
		p := &params[i]
		if p.Key != "" {
			k := [2]string{p.Workflow, p.Key}
			if id, ok := owners[k]; ok {
				results[i] = storage.CreateResult{ID: id, Existed: true}
				continue
			}
			if id, ok := createdKeys[k]; ok {
				results[i] = storage.CreateResult{ID: id, Existed: true}
				continue
			}
			createdKeys[k] = p.ID
		}
		if !seenDef[p.DefinitionHash] {
			seenDef[p.DefinitionHash] = true
			rows.definition(p)
		}
		n, err := storage.PlanNew(p, plan, s.definitionLoader(ctx, tx, p.DefinitionHash))
		if err != nil {
			return nil, err
		}
		planned = append(planned, n)
	}
	held, err := s.admit(ctx, tx, now, planned)
	if err != nil {
		return nil, err
	}
	if err := storage.StartAdmitted(planned, held, plan, func(hash string) func() ([]byte, error) {
		return s.definitionLoader(ctx, tx, hash)
	}); err != nil {
		return nil, err
	}
	for _, n := range planned {
		rows.instance(st, n, held[n.Params.ID])
	}
	st.created = planned
	if len(rows.ids) == 0 {
		return results, nil
	}

	// The definitions' shared locks go first, in the same round trip: see
	// lockDefinitionsSQL.
	var (
		b        = &pgx.Batch{}
		inserted []string
	)
	// When nothing has to be read back before the commit (no idempotency
	// key another start may have taken since keyOwners looked, no step
	// expanded or child finished at once), the statement goes on the
	// transaction's tail, with the claim of a CreateAndClaim and the
	// COMMIT: a start is then one round trip. An instance that exists
	// already fails the whole tail (see createError).
	deferred := onTail && owners == nil && len(rows.expansions) == 0 && len(rows.finishedChildren) == 0
	if deferred {
		b = &st.tail
	}
	b.Queue(lockDefinitionsShared, rows.defHashes)
	sql := createSQL
	if slices.Contains(rows.stClaims, true) {
		sql = claimingCreateSQL
	}
	insert := b.Queue(s.q(sql), now,
		rows.defHashes, rows.defWorkflows, rows.defSources,
		rows.ids, rows.workflows, rows.hashes, rows.statuses, rows.inputs, rows.outputs, rows.errors, rows.keys, rows.priorities, rows.runAfters,
		rows.stInst, rows.stPos, rows.stNames, rows.stHandlers, rows.stQueues, rows.stWorkflows, rows.stDeps, rows.stStatuses,
		rows.stMax, rows.stBackoff, rows.stMaxBackoff, rows.stTimeout, rows.stPriorities, rows.stInputs, rows.stErrors, rows.stRunAfters,
		rows.evInst, rows.evSteps, rows.evTypes, rows.evMessages,
		rows.stOutputs, rows.stForEach, rows.stCaps, rows.stContinue, rows.stSignals, rows.stWaitTimeouts,
		rows.timeouts, rows.failing, rows.failedSteps, rows.concurrencyKeys, rows.concurrencyLimits, rows.held,
		rows.stOnFailure, rows.stKeys, rows.stLimits, rows.stHeld, rows.traceParents, rows.traceCallers,
		rows.parentIDs, rows.parentSteps, rows.parentItems, rows.depths, rows.stChildWorkflows, rows.deferred, rows.parked)
	if sql == claimingCreateSQL {
		insert.Arguments = append(insert.Arguments, rows.stClaims, rows.claimLease, rows.claimWorker)
	}
	insert.Query(func(dbRows pgx.Rows) error {
		var err error
		inserted, err = pgx.CollectRows(dbRows, pgx.RowTo[string])
		return err
	})
	if deferred {
		for i, p := range params {
			results[i] = storage.CreateResult{ID: p.ID}
		}
		return results, nil
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return nil, createError(err)
	}
	created := make(map[string]bool, len(inserted))
	for _, id := range inserted {
		created[id] = true
	}
	// A step the plan expanded at once was inserted blocked: its items go
	// in now that it has a row (the expansion's event came with the
	// creation's).
	for _, x := range rows.expansions {
		if !created[x.instanceID] {
			continue
		}
		if len(x.children) > 0 {
			change := storage.StepChange{Name: x.name, Status: storage.StepRunning, Input: x.input, Items: x.items, Children: x.children}
			if err := s.queueStartChildren(st, now, x.instanceID, change, false); err != nil {
				return nil, err
			}
			continue
		}
		s.queueExpandAtCreation(st, now, x.instanceID, x.name, x.items)
	}
	// A child its plan finished at once settles its parent's step, once
	// the parent's row is written (see followUp).
	for _, n := range rows.finishedChildren {
		if created[n.Params.ID] {
			st.finished = append(st.finished, finishedInstance{id: n.Params.ID, status: n.Status, output: n.Output, error: n.Error, parent: n.Params.Parent})
		}
	}

	// A planned instance that was not inserted lost its idempotency key to
	// a start committed since keyOwners looked.
	var late []storage.CreateParams
	for i, p := range params {
		if results[i].ID != "" {
			continue
		}
		if created[p.ID] {
			results[i] = storage.CreateResult{ID: p.ID}
			delete(created, p.ID) // a repeated ID is created once
			continue
		}
		if p.Key == "" {
			return nil, fmt.Errorf("%w: instance %s was not created", storage.ErrConflict, p.ID)
		}
		late = append(late, p)
	}
	if len(late) > 0 {
		owners, err := s.keyOwners(ctx, tx, late)
		if err != nil {
			return nil, err
		}
		for i, p := range params {
			if results[i].ID != "" {
				continue
			}
			id, ok := owners[[2]string{p.Workflow, p.Key}]
			if !ok {
				return nil, fmt.Errorf("postgres: instance with key %q of %s neither created nor found", p.Key, p.Workflow)
			}
			results[i] = storage.CreateResult{ID: id, Existed: true}
		}
	}
	return results, nil
}

// createError names an instance ID taken already as storage.ErrConflict.
func createError(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "23505" && pe.ConstraintName == "instances_pkey" {
		return fmt.Errorf("%w: an instance with this ID already exists (%s)", storage.ErrConflict, pe.Detail)
	}
	return err
}

// keyOwners finds the instances that already own the idempotency keys of
// params, as (workflow, key) -> instance ID.
func (s *Store) keyOwners(ctx context.Context, tx pgx.Tx, params []storage.CreateParams) (map[[2]string]string, error) {
	var workflows, keys []string
	for _, p := range params {
		if p.Key != "" {
			workflows, keys = append(workflows, p.Workflow), append(keys, p.Key)
		}
	}
	if len(keys) == 0 {
		return nil, nil
	}
	rows, err := tx.Query(ctx, s.q(existingSQL), workflows, keys)
	if err != nil {
		return nil, err
	}
	owners := make(map[[2]string]string)
	var id, w, k string
	if _, err := pgx.ForEachRow(rows, []any{&id, &w, &k}, func() error {
		owners[[2]string{w, k}] = id
		return nil
	}); err != nil {
		return nil, err
	}
	return owners, nil
}

// createRows holds the rows of createSQL as parallel arrays for unnest.
type createRows struct {
	defHashes, defWorkflows []string
	defSources              [][]byte

	ids, workflows, hashes, statuses, errors []string
	inputs, outputs                          []json.RawMessage
	keys                                     []*string
	priorities                               []int32
	runAfters                                []*time.Time
	timeouts                                 []int64
	failing                                  []bool
	failedSteps                              []string
	traceParents, traceCallers               []*string

	stInst, stNames, stHandlers, stQueues, stWorkflows, stDeps, stStatuses, stErrors []string
	stPos, stMax, stPriorities                                                       []int32
	stBackoff, stMaxBackoff, stTimeout                                               []int64
	stInputs                                                                         []json.RawMessage
	stRunAfters                                                                      []*time.Time
	stOutputs                                                                        []json.RawMessage
	stForEach, stContinue                                                            []bool
	stCaps                                                                           []int32
	stSignals                                                                        []string
	stWaitTimeouts                                                                   []int64
	stOnFailure                                                                      []bool
	stChildWorkflows                                                                 []string
	expansions                                                                       []expansion

	parentIDs        []*string
	parentSteps      []string
	parentItems      []int32
	depths           []int32
	deferred         []bool
	finishedChildren []*storage.NewInstance

	evInst, evSteps, evTypes, evMessages []string

	// Concurrency limits: the instances' and the steps'.
	concurrencyKeys, stKeys     []*string
	concurrencyLimits, stLimits []int32
	held, parked, stHeld        []bool

	// The steps claimed as they are inserted, and that claim's lease in
	// microseconds and worker ("Claims at insert", below).
	stClaims    []bool
	claimLease  int64
	claimWorker string
}

func (r *createRows) definition(p *storage.CreateParams) {
	src := p.Definition
	if src == nil {
		src = []byte{}
	}
	r.defHashes = append(r.defHashes, p.DefinitionHash)
	r.defWorkflows = append(r.defWorkflows, p.Workflow)
	r.defSources = append(r.defSources, src)
}

func (r *createRows) instance(st *txState, n *storage.NewInstance, held bool) {
	p := n.Params
	var runAfter *time.Time
	if !p.RunAfter.IsZero() {
		runAfter = &p.RunAfter
	}
	var key *string
	if p.Key != "" {
		key = &p.Key
	}
	r.ids = append(r.ids, p.ID)
	r.workflows = append(r.workflows, p.Workflow)
	r.hashes = append(r.hashes, p.DefinitionHash)
	r.statuses = append(r.statuses, string(n.Status))
	r.inputs = append(r.inputs, jsonOrNil(p.Input))
	r.outputs = append(r.outputs, jsonOrNil(n.Output))
	r.errors = append(r.errors, n.Error)
	r.keys = append(r.keys, key)
	r.priorities = append(r.priorities, int32(p.Priority))
	r.runAfters = append(r.runAfters, runAfter)
	r.timeouts = append(r.timeouts, p.Timeout.Microseconds())
	r.failing = append(r.failing, n.Failing)
	r.failedSteps = append(r.failedSteps, n.FailedStep)
	var concurrencyKey *string
	if p.ConcurrencyLimit > 0 && p.ConcurrencyKey != "" {
		concurrencyKey = &p.ConcurrencyKey
	}
	r.concurrencyKeys = append(r.concurrencyKeys, concurrencyKey)
	r.concurrencyLimits = append(r.concurrencyLimits, int32(p.ConcurrencyLimit))
	r.held = append(r.held, held)
	r.parked = append(r.parked, n.Parked)
	r.traceParents = append(r.traceParents, nilIfEmpty(p.TraceParent))
	r.traceCallers = append(r.traceCallers, nilIfEmpty(p.TraceCaller))
	if p.Parent != nil {
		r.parentIDs = append(r.parentIDs, &p.Parent.InstanceID)
		r.parentSteps = append(r.parentSteps, p.Parent.Step)
		r.parentItems = append(r.parentItems, int32(p.Parent.Item))
		if n.Status.Finished() {
			r.finishedChildren = append(r.finishedChildren, n)
		}
	} else {
		r.parentIDs = append(r.parentIDs, nil)
		r.parentSteps = append(r.parentSteps, "")
		r.parentItems = append(r.parentItems, -1)
	}
	r.depths = append(r.depths, int32(p.Depth))
	r.deferred = append(r.deferred, n.Deferred)
	claim := st.insertClaim
	if claim != nil && !instanceClaimableAtInsert(n, held) {
		claim = nil
	}
	if claim != nil {
		r.claimLease, r.claimWorker = claim.Lease.Microseconds(), claim.WorkerID
	}
	for i, ns := range n.Steps {
		sp := &p.Steps[i]
		atInsert := claim != nil && len(st.insertClaimed) < max(claim.Limit, 1) && stepClaimableAtInsert(*sp, ns, *claim)
		r.stClaims = append(r.stClaims, atInsert)
		if atInsert {
			st.insertClaimed = append(st.insertClaimed, stepRef{p.ID, sp.Name})
		} else if ns.Status == storage.StepPending {
			// As a plan's: an eager claim on the tail that takes it
			// leaves no one to tell (see txState.claimedAllReady).
			st.readyByPlan(queueOf(*sp), p.ID, sp.Name)
		}
		r.stInst = append(r.stInst, p.ID)
		r.stPos = append(r.stPos, int32(i))
		r.stNames = append(r.stNames, sp.Name)
		r.stHandlers = append(r.stHandlers, sp.Handler)
		r.stQueues = append(r.stQueues, queueOf(*sp))
		r.stWorkflows = append(r.stWorkflows, p.Workflow)
		r.stDeps = append(r.stDeps, arrayLiteral(sp.DependsOn))
		status := ns.Status
		if status == storage.StepRunning {
			status = storage.StepBlocked
			r.expansions = append(r.expansions, expansion{p.ID, sp.Name, ns.Input, ns.Items, ns.Children})
			st.ready(queueOf(*sp))
		}
		if status == storage.StepWaiting && (sp.Wait != nil && sp.Wait.Timeout > 0 || p.Timeout > 0) {
			// Idle workers learn of the wait's deadline, or of the
			// workflow's: an instance that starts only waiting makes no
			// step ready, and another process's worker would otherwise
			// see the deadline only at its next poll.
			st.waiting(queueOf(*sp))
		}
		r.stStatuses = append(r.stStatuses, string(status))
		r.stOutputs = append(r.stOutputs, jsonOrNil(ns.Output))
		r.stForEach = append(r.stForEach, sp.ForEach)
		r.stContinue = append(r.stContinue, sp.ContinueOnError)
		r.stOnFailure = append(r.stOnFailure, sp.OnFailure)
		signal, waitTimeout := "", int64(0)
		if sp.Wait != nil {
			signal, waitTimeout = sp.Wait.Signal, sp.Wait.Timeout.Microseconds()
		}
		r.stSignals = append(r.stSignals, signal)
		r.stWaitTimeouts = append(r.stWaitTimeouts, waitTimeout)
		r.stChildWorkflows = append(r.stChildWorkflows, sp.Workflow)
		r.stCaps = append(r.stCaps, int32(sp.ItemConcurrency))
		r.stMax = append(r.stMax, int32(max(1, sp.Retry.MaxAttempts)))
		r.stBackoff = append(r.stBackoff, sp.Retry.Backoff.Microseconds())
		r.stMaxBackoff = append(r.stMaxBackoff, sp.Retry.MaxBackoff.Microseconds())
		r.stTimeout = append(r.stTimeout, sp.Timeout.Microseconds())
		r.stPriorities = append(r.stPriorities, int32(p.Priority))
		r.stInputs = append(r.stInputs, jsonOrNil(ns.Input))
		r.stErrors = append(r.stErrors, ns.Error)
		r.stRunAfters = append(r.stRunAfters, runAfter)
		var stepKey *string
		if sp.ConcurrencyLimit > 0 && ns.ConcurrencyKey != "" {
			stepKey = &ns.ConcurrencyKey
		}
		r.stKeys = append(r.stKeys, stepKey)
		r.stLimits = append(r.stLimits, int32(sp.ConcurrencyLimit))
		r.stHeld = append(r.stHeld, held)
	}
	for _, e := range n.Events {
		r.evInst = append(r.evInst, p.ID)
		r.evSteps = append(r.evSteps, e.Step)
		r.evTypes = append(r.evTypes, string(e.Type))
		r.evMessages = append(r.evMessages, e.Message)
	}
}

// expansion is a forEach step a creation's plan expanded at once, or a
// workflow step it started (children set).
type expansion struct {
	instanceID, name string
	input            json.RawMessage
	items            []json.RawMessage
	children         []storage.CreateParams
}

// arrayLiteral spells names as a PostgreSQL text[] literal, every element
// quoted so that any name survives.
func arrayLiteral(names []string) string {
	if len(names) == 0 {
		return "{}"
	}
	var b strings.Builder
	b.WriteByte('{')
	for i, n := range names {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('"')
		for _, c := range []byte(n) {
			if c == '"' || c == '\\' {
				b.WriteByte('\\')
			}
			b.WriteByte(c)
		}
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String()
}

// queueOf is a step's queue; "default" when unset.
func queueOf(sp storage.StepSpec) string { return cmp.Or(sp.Queue, "default") }

// nilIfEmpty stores an absent text as NULL, which costs a reader nothing
// to scan.
func nilIfEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// Claims at insert. A start that claims for a worker of its process
// (CreateAndClaim) whose claim loop is settled (Store.settled: its last
// claim found nothing, nothing was signalled since, and the listener
// listens) need not look for other ready steps: any there are will be
// announced to that loop. So its claim takes only the new instance's
// first steps, and takes them as it inserts them: the steps go in
// running under the claim and the instance started, with the claim's
// events after the creation's, instead of a claim statement that walks
// the ready index and writes each step and the instance a second time.
// Only what a claim of the worker would take plainly is claimed so, by a
// claimer bound to no other instance: steps of its queues and handlers, up
// to its limit, neither delayed, nor under a concurrency limit (a queue's
// is checked by createSQL), nor forEach, wait or workflow steps, of a
// single instance started at once. A start of several instances claims
// the usual way.

// instanceClaimableAtInsert reports whether a claim at insert may start
// the new instance n.
func instanceClaimableAtInsert(n *storage.NewInstance, held bool) bool {
	p := n.Params
	return n.Status == storage.InstancePending && !n.Failing && !held && !n.Deferred && p.RunAfter.IsZero() &&
		p.Parent == nil && (p.ConcurrencyLimit == 0 || p.ConcurrencyKey == "")
}

// stepClaimableAtInsert reports whether a claim at insert with p may take
// the new step sp, planned as ns.
func stepClaimableAtInsert(sp storage.StepSpec, ns storage.NewStep, p storage.ClaimParams) bool {
	return ns.Status == storage.StepPending && !sp.ForEach && sp.ItemConcurrency == 0 && sp.Wait == nil &&
		sp.Workflow == "" && (sp.ConcurrencyLimit == 0 || ns.ConcurrencyKey == "") &&
		(len(p.Queues) == 0 || slices.Contains(p.Queues, queueOf(sp))) &&
		(len(p.Handlers) == 0 || slices.Contains(p.Handlers, sp.Handler))
}

// insertClaimedSQL reads back the steps of the instance $2 a start
// created with a claim at insert, in position order: each one's status
// and the transaction's ID, then the claim's columns (claimedColumns),
// with lease_until read as now for a step not claimed so that every row
// scans alike (claimColumnsOf, as the settled hand-off reads its rows).
func insertClaimedSQL(trace bool) string {
	return `SELECT status, txid, ` + claimedColumns(claimShape{trace: trace}, "s") + ` FROM (
	SELECT s.status, pg_current_xact_id()::xid::text AS txid, s.position, ` + claimColumnsOf("s", true) + `
	FROM {s}steps s WHERE s.instance_id = $2 AND s.item_index = -1
) s ORDER BY position`
}

var insertClaimedQueries = [2]string{insertClaimedSQL(false), insertClaimedSQL(true)}

// queueInsertClaimed queues, on the tail after the creating statement,
// the read of what its claim at insert took (into claimed), with the
// steps' IDs (ids) and the transaction's ID (txid) a snapshot needs. A
// step marked for the claim that is pending instead was of a limited
// queue: it was made ready, and the worker's claim loop hears of it as
// of any other.
func (s *Store) queueInsertClaimed(st *txState, p storage.ClaimParams, now *time.Time, claimed *[]storage.ClaimedStep, ids *map[string][]int64, txid *string) {
	instanceID := st.insertClaimed[0].instanceID
	sql := insertClaimedQueries[0]
	if p.TraceParent {
		sql = insertClaimedQueries[1]
	}
	st.tail.Queue(s.q(sql), now, instanceID).Query(func(rows pgx.Rows) error {
		var (
			got    []int64
			took   []storage.ClaimedStep
			status storage.StepStatus
		)
		for rows.Next() {
			c, err := scanClaimedAfter(rows, &status, txid)
			if err != nil {
				return err
			}
			got = append(got, c.StepID)
			switch {
			case status == storage.StepRunning:
				took = append(took, c)
			case status == storage.StepPending && slices.Contains(st.insertClaimed, stepRef{instanceID, c.Step}):
				st.ready(c.Queue)
			}
		}
		if err := rows.Err(); err != nil {
			return err
		}
		*claimed, st.claimed = took, took
		*ids = map[string][]int64{instanceID: got}
		return nil
	})
}
