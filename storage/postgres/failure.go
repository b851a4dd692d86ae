package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dagrun/dagrun/storage"
)

// failureChanges holds the Failures plans recorded, as parallel arrays.
type failureChanges struct {
	ids, errors, steps []string
}

// add records f for l's instance and updates l's state as the store will
// leave it: its unfinished main steps cancelled.
func (c *failureChanges) add(l *loaded, f *storage.Failure) {
	if f == nil {
		return
	}
	c.ids = append(c.ids, l.state.ID)
	c.errors = append(c.errors, f.Error)
	c.steps = append(c.steps, f.Step)
	for i := range l.state.Steps {
		if ss := &l.state.Steps[i]; !l.onFailure[i] && !ss.Status.Finished() {
			ss.Status = storage.StepCancelled
		}
	}
	l.state.Failure = f
}

// recordFailuresSQL keeps the failures on their instances (which stay
// running, without a deadline) and cancels their unfinished main steps
// and the items of those, running ones included, with the events of both.
// The onFailure steps, and their items, are left alone.
const recordFailuresSQL = `
WITH x AS (
	SELECT * FROM unnest($2::text[], $3::text[], $4::text[]) AS x(id, error, step)
),
i AS (
	UPDATE {s}instances i SET failing = true, error = x.error, failed_step = x.step, deadline = NULL
	FROM x WHERE i.id = x.id AND i.status IN ('pending', 'running')
	RETURNING i.id, i.error
),
c AS (
	UPDATE {s}steps s SET status = 'cancelled', finished_at = {now}, lease_until = NULL, deadline = NULL
	FROM i
	WHERE s.instance_id = i.id AND s.status IN ('blocked', 'pending', 'running', 'waiting') AND NOT s.on_failure
		AND (s.parent_id IS NULL OR s.parent_id NOT IN (
			SELECT f.id FROM {s}steps f WHERE f.instance_id = i.id AND f.item_index = -1 AND f.on_failure))
	RETURNING s.instance_id, s.name, s.attempts, s.position, s.item_index, i.error
),
ev AS (
	SELECT c.instance_id, c.name AS step, 'step.cancelled' AS type, c.attempts AS attempt, c.error AS message, 0 AS ord, c.position
	FROM c WHERE c.item_index = -1 -- items have no events of their own
	UNION ALL
	SELECT i.id, '', 'instance.failing', 0, i.error, 1, 0 FROM i
)
INSERT INTO {s}events (instance_id, step, type, attempt, message, at)
SELECT ev.instance_id, ev.step, ev.type, ev.attempt, ev.message, {now}
FROM ev ORDER BY ev.instance_id, ev.ord, ev.position`

// queueFailures queues the recording of the failures on the tail.
func (s *Store) queueFailures(st *txState, now *time.Time, c *failureChanges) {
	if len(c.ids) > 0 {
		st.tail.Queue(s.q(recordFailuresSQL), now, c.ids, c.errors, c.steps)
	}
}

// rearmFailureSQL readies a retried instance ($2) for another failure: its
// onFailure steps are blocked again whatever they did (their items gone),
// its failure is forgotten, and its workflow timeout counts again from
// the retry. It runs after retrySQL, on the rows that left.
const rearmFailureSQL = `
WITH d AS (
	DELETE FROM {s}steps WHERE parent_id IN (
		SELECT id FROM {s}steps WHERE instance_id = $2 AND item_index = -1 AND on_failure)
),
st AS (
	UPDATE {s}steps SET status = 'blocked', attempts = 0, input = NULL, output = NULL, error = '',
		run_after = NULL, ready_at = NULL, first_started_at = NULL, started_at = NULL, finished_at = NULL,
		lease_until = NULL, worker_id = '', deadline = NULL
	WHERE instance_id = $2 AND item_index = -1 AND on_failure AND status <> 'blocked'
)
UPDATE {s}instances SET failing = false, failed_step = '',
	deadline = CASE WHEN timeout_us > 0 THEN {now} + timeout_us * interval '1 microsecond' END
WHERE id = $2`

// rearmFailure queues rearmFailureSQL and updates l's state as it leaves
// it.
func (s *Store) rearmFailure(st *txState, now *time.Time, l *loaded) {
	st.tail.Queue(s.q(rearmFailureSQL), now, l.state.ID)
	for i := range l.state.Steps {
		if ss := &l.state.Steps[i]; l.onFailure[i] {
			*ss = storage.StepState{Name: ss.Name, DependsOn: ss.DependsOn, Status: storage.StepBlocked}
		}
	}
	l.state.Failure = nil
}

// expiredInstancesSQL finds running instances past their deadline.
const expiredInstancesSQL = `
SELECT id FROM {s}instances WHERE status = 'running' AND deadline IS NOT NULL AND deadline <= {now}
ORDER BY deadline LIMIT $2`

// ExpireInstances implements storage.TimeoutStore. A limit below 1 means
// 1000.
func (s *Store) ExpireInstances(ctx context.Context, limit int, plan storage.PlanFunc) (int, error) {
	return s.sweep(ctx, "expire instances", expiredInstancesSQL, limit, plan, func(tx pgx.Tx, st *txState, now *time.Time, ids []string) (int, error) {
		ls, err := s.lock(ctx, tx, ids)
		if err != nil {
			return 0, err
		}
		var expired []*loaded
		var b pgx.Batch
		for _, id := range ids {
			// Locked now: another process may have finished it, or
			// recorded its failure, since the query.
			if l := ls[id]; l != nil && l.state.Status == storage.InstanceRunning && l.state.Failure == nil {
				l.state.TimedOut = time.Duration(l.timeout) * time.Microsecond
				expired = append(expired, l)
				// Its running steps are cancelled: lock them in id order,
				// as a cancel does, so as not to deadlock with a
				// heartbeat or a finish.
				b.Queue(s.q(lockUnfinishedStepsSQL), id)
			}
		}
		if len(expired) == 0 {
			return 0, nil
		}
		if err := tx.SendBatch(ctx, &b).Close(); err != nil {
			return 0, err
		}
		return len(expired), s.planAndApply(st, now, expired, checkedTimeout(plan))
	})
}

// checkedTimeout wraps plan so that a timed-out instance always ends or
// records its failure: a plan that does neither is overruled.
func checkedTimeout(plan storage.PlanFunc) storage.PlanFunc {
	return func(state *storage.InstanceState) (*storage.Plan, error) {
		p, err := plan(state)
		if err != nil || state.TimedOut == 0 || state.Failure != nil {
			return p, err
		}
		if p == nil {
			p = &storage.Plan{}
		}
		if p.Instance == nil && p.Failure == nil {
			p.Instance = &storage.InstanceChange{Status: storage.InstanceFailed, Error: storage.WorkflowTimeoutError(state.TimedOut)}
		}
		return p, nil
	}
}
