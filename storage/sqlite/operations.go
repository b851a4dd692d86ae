package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"

	"github.com/dagrun/dagrun/storage"
)

var _ storage.Operator = (*Store)(nil)

// writeBy is write for an operation done by hand: every event the
// transaction writes carries the actor of ctx. Writes are serial, so the
// events after the newest one at the start are this transaction's.
func (s *Store) writeBy(ctx context.Context, op string, fn func(t *txn) error) error {
	actor := storage.ActorOf(ctx)
	return s.write(ctx, op, func(t *txn) error {
		var last int64
		if actor != "" {
			if err := t.queryRow(`SELECT coalesce(max(id), 0) FROM events`).Scan(&last); err != nil {
				return err
			}
		}
		if err := fn(t); err != nil {
			return err
		}
		if actor == "" {
			return nil
		}
		if err := t.flushEvents(); err != nil {
			return err
		}
		_, err := t.exec(`UPDATE events SET actor = ? WHERE id > ?`, actor, last)
		return err
	})
}

// opStep is a step row as an operation sees it.
type opStep struct {
	id      int64
	state   storage.StepState
	forEach bool
	signal  string
}

// opSteps reads the steps of an instance in definition order.
func (t *txn) opSteps(id string) ([]opStep, []storage.StepState, error) {
	rows, err := t.query(`SELECT id, name, depends_on, status, for_each, wait_signal FROM steps
		WHERE instance_id = ? AND item_index = -1 ORDER BY position`, id)
	if err != nil {
		return nil, nil, err
	}
	var (
		out    []opStep
		states []storage.StepState
	)
	err = eachRow(rows, func(sc scanner) error {
		var (
			s    opStep
			deps []byte
		)
		if err := sc.Scan(&s.id, &s.state.Name, &deps, &s.state.Status, &s.forEach, &s.signal); err != nil {
			return err
		}
		if err := json.Unmarshal(deps, &s.state.DependsOn); err != nil {
			return err
		}
		out, states = append(out, s), append(states, s.state)
		return nil
	})
	return out, states, err
}

func indexOf(steps []opStep, name string) int {
	for i := range steps {
		if steps[i].state.Name == name {
			return i
		}
	}
	return -1
}

// revivedStatus is the status an instance that finished takes when it is
// made to run again: running if it had started, pending if no claim (nor
// wait or child) ever started it, so that its first claim starts it as it
// would a new instance, with its instance.started event and its workflow
// timeout counted from then.
const revivedStatus = `CASE WHEN started_at IS NULL THEN 'pending' ELSE 'running' END`

// revivedRunAfter is the run_after of an instance made to run again (?2
// is now), which the steps it makes ready take: its own if it has come,
// so that they keep its place among the ready steps, and now if not, so
// that an instance cancelled before its delayed start runs at once
// rather than at that start.
const revivedRunAfter = `min(run_after, ?2)`

// rerun makes the steps at indexes blocked as if they had never run
// (attempts, input, output, error and timings cleared, the items of a
// forEach step deleted, the signal a wait step received forgotten, so that
// it waits for a new one), and the finished instance unfinished again (see
// revivedStatus and revivedRunAfter), not paused, with an instance.retried
// event saying why (msg).
func (t *txn) rerun(instanceID string, steps []opStep, indexes []int, msg string) error {
	for _, i := range indexes {
		s := steps[i]
		if s.forEach {
			if _, err := t.exec(`DELETE FROM steps WHERE parent_id = ?`, s.id); err != nil {
				return err
			}
		}
		if s.signal != "" {
			if _, err := t.exec(`DELETE FROM signals WHERE instance_id = ? AND name = ?`, instanceID, s.signal); err != nil {
				return err
			}
		}
		if _, err := t.exec(`UPDATE steps SET status = 'blocked', attempts = 0, input = NULL, output = NULL, error = '',
				run_after = 0, ready_at = NULL, first_started_at = NULL, started_at = NULL, finished_at = NULL,
				lease_until = NULL, worker_id = '', deadline = NULL
			WHERE id = ?`, s.id); err != nil {
			return err
		}
	}
	id := instanceID
	if _, err := t.exec(`UPDATE instances SET status = `+revivedStatus+`, output = NULL, error = '', finished_at = NULL,
		paused = 0, run_after = `+revivedRunAfter+` WHERE id = ?1`, id, us(t.now)); err != nil {
		return err
	}
	t.event(id, "", storage.EventInstanceRetried, 0, msg)
	// Its onFailure steps run again only if it fails again.
	return t.rearmFailure(id)
}

// replan is writeBy for an operation that changes steps of instance id
// with fn, then plans the instance and wakes the claimers.
func (s *Store) replan(ctx context.Context, op, id string, plan storage.PlanFunc, fn func(t *txn) error) error {
	if plan == nil {
		return fmt.Errorf("sqlite: %s: nil PlanFunc", op)
	}
	err := s.writeBy(ctx, op, func(t *txn) error {
		if err := fn(t); err != nil {
			return err
		}
		return t.plan([]string{id}, plan)
	})
	if err != nil {
		return err
	}
	s.notify()
	return nil
}

// RetryFrom implements storage.Operator.
func (s *Store) RetryFrom(ctx context.Context, id, step string, plan storage.PlanFunc) error {
	return s.replan(ctx, "retry from", id, plan, func(t *txn) error {
		status, err := t.instanceStatus(id)
		if err != nil {
			return err
		}
		if !status.Finished() {
			return storage.RetryFromRefusal(id, status)
		}
		if err := t.refuseChild(id); err != nil {
			return err
		}
		steps, states, err := t.opSteps(id)
		if err != nil {
			return err
		}
		if indexOf(steps, step) < 0 {
			return storage.UnknownStepError(id, step, states)
		}
		// The step and what depends on it run afresh; the other failed and
		// cancelled steps run again as a retry runs them, keeping what
		// their items and children completed.
		if err := t.rerun(id, steps, storage.Indexes(states, storage.Downstream(states, step)), "from "+step); err != nil {
			return err
		}
		if err := t.rearmItems(id); err != nil {
			return err
		}
		t.planFn = plan // a child retried that had completed settles its step
		children, err := t.rearmFailedSteps(id)
		t.replan = append(t.replan, children...)
		return err
	})
}

// SkipStep implements storage.Operator.
func (s *Store) SkipStep(ctx context.Context, id, step string, output json.RawMessage, plan storage.PlanFunc) error {
	if len(output) == 0 {
		output = json.RawMessage("null")
	}
	return s.replan(ctx, "skip step", id, plan, func(t *txn) error {
		status, err := t.instanceStatus(id)
		if err != nil {
			return err
		}
		steps, states, err := t.opSteps(id)
		if err != nil {
			return err
		}
		i := indexOf(steps, step)
		if i < 0 {
			return storage.UnknownStepError(id, step, states)
		}
		target := steps[i]
		if status == storage.InstanceCompleted || status == storage.InstanceCancelled || !storage.Skippable(target.state.Status) {
			return storage.SkipRefusal(id, step, status, target.state.Status)
		}
		if status == storage.InstanceRunning {
			var failing bool
			if err := t.queryRow(`SELECT i.failing AND NOT s.on_failure FROM instances i, steps s WHERE i.id = ? AND s.id = ?`,
				id, target.id).Scan(&failing); err != nil {
				return err
			}
			if failing {
				return storage.SkipWhileFailingRefusal(id)
			}
		}
		if status == storage.InstanceFailed {
			// Skipping in a failed child would run it again while its
			// parent step stays failed.
			if err := t.refuseChild(id); err != nil {
				return err
			}
		}
		if target.forEach {
			if _, err := t.exec(`DELETE FROM steps WHERE parent_id = ?`, target.id); err != nil {
				return err
			}
		}
		if _, err := t.exec(`UPDATE steps SET status = 'completed', output = ?, error = '', finished_at = ?,
			lease_until = NULL, worker_id = '', deadline = NULL WHERE id = ?`, string(output), us(t.now), target.id); err != nil {
			return err
		}
		t.event(id, step, storage.EventStepCompleted, 0, storage.SkippedByHand)
		if status == storage.InstanceFailed {
			return t.rerun(id, steps, storage.Rerun(states, i, nil), "skip of "+step)
		}
		return nil
	})
}

// pauseState reads what pausing and resuming check.
func (t *txn) pauseState(id string) (storage.InstanceStatus, bool, error) {
	var (
		status storage.InstanceStatus
		paused bool
	)
	if err := t.queryRow(`SELECT status, paused FROM instances WHERE id = ?`, id).Scan(&status, &paused); err != nil {
		return "", false, fmt.Errorf("instance %s: %w", id, interpretError("", err))
	}
	return status, paused, nil
}

// PauseInstance implements storage.Operator: the pending steps are put off
// by storage.PauseShiftMicros; those that become pending later are by the
// statements that make them so (see loaded.due and requeueHeld). Its
// unfinished descendants are paused with it (see pauseTree). The claimers
// are woken: the slots of a rate its steps gave up may bring other steps'
// starts forward.
func (s *Store) PauseInstance(ctx context.Context, id string) error {
	err := s.writeBy(ctx, "pause instance", func(t *txn) error {
		status, paused, err := t.pauseState(id)
		if err != nil {
			return err
		}
		if status.Finished() || paused {
			return storage.PauseRefusal(id, status)
		}
		return t.pauseTree([]string{id}, true)
	})
	if err != nil {
		return err
	}
	s.notify()
	return nil
}

// ResumeInstance implements storage.Operator, for the instance and its
// paused descendants.
func (s *Store) ResumeInstance(ctx context.Context, id string) error {
	err := s.writeBy(ctx, "resume instance", func(t *txn) error {
		status, paused, err := t.pauseState(id)
		if err != nil {
			return err
		}
		if status.Finished() || !paused {
			return storage.ResumeRefusal(id, status)
		}
		return t.pauseTree([]string{id}, false)
	})
	if err != nil {
		return err
	}
	s.notify()
	return nil
}

// pauseTree pauses (or resumes) the unfinished instances of roots and of
// their descendants not paused (or resumed) yet, each with its event.
// Children are held with their parent, as a cancel reaches them: a paused
// parent whose children ran on would finish while paused.
func (t *txn) pauseTree(roots []string, pause bool) error {
	list, err := json.Marshal(roots)
	if err != nil {
		return err
	}
	rows, err := t.query(`WITH RECURSIVE tree (id) AS (
			SELECT value FROM json_each(?1)
			UNION
			SELECT i.id FROM instances i JOIN tree ON i.parent_id = tree.id
		)
		SELECT id FROM instances WHERE id IN tree AND finished_at IS NULL AND paused <> ?2 ORDER BY id`, string(list), pause)
	if err != nil {
		return err
	}
	ids, err := column[string](rows)
	if err != nil {
		return err
	}
	shift, event := `run_after + `+pauseShift, storage.EventInstancePaused
	if !pause {
		shift, event = `run_after - `+pauseShift, storage.EventInstanceResumed
	}
	freed := map[string]int64{}
	for _, id := range ids {
		if _, err := t.exec(`UPDATE instances SET paused = ? WHERE id = ?`, pause, id); err != nil {
			return err
		}
		if pause {
			if err := t.giveUpRateSlots(id, freed); err != nil {
				return err
			}
		}
		if _, err := t.exec(`UPDATE steps SET run_after = `+shift+`
			WHERE instance_id = ? AND status = 'pending' AND (? OR run_after > `+pauseShift+`)`, id, pause); err != nil {
			return err
		}
		t.event(id, "", event, 0, "")
	}
	if pause {
		for queue, from := range freed {
			if err := t.compactRate(queue, from); err != nil {
				return err
			}
		}
		return nil
	}
	if err := t.retakeSlots(ids); err != nil {
		return err
	}
	for _, id := range ids {
		if err := t.admitResumed(id); err != nil {
			return err
		}
	}
	return t.releaseResumed(ids)
}

// giveUpRateSlots makes the pending steps of instance id, being paused,
// give up the slots their queues' rates gave them that are still ahead,
// so that the steps spaced out after them need not wait for a paused
// instance (see compactRate). They wait for no time of their own, so they
// become due now; a resume gives them new slots (retakeSlots). freed
// collects, by queue, the earliest slot given up.
func (t *txn) giveUpRateSlots(id string, freed map[string]int64) error {
	now := us(t.now)
	rows, err := t.query(`SELECT queue, min(run_after) FROM steps
		WHERE instance_id = ?1 AND run_after > ?2 AND `+rateSlotSQL+` GROUP BY queue`, id, now)
	if err != nil {
		return err
	}
	if err := eachRow(rows, func(sc scanner) error {
		var (
			queue string
			from  int64
		)
		if err := sc.Scan(&queue, &from); err != nil {
			return err
		}
		if f, ok := freed[queue]; !ok || from < f {
			freed[queue] = from
		}
		return nil
	}); err != nil {
		return err
	}
	_, err = t.exec(`UPDATE steps SET run_after = ?2 WHERE instance_id = ?1 AND run_after > ?2 AND `+rateSlotSQL, id, now)
	return err
}

// retakeSlots makes the pending steps of the resumed instances ids
// under a limit (a step key, their queue's concurrency or rate) take
// their slots again, as steps made ready now would: while paused they
// held none (every count of a limit's slots leaves out a paused step),
// and another step may have taken theirs. Those that are due are held,
// for releaseResumed to release those that fit, in release order, each
// with the rate's next slot from now (steps_limits_released): they gave
// up their rate slots when paused, or the slots passed, or they were made
// ready while paused, which takes none. Those that start later (a retry's
// backoff) take their slots when their time comes, as delayed steps do
// (slots_due, rate_slot_due); those marked so already are left to that.
func (t *txn) retakeSlots(ids []string) error {
	list, err := json.Marshal(ids)
	if err != nil {
		return err
	}
	now := us(t.now)
	if _, err := t.exec(`UPDATE steps SET run_after = `+heldUS+`, slots_due = 0, rate_slot_due = 0, promoted = 0
		WHERE instance_id IN (SELECT value FROM json_each(?1)) AND status = 'pending' AND run_after <= ?2
			AND (concurrency_key IS NOT NULL OR queue_limited = 1)
			AND NOT ((slots_due = 1 OR rate_slot_due = 1) AND run_after > ready_at)`, string(list), now); err != nil {
		return err
	}
	_, err = t.exec(`UPDATE steps SET slots_due = 1, rate_slot_due = queue_limited
		WHERE instance_id IN (SELECT value FROM json_each(?1)) AND status = 'pending' AND run_after > ?2
			AND run_after < `+heldUS+` AND promoted = 0 AND slots_due = 0 AND (concurrency_key IS NOT NULL OR queue_limited = 1)`,
		string(list), now)
	return err
}

// admitResumed admits a resumed instance held by its workflow's
// concurrency limit if its key has room and its time has come by the
// terms of a finish's admission (instances_limits_release), which passes
// over paused instances: a slot that freed while it was paused went to
// none of it.
func (t *txn) admitResumed(id string) error {
	res, err := t.exec(`UPDATE instances SET held = 0 WHERE id = ?1 AND held = 1 AND finished_at IS NULL
		AND (parked = 1 OR run_after <= ?2 OR run_after <= created_at
			OR EXISTS (SELECT 1 FROM steps s WHERE s.instance_id = instances.id AND s.status = 'pending'
				AND s.run_after = `+heldUS+` AND s.slots_due = 0))
		AND `+keyHasRoomSQL, id, us(t.now))
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return err
	}
	_, err = t.exec(`UPDATE steps SET held_by_instance = 0 WHERE instance_id = ? AND held_by_instance = 1`, id)
	return err
}

// releaseResumedPickSQL picks the held step of the instances ?2 (a JSON
// list) that goes next, of those that fit now: highest priority first,
// then oldest, as releaseHeldPickSQL.
const releaseResumedPickSQL = `SELECT h.id FROM steps h
	WHERE h.instance_id IN (SELECT value FROM json_each(?2)) AND h.status = 'pending'
		AND h.run_after = ` + heldUS + ` AND ` + fitsSQL + `
	ORDER BY h.priority DESC, h.id LIMIT 1`

// releaseResumed releases the held steps of resumed instances that fit
// now, one per statement. A step that was paused while held was passed
// over by the releases of its limits, which take only steps held and not
// paused: its slot may have freed (or its instance been admitted by its
// workflow's limit) meanwhile, and no finish would come to release it.
func (t *txn) releaseResumed(ids []string) error {
	list, err := json.Marshal(ids)
	if err != nil {
		return err
	}
	for {
		res, err := t.exec(`UPDATE steps SET run_after = ?1 WHERE id = (`+releaseResumedPickSQL+`)`, us(t.now), string(list))
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			return err
		}
	}
}

// MatchInstances implements storage.Operator.
func (s *Store) MatchInstances(ctx context.Context, f storage.InstanceFilter) ([]string, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = 1000
	}
	var before int64
	if !f.CreatedBefore.IsZero() {
		before = us(f.CreatedBefore)
	}
	var ids []string
	err := s.read(ctx, "match instances", func(tx *sql.Tx) error {
		rows, err := tx.QueryContext(ctx, `SELECT id FROM instances
			WHERE (?1 = '' OR workflow = ?1) AND (?2 = '' OR status = ?2) AND (?3 = 0 OR created_at < ?3) AND id > ?5
				AND (NOT ?6 OR parent_id IS NULL)
			ORDER BY id LIMIT CAST(?4 AS INTEGER)`, f.Workflow, string(f.Status), before, limit, f.AfterID, f.TopLevel)
		if err != nil {
			return err
		}
		ids, err = column[string](rows)
		return err
	})
	return ids, err
}
