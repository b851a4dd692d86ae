package sqlite

import (
	"context"
	"database/sql"
	"time"

	"github.com/dagrun/dagrun/storage"
)

// heldUS is storage.HeldUntil as stored: the run_after of a held step (the
// triggers of migration 0006 spell it out too).
const heldUS = "253370764800000000"

// fitsSQL holds for the held step h when every limit it is under has a
// free slot; the triggers of migration 17 use the same test. A pending
// step that waits for its time holds no slot (slots_due).
const fitsSQL = `h.held_by_instance = 0
    AND (h.concurrency_key IS NULL OR (SELECT count(*) FROM steps k
        WHERE k.workflow = h.workflow AND k.name = h.name AND k.concurrency_key = h.concurrency_key
            AND k.status IN ('pending', 'running') AND k.run_after < ` + heldUS + ` AND (k.status = 'running' OR k.slots_due = 0)
            AND k.id <> h.id) < h.concurrency_limit)
    AND (h.queue_limited = 0 OR NOT EXISTS (SELECT 1 FROM queue_limits q WHERE q.queue = h.queue AND q.concurrency > 0
        AND (SELECT count(*) FROM steps c WHERE c.queue_limited = 1 AND c.queue = h.queue
            AND c.status IN ('pending', 'running') AND c.run_after < ` + heldUS + ` AND (c.status = 'running' OR c.slots_due = 0)
            AND c.id <> h.id) >= q.concurrency))`

// runsHandlerSQL holds for a step of table steps that a worker runs, one
// that may take a slot of its queue: not a workflow step, nor an item of
// one, which run no handler and are running while their child instance
// runs (migration 23 marks new rows so).
const runsHandlerSQL = `child_workflow = ''
			AND NOT EXISTS (SELECT 1 FROM steps p WHERE p.id = steps.parent_id AND p.child_workflow <> '')`

func nullText(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// stepKey is the concurrency_key column of a step created in state st.
func stepKey(spec *storage.StepSpec, key string) any {
	if spec.ConcurrencyLimit <= 0 {
		return nil
	}
	return nullText(key)
}

// admit decides which of the new instances with a workflow-level limit are
// held (see storage.Admit).
func (t *txn) admit(instances []*storage.NewInstance) (map[string]bool, error) {
	return storage.Admit(instances, t.now, func(workflow, key string) (count int, err error) {
		err = t.queryRow(`SELECT count(*) FROM instances WHERE workflow = ? AND concurrency_key = ?
			AND finished_at IS NULL AND held = 0`, workflow, key).Scan(&count)
		return count, err
	})
}

// SetQueueLimit implements storage.Store.
func (s *Store) SetQueueLimit(ctx context.Context, c storage.QueueLimitChange) (storage.QueueLimit, error) {
	var l storage.QueueLimit
	err := s.write(ctx, "set queue limit", func(t *txn) (err error) {
		l, err = t.setQueueLimit(c)
		return err
	})
	if err != nil {
		return storage.QueueLimit{}, err
	}
	s.notify()
	return l, nil
}

func (t *txn) setQueueLimit(c storage.QueueLimitChange) (storage.QueueLimit, error) {
	var (
		stored                     = storage.QueueLimit{Queue: c.Queue}
		perUS, oldInterval, oldTat int64
	)
	err := t.queryRow(`SELECT concurrency, rate, per_us, interval_us, tat FROM queue_limits WHERE queue = ?`, c.Queue).
		Scan(&stored.Concurrency, &stored.Rate, &perUS, &oldInterval, &oldTat)
	if err != nil && err != sql.ErrNoRows {
		return storage.QueueLimit{}, err
	}
	stored.Per = time.Duration(perUS) * time.Microsecond
	l := c.Apply(stored)
	if err := l.Check(); err != nil {
		return storage.QueueLimit{}, err // write names the operation
	}
	return l, t.applyQueueLimit(l, oldInterval, oldTat)
}

// applyQueueLimit stores l, which replaces limits spacing a rate by
// oldInterval with its next start at oldTat (zero: none), and applies it
// to the queue's unfinished steps.
func (t *txn) applyQueueLimit(l storage.QueueLimit, oldInterval, oldTat int64) error {
	now := us(t.now)
	interval := l.Interval().Microseconds()
	// A rate that ends or changes lets the steps it had spaced out start
	// now: not those waiting for a time of their own (rate_slot_due), which
	// take their slot of the new rate, if any, when it comes.
	if oldInterval > 0 && interval != oldInterval {
		if _, err := t.exec(`UPDATE steps SET run_after = ?1 WHERE queue = ?2 AND status = 'pending' AND rate_slot_due = 0
			AND run_after > ?1 AND run_after < ?3`, now, l.Queue, oldTat); err != nil {
			return err
		}
	}
	if l.Concurrency == 0 && l.Rate == 0 {
		if _, err := t.exec(`DELETE FROM queue_limits WHERE queue = ?`, l.Queue); err != nil {
			return err
		}
		// Released while they are still marked limited, which is what the
		// release's pick reads them by.
		if err := t.releaseHeld(l.Queue, now); err != nil {
			return err
		}
		if _, err := t.exec(`UPDATE steps SET queue_limited = 0, rate_slot_due = 0 WHERE queue = ? AND queue_limited = 1`, l.Queue); err != nil {
			return err
		}
	} else {
		if _, err := t.exec(`INSERT INTO queue_limits (queue, concurrency, rate, per_us, interval_us, tat, updated_at)
			VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6)
			ON CONFLICT (queue) DO UPDATE SET concurrency = ?2, rate = ?3, per_us = ?4, interval_us = ?5, updated_at = ?6`,
			l.Queue, l.Concurrency, l.Rate, l.Per.Microseconds(), interval, now); err != nil {
			return err
		}
		// Steps that wait for a time of their own take their slots then.
		if _, err := t.exec(`UPDATE steps SET queue_limited = 1,
				rate_slot_due = status = 'pending' AND run_after > ?2 AND run_after < `+heldUS+`,
				slots_due = slots_due OR status = 'pending' AND run_after > ?2 AND run_after < `+heldUS+`
			WHERE queue = ?1 AND queue_limited = 0
			AND status IN ('blocked', 'pending', 'running', 'waiting') AND (parent_id IS NOT NULL OR for_each = 0)
			AND `+runsHandlerSQL+``, l.Queue, now); err != nil {
			return err
		}
	}
	// A new rate spaces out the ready steps from now.
	if interval > 0 && interval != oldInterval {
		if err := t.respace(l.Queue, now, interval, false); err != nil {
			return err
		}
	}
	if l.Concurrency > 0 {
		// Hold the ready steps beyond a lowered limit that a release
		// would take last: the lowest priority, newest first (of those
		// that hold a slot: see migration 17). The status term is
		// repeated for steps_queue_limited, as in releaseHeldPickSQL.
		if _, err := t.exec(`UPDATE steps SET run_after = `+heldUS+` WHERE id IN (
				SELECT id FROM steps WHERE queue = +?1 AND queue_limited = 1 AND status = 'pending' AND status IN ('pending', 'running')
					AND run_after < `+heldUS+` AND slots_due = 0
				ORDER BY priority, id DESC LIMIT max(0, (SELECT count(*) FROM steps c WHERE c.queue = ?1 AND c.queue_limited = 1
					AND c.status IN ('pending', 'running') AND c.run_after < `+heldUS+`
					AND (c.status = 'running' OR c.slots_due = 0)) - ?2))`, l.Queue, l.Concurrency); err != nil {
			return err
		}
	}
	return t.releaseHeld(l.Queue, now)
}

// releaseHeldPickSQL picks the held step of limited queue ?2 that goes
// next: highest priority first, then oldest, of those that fit (see the
// release trigger of migration 19). It repeats the status term of the
// partial index steps_queue_limited, which SQLite does not infer, so that
// it reads the queue's held steps in release order instead of scanning
// the steps table.
const releaseHeldPickSQL = `SELECT h.id FROM steps h
	WHERE h.queue = ?2 AND h.queue_limited = 1 AND h.status = 'pending' AND h.status IN ('pending', 'running')
		AND h.run_after = ` + heldUS + ` AND ` + fitsSQL + `
	ORDER BY h.priority DESC, h.id LIMIT 1`

// releaseHeld releases the held steps of a limited queue that fit now,
// one per statement.
func (t *txn) releaseHeld(queue string, now int64) error {
	for {
		res, err := t.exec(`UPDATE steps SET run_after = ?1 WHERE id = (`+releaseHeldPickSQL+`)`, now, queue)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			return err
		}
	}
}

// respace gives the queue's ready steps start times interval apart from
// now, in claim order, and leaves the rate's next start after the last.
// Steps waiting for a time of their own take their slot when it comes;
// with due, those whose time has come take theirs here too, in claim
// order with the others, instead of as they are promoted.
func (t *txn) respace(queue string, now, interval int64, due bool) error {
	rows, err := t.query(`SELECT id, run_after FROM steps WHERE queue = +?1 AND queue_limited = 1 AND status = 'pending'
		AND (rate_slot_due = 0 OR ?3 AND run_after <= ?2) AND run_after < `+heldUS+` ORDER BY priority DESC, run_after, id`, queue, now, due)
	if err != nil {
		return err
	}
	var ids, starts []int64
	tat := now
	err = eachRow(rows, func(sc scanner) error {
		var id, runAfter int64
		if err := sc.Scan(&id, &runAfter); err != nil {
			return err
		}
		start := max(runAfter, tat)
		tat = start + interval
		ids, starts = append(ids, id), append(starts, start)
		return nil
	})
	if err != nil {
		return err
	}
	for i, id := range ids {
		// A promoted step given a later start goes back among the delayed
		// steps, where the next wake-up is read and promotion finds it.
		if _, err := t.exec(`UPDATE steps SET run_after = ?1, promoted = promoted AND ?1 <= ?2, rate_slot_due = 0 WHERE id = ?3`, starts[i], now, id); err != nil {
			return err
		}
	}
	// An idle queue's respace is remembered until a step starts (see
	// idleRatesSQL).
	_, err = t.exec(`UPDATE queue_limits SET tat = ?1, respaced_at = CASE WHEN ?3 THEN ?4 ELSE respaced_at END WHERE queue = ?2`,
		tat, queue, due, now)
	return err
}

// rateSlotSQL holds for a pending step of table steps that starts at
// the slot its queue's rate gave it: not one that waits for a time of its
// own and takes its slot then (rate_slot_due), nor a held or paused one.
const rateSlotSQL = `steps.status = 'pending' AND steps.queue_limited = 1 AND steps.rate_slot_due = 0
	AND steps.run_after < ` + heldUS + ` AND EXISTS (SELECT 1 FROM queue_limits q WHERE q.queue = steps.queue AND q.interval_us > 0)`

// compactRate moves the steps of queue that start at slots of its rate
// from slot from on, which a paused step gave up, up to the slots from
// from on, in their order, and leaves the rate's next start after the
// last: a paused instance holds no slot that the steps spaced out after
// it would wait for. The status term is repeated for steps_queue_limited,
// as in releaseHeldPickSQL.
func (t *txn) compactRate(queue string, from int64) error {
	var interval int64
	if err := t.queryRow(`SELECT interval_us FROM queue_limits WHERE queue = ?`, queue).Scan(&interval); err != nil {
		return err
	}
	rows, err := t.query(`SELECT id FROM steps WHERE queue = ?1 AND status IN ('pending', 'running') AND run_after >= ?2
		AND `+rateSlotSQL+` ORDER BY run_after, id`, queue, from)
	if err != nil {
		return err
	}
	ids, err := column[int64](rows)
	if err != nil {
		return err
	}
	for i, id := range ids {
		if _, err := t.exec(`UPDATE steps SET run_after = ?1 WHERE id = ?2`, from+int64(i)*interval, id); err != nil {
			return err
		}
	}
	_, err = t.exec(`UPDATE queue_limits SET tat = ?1 WHERE queue = ?2`, from+int64(len(ids))*interval, queue)
	return err
}

// scheduledSQL counts, by queue, the pending steps that are not due yet
// (?1 is now): those of steps_delayed, which holds every such step (a step
// in the claim indexes was due when it was made pending or promoted), so
// the count reads that index from now on and never the steps due, held
// (HeldUntil) or paused (beyond it), nor the finished ones.
const scheduledSQL = `SELECT queue, count(*) FROM steps
	WHERE status = 'pending' AND promoted = 0 AND run_after > ready_at AND run_after > ?1 AND run_after < ` + heldUS + `
	GROUP BY queue`

// queueLoadsSQL counts each queue's ready (held included), held and
// running steps, and when its oldest ready step was made ready (?1 is
// now). Each branch reads one partial index of unfinished steps whole (the
// claims', which hold the capped items too, the delayed steps', the
// running steps'), so that the cost follows the unfinished steps and not
// the finished history; see TestQueuesReadIndexes. Every pending or
// running step is in exactly one of them, so a queue with any is listed,
// even when all its counts are 0 (a paused instance's steps, a forEach
// step running its items). A running step counts when it holds a lease,
// that is when a worker runs it: not a forEach step, whose items count,
// nor a workflow step or item, whose child's steps count. The items their
// caps hold back are counted from the capped items' index.
const queueLoadsSQL = `SELECT queue, sum(ready), sum(held), sum(running), min(oldest) FROM (
	SELECT queue, ` + queuePendingLoad + ` FROM steps
	WHERE status = 'pending' AND ` + readyTerm + ` GROUP BY queue
	UNION ALL
	SELECT queue, ` + queuePendingLoad + ` FROM steps
	WHERE status = 'pending' AND promoted = 0 AND run_after > ready_at GROUP BY queue
	UNION ALL
	SELECT queue, 0, sum(max(due - room, 0)), 0, NULL FROM (` + cappedSteps + cappedStepsGroup + `) GROUP BY queue
	UNION ALL
	SELECT queue, 0, 0, count(*) FILTER (WHERE lease_until IS NOT NULL), NULL FROM steps
	WHERE status = 'running' GROUP BY queue
) GROUP BY queue ORDER BY queue`

// queuePendingLoad is what queueLoadsSQL counts of a queue's pending
// steps: those due or held (a paused instance's are beyond heldUS), the
// held ones, none running, and when the oldest due or held one was made
// ready.
const queuePendingLoad = `count(*) FILTER (WHERE run_after <= ?1 OR run_after = ` + heldUS + `) AS ready,
	count(*) FILTER (WHERE run_after = ` + heldUS + `) AS held, 0 AS running,
	min(ready_at) FILTER (WHERE run_after <= ?1 OR run_after = ` + heldUS + `) AS oldest`

// Queues implements storage.Store.
func (s *Store) Queues(ctx context.Context) ([]storage.QueueInfo, error) {
	now := s.now()
	var (
		limits []storage.QueueLimit
		loads  []storage.QueueInfo
	)
	err := s.read(ctx, "queues", func(tx *sql.Tx) error {
		limits, loads = nil, nil
		rows, err := tx.QueryContext(ctx, `SELECT queue, concurrency, rate, per_us FROM queue_limits ORDER BY queue`)
		if err != nil {
			return err
		}
		if err := eachRow(rows, func(sc scanner) error {
			var (
				l   storage.QueueLimit
				per int64
			)
			if err := sc.Scan(&l.Queue, &l.Concurrency, &l.Rate, &per); err != nil {
				return err
			}
			l.Per = time.Duration(per) * time.Microsecond
			limits = append(limits, l)
			return nil
		}); err != nil {
			return err
		}
		rows, err = tx.QueryContext(ctx, queueLoadsSQL, us(now))
		if err != nil {
			return err
		}
		if err := eachRow(rows, func(sc scanner) error {
			var (
				q      storage.QueueInfo
				oldest sql.NullInt64
			)
			if err := sc.Scan(&q.Queue, &q.Ready, &q.Held, &q.Running, &oldest); err != nil {
				return err
			}
			if oldest.Valid {
				q.OldestWait = max(0, now.Sub(fromUS(oldest.Int64)))
			}
			loads = append(loads, q)
			return nil
		}); err != nil {
			return err
		}
		rows, err = tx.QueryContext(ctx, scheduledSQL, us(now))
		if err != nil {
			return err
		}
		return eachRow(rows, func(sc scanner) error {
			var q storage.QueueInfo
			if err := sc.Scan(&q.Queue, &q.Scheduled); err != nil {
				return err
			}
			loads = append(loads, q)
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	return storage.MergeQueues(limits, loads), nil
}
