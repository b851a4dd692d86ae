package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dagrun/dagrun/storage"
)

// Child instances. A workflow step (or item) that starts is running with
// no lease and its child's ID on its row; the child names it back through
// parent_id, parent_step and parent_item. Every instance finishes through
// finishInstancesSQL (queueFinish), whose rows the transaction follows up
// before it commits (followUp): the parent step of a finished child is
// settled, and the unfinished children of an instance that did not
// complete are cancelled. So a parent never runs on with a finished child,
// nor a child with a finished parent.

// childStart is a workflow step whose row the tail starts, and whose
// children followUp then creates.
type childStart struct {
	parentID string
	change   storage.StepChange
}

// finishedInstance is an instance the transaction finished.
type finishedInstance struct {
	id     string
	status storage.InstanceStatus
	output json.RawMessage
	error  string
	parent *storage.ParentRef
}

// queueFinish queues finishInstancesSQL and has followUp look at what it
// finished. followUp says whether that may call for any: an instance that
// completes with no parent has no step to settle and no child left to
// cancel, and its transaction may commit with the tail (see
// txState.finish).
func (s *Store) queueFinish(st *txState, now *time.Time, ids, statuses []string, outputs []json.RawMessage, errs, failedSteps []string, followUp bool) {
	st.finishing = st.finishing || followUp
	q := st.tail.Queue(s.q(finishInstancesSQL), now, ids, statuses, outputs, errs, failedSteps)
	if len(ids) == 1 {
		q.SQL, q.Arguments = s.q(finishInstanceSQL), []any{now, ids[0], statuses[0], outputs[0], errs[0], failedSteps[0]}
	}
	q.Query(func(rows pgx.Rows) error {
		var (
			f          finishedInstance
			output     []byte
			parent     *string
			step       string
			parentItem int
		)
		_, err := pgx.ForEachRow(rows, []any{&f.id, &f.status, &f.error, &output, &parent, &step, &parentItem}, func() error {
			f.output = rawJSON(append([]byte(nil), output...))
			if output == nil {
				f.output = nil
			}
			f.parent = nil
			if parent != nil {
				f.parent = &storage.ParentRef{InstanceID: *parent, Step: step, Item: parentItem}
			}
			if f.parent == nil && f.status == storage.InstanceCompleted {
				return nil // nothing to follow up: see queueFinish
			}
			st.finished = append(st.finished, f)
			return nil
		})
		return err
	})
}

// startWorkflowStepSuffix starts the instance of the step(s) u started,
// when $5 (not at creation, which writes these itself), with the step's
// step.started event ($6).
const startWorkflowStepSuffix = `,
started AS (
	UPDATE {s}instances i SET status = 'running', started_at = {now},
		deadline = CASE WHEN i.timeout_us > 0 THEN {now} + i.timeout_us * interval '1 microsecond' END
	WHERE $5 AND i.id = $2 AND i.status = 'pending'
	RETURNING i.id
),
ev AS (
	INSERT INTO {s}events (instance_id, step, type, attempt, message, at)
	SELECT e.instance_id, e.step, e.type, 0, e.message, {now} FROM (
		SELECT $2 AS instance_id, $3 AS step, 'step.started' AS type, $6 AS message, 1 AS ord WHERE $5 AND EXISTS (SELECT 1 FROM u)
		UNION ALL
		SELECT started.id, '', 'instance.started', '', 0 FROM started
	) e ORDER BY e.ord
)
SELECT count(*) FROM u`

// startWorkflowStepSQL makes blocked workflow step $3 of instance $2
// running, with input $4, no lease, and child $7.
const startWorkflowStepSQL = `
WITH u AS (
	UPDATE {s}steps s SET status = 'running', input = $4, started_at = {now}, first_started_at = {now}, ready_at = {now},
		run_after = greatest({now}, (SELECT i.run_after FROM {s}instances i WHERE i.id = s.instance_id)),
		lease_until = NULL, child_id = $7
	WHERE s.instance_id = $2 AND s.item_index = -1 AND s.name = $3 AND s.status = 'blocked' AND s.child_workflow <> ''
	RETURNING s.id
)` + startWorkflowStepSuffix

// startWorkflowItemsSQL makes the items of forEach workflow step $3 of
// instance $2, just expanded, running with no lease, each with its child
// of $7 (in item order); $4 is unused.
const startWorkflowItemsSQL = `
WITH p AS (
	SELECT id FROM {s}steps WHERE instance_id = $2 AND item_index = -1 AND name = $3 AND child_workflow <> '' AND $4::json IS NULL
),
u AS (
	UPDATE {s}steps s SET status = 'running', started_at = {now}, first_started_at = {now}, lease_until = NULL, child_id = c.id
	FROM p, unnest($7::text[]) WITH ORDINALITY AS c(id, ord)
	WHERE s.parent_id = p.id AND s.item_index = c.ord - 1
	RETURNING s.id
)` + startWorkflowStepSuffix

// queueStartChildren queues the start of a workflow step (its items first,
// for a forEach step) and has followUp create its children. event is
// false at the instance's creation, whose plan wrote the events.
func (s *Store) queueStartChildren(st *txState, now *time.Time, instanceID string, c storage.StepChange, event bool) error {
	if err := storage.CheckChildren(instanceID, nil, c); err != nil {
		return err
	}
	ids := make([]string, len(c.Children))
	for i, ch := range c.Children {
		ids[i] = ch.ID
	}
	msg := storage.ChildrenStartedMessage(c.Children)
	check := func(row pgx.Row) error {
		var n int
		if err := row.Scan(&n); err != nil {
			return err
		}
		if n != len(ids) {
			return fmt.Errorf("plan for instance %s starts children of step %q, which is not a blocked workflow step", instanceID, c.Name)
		}
		return nil
	}
	if len(c.Items) > 0 {
		s.queueExpansion(st, now, instanceID, c.Name, c.Items, event)
		st.tail.Queue(s.q(startWorkflowItemsSQL), now, instanceID, c.Name, nil, event, msg, ids).QueryRow(check)
	} else {
		st.tail.Queue(s.q(startWorkflowStepSQL), now, instanceID, c.Name, jsonOrNil(c.Input), event, msg, ids[0]).QueryRow(check)
	}
	st.starts = append(st.starts, childStart{parentID: instanceID, change: c})
	return nil
}

// settleChildSQL settles the workflow step (or item) whose child $8 just
// finished, if it is still running for it: completed with the child's
// output, or failed for good.
const settleChildSQL = `
WITH t AS MATERIALIZED (
	SELECT id, status FROM {s}steps WHERE instance_id = $2 AND name = $3 AND item_index = $4 AND child_id = $8
)
UPDATE {s}steps s SET status = $5, output = $6, error = $7, finished_at = {now}
FROM t WHERE s.id = t.id AND t.status = 'running'
RETURNING s.id, coalesce(s.parent_id, 0)`

// followUp does what the last tail calls for: it creates the children of
// the workflow steps it started, cancels the unfinished children of the
// instances it ended otherwise than completed, and settles the parent
// steps of the children it finished, planning their instances. What this
// queues is the next tail.
func (s *Store) followUp(ctx context.Context, tx pgx.Tx, st *txState) error {
	now := s.now()
	starts, finished, orphans := st.starts, st.finished, st.orphans
	st.starts, st.finished, st.orphans = nil, nil, nil
	for _, c := range starts {
		if err := s.createChildren(ctx, tx, st, now, c); err != nil {
			return err
		}
	}
	if len(orphans) > 0 {
		ids, statuses, msgs := make([]string, len(orphans)), make([]string, len(orphans)), make([]string, len(orphans))
		for i, o := range orphans {
			ids[i], statuses[i] = o.id, string(storage.InstanceCancelled)
			msgs[i] = storage.ParentFinishedMessage(o.parent, storage.InstanceFailed)
			st.tail.Queue(s.q(lockUnfinishedStepsSQL), o.id)
		}
		s.queueFinish(st, now, ids, statuses, make([]json.RawMessage, len(ids)), msgs, make([]string, len(ids)), true)
	}
	if len(finished) == 0 {
		return nil
	}
	if err := s.cancelChildren(ctx, tx, st, now, finished); err != nil {
		return err
	}
	var parents []string
	for _, f := range finished {
		if f.parent != nil && !slices.Contains(parents, f.parent.InstanceID) {
			parents = append(parents, f.parent.InstanceID)
		}
	}
	if len(parents) == 0 {
		return nil
	}
	if st.plan == nil {
		return errors.New("postgres: a child instance finished in a transaction without a PlanFunc for its parent")
	}
	locked, err := s.lock(ctx, tx, parents)
	if err != nil {
		return err
	}
	var (
		touched  []*loaded
		forEachs []int64
	)
	for _, f := range finished {
		if f.parent == nil {
			continue
		}
		status, output, msg := storage.StepCompleted, f.output, ""
		if f.status != storage.InstanceCompleted {
			status, output, msg = storage.StepFailed, nil, storage.ChildError(f.id, f.status, f.error)
		}
		p := f.parent
		var rowID, forEachRow int64
		err := tx.QueryRow(ctx, s.q(settleChildSQL), now, p.InstanceID, p.Step, p.Item, string(status), jsonOrNil(output), msg, f.id).
			Scan(&rowID, &forEachRow)
		if errors.Is(err, pgx.ErrNoRows) {
			continue // its instance finished first, which is what ended the child
		}
		if err != nil {
			return err
		}
		if forEachRow != 0 {
			forEachs = append(forEachs, forEachRow)
			continue
		}
		l := locked[p.InstanceID]
		if l == nil {
			return fmt.Errorf("parent instance %s of %s is not locked", p.InstanceID, f.id)
		}
		if i := stepIndex(&l.state, p.Step); i >= 0 {
			ss := &l.state.Steps[i]
			ss.Status, ss.Output, ss.Error = status, output, msg
		}
		typ := storage.EventStepCompleted
		if status == storage.StepFailed {
			typ = storage.EventStepFailed
		}
		st.tail.Queue(s.q(`INSERT INTO {s}events (instance_id, step, type, attempt, message, at) VALUES ($2, $3, $4, 0, $5, {now})`),
			now, p.InstanceID, p.Step, string(typ), msg)
		if !slices.Contains(touched, l) {
			touched = append(touched, l)
		}
	}
	settled, err := s.settle(ctx, tx, now, forEachs, locked)
	if err != nil {
		return err
	}
	for _, l := range settled {
		if !slices.Contains(touched, l) {
			touched = append(touched, l)
		}
	}
	return s.planAndApply(st, now, touched, st.plan)
}

// createChildren creates the children of a workflow step the last tail
// started, at its instance's depth+1 and priority, no earlier than its
// run_after.
func (s *Store) createChildren(ctx context.Context, tx pgx.Tx, st *txState, now *time.Time, c childStart) error {
	var (
		depth, priority int
		runAfter        time.Time
		paused          bool
	)
	if err := tx.QueryRow(ctx, s.q(`SELECT depth, priority, run_after, paused FROM {s}instances WHERE id = $1`), c.parentID).
		Scan(&depth, &priority, &runAfter, &paused); err != nil {
		return fmt.Errorf("parent instance %s: %w", c.parentID, err)
	}
	children := storage.ChildParams(c.parentID, depth, priority, c.change.Name, c.change, runAfter)
	if err := validateCreate(children); err != nil {
		return err
	}
	if st.plan == nil {
		return errors.New("postgres: a workflow step started in a transaction without a PlanFunc for its children")
	}
	created, err := s.create(ctx, tx, st, now, children, st.plan, false)
	if err != nil || !paused {
		return err
	}
	// A paused parent's running step started them: they wait with it.
	ids := make([]string, len(created))
	for i, r := range created {
		ids[i] = r.ID
	}
	return s.pauseTree(ctx, tx, st, ids, true)
}

// cancelChildren cancels the unfinished children of the instances that
// ended otherwise than completed (a completed instance has none), locked
// in id order.
func (s *Store) cancelChildren(ctx context.Context, tx pgx.Tx, st *txState, now *time.Time, finished []finishedInstance) error {
	var ended []string
	for _, f := range finished {
		if f.status != storage.InstanceCompleted {
			ended = append(ended, f.id)
		}
	}
	if len(ended) == 0 {
		return nil
	}
	rows, err := tx.Query(ctx, s.q(`SELECT i.id, i.parent_id, p.status FROM {s}instances i JOIN {s}instances p ON p.id = i.parent_id
		WHERE i.parent_id = ANY($1) AND i.finished_at IS NULL ORDER BY i.id FOR NO KEY UPDATE OF i`), ended)
	if err != nil {
		return err
	}
	var (
		ids, statuses, msgs []string
		id, parent          string
		status              storage.InstanceStatus
	)
	if _, err := pgx.ForEachRow(rows, []any{&id, &parent, &status}, func() error {
		ids, statuses = append(ids, id), append(statuses, string(storage.InstanceCancelled))
		msgs = append(msgs, storage.ParentFinishedMessage(parent, status))
		return nil
	}); err != nil {
		return err
	}
	if len(ids) == 0 {
		return nil
	}
	for _, id := range ids {
		st.tail.Queue(s.q(lockUnfinishedStepsSQL), id)
	}
	s.queueFinish(st, now, ids, statuses, make([]json.RawMessage, len(ids)), msgs, make([]string, len(ids)), true)
	return nil
}
