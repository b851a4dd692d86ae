package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dagrun/dagrun/storage"
)

// failureChanges holds the Failures plans recorded, as parallel arrays;
// stop tells a timed-out instance, whose running attempts are cancelled
// too.
type failureChanges struct {
	ids, errors, steps []string
	stop               []bool
}

// add records f for l's instance and updates l's state as the store will
// leave it: its unfinished main steps cancelled, but for the running
// ones when the instance did not time out (a forEach or workflow step
// among them is cancelled all the same, which the state does not show:
// the plan tells those apart by its definition).
func (c *failureChanges) add(l *loaded, f *storage.Failure) {
	if f == nil {
		return
	}
	stop := l.state.TimedOut > 0
	c.ids = append(c.ids, l.state.ID)
	c.errors = append(c.errors, f.Error)
	c.steps = append(c.steps, f.Step)
	c.stop = append(c.stop, stop)
	for i := range l.state.Steps {
		ss := &l.state.Steps[i]
		if l.onFailure[i] || ss.Status.Finished() || !stop && ss.Status == storage.StepRunning {
			continue
		}
		ss.Status = storage.StepCancelled
	}
	l.state.Failure = f
}

// inFlightMainSQL tells a main step (s, item_index -1) that runs an
// attempt: running with a lease, neither a forEach step (its items run)
// nor a workflow step (its child runs), or pending again after a snooze
// or a release while its instance is failing.
const inFlightMainSQL = `((s.status = 'running' AND NOT s.for_each AND s.child_workflow = '' OR s.status = 'pending') AND NOT s.on_failure)`

// runningAttemptSQL tells a main step (s) that runs an attempt as its
// instance begins to fail: the attempts it lets finish. A step pending
// then (a retry's backoff, a snooze, a delay) runs none and is cancelled.
// It is inFlightMainSQL without the pending steps rather than a plain
// status = 'running', which a generic plan would answer through the
// partial index of running steps instead of the instance's key
// (TestKeyedWritesSkipInFlightIndexes).
const runningAttemptSQL = `(` + inFlightMainSQL + ` AND s.status <> 'pending')`

// recordFailuresSQL keeps the failures on their instances (which stay
// running, failing) and cancels their unfinished main steps and the items
// of those, with the events of both; but for the running attempts of
// plain steps when a step failed (x.stop false: not a timeout), which
// finish (in-flight work is not aborted halfway), the instance keeping
// its deadline until they end. The onFailure steps, and their items, are
// left alone.
const recordFailuresSQL = `
WITH x AS (
	SELECT * FROM unnest($2::text[], $3::text[], $4::text[], $5::bool[]) AS x(id, error, step, stop)
),
i AS (
	UPDATE {s}instances i SET failing = true, error = x.error, failed_step = x.step,
		deadline = CASE WHEN x.stop OR NOT EXISTS (
			SELECT 1 FROM {s}steps s WHERE s.instance_id = i.id AND s.item_index = -1 AND ` + runningAttemptSQL + `)
			THEN NULL ELSE i.deadline END
	FROM x WHERE i.id = x.id AND i.status IN ('pending', 'running')
	RETURNING i.id, i.error, x.stop
),
c AS (
	UPDATE {s}steps s SET status = 'cancelled', finished_at = {now}, lease_until = NULL, deadline = NULL
	FROM i
	WHERE s.instance_id = i.id AND s.status IN ('blocked', 'pending', 'running', 'waiting') AND NOT s.on_failure
		AND (s.parent_id IS NULL OR s.parent_id NOT IN (
			SELECT f.id FROM {s}steps f WHERE f.instance_id = i.id AND f.item_index = -1 AND f.on_failure))
		AND (i.stop OR s.parent_id IS NOT NULL OR NOT ` + runningAttemptSQL + `)
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

// orphansSQL finds, locked in id order, the unfinished children of the
// workflow steps (and items) of failing instances ($1) that their
// recorded failure cancelled.
const orphansSQL = `
SELECT i.id, i.parent_id FROM {s}instances i
WHERE i.parent_id = ANY($1::text[]) AND i.finished_at IS NULL AND EXISTS (
	SELECT 1 FROM {s}steps s WHERE s.instance_id = i.parent_id AND s.child_id = i.id AND s.status = 'cancelled')
ORDER BY i.id FOR NO KEY UPDATE OF i`

// orphan is a child instance whose workflow step a recorded failure
// cancelled.
type orphan struct{ id, parent string }

// queueFailures queues the recording of the failures on the tail, and
// the search for the children of the workflow steps they cancel, which
// the follow-up cancels (see followUp): a child is no attempt to wait
// for.
func (s *Store) queueFailures(st *txState, now *time.Time, c *failureChanges) {
	if len(c.ids) == 0 {
		return
	}
	st.tail.Queue(s.q(recordFailuresSQL), now, c.ids, c.errors, c.steps, c.stop)
	st.finishing = true
	st.tail.Queue(s.q(orphansSQL), c.ids).Query(func(rows pgx.Rows) error {
		var o orphan
		_, err := pgx.ForEachRow(rows, []any{&o.id, &o.parent}, func() error {
			st.orphans = append(st.orphans, o)
			return nil
		})
		return err
	})
}

// rearmFailureSQL readies a retried instance ($2) for another failure: its
// onFailure steps are blocked again whatever they did (their items gone),
// its failure is forgotten, and its workflow timeout counts again from
// the retry, or, for one that never started, from the claim that starts
// it (startClaimedInstances). It runs after retrySQL, on the rows that
// left.
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
	deadline = CASE WHEN timeout_us > 0 AND started_at IS NOT NULL THEN {now} + timeout_us * interval '1 microsecond' END
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
			if l := ls[id]; l != nil && l.state.Status == storage.InstanceRunning {
				l.state.TimedOut = time.Duration(l.timeout) * time.Microsecond
				expired = append(expired, l)
				// Its running steps are cancelled: lock them in id order,
				// as a cancel does, so as not to deadlock with a
				// heartbeat or a finish.
				b.Queue(s.q(lockUnfinishedStepsSQL), id)
				if l.state.Failure != nil {
					// Failing, it waited for the attempts of its main
					// steps: its timeout stops them, then the plan goes on.
					b.Queue(s.q(stopFailingSQL), now, id, storage.WorkflowTimeoutError(l.state.TimedOut))
					for i := range l.state.Steps {
						if ss := &l.state.Steps[i]; !l.onFailure[i] && (ss.Status == storage.StepRunning || ss.Status == storage.StepPending) {
							ss.Status = storage.StepCancelled
						}
					}
				}
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

// stopFailingSQL cancels the main steps of a failing instance ($2) that
// still run an attempt, its workflow timeout having passed ($3 the
// error), and clears its deadline.
const stopFailingSQL = `
WITH i AS (
	UPDATE {s}instances SET deadline = NULL WHERE id = $2
),
c AS (
	UPDATE {s}steps s SET status = 'cancelled', finished_at = {now}, lease_until = NULL, deadline = NULL
	WHERE s.instance_id = $2 AND s.item_index = -1 AND ` + inFlightMainSQL + `
	RETURNING s.name, s.attempts, s.position
)
INSERT INTO {s}events (instance_id, step, type, attempt, message, at)
SELECT $2, c.name, 'step.cancelled', c.attempts, $3, {now} FROM c ORDER BY c.position`

// clearFailingDeadlineSQL clears the deadline of a failing instance ($1)
// whose main steps run no attempt any more.
const clearFailingDeadlineSQL = `
UPDATE {s}instances i SET deadline = NULL WHERE i.id = $1 AND i.deadline IS NOT NULL AND NOT EXISTS (
	SELECT 1 FROM {s}steps s WHERE s.instance_id = $1 AND s.item_index = -1 AND ` + inFlightMainSQL + `)`

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
