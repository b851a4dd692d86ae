package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/dagrun/dagrun/storage"
)

// waitColumns are a step's wait_signal and wait_timeout_us.
func waitColumns(w *storage.WaitSpec) (string, int64) {
	if w == nil {
		return "", 0
	}
	return w.Signal, w.Timeout.Microseconds()
}

// deadlineUS is the deadline of a wait step that starts waiting at from,
// nil for one without a timeout.
func deadlineUS(from, timeout int64) any {
	if timeout <= 0 {
		return nil
	}
	return from + timeout
}

// wait makes step i of l waiting and delivers a signal of its name sent
// before, completing the step; the instance is then planned again (see
// plan), since its plan was computed before the step completed.
func (t *txn) wait(l *loaded, i int, input json.RawMessage) (storage.StepStatus, error) {
	id, name := l.state.ID, l.state.Steps[i].Name
	now := us(t.now)
	var signal string
	err := t.queryRow(`UPDATE steps SET status = 'waiting', input = ?1, ready_at = ?2, started_at = ?2,
			deadline = CASE WHEN wait_timeout_us > 0 THEN ?3 + wait_timeout_us END
		WHERE id = ?4 AND wait_signal <> '' RETURNING wait_signal`, jsonArg(input), now, max(now, l.runAfter), l.ids[i]).Scan(&signal)
	if errors.Is(err, sql.ErrNoRows) {
		return "", storage.CheckWait(id, false, name)
	}
	if err != nil {
		return "", err
	}
	t.event(id, name, storage.EventStepReady, 0, storage.WaitingMessage(signal))
	var payload []byte
	err = t.queryRow(`UPDATE signals SET delivered = 1 WHERE instance_id = ? AND name = ? AND NOT delivered RETURNING payload`,
		id, signal).Scan(&payload)
	if errors.Is(err, sql.ErrNoRows) {
		return storage.StepWaiting, nil
	}
	if err != nil {
		return "", err
	}
	if err := t.deliver(id, name, signal, l.ids[i], payload); err != nil {
		return "", err
	}
	t.replan = append(t.replan, id)
	return storage.StepCompleted, nil
}

// deliver completes a waiting step with a signal's payload.
func (t *txn) deliver(instanceID, step, signal string, stepID int64, payload []byte) error {
	if _, err := t.exec(`UPDATE steps SET status = 'completed', output = ?, finished_at = ?, deadline = NULL WHERE id = ?`,
		jsonArg(payload), us(t.now), stepID); err != nil {
		return err
	}
	t.event(instanceID, step, storage.EventStepCompleted, 0, storage.DeliveredMessage(signal))
	return nil
}

// SendSignal implements storage.Store. SQLite's single writer serializes
// racing senders: the second sees the first's row.
func (s *Store) SendSignal(ctx context.Context, p storage.SignalParams, plan storage.PlanFunc) (storage.SignalResult, error) {
	if plan == nil {
		return storage.SignalResult{}, errors.New("sqlite: send signal: nil PlanFunc")
	}
	if err := storage.CheckSignalParams(p); err != nil {
		return storage.SignalResult{}, err
	}
	var res storage.SignalResult
	err := s.writeBy(ctx, "send signal", func(t *txn) error {
		res = storage.SignalResult{}
		var status storage.InstanceStatus
		var err error
		if p.InstanceID != "" {
			res.InstanceID = p.InstanceID
			err = t.queryRow(`SELECT status FROM instances WHERE id = ?`, p.InstanceID).Scan(&status)
		} else {
			err = t.queryRow(`SELECT id, status FROM instances WHERE workflow = ? AND idem_key = ?`, p.Workflow, p.Key).Scan(&res.InstanceID, &status)
		}
		if errors.Is(err, sql.ErrNoRows) {
			return signalTargetMissing(p)
		}
		if err != nil {
			return err
		}
		id := res.InstanceID
		var (
			prevID    string
			delivered bool
		)
		err = t.queryRow(`SELECT signal_id, delivered FROM signals WHERE instance_id = ? AND name = ?`, id, p.Name).Scan(&prevID, &delivered)
		switch {
		case err == nil && p.ID != "" && prevID == p.ID:
			res.Duplicate = true
			return nil
		case err == nil:
			return storage.SignalConflict(id, p.Name, delivered)
		case !errors.Is(err, sql.ErrNoRows):
			return err
		}
		if status.Finished() {
			return storage.FinishedConflict(id, status)
		}
		var (
			step       string
			stepID     int64
			stepStatus storage.StepStatus
		)
		err = t.queryRow(`SELECT id, name, status FROM steps WHERE instance_id = ? AND item_index = -1 AND wait_signal = ?`,
			id, p.Name).Scan(&stepID, &step, &stepStatus)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		if err == nil && stepStatus.Finished() {
			return storage.WaitFinishedConflict(id, step, p.Name, stepStatus)
		}
		res.Delivered = err == nil && stepStatus == storage.StepWaiting
		if _, err := t.exec(`INSERT INTO signals (instance_id, name, signal_id, payload, delivered, created_at) VALUES (?, ?, ?, ?, ?, ?)`,
			id, p.Name, p.ID, jsonArg(p.Payload), res.Delivered, us(t.now)); err != nil {
			return err
		}
		if !res.Delivered {
			t.event(id, "", storage.EventSignalReceived, 0, p.Name)
			return nil
		}
		if err := t.deliver(id, step, p.Name, stepID, p.Payload); err != nil {
			return err
		}
		return t.plan([]string{id}, plan)
	})
	if err != nil {
		return storage.SignalResult{}, err
	}
	if res.Delivered {
		s.notify()
	}
	return res, nil
}

// signalTargetMissing is the error of a signal to an instance that does
// not exist.
func signalTargetMissing(p storage.SignalParams) error {
	if p.InstanceID != "" {
		return fmt.Errorf("instance %s: %w", p.InstanceID, storage.ErrNotFound)
	}
	return storage.Refuse(storage.ErrNotFound, "no instance of workflow %s with key %q", p.Workflow, p.Key)
}

// ExpireWaits implements storage.Store. A limit below 1 means 1000.
func (s *Store) ExpireWaits(ctx context.Context, limit int, plan storage.PlanFunc) (int, error) {
	return s.sweep(ctx, "expire waits", plan, limit, `SELECT EXISTS (SELECT 1 FROM steps WHERE status = 'waiting' AND deadline <= ?)`, func(t *txn, limit int) (int, error) {
		now := us(t.now)
		rows, err := t.query(`SELECT id, instance_id, name, wait_signal, wait_timeout_us FROM steps
			WHERE status = 'waiting' AND deadline <= ? ORDER BY deadline LIMIT CAST(? AS INTEGER)`, now, limit)
		if err != nil {
			return 0, err
		}
		type expired struct {
			id                    int64
			instanceID, name, sig string
			timeout               int64
		}
		var exp []expired
		if err := eachRow(rows, func(sc scanner) error {
			var e expired
			if err := sc.Scan(&e.id, &e.instanceID, &e.name, &e.sig, &e.timeout); err != nil {
				return err
			}
			exp = append(exp, e)
			return nil
		}); err != nil {
			return 0, err
		}
		var instances []string
		for _, e := range exp {
			msg := storage.WaitTimeoutError(e.sig, time.Duration(e.timeout)*time.Microsecond)
			if _, err := t.exec(`UPDATE steps SET status = 'failed', error = ?, finished_at = ?, deadline = NULL WHERE id = ?`,
				msg, now, e.id); err != nil {
				return 0, err
			}
			t.event(e.instanceID, e.name, storage.EventStepFailed, 0, msg)
			instances = appendOnce(instances, e.instanceID)
		}
		return len(exp), t.plan(instances, plan)
	})
}

func appendOnce(ids []string, id string) []string {
	for _, x := range ids {
		if x == id {
			return ids
		}
	}
	return append(ids, id)
}

// NextWake implements storage.Store, on a reader connection.
func (s *Store) NextWake(ctx context.Context, p storage.ClaimParams) (time.Time, error) {
	var next time.Time
	err := s.read(ctx, "next wake", func(tx *sql.Tx) error {
		var err error
		next, err = nextWake(p, s.now(), func(query string, args ...any) *sql.Row {
			return tx.QueryRowContext(ctx, query, args...)
		})
		return err
	})
	return next, err
}

// nextWake reads NextWake's answer as of now through queryRow. Only a
// step of steps_delayed can become due later (one in the claim indexes was
// due when it was made pending), so the pending side reads that index from
// now on, never the whole queue. Of the instances whose start was
// deferred it reads those not parked (see startableDeferredSQL), the
// earliest first.
//
// The delayed steps of other queues and handlers are passed over, but
// only wakeWalk of them: when the first wakeWalk delayed steps are all
// others', none of p's falls due before the last of them, and its time is
// the wake. The worker then wakes early and looks again, rather than
// every look reading every other step: a worker of one queue beside
// 200,000 delayed steps of another read all of them at each poll (45 ms;
// BenchmarkHotPaths/NextWakePastOthers).
func nextWake(p storage.ClaimParams, now time.Time, queryRow func(string, ...any) *sql.Row) (time.Time, error) {
	queues, err := json.Marshal(p.Queues)
	if err != nil {
		return time.Time{}, err
	}
	handlers, err := json.Marshal(p.Handlers)
	if err != nil {
		return time.Time{}, err
	}
	var next sql.NullInt64
	err = queryRow(`SELECT min(t) FROM (
			SELECT coalesce(
				(SELECT d.run_after FROM (SELECT run_after, queue, handler FROM steps WHERE `+delayedLater+`
					ORDER BY run_after LIMIT `+wakeWalk+`) d
				WHERE (?2 = '[]' OR ?2 = 'null' OR d.queue IN (SELECT value FROM json_each(?2)))
				AND (?3 = '[]' OR ?3 = 'null' OR d.handler IN (SELECT value FROM json_each(?3)))
				ORDER BY d.run_after LIMIT 1),
				(SELECT run_after FROM steps WHERE `+delayedLater+` ORDER BY run_after LIMIT 1 OFFSET `+wakeWalk+` - 1)) AS t
			UNION ALL
			SELECT min(deadline) FROM steps WHERE status = 'waiting'
			UNION ALL
			SELECT min(deadline) FROM instances WHERE status = 'running' AND deadline IS NOT NULL
			UNION ALL
			-- a parked instance waits for a finish of its key, not a time
			SELECT run_after FROM (SELECT run_after FROM instances WHERE deferred = 1 AND finished_at IS NULL AND parked = 0
				AND paused = 0 ORDER BY run_after LIMIT 1))`, us(now), string(queues), string(handlers)).Scan(&next)
	if err != nil || !next.Valid {
		return time.Time{}, err
	}
	return fromUS(next.Int64), nil
}

// delayedLater is nextWake's condition on a delayed step that falls due
// after ?1, through steps_delayed: not held for a slot (the first bound)
// and not held back by a pause (the second), which wait for a slot or a
// resume, not a time.
const delayedLater = `status = 'pending' AND promoted = 0 AND run_after > ready_at AND run_after > ?1
	AND run_after < ` + heldUS + ` AND run_after < ` + pauseShift

// wakeWalk is how many delayed steps of other queues and handlers
// nextWake passes over at most.
const wakeWalk = "100"
