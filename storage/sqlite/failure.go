package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"

	"github.com/dagrun/dagrun/storage"
)

// ExpireInstances implements storage.TimeoutStore. A limit below 1 means
// 1000.
func (s *Store) ExpireInstances(ctx context.Context, limit int, plan storage.PlanFunc) (int, error) {
	return s.sweep(ctx, "expire instances", plan, limit, `SELECT EXISTS (SELECT 1 FROM instances
			WHERE status = 'running' AND deadline IS NOT NULL AND deadline <= ?)`, func(t *txn, limit int) (int, error) {
		rows, err := t.query(`SELECT id FROM instances WHERE status = 'running' AND deadline IS NOT NULL AND deadline <= ?
			ORDER BY deadline LIMIT CAST(? AS INTEGER)`, us(t.now), limit)
		if err != nil {
			return 0, err
		}
		ids, err := column[string](rows)
		if err != nil {
			return 0, err
		}
		return len(ids), t.expire(ids, plan)
	})
}

// sweep is what the sweeps of passed times share. Most calls find nothing
// due, so it first looks without taking the write lock, with due (a
// SELECT EXISTS whose parameter is now); then run, in a write
// transaction, handles up to limit (below 1: 1000) and returns how many
// it handled. Workers hear of any. op names the sweep in errors.
func (s *Store) sweep(ctx context.Context, op string, plan storage.PlanFunc, limit int, due string, run func(t *txn, limit int) (int, error)) (int, error) {
	if plan == nil {
		return 0, fmt.Errorf("sqlite: %s: nil PlanFunc", op)
	}
	if limit < 1 {
		limit = 1000
	}
	var found bool
	if err := s.read(ctx, op, func(tx *sql.Tx) error {
		return tx.QueryRowContext(ctx, due, us(s.now())).Scan(&found)
	}); err != nil || !found {
		return 0, err
	}
	var n int
	err := s.write(ctx, op, func(t *txn) (err error) {
		n, err = run(t, limit)
		return err
	})
	if err != nil {
		return 0, err
	}
	if n > 0 {
		s.notify()
	}
	return n, nil
}

// expire plans the timed-out instances, and fails the ones whose plan
// neither failed them nor recorded their failure. A failing instance
// (a step failed for good while others ran an attempt) has its deadline
// until those attempts end: its timeout cancels them first.
func (t *txn) expire(ids []string, plan storage.PlanFunc) error {
	// A failing instance waits for the attempts of its main steps:
	// its timeout stops them, then the plan goes on.
	if err := t.stopFailing(ids); err != nil {
		return err
	}
	t.timedOut = make(map[string]bool, len(ids))
	for _, id := range ids {
		t.timedOut[id] = true
	}
	err := t.plan(ids, plan)
	t.timedOut = nil
	if err != nil {
		return err
	}
	idsJSON, err := json.Marshal(ids)
	if err != nil {
		return err
	}
	overruled, err := t.timeouts(`SELECT id, timeout_us FROM instances WHERE id IN (SELECT value FROM json_each(?))
		AND status = 'running' AND NOT failing`, string(idsJSON))
	if err != nil {
		return err
	}
	for id, timeout := range overruled {
		msg := storage.WorkflowTimeoutError(timeout)
		if err := t.finishInstance(id, storage.InstanceChange{Status: storage.InstanceFailed, Error: msg}, true); err != nil {
			return err
		}
	}
	return nil
}

// recordFailure applies a Plan's Failure: the instance keeps its error
// and runs its onFailure steps, and its unfinished main steps (and their
// items) are cancelled, but for the running attempts of plain steps
// (neither forEach nor workflow steps), which finish unless the instance
// timed out: in-flight work is not aborted halfway. It has no deadline
// any more once none of those runs (see expire).
func (t *txn) recordFailure(l *loaded, f *storage.Failure) error {
	id := l.state.ID
	now := us(t.now)
	stop := t.timedOut[id]
	if _, err := t.exec(`UPDATE instances SET failing = 1, error = ?1, failed_step = ?2,
			deadline = CASE WHEN ?4 OR NOT EXISTS (SELECT 1 FROM steps WHERE instance_id = ?3 AND item_index = -1 AND `+runningAttempt+`)
				THEN NULL ELSE deadline END
		WHERE id = ?3`, f.Error, f.Step, id, stop); err != nil {
		return err
	}
	rows, err := t.query(`UPDATE steps SET status = 'cancelled', finished_at = ?1, lease_until = NULL, deadline = NULL
		WHERE instance_id = ?2 AND status IN ('blocked', 'pending', 'running', 'waiting') AND on_failure = 0
			AND (parent_id IS NULL OR parent_id NOT IN (SELECT id FROM steps WHERE instance_id = ?2 AND item_index = -1 AND on_failure))
			AND (?3 OR parent_id IS NOT NULL OR NOT (`+runningAttempt+`))
		RETURNING name, attempts, item_index`, now, id, stop)
	if err != nil {
		return err
	}
	if err := eachRow(rows, func(sc scanner) error {
		var (
			name            string
			attempts, index int
		)
		if err := sc.Scan(&name, &attempts, &index); err != nil {
			return err
		}
		if index < 0 {
			t.event(id, name, storage.EventStepCancelled, attempts, f.Error)
			if i := l.index(name); i >= 0 {
				l.state.Steps[i].Status = storage.StepCancelled
			}
		}
		return nil
	}); err != nil {
		return err
	}
	t.event(id, "", storage.EventInstanceFailing, 0, f.Error)
	l.state.Failure = f
	// The children of the workflow steps (and items) it cancelled are
	// cancelled with them, as when the instance fails: a child is no
	// attempt to wait for. Its only unfinished children are theirs: its
	// onFailure steps have not started yet.
	return t.cancelChildren(id, storage.InstanceFailed)
}

// timeouts runs query, which returns instances' id and timeout_us, and
// maps each instance to its workflow timeout.
func (t *txn) timeouts(query string, args ...any) (map[string]time.Duration, error) {
	rows, err := t.query(query, args...)
	if err != nil {
		return nil, err
	}
	out := map[string]time.Duration{}
	err = eachRow(rows, func(sc scanner) error {
		var (
			id      string
			timeout int64
		)
		err := sc.Scan(&id, &timeout)
		out[id] = time.Duration(timeout) * time.Microsecond
		return err
	})
	return out, err
}

// inFlightMain tells a main step (of the row's instance, item_index -1)
// that runs an attempt: running with a lease, neither a forEach step
// (its items run) nor a workflow step (its child runs), or pending again
// after a snooze or a release while its instance is failing.
const inFlightMain = `(status = 'running' AND for_each = 0 AND child_workflow = '' OR status = 'pending') AND NOT on_failure`

// runningAttempt tells a main step that runs an attempt as its instance
// begins to fail: the attempts it lets finish. A step pending then (a
// retry's backoff, a snooze, a delay) runs none and is cancelled.
const runningAttempt = `status = 'running' AND for_each = 0 AND child_workflow = '' AND NOT on_failure`

// stopFailing cancels the main steps of failing instances (among ids)
// that still run an attempt, as their workflow timeout passed; the
// instances have no deadline any more.
func (t *txn) stopFailing(ids []string) error {
	idsJSON, err := json.Marshal(ids)
	if err != nil {
		return err
	}
	failing, err := t.timeouts(`UPDATE instances SET deadline = NULL
		WHERE id IN (SELECT value FROM json_each(?)) AND status = 'running' AND failing
		RETURNING id, timeout_us`, string(idsJSON))
	if err != nil {
		return err
	}
	for id, timeout := range failing {
		msg := storage.WorkflowTimeoutError(timeout)
		rows, err := t.query(`UPDATE steps SET status = 'cancelled', finished_at = ?1, lease_until = NULL, deadline = NULL
			WHERE instance_id = ?2 AND item_index = -1 AND `+inFlightMain+`
			RETURNING name, attempts`, us(t.now), id)
		if err != nil {
			return err
		}
		if err := eachRow(rows, func(sc scanner) error {
			var (
				name     string
				attempts int
			)
			if err := sc.Scan(&name, &attempts); err != nil {
				return err
			}
			t.event(id, name, storage.EventStepCancelled, attempts, msg)
			return nil
		}); err != nil {
			return err
		}
	}
	return nil
}

// rearmFailure readies a retried instance for another failure: its
// onFailure steps are blocked again whatever they did (they run only if it
// fails again), its failure is forgotten, and its workflow timeout counts
// again from the retry, or, for one that never started, from the claim
// that starts it (startInstances).
func (t *txn) rearmFailure(id string) error {
	now := us(t.now)
	if _, err := t.exec(`DELETE FROM steps WHERE parent_id IN (SELECT id FROM steps WHERE instance_id = ? AND item_index = -1 AND on_failure)`, id); err != nil {
		return err
	}
	if _, err := t.exec(`UPDATE steps SET status = 'blocked', attempts = 0, input = NULL, output = NULL, error = '',
			run_after = 0, ready_at = NULL, first_started_at = NULL, started_at = NULL, finished_at = NULL,
			lease_until = NULL, worker_id = '', deadline = NULL
		WHERE instance_id = ? AND item_index = -1 AND on_failure AND status <> 'blocked'`, id); err != nil {
		return err
	}
	_, err := t.exec(`UPDATE instances SET failing = 0, failed_step = '',
		deadline = CASE WHEN timeout_us > 0 AND started_at IS NOT NULL THEN ? + timeout_us END WHERE id = ?`, now, id)
	return err
}
