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

// lockOne locks one instance, with its steps when withSteps: ErrNotFound
// if it does not exist.
func (s *Store) lockOne(ctx context.Context, tx pgx.Tx, id string, withSteps bool) (*loaded, error) {
	into := map[string]*loaded{}
	var b pgx.Batch
	s.queueLock(&b, []string{id}, into)
	if withSteps {
		s.queueLoadSteps(ctx, tx, &b, []string{id}, into)
	}
	if err := tx.SendBatch(ctx, &b).Close(); err != nil {
		return nil, err
	}
	l := into[id]
	if l == nil {
		return nil, fmt.Errorf("instance %s: %w", id, storage.ErrNotFound)
	}
	return l, nil
}

// lockUnfinishedStepsSQL locks, in id order, the steps a cancel changes,
// running ones included: extendSQL and finishSQL lock running steps in the
// same order, so a cancel cannot deadlock with a heartbeat or a finish.
const lockUnfinishedStepsSQL = `
SELECT id FROM {s}steps
WHERE instance_id = $1 AND status IN ('blocked', 'pending', 'running', 'waiting')
ORDER BY id FOR NO KEY UPDATE`

// CancelInstance implements storage.Store. Running steps are cancelled too:
// their claims go stale, so heartbeats report them lost and their handlers
// are stopped.
func (s *Store) CancelInstance(ctx context.Context, id, reason string, plan storage.PlanFunc) error {
	if plan == nil {
		return errors.New("postgres: cancel instance: nil PlanFunc")
	}
	err := s.inTx(ctx, func(tx pgx.Tx, st *txState) error {
		if err := actAs(ctx, tx); err != nil {
			return err
		}
		l, err := s.lockOne(ctx, tx, id, false)
		if err != nil {
			return err
		}
		if status := l.state.Status; status.Finished() {
			return storage.Refuse(storage.ErrConflict, "instance %s is already %s", id, status)
		}
		st.plan = plan
		st.tail.Queue(s.q(lockUnfinishedStepsSQL), id)
		s.queueFinish(st, s.now(), []string{id}, []string{string(storage.InstanceCancelled)}, []json.RawMessage{nil}, []string{reason}, []string{""}, true)
		return nil
	})
	if err != nil {
		return s.fail("cancel instance", err)
	}
	return nil
}

// retrySQL re-arms the failed and cancelled steps of an instance (see
// rearmStepsSQL) and makes it unfinished again (see reviveStatusSQL and
// reviveRunAfterSQL).
var retrySQL = rearmSteps(true)

// rearmStepsSQL re-arms the failed and cancelled steps of instance $2.
// Re-armed steps start over (attempts, error, timings); the fence is kept
// so that claims from before stay stale. The forEach steps of $3, which
// expanded, run again instead: their failed and cancelled items are
// pending again, their completed ones keep their outputs.
var rearmStepsSQL = rearmSteps(false)

// rearmSteps is rearmStepsSQL, and with revive retrySQL.
func rearmSteps(revive bool) string {
	ctes := `
WITH it AS (
	UPDATE {s}steps SET status = 'pending', attempts = 0, output = NULL, error = '',
		run_after = {now}, ready_at = {now}, first_started_at = NULL, started_at = NULL, finished_at = NULL,
		lease_until = NULL, worker_id = ''
	WHERE parent_id IN (SELECT id FROM {s}steps WHERE instance_id = $2 AND item_index = -1 AND name = ANY($3))
		AND status IN ('failed', 'cancelled') AND child_id = ''
),
-- A workflow step (or item) with a child runs again by retrying its child,
-- and starts again now, so that its time counts this run.
ch AS (
	UPDATE {s}steps SET status = 'running', output = NULL, error = '', started_at = {now}, first_started_at = {now},
		finished_at = NULL, lease_until = NULL
	WHERE instance_id = $2 AND child_id <> '' AND status IN ('failed', 'cancelled')
),
fe AS (
	UPDATE {s}steps SET status = 'running', output = NULL, error = '', finished_at = NULL
	WHERE instance_id = $2 AND item_index = -1 AND name = ANY($3)
)`
	rest := `
	UPDATE {s}steps SET status = 'blocked', attempts = 0, input = NULL, output = NULL, error = '',
		run_after = NULL, ready_at = NULL, first_started_at = NULL, started_at = NULL, finished_at = NULL,
		lease_until = NULL, worker_id = '', deadline = NULL
	WHERE instance_id = $2 AND item_index = -1 AND status IN ('failed', 'cancelled') AND NOT name = ANY($3) AND child_id = ''`
	if !revive {
		return ctes + rest
	}
	return ctes + `,
st AS (` + rest + `
),
i AS (
	UPDATE {s}instances SET status = ` + reviveStatusSQL + `, output = NULL, error = '', finished_at = NULL,
		paused = false, run_after = ` + reviveRunAfterSQL + `
	WHERE id = $2
)
INSERT INTO {s}events (instance_id, type, at) VALUES ($2, 'instance.retried', {now})`
}

// expandedToRetrySQL names the failed or cancelled forEach steps of an
// instance that expanded: a retry runs their items again.
const expandedToRetrySQL = `
SELECT s.name FROM {s}steps s
WHERE s.instance_id = $1 AND s.item_index = -1 AND s.for_each AND s.status IN ('failed', 'cancelled')
	AND EXISTS (SELECT 1 FROM {s}steps i WHERE i.parent_id = s.id)`

// childrenToRetrySQL lists the failed and cancelled workflow steps and
// items of an instance that have a child, with their child's status.
const childrenToRetrySQL = `
SELECT s.name, s.item_index, s.child_id, i.status, i.output FROM {s}steps s JOIN {s}instances i ON i.id = s.child_id
WHERE s.instance_id = $1 AND s.child_id <> '' AND s.status IN ('failed', 'cancelled')
ORDER BY s.child_id`

// refuseChild refuses an operation that would run child instance id again
// by itself (see storage.RetryChildError); nil for a top-level instance.
func (s *Store) refuseChild(ctx context.Context, tx pgx.Tx, id string) error {
	var (
		parent     *string
		parentStep string
	)
	err := tx.QueryRow(ctx, s.q(`SELECT parent_id, parent_step FROM {s}instances WHERE id = $1`), id).Scan(&parent, &parentStep)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("instance %s: %w", id, storage.ErrNotFound)
	}
	if err != nil || parent == nil {
		return err
	}
	return storage.RetryChildError(id, &storage.ParentRef{InstanceID: *parent, Step: parentStep})
}

// RetryInstance implements storage.Store.
func (s *Store) RetryInstance(ctx context.Context, id string, plan storage.PlanFunc) error {
	if plan == nil {
		return errors.New("postgres: retry instance: nil PlanFunc")
	}
	err := s.inTx(ctx, func(tx pgx.Tx, st *txState) error {
		if err := actAs(ctx, tx); err != nil {
			return err
		}
		if err := s.refuseChild(ctx, tx, id); err != nil {
			return err
		}
		now := s.now()
		st.plan = plan
		ls, err := s.retryOne(ctx, tx, st, now, id)
		if err != nil {
			return err
		}
		if err := s.planAndApply(st, now, ls, plan); err != nil {
			return err
		}
		return nil
	})
	if err != nil {
		return s.fail("retry instance", err)
	}
	return nil
}

// retryOne re-arms a failed or cancelled instance and, through its
// workflow steps, its failed and cancelled children (locked after it, as a
// cancel locks them); it returns them locked, in the state the retry
// leaves, to plan.
func (s *Store) retryOne(ctx context.Context, tx pgx.Tx, st *txState, now *time.Time, id string) ([]*loaded, error) {
	l, err := s.lockOne(ctx, tx, id, true)
	if err != nil {
		return nil, err
	}
	if status := l.state.Status; status != storage.InstanceFailed && status != storage.InstanceCancelled {
		return nil, storage.Refuse(storage.ErrConflict, "instance %s is %s; only a failed or cancelled instance can be retried", id, status)
	}
	status, err := s.revivedStatus(ctx, tx, id)
	if err != nil {
		return nil, err
	}
	l.state.Status = status
	out, err := s.rearmFailed(ctx, tx, st, now, l, nil, retrySQL)
	if err != nil {
		return nil, err
	}
	// Its onFailure steps run again only if it fails again.
	s.rearmFailure(st, now, l)
	return out, nil
}

// rearmFailed queues stmt (retrySQL or rearmStepsSQL) to make the failed
// and cancelled steps of l run again, but for those named in fresh, which
// the caller re-armed from the start: an expanded forEach step re-runs its
// failed and cancelled items, a workflow step (or item) retries its child
// (locked after l, as a cancel locks them), any other step starts over.
// It shows the plan the state stmt leaves and returns l and the children
// it re-armed, locked, to plan.
func (s *Store) rearmFailed(ctx context.Context, tx pgx.Tx, st *txState, now *time.Time, l *loaded, fresh map[string]bool, stmt string) ([]*loaded, error) {
	id := l.state.ID
	rows, err := tx.Query(ctx, s.q(expandedToRetrySQL), id)
	if err != nil {
		return nil, err
	}
	expanded, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	expanded = slices.DeleteFunc(expanded, func(name string) bool { return fresh[name] })
	type child struct {
		ref    storage.ParentRef
		id     string
		status storage.InstanceStatus
		output []byte
	}
	rows, err = tx.Query(ctx, s.q(childrenToRetrySQL), id)
	if err != nil {
		return nil, err
	}
	var (
		children []child
		c        child
	)
	if _, err := pgx.ForEachRow(rows, []any{&c.ref.Step, &c.ref.Item, &c.id, &c.status, &c.output}, func() error {
		if fresh[c.ref.Step] {
			return nil // re-armed from the start, a new child will run
		}
		c.ref.InstanceID = id
		c.output = append([]byte(nil), c.output...)
		children = append(children, c)
		return nil
	}); err != nil {
		return nil, err
	}
	st.tail.Queue(s.q(stmt), now, id, expanded)
	// The plan sees the state stmt leaves, which it runs before the
	// plan's changes, in the same round trip.
	for i := range l.state.Steps {
		ss := &l.state.Steps[i]
		if fresh[ss.Name] {
			continue
		}
		rerun := slices.ContainsFunc(children, func(c child) bool { return c.ref.Item < 0 && c.ref.Step == ss.Name })
		switch {
		case slices.Contains(expanded, ss.Name):
			*ss = storage.StepState{Name: ss.Name, DependsOn: ss.DependsOn, Status: storage.StepRunning}
			st.ready(l.queues[i])
		case rerun:
			*ss = storage.StepState{Name: ss.Name, DependsOn: ss.DependsOn, Status: storage.StepRunning}
		case ss.Status == storage.StepFailed || ss.Status == storage.StepCancelled:
			*ss = storage.StepState{Name: ss.Name, DependsOn: ss.DependsOn, Status: storage.StepBlocked}
		}
	}
	out := []*loaded{l}
	for _, c := range children {
		switch c.status {
		case storage.InstanceFailed, storage.InstanceCancelled:
			more, err := s.retryOne(ctx, tx, st, now, c.id)
			if err != nil {
				return nil, err
			}
			out = append(out, more...)
		case storage.InstanceCompleted:
			// Settled as it would have been when the child completed.
			ref := c.ref
			st.finished = append(st.finished, finishedInstance{id: c.id, status: c.status, output: rawJSON(c.output), parent: &ref})
		}
	}
	return out, nil
}
