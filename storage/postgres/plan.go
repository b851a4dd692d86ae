package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dagrun/dagrun/storage"
)

// loaded is an instance as a PlanFunc sees it, plus the queues of its steps
// (parallel to state.Steps), to notify the queues of steps made pending.
type loaded struct {
	state  storage.InstanceState
	queues []string
	// waitSignals are the steps' wait signals ("" for a step that runs a
	// handler), parallel to state.Steps; signals are the payloads of the
	// instance's signals not yet delivered, by name.
	waitSignals []string
	signals     map[string]json.RawMessage
	timeout     int64 // the instance's timeout_us
	// onFailure marks the onFailure steps, parallel to state.Steps.
	onFailure []bool
	// ids, fences and xmins are the step rows' IDs, fences and versions
	// (xmin), parallel to state.Steps, and xmin the instance row's, as
	// read: what a snapshot of the instance is checked by (speculate.go).
	ids, fences []int64
	xmins       []string
	xmin        string
}

// lockInstancesSQL locks instance rows in id order. Every transaction that
// changes steps of an instance other than by claiming them or renewing
// their leases takes this lock first, always in the same order, so
// concurrent finishers of sibling steps serialize (under READ COMMITTED
// each would otherwise miss the other's completion, and a fan-in join would
// never be promoted) and cannot deadlock one another. NO KEY UPDATE is the
// weakest row lock that conflicts with itself. The last column is
// InstanceState.Deferred: the instance is held, not started yet by
// StartDeferred, or finished under a workflow limit, which a retry
// planned before its re-arm runs (see retryOne) may hold again.
//
// It then takes the advisory locks of the admitted instances' workflow
// keys, sorted (k), before the transaction touches their steps: a finish
// of steps under limits takes the steps' queue and key locks, and the
// workflow key's when it finishes the instance, and every path takes a
// workflow key's lock before any queue's or step key's (migration 22). A
// held instance's key is left alone: whoever holds a key's lock may wait
// for a held instance's row, to admit it, never for an admitted one's.
const lockInstancesSQL = `
WITH l AS MATERIALIZED (
	SELECT id, workflow, definition_hash, status, input, timeout_us, failing, error, failed_step, depth,
		coalesce(traceparent, '') AS traceparent, xmin::text AS xmin, concurrency_key, held,
		held OR deferred OR finished_at IS NOT NULL AND concurrency_key IS NOT NULL AS deferred
	FROM {s}instances WHERE id = ANY($1) ORDER BY id FOR NO KEY UPDATE
),
k AS MATERIALIZED (
	SELECT count(*) FROM (
		SELECT {s}limits_lock('i', w.workflow, w.concurrency_key, '') FROM (
			SELECT DISTINCT workflow, concurrency_key FROM l WHERE concurrency_key IS NOT NULL AND NOT held ORDER BY 1, 2
		) w
	) locked
)
SELECT l.id, l.workflow, l.definition_hash, l.status, l.input, l.timeout_us, l.failing, l.error, l.failed_step, l.depth,
	l.traceparent, l.xmin, l.deferred
FROM l, k ORDER BY l.id`

// markDeferredSQL keeps an instance for StartDeferred.
const markDeferredSQL = `UPDATE {s}instances SET deferred = true WHERE id = $1`

// queueLock queues the lock of the given instances (duplicates and unknown
// ids are fine) on b; into receives them when the batch runs.
func (s *Store) queueLock(b *pgx.Batch, ids []string, into map[string]*loaded) {
	queueByIDs(b, s.q(lockInstancesSQL), s.q(lockInstanceSQL), ids).Query(func(rows pgx.Rows) error {
		return scanInstances(rows, into)
	})
}

// scanInstances reads the rows of lockInstancesSQL's columns into into.
func scanInstances(rows pgx.Rows, into map[string]*loaded) error {
	var (
		st      storage.InstanceState
		input   []byte
		timeout int64
		failing bool
		failure storage.Failure
		xmin    string
	)
	_, err := pgx.ForEachRow(rows, []any{&st.ID, &st.Workflow, &st.DefinitionHash, &st.Status, &input,
		&timeout, &failing, &failure.Error, &failure.Step, &st.Depth, &st.TraceParent, &xmin, &st.Deferred}, func() error {
		l := &loaded{state: st, timeout: timeout, xmin: xmin}
		l.state.Input = rawJSON(input)
		if failing {
			f := failure
			l.state.Failure = &f
		}
		into[st.ID] = l
		return nil
	})
	return err
}

const loadStepStatesSQL = `
SELECT instance_id, name, depends_on, status, output, error, attempts, queue, wait_signal, on_failure, id, fence, xmin::text
FROM {s}steps WHERE instance_id = ANY($1) AND item_index = -1 ORDER BY instance_id, position`

const loadSignalsSQL = `
SELECT instance_id, name, payload FROM {s}signals WHERE instance_id = ANY($1) AND NOT delivered`

// queueLoadSteps queues the load of the steps of instances, as this
// transaction sees them, after a queueLock of them on the same batch.
func (s *Store) queueLoadSteps(ctx context.Context, tx pgx.Tx, b *pgx.Batch, ids []string, into map[string]*loaded) {
	queueByIDs(b, s.q(loadStepStatesSQL), s.q(loadStepStateSQL), ids).Query(func(rows pgx.Rows) error {
		err := scanStepStates(rows, into)
		for _, l := range into {
			l.state.LoadDefinition = s.definitionLoader(ctx, tx, l.state.DefinitionHash)
		}
		return err
	})
	queueByIDs(b, s.q(loadSignalsSQL), s.q(loadSignalSQL), ids).Query(func(rows pgx.Rows) error {
		var (
			id, name string
			payload  []byte
		)
		_, err := pgx.ForEachRow(rows, []any{&id, &name, &payload}, func() error {
			if l := into[id]; l != nil {
				if l.signals == nil {
					l.signals = map[string]json.RawMessage{}
				}
				l.signals[name] = rawJSON(payload)
			}
			return nil
		})
		return err
	})
}

// scanStepStates reads the rows of loadStepStatesSQL's columns into the
// instances of into they belong to, skipping the others.
func scanStepStates(rows pgx.Rows, into map[string]*loaded) error {
	var (
		id, queue, signal, xmin string
		ss                      storage.StepState
		output                  []byte
		onFailure               bool
		stepID, fence           int64
	)
	_, err := pgx.ForEachRow(rows, []any{&id, &ss.Name, &ss.DependsOn, &ss.Status, &output, &ss.Error, &ss.Attempts, &queue, &signal, &onFailure,
		&stepID, &fence, &xmin}, func() error {
		l := into[id]
		if l == nil {
			return nil
		}
		ss.Output = rawJSON(output)
		if len(ss.DependsOn) == 0 {
			ss.DependsOn = nil
		}
		l.state.Steps = append(l.state.Steps, ss)
		l.queues = append(l.queues, queue)
		l.waitSignals = append(l.waitSignals, signal)
		l.onFailure = append(l.onFailure, onFailure)
		l.ids, l.fences, l.xmins = append(l.ids, stepID), append(l.fences, fence), append(l.xmins, xmin)
		ss = storage.StepState{}
		return nil
	})
	return err
}

// lock locks instances and loads their steps, in one round trip.
func (s *Store) lock(ctx context.Context, tx pgx.Tx, ids []string) (map[string]*loaded, error) {
	into := make(map[string]*loaded, len(ids))
	var b pgx.Batch
	s.queueLock(&b, ids, into)
	s.queueLoadSteps(ctx, tx, &b, ids, into)
	return into, tx.SendBatch(ctx, &b).Close()
}

// definitionLoader reads a definition snapshot inside the transaction; it
// is valid while the transaction is open.
func (s *Store) definitionLoader(ctx context.Context, tx pgx.Tx, hash string) func() ([]byte, error) {
	return func() ([]byte, error) {
		var src []byte
		err := tx.QueryRow(ctx, s.q(`SELECT source FROM {s}definitions WHERE hash = $1`), hash).Scan(&src)
		if err != nil {
			return nil, fmt.Errorf("definition %s: %w", hash, interpretError(err))
		}
		return src, nil
	}
}

// applyStepChangesSQL moves blocked steps to pending (runnable no earlier
// than their instance's run_after), waiting, skipped or failed, with one
// event each. The instance's run_after is read per row by primary key
// rather than by joining instances: with statistics not yet gathered on a
// young database the planner chose a hash join over a sequential scan of
// every instance, which made each start cost O(instances).
var applyStepChangesSQL = applyStepChanges(true)

// applyReadySQL is applyStepChangesSQL for plans that make no step wait,
// nearly all of them, without what only a wait needs: its deadline and the
// start of its instance. That start is an UPDATE of instances, whose
// statement-level count trigger fires even when no row changes; it cost
// each transition about 0.1 ms of server time (a rolled-back probe of the
// statement, 0.45 -> 0.35 ms).
var applyReadySQL = applyStepChanges(false)

// applyRows is the step changes of applyStepChangesSQL, as arrays.
const applyRows = `SELECT * FROM unnest($2::text[], $3::text[], $4::text[], $5::json[], $6::text[], $7::text[])
		WITH ORDINALITY AS c(instance_id, name, status, input, error, ckey, ord)`

func applyStepChanges(waits bool) string {
	deadline, started, startedEvent := "NULL", "", ""
	if waits {
		deadline = `CASE WHEN c.status = 'waiting' AND s.wait_timeout_us > 0
			THEN greatest({now}, (SELECT i.run_after FROM {s}instances i WHERE i.id = s.instance_id))
				+ s.wait_timeout_us * interval '1 microsecond' END`
		// A step that waits has started its instance, as a claimed step
		// would have, and so has one that found its signal and completed
		// at once. The caller holds the instances' locks.
		started = `,
started AS (
	UPDATE {s}instances i SET status = 'running', started_at = {now},
		deadline = CASE WHEN i.timeout_us > 0 THEN {now} + i.timeout_us * interval '1 microsecond' END
	WHERE i.id IN (SELECT instance_id FROM u WHERE wait_signal <> '' AND status IN ('waiting', 'completed')) AND i.status = 'pending'
	RETURNING i.id
)`
		startedEvent = `
	UNION ALL
	SELECT started.id, '', 'instance.started', '', 0 FROM started`
	}
	events := `INSERT INTO {s}events (instance_id, step, type, attempt, message, at)
SELECT e.instance_id, e.step, e.type, 0, e.message, {now} FROM (
	SELECT u.instance_id, u.name AS step, ` + planEvent("u.status") + `, u.ord
	FROM u` + startedEvent + `
) e ORDER BY e.ord`
	tail := events
	if waits {
		// The events include the starts, so the statement returns the
		// number of steps it changed (the caller checks it) instead.
		tail = `,
ev AS (
	` + events + `
)
SELECT count(*) FROM u`
	}
	set := applySet(deadline)
	if waits {
		// A wait step starts when it begins to wait, or when it finds its
		// signal and completes at once.
		set += `,
		started_at = CASE WHEN s.wait_signal <> '' AND c.status IN ('waiting', 'completed') THEN {now} ELSE s.started_at END`
	}
	return `
WITH c AS (
	` + applyRows + `
),
u AS (
	UPDATE {s}steps s SET
		status = c.status,
		` + set + `
	FROM c
	-- No item is ever blocked, so this matches the step of that name
	-- alone; a condition on item_index here, without statistics on a
	-- young table, made the planner loop over the plan's rows for every
	-- step row (measured: 89 ms instead of 2 ms for 100 changes).
	WHERE s.instance_id = c.instance_id AND s.name = c.name AND s.status = 'blocked'
	RETURNING s.instance_id, s.name, s.status, s.error, s.wait_signal, c.ord
)` + started + tail
}

// applySet is what applying a plan's change c writes to its step s, but
// for the status: the step's input, output or error, when it is ready to
// run, its deadline (deadline: a wait's, or NULL), its concurrency key.
func applySet(deadline string) string {
	return `input = CASE WHEN c.status IN ('failed', 'completed') THEN s.input ELSE c.input END,
		output = CASE WHEN c.status = 'completed' THEN c.input ELSE s.output END,
		error = CASE WHEN c.status = 'failed' THEN c.error ELSE s.error END,
		run_after = CASE WHEN c.status = 'pending'
			THEN (SELECT i.run_after + ` + heldSQL + ` FROM {s}instances i WHERE i.id = s.instance_id)
			ELSE s.run_after END,
		ready_at = CASE WHEN c.status IN ('pending', 'waiting') THEN {now} ELSE s.ready_at END,
		deadline = ` + deadline + `,
		finished_at = CASE WHEN c.status IN ('pending', 'waiting') THEN NULL ELSE {now} END,
		-- Set with the status, so the limit triggers see it.
		concurrency_key = CASE WHEN c.status = 'pending' AND s.concurrency_limit > 0 THEN c.ckey END`
}

// planEvent is the type and message columns of the event of a plan's
// change to status of the step u (with its error and wait signal).
func planEvent(status string) string {
	return `CASE ` + status + ` WHEN 'pending' THEN 'step.ready' WHEN 'waiting' THEN 'step.ready' WHEN 'skipped' THEN 'step.skipped'
			WHEN 'completed' THEN 'step.completed' ELSE 'step.failed' END AS type,
		CASE WHEN ` + status + ` = 'waiting' THEN 'waiting for signal ' || u.wait_signal
			WHEN ` + status + ` = 'completed' AND u.wait_signal <> '' THEN 'signal ' || u.wait_signal || ' received'
			ELSE u.error END AS message`
}

// finishInstancesRows is the instances finishInstancesSQL finishes, as
// arrays.
const finishInstancesRows = `SELECT * FROM unnest($2::text[], $3::text[], $4::json[], $5::text[], $6::text[]) AS x(id, status, output, error, failed_step)`

// finishInstancesSQL finishes unfinished instances and cancels their
// unfinished steps (running ones too: their claims go stale), with the
// events of both, the steps' first. It returns the finished instances.
// "Unfinished" is spelled by status, not finished_at IS NULL, which would
// let a generic plan read all of instances_unfinished (see finishSQL).
const finishInstancesSQL = `
WITH x AS (
	` + finishInstancesRows + `
),
i AS (
	UPDATE {s}instances i SET status = x.status, output = x.output, error = x.error, finished_at = {now},
		started_at = CASE WHEN x.status = 'cancelled' THEN i.started_at ELSE coalesce(i.started_at, {now}) END,
		failed_step = coalesce(nullif(x.failed_step, ''), i.failed_step)
	FROM x
	WHERE i.id = x.id AND i.status IN ('pending', 'running')
	RETURNING i.id, i.status, i.error, i.output, i.parent_id, i.parent_step, i.parent_item
),
c AS (
	UPDATE {s}steps s SET status = 'cancelled', finished_at = {now}, lease_until = NULL, deadline = NULL
	FROM i
	WHERE s.instance_id = i.id AND s.status IN ('blocked', 'pending', 'running', 'waiting')
	RETURNING s.instance_id, s.name, s.attempts, s.position, s.item_index, i.error
),
ev AS (
	SELECT c.instance_id, c.name AS step, 'step.cancelled' AS type, c.attempts AS attempt, c.error AS message, 0 AS ord, c.position
	FROM c WHERE c.item_index = -1 -- items have no events of their own
	UNION ALL
	SELECT i.id, '', 'instance.' || i.status, 0, i.error, 1, 0 FROM i
),
e AS (
	INSERT INTO {s}events (instance_id, step, type, attempt, message, at)
	SELECT ev.instance_id, ev.step, ev.type, ev.attempt, ev.message, {now}
	FROM ev ORDER BY ev.instance_id, ev.ord, ev.position
)
SELECT id, status, error, output, parent_id, parent_step, parent_item FROM i`

// planAndApply asks plan once about each unfinished instance (locked, with
// its steps loaded), in id order, checks the answers against the states,
// and queues their application on the transaction's tail. A Plan already
// holds the cascade (a skipped step unblocking its dependents), so plan is
// not asked again.
func (s *Store) planAndApply(st *txState, now *time.Time, ls []*loaded, plan storage.PlanFunc) error {
	st.plan = plan
	slices.SortFunc(ls, func(a, b *loaded) int { return strings.Compare(a.state.ID, b.state.ID) })
	var (
		sc stepChanges
		ic instanceChanges
		fc failureChanges
	)
	tailLen := st.tail.Len()
	for _, l := range ls {
		if l.state.Status.Finished() {
			continue // nothing can become ready in it
		}
		if l.state.Failure != nil && l.state.TimedOut == 0 {
			// A failing instance keeps its deadline while its main steps
			// run an attempt, no longer.
			st.tail.Queue(s.q(clearFailingDeadlineSQL), l.state.ID)
		}
		// A wait step that becomes ready and finds its signal completes
		// at once (see stepChanges.add): plan again for its dependents.
		// Each round completes steps, so this ends.
		for again := true; again; {
			p, err := plan(&l.state)
			if err != nil {
				return fmt.Errorf("plan instance %s: %w", l.state.ID, err)
			}
			if p == nil {
				break
			}
			if again, err = sc.add(st, now, s, l, p.Steps); err != nil {
				return err
			}
			if p.Deferred {
				// A held instance (a retried one waiting for its slot):
				// the sweep starts what the plan left once it is admitted.
				st.tail.Queue(s.q(markDeferredSQL), l.state.ID)
			}
			if err := storage.CheckFailure(l.state.ID, p, &l.state); err != nil {
				return err
			}
			fc.add(l, p.Failure)
			if err := ic.add(&l.state, p.Instance); err != nil {
				return err
			}
			if p.Instance != nil {
				l.state.Status = p.Instance.Status
				again = false
			}
		}
	}
	if len(ic.ids) == 0 && len(fc.ids) == 0 && st.canHandOff(&sc, tailLen) {
		s.queueHandoff(st, now, &sc)
		return nil
	}
	if n := len(sc.ids); n > 0 {
		apply, applyOne := applyReadySQL, applyReadyOneSQL
		if sc.waits {
			apply, applyOne = applyStepChangesSQL, applyStepChangeSQL
		}
		q := st.tail.Queue(s.q(apply), now, sc.ids, sc.names, sc.statuses, sc.inputs, sc.errors, sc.keys)
		if n == 1 {
			q.SQL, q.Arguments = s.q(applyOne), []any{now, sc.ids[0], sc.names[0], sc.statuses[0], sc.inputs[0], sc.errors[0], sc.keys[0]}
		}
		// Checked against the locked state above: only a bug gets a count
		// other than n.
		check := func(changed int64) error {
			if int(changed) != n {
				return fmt.Errorf("applying plans changed %d steps, want %d", changed, n)
			}
			return nil
		}
		if sc.waits {
			q.QueryRow(func(row pgx.Row) error {
				var changed int64
				if err := row.Scan(&changed); err != nil {
					return err
				}
				return check(changed)
			})
		} else {
			q.Exec(func(tag pgconn.CommandTag) error { return check(tag.RowsAffected()) })
		}
	}
	// After the step changes, which the failures' cancelling must see
	// (onFailure steps made ready stay so), before the finishes.
	s.queueFailures(st, now, &fc)
	if len(ic.ids) > 0 {
		s.queueFinish(st, now, ic.ids, ic.statuses, ic.outputs, ic.errors, ic.failedSteps, ic.followUp)
	}
	return nil
}

// stepChanges holds StepChanges of many instances as parallel arrays for unnest.
type stepChanges struct {
	ids, names, statuses, errors []string
	inputs                       []json.RawMessage
	keys                         []*string // concurrency keys of steps made pending
	// waits is set when a step was made waiting, or completed at once by
	// a signal that came first: its instance may start.
	waits bool
}

// add checks changes against the instance's state, and updates the state
// as it goes so that one Plan cannot change a step twice. It reports
// whether a wait step made ready found its signal and completed, which
// calls for planning the instance again.
func (c *stepChanges) add(st *txState, now *time.Time, s *Store, l *loaded, changes []storage.StepChange) (delivered bool, err error) {
	is := &l.state
	for _, ch := range changes {
		i := stepIndex(is, ch.Name)
		if i < 0 {
			return false, fmt.Errorf("plan for instance %s names unknown step %q", is.ID, ch.Name)
		}
		switch ch.Status {
		case storage.StepPending, storage.StepSkipped, storage.StepFailed, storage.StepCompleted:
		case storage.StepRunning:
			if len(ch.Children) > 0 {
				if err := storage.CheckChildren(is.ID, nil, ch); err != nil {
					return false, err
				}
			} else if err := storage.CheckExpansion(is.ID, nil, ch); err != nil {
				return false, err
			}
		case storage.StepWaiting:
			if err := storage.CheckWait(is.ID, l.waitSignals[i] != "", ch.Name); err != nil {
				return false, err
			}
			c.waits = true
		default:
			return false, fmt.Errorf("plan for instance %s moves step %q to %q: only pending, waiting (a wait step), running (a forEach expansion), completed, skipped or failed are allowed", is.ID, ch.Name, ch.Status)
		}
		if cur := is.Steps[i].Status; cur != storage.StepBlocked {
			return false, fmt.Errorf("plan for instance %s moves step %q to %s, but it is %s, not blocked", is.ID, ch.Name, ch.Status, cur)
		}
		if payload, ok := l.signals[l.waitSignals[i]]; ok && ch.Status == storage.StepWaiting {
			// Its signal came first: the step completes with it.
			delete(l.signals, l.waitSignals[i])
			st.tail.Queue(s.q(markDeliveredSQL), is.ID, l.waitSignals[i])
			st.tail.Queue(s.q(waitedSQL), now, is.ID, ch.Name, storage.WaitingMessage(l.waitSignals[i]))
			ch = storage.StepChange{Name: ch.Name, Status: storage.StepCompleted, Output: payload}
			is.Steps[i].Output = payload
			delivered = true
		}
		is.Steps[i].Status = ch.Status
		if ch.Status == storage.StepRunning && len(ch.Children) > 0 {
			if err := s.queueStartChildren(st, now, is.ID, ch, true); err != nil {
				return false, err
			}
			continue
		}
		if ch.Status == storage.StepRunning {
			st.ready(l.queues[i])
			s.queueExpand(st, now, is.ID, ch.Name, ch.Items)
			continue
		}
		switch ch.Status {
		case storage.StepPending:
			st.readyByPlan(l.queues[i], is.ID, ch.Name)
		case storage.StepWaiting:
			st.waiting(l.queues[i]) // idle workers learn of its deadline
		}
		input := ch.Input
		if ch.Status == storage.StepCompleted {
			input = ch.Output // the column of c.input carries a completed step's output
		}
		c.ids = append(c.ids, is.ID)
		c.names = append(c.names, ch.Name)
		c.statuses = append(c.statuses, string(ch.Status))
		c.inputs = append(c.inputs, jsonOrNil(input))
		c.errors = append(c.errors, ch.Error)
		var key *string
		if ch.Status == storage.StepPending && ch.ConcurrencyKey != "" {
			key = &ch.ConcurrencyKey
		}
		c.keys = append(c.keys, key)
	}
	return delivered, nil
}

func stepIndex(is *storage.InstanceState, name string) int {
	for i := range is.Steps {
		if is.Steps[i].Name == name {
			return i
		}
	}
	return -1
}

// instanceChanges holds InstanceChanges of many instances as parallel arrays.
type instanceChanges struct {
	ids, statuses, errors, failedSteps []string
	outputs                            []json.RawMessage
	// followUp is set when one of them is a child, whose parent's step
	// to settle, or ends otherwise than completed, with children to cancel.
	followUp bool
}

func (c *instanceChanges) add(in *storage.InstanceState, ch *storage.InstanceChange) error {
	if ch == nil {
		return nil
	}
	id := in.ID
	if !ch.Status.Finished() {
		return fmt.Errorf("plan for instance %s sets status %q: only completed, failed or cancelled are allowed", id, ch.Status)
	}
	c.followUp = c.followUp || in.Depth > 0 || ch.Status != storage.InstanceCompleted
	c.ids = append(c.ids, id)
	c.statuses = append(c.statuses, string(ch.Status))
	c.outputs = append(c.outputs, jsonOrNil(ch.Output))
	c.errors = append(c.errors, ch.Error)
	c.failedSteps = append(c.failedSteps, ch.FailedStep)
	return nil
}

// jsonOrNil maps an empty RawMessage to SQL NULL (an empty string is not
// valid JSON).
func jsonOrNil(m json.RawMessage) json.RawMessage {
	if len(m) == 0 {
		return nil
	}
	return m
}

// rawJSON returns a scanned json column, nil for NULL.
func rawJSON(b []byte) json.RawMessage {
	if b == nil {
		return nil
	}
	return json.RawMessage(b)
}
