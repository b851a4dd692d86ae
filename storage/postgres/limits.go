package postgres

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dagrun/dagrun/storage"
)

// heldAt is storage.HeldUntil as the statements spell it (the functions of
// migration 8 too).
const heldAt = `'9999-01-01 00:00:00+00'`

// admit decides which of the new instances with a workflow-level limit are
// held (see storage.Admit). Each key's count is taken under its advisory
// lock, which the transaction keeps until it commits. An instance that
// starts later is held until then, judged by the time the transaction's
// rows carry ({now}), so that it agrees with its steps (see migration 18).
func (s *Store) admit(ctx context.Context, tx pgx.Tx, now *time.Time, instances []*storage.NewInstance) (map[string]bool, error) {
	var at time.Time
	if now != nil {
		at = *now
	} else if slices.ContainsFunc(instances, func(n *storage.NewInstance) bool {
		return !n.Params.RunAfter.IsZero() && n.Params.ConcurrencyLimit > 0
	}) {
		if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&at); err != nil {
			return nil, err
		}
	}
	return storage.Admit(instances, at, func(workflow, key string) (count int, err error) {
		err = tx.QueryRow(ctx, s.q(`SELECT {s}limits_admitted($1, $2)`), workflow, key).Scan(&count)
		return count, err
	})
}

// SetQueueLimit implements storage.Store.
func (s *Store) SetQueueLimit(ctx context.Context, c storage.QueueLimitChange) (storage.QueueLimit, error) {
	var l storage.QueueLimit
	err := s.inTx(ctx, func(tx pgx.Tx, st *txState) (err error) {
		st.ready(c.Queue) // released steps are news for the queue's workers
		l, err = s.setQueueLimit(ctx, tx, s.now(), c)
		return err
	})
	if err != nil {
		return storage.QueueLimit{}, s.fail("set queue limit", err)
	}
	return l, nil
}

func (s *Store) setQueueLimit(ctx context.Context, tx pgx.Tx, now *time.Time, c storage.QueueLimitChange) (storage.QueueLimit, error) {
	// The queue's lock first: the triggers that hold and release its steps
	// take it too, and it orders two changes of the same queue.
	if _, err := tx.Exec(ctx, s.q(`SELECT {s}limits_lock('q', $1, '', '')`), c.Queue); err != nil {
		return storage.QueueLimit{}, err
	}
	var (
		stored      = storage.QueueLimit{Queue: c.Queue}
		perUS       int64
		oldInterval int64
		oldTat      time.Time
	)
	err := tx.QueryRow(ctx, s.q(`SELECT concurrency, rate, per_us, interval_us, tat FROM {s}queue_limits WHERE queue = $1`), c.Queue).
		Scan(&stored.Concurrency, &stored.Rate, &perUS, &oldInterval, &oldTat)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return storage.QueueLimit{}, err
	}
	stored.Per = time.Duration(perUS) * time.Microsecond
	l := c.Apply(stored)
	if err := l.Check(); err != nil {
		return storage.QueueLimit{}, err
	}
	return l, s.applyQueueLimit(ctx, tx, now, l, oldInterval, oldTat)
}

// applyQueueLimit stores l, which replaces limits spacing a rate by
// oldInterval with its next start at oldTat, and applies it to the queue's
// unfinished steps.
func (s *Store) applyQueueLimit(ctx context.Context, tx pgx.Tx, now *time.Time, l storage.QueueLimit, oldInterval int64, oldTat time.Time) error {
	interval := l.Interval().Microseconds()
	exec := func(sql string, args ...any) error {
		_, err := tx.Exec(ctx, s.q(sql), args...)
		return err
	}
	// A rate that ends or changes lets the steps it had spaced out start
	// now: not those waiting for a time of their own (rate_slot_due), which
	// take their slot of the new rate, if any, when it comes.
	if oldInterval > 0 && interval != oldInterval {
		if err := exec(`UPDATE {s}steps SET run_after = {now} WHERE queue = $2 AND status = 'pending' AND NOT rate_slot_due
			AND run_after > {now} AND run_after < $3`, now, l.Queue, oldTat); err != nil {
			return err
		}
	}
	if l.Concurrency == 0 && l.Rate == 0 {
		if err := exec(`DELETE FROM {s}queue_limits WHERE queue = $1`, l.Queue); err != nil {
			return err
		}
		// Released while they are still marked limited, which is what
		// limits_release_queue reads them by.
		if err := exec(`SELECT {s}limits_release_queue($2, {now})`, now, l.Queue); err != nil {
			return err
		}
		if err := exec(`UPDATE {s}steps SET queue_limited = false, rate_slot_due = false WHERE queue = $1 AND queue_limited`, l.Queue); err != nil {
			return err
		}
	} else {
		if err := exec(`INSERT INTO {s}queue_limits (queue, concurrency, rate, per_us, interval_us, updated_at)
			VALUES ($2, $3, $4, $5, $6, {now})
			ON CONFLICT (queue) DO UPDATE SET concurrency = $3, rate = $4, per_us = $5, interval_us = $6, updated_at = {now}`,
			now, l.Queue, l.Concurrency, l.Rate, l.Per.Microseconds(), interval); err != nil {
			return err
		}
		// Steps that wait for a time of their own take their slots then.
		if err := exec(`UPDATE {s}steps SET queue_limited = true,
				rate_slot_due = status = 'pending' AND run_after > {now} AND run_after < `+heldAt+`,
				slots_due = slots_due OR status = 'pending' AND run_after > {now} AND run_after < `+heldAt+`
			WHERE queue = $2 AND NOT queue_limited
			AND status IN ('blocked', 'pending', 'running', 'waiting') AND (parent_id IS NOT NULL OR NOT for_each)
			AND child_workflow = '' AND NOT EXISTS (SELECT 1 FROM {s}steps p WHERE p.id = steps.parent_id AND p.child_workflow <> '')`,
			now, l.Queue); err != nil {
			return err
		}
	}
	// A new rate spaces out the ready steps from now.
	if interval > 0 && interval != oldInterval {
		if err := exec(`SELECT {s}respace_queue($2, {now}, false)`, now, l.Queue); err != nil {
			return err
		}
	}
	if l.Concurrency > 0 {
		// Hold the ready steps beyond a lowered limit that a release
		// would take last: the lowest priority, newest first (of those
		// that hold a slot: see migration 18).
		if err := exec(`UPDATE {s}steps SET run_after = `+heldAt+` WHERE id IN (
				SELECT id FROM {s}steps WHERE queue = $1 AND queue_limited AND status = 'pending' AND run_after < `+heldAt+`
					AND NOT slots_due
				ORDER BY priority, id DESC LIMIT greatest(0, (SELECT count(*) FROM {s}steps c WHERE c.queue = $1 AND c.queue_limited
					AND c.status IN ('pending', 'running') AND c.run_after < `+heldAt+`
					AND (c.status = 'running' OR NOT c.slots_due)) - $2))`, l.Queue, l.Concurrency); err != nil {
			return err
		}
	}
	return exec(`SELECT {s}limits_release_queue($2, {now})`, now, l.Queue)
}

// scheduledSQL counts, by queue, the pending steps that are not due yet:
// those of steps_delayed, which holds every such step (a step in the claim
// indexes was due when it was made pending or promoted), so the count
// reads that index from now on and never the steps due, held (heldAt) or
// paused (beyond it), nor the finished ones.
const scheduledSQL = `SELECT queue, count(*) FROM {s}steps
	WHERE status = 'pending' AND NOT promoted AND run_after > ready_at AND run_after > {now} AND run_after < ` + heldAt + `
	GROUP BY queue`

// queueLoadsSQL counts each queue's ready (held included), held and
// running steps, and how long its oldest ready step has waited. Each
// branch reads one partial index of unfinished steps whole (the claims',
// the delayed steps' less the capped items, the capped items', the
// running steps'), so that the cost follows the unfinished steps and not
// the finished history; see TestQueuesReadIndexes. Every pending or
// running step is in exactly one of them, so a queue with any is listed,
// even when all its counts are 0 (a paused instance's steps, a forEach
// step running its items). A running step counts when it holds a lease,
// that is when a worker runs it: not a forEach step, whose items count,
// nor a workflow step or item, whose child's steps count. The capped
// items' index is read again for those their caps hold back.
const queueLoadsSQL = `SELECT queue, sum(ready)::bigint, sum(held)::bigint, sum(running)::bigint,
	coalesce((extract(epoch FROM {now} - min(oldest)) * 1000000)::bigint, 0)
FROM (
	SELECT queue, ` + queuePendingLoad + ` FROM {s}steps
	WHERE status = 'pending' AND item_concurrency = 0 AND (promoted OR run_after <= ready_at) GROUP BY queue
	UNION ALL
	SELECT queue, ` + queuePendingLoad + ` FROM {s}steps
	WHERE status = 'pending' AND NOT promoted AND run_after > ready_at AND item_concurrency = 0 GROUP BY queue
	UNION ALL
	SELECT queue, ` + queuePendingLoad + ` FROM {s}steps
	WHERE status = 'pending' AND item_concurrency > 0 GROUP BY queue
	UNION ALL
	SELECT queue, 0, sum(greatest(due - room, 0)), 0, NULL FROM (` + cappedSteps + cappedStepsGroup + `) capped GROUP BY queue
	UNION ALL
	SELECT queue, 0, 0, count(*) FILTER (WHERE lease_until IS NOT NULL), NULL FROM {s}steps
	WHERE status = 'running' GROUP BY queue
) loads GROUP BY queue ORDER BY queue`

// queuePendingLoad is what queueLoadsSQL counts of a queue's pending
// steps: those due or held (a paused instance's are beyond heldAt), the
// held ones, none running, and when the oldest due or held one was made
// ready.
const queuePendingLoad = `count(*) FILTER (WHERE run_after <= {now} OR run_after = ` + heldAt + `) AS ready,
	count(*) FILTER (WHERE run_after = ` + heldAt + `) AS held, 0 AS running,
	min(ready_at) FILTER (WHERE run_after <= {now} OR run_after = ` + heldAt + `) AS oldest`

// Queues implements storage.Store.
func (s *Store) Queues(ctx context.Context) ([]storage.QueueInfo, error) {
	now := s.now()
	var (
		limits []storage.QueueLimit
		loads  []storage.QueueInfo
	)
	err := s.read(ctx, func(tx pgx.Tx) error {
		limits, loads = nil, nil
		var b pgx.Batch
		b.Queue(s.q(`SELECT queue, concurrency, rate, per_us FROM {s}queue_limits ORDER BY queue`)).Query(func(rows pgx.Rows) error {
			var (
				l   storage.QueueLimit
				per int64
			)
			_, err := pgx.ForEachRow(rows, []any{&l.Queue, &l.Concurrency, &l.Rate, &per}, func() error {
				l.Per = time.Duration(per) * time.Microsecond
				limits = append(limits, l)
				return nil
			})
			return err
		})
		b.Queue(s.q(queueLoadsSQL), now).Query(func(rows pgx.Rows) error {
			var (
				q      storage.QueueInfo
				waited int64
			)
			_, err := pgx.ForEachRow(rows, []any{&q.Queue, &q.Ready, &q.Held, &q.Running, &waited}, func() error {
				q.OldestWait = max(0, time.Duration(waited)*time.Microsecond)
				loads = append(loads, q)
				return nil
			})
			return err
		})
		b.Queue(s.q(scheduledSQL), now).Query(func(rows pgx.Rows) error {
			var q storage.QueueInfo
			_, err := pgx.ForEachRow(rows, []any{&q.Queue, &q.Scheduled}, func() error {
				loads = append(loads, q)
				return nil
			})
			return err
		})
		return tx.SendBatch(ctx, &b).Close()
	})
	if err != nil {
		return nil, err
	}
	return storage.MergeQueues(limits, loads), nil
}
