package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dagrun/dagrun/storage"
)

// markDeliveredSQL marks a signal stored before its step waited delivered,
// in the transaction that made the step ready and completed it.
const markDeliveredSQL = `UPDATE {s}signals SET delivered = true WHERE instance_id = $1 AND name = $2`

// waitedSQL records that wait step $3 of instance $2 waited for its signal,
// which came first and completes it in the plan's statement after this
// one: the history shows the wait, as for a signal that comes later.
const waitedSQL = `INSERT INTO {s}events (instance_id, step, type, message, at) VALUES ($2, $3, 'step.ready', $4, {now})`

const instanceByKeySQL = `SELECT id FROM {s}instances WHERE workflow = $1 AND idempotency_key = $2`

const priorSignalSQL = `SELECT signal_id, delivered FROM {s}signals WHERE instance_id = $1 AND name = $2`

// deliverSQL stores a signal and, when a step waits for it, completes the
// step with its payload, with the event of either. It returns the step
// completed, if any.
const deliverSQL = `
WITH t AS MATERIALIZED (
	SELECT id, status, wait_signal FROM {s}steps WHERE instance_id = $2 AND item_index = -1
),
w AS (
	UPDATE {s}steps s SET status = 'completed', output = $4, finished_at = {now}, deadline = NULL
	FROM t WHERE s.id = t.id AND t.status = 'waiting' AND t.wait_signal = $3
	RETURNING s.name
),
sg AS (
	INSERT INTO {s}signals (instance_id, name, signal_id, payload, delivered, created_at)
	VALUES ($2, $3, $5, $4, EXISTS (SELECT 1 FROM w), {now})
),
ev AS (
	INSERT INTO {s}events (instance_id, step, type, message, at)
	SELECT $2, w.name, 'step.completed', 'signal ' || $3 || ' received', {now} FROM w
	UNION ALL
	SELECT $2, '', '` + string(storage.EventSignalReceived) + `', $3, {now} WHERE NOT EXISTS (SELECT 1 FROM w)
)
SELECT name FROM w`

// finishedWaitSQL finds the wait step for signal $2 of instance $1 when it
// has finished: such a signal would be stored and never delivered.
const finishedWaitSQL = `SELECT name, status FROM {s}steps WHERE instance_id = $1 AND item_index = -1 AND wait_signal = $2
	AND status IN ('completed', 'failed', 'skipped', 'cancelled')`

// SendSignal implements storage.Store. The sender locks the instance row
// first, as every transaction that changes its steps does, so two racing
// senders serialize and the second sees the first's signal; the plan that
// makes a wait step ready holds the same lock, so a signal is either seen
// by it or finds the step waiting.
func (s *Store) SendSignal(ctx context.Context, p storage.SignalParams, plan storage.PlanFunc) (storage.SignalResult, error) {
	if plan == nil {
		return storage.SignalResult{}, errors.New("postgres: send signal: nil PlanFunc")
	}
	if err := storage.CheckSignalParams(p); err != nil {
		return storage.SignalResult{}, err
	}
	var res storage.SignalResult
	err := s.inTx(ctx, func(tx pgx.Tx, st *txState) error {
		if err := actAs(ctx, tx); err != nil {
			return err
		}
		res = storage.SignalResult{InstanceID: p.InstanceID}
		if p.InstanceID == "" {
			err := tx.QueryRow(ctx, s.q(instanceByKeySQL), p.Workflow, p.Key).Scan(&res.InstanceID)
			if errors.Is(err, pgx.ErrNoRows) {
				return storage.Refuse(storage.ErrNotFound, "no instance of workflow %s with key %q", p.Workflow, p.Key)
			}
			if err != nil {
				return err
			}
		}
		id := res.InstanceID
		l, err := s.lockOne(ctx, tx, id, false)
		if err != nil {
			return err
		}
		var (
			prevID    string
			delivered bool
		)
		err = tx.QueryRow(ctx, s.q(priorSignalSQL), id, p.Name).Scan(&prevID, &delivered)
		switch {
		case err == nil && p.ID != "" && prevID == p.ID:
			res.Duplicate = true
			return nil
		case err == nil:
			return storage.SignalConflict(id, p.Name, delivered)
		case !errors.Is(err, pgx.ErrNoRows):
			return err
		}
		if status := l.state.Status; status.Finished() {
			return storage.FinishedConflict(id, status)
		}
		var (
			step       string
			stepStatus storage.StepStatus
		)
		err = tx.QueryRow(ctx, s.q(finishedWaitSQL), id, p.Name).Scan(&step, &stepStatus)
		switch {
		case err == nil:
			return storage.WaitFinishedConflict(id, step, p.Name, stepStatus)
		case !errors.Is(err, pgx.ErrNoRows):
			return err
		}
		now := s.now()
		err = tx.QueryRow(ctx, s.q(deliverSQL), now, id, p.Name, jsonOrNil(p.Payload), p.ID).Scan(&step)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil // stored until its step waits
		}
		if err != nil {
			return err
		}
		res.Delivered = true
		ls, err := s.lock(ctx, tx, []string{id})
		if err != nil {
			return err
		}
		if err := s.planAndApply(st, now, []*loaded{ls[id]}, plan); err != nil {
			return err
		}
		return nil
	})
	if err != nil {
		return storage.SignalResult{}, s.fail("send signal", err)
	}
	return res, nil
}

// expiredWaitsSQL names the waiting steps whose deadline passed.
const expiredWaitsSQL = `
SELECT instance_id FROM {s}steps WHERE status = 'waiting' AND deadline <= {now}
ORDER BY deadline, id LIMIT $2`

// expireWaitsSQL fails the waiting steps of the locked instances $2 whose
// deadline passed, with their events.
const expireWaitsSQL = `
WITH u AS (
	UPDATE {s}steps SET status = 'failed', finished_at = {now}, deadline = NULL,
		error = 'no signal ' || wait_signal || ' within ' || ($3::text[])[array_position($4::bigint[], wait_timeout_us)]
	WHERE instance_id = ANY($2) AND status = 'waiting' AND deadline <= {now}
	RETURNING instance_id, name, error
)
INSERT INTO {s}events (instance_id, step, type, message, at)
SELECT instance_id, name, 'step.failed', error, {now} FROM u ORDER BY instance_id, name
RETURNING 1`

// ExpireWaits implements storage.Store. A limit below 1 means 1000.
func (s *Store) ExpireWaits(ctx context.Context, limit int, plan storage.PlanFunc) (int, error) {
	return s.sweep(ctx, "expire waits", expiredWaitsSQL, limit, plan, func(tx pgx.Tx, st *txState, now *time.Time, ids []string) (int, error) {
		// Lock first, as every transaction that changes an instance's
		// steps does, then fail the steps still waiting.
		var b pgx.Batch
		s.queueLock(&b, ids, map[string]*loaded{})
		if err := tx.SendBatch(ctx, &b).Close(); err != nil {
			return 0, err
		}
		timeouts, texts, err := s.waitTimeouts(ctx, tx, ids)
		if err != nil {
			return 0, err
		}
		rows, err := tx.Query(ctx, s.q(expireWaitsSQL), now, ids, texts, timeouts)
		if err != nil {
			return 0, err
		}
		failed, err := pgx.CollectRows(rows, pgx.RowTo[int])
		if err != nil {
			return 0, err
		}
		ls, err := s.lock(ctx, tx, ids)
		if err != nil {
			return 0, err
		}
		touched := make([]*loaded, 0, len(ls))
		for _, l := range ls {
			touched = append(touched, l)
		}
		return len(failed), s.planAndApply(st, now, touched, plan)
	})
}

// sweep is what the sweeps of passed deadlines share: in one transaction,
// it reads up to limit (below 1: 1000) instance IDs with query (whose
// parameters are now and the limit) and, when there are any, hands them
// to expire, which returns how many it ended. op names the sweep in
// errors.
func (s *Store) sweep(ctx context.Context, op, query string, limit int, plan storage.PlanFunc,
	expire func(tx pgx.Tx, st *txState, now *time.Time, ids []string) (int, error)) (int, error) {
	if plan == nil {
		return 0, fmt.Errorf("postgres: %s: nil PlanFunc", op)
	}
	if limit < 1 {
		limit = 1000
	}
	var n int
	err := s.inTx(ctx, func(tx pgx.Tx, st *txState) error {
		n = 0 // a retried transaction starts over
		now := s.now()
		rows, err := tx.Query(ctx, s.q(query), now, limit)
		if err != nil {
			return err
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil || len(ids) == 0 {
			return err
		}
		n, err = expire(tx, st, now, ids)
		return err
	})
	if err != nil {
		return 0, s.fail(op, err)
	}
	return n, nil
}

// waitTimeouts returns the distinct timeouts of the waiting steps of the
// instances, with each written as workflow files write it, for the
// failure message.
func (s *Store) waitTimeouts(ctx context.Context, tx pgx.Tx, ids []string) ([]int64, []string, error) {
	rows, err := tx.Query(ctx, s.q(`SELECT DISTINCT wait_timeout_us FROM {s}steps WHERE instance_id = ANY($1) AND status = 'waiting'`), ids)
	if err != nil {
		return nil, nil, err
	}
	timeouts, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, nil, err
	}
	texts := make([]string, len(timeouts))
	for i, us := range timeouts {
		texts[i] = storage.FormatDuration(time.Duration(us) * time.Microsecond)
	}
	return timeouts, texts, nil
}

// nextWakeSQL is the earliest time after now at which a pending step of
// the claimer's queues ($2, empty: all) and handlers ($3, empty: all)
// becomes claimable, a waiting step or a running instance times out, or
// an instance whose start was deferred may start, or be parked (see
// admissibleDeferredSQL). Only a step of steps_delayed can become due
// later (one in the claim indexes was due when it was made pending), so it
// reads that index, never the whole queue.
// Each earliest time is the first entry of its index in order, not a
// min(): the planner made a min() read the whole index when the
// connection first planned it on young tables, and kept that plan (see
// TestEarliestReadsStopAtTheFirstEntry).
//
// The delayed steps of other queues and handlers are passed over, but
// only wakeWalk of them: when the first wakeWalk delayed steps are all
// others', none of the claimer's falls due before the last of them, and
// its time is the wake. The claimer then wakes early and looks again,
// rather than every look reading every other step: a worker of one queue
// beside 200,000 delayed steps of another read all of them at each poll.
const nextWakeSQL = `
SELECT least(
	coalesce(
		(SELECT d.run_after FROM (SELECT run_after, queue, handler FROM {s}steps WHERE ` + delayedLater + `
			ORDER BY run_after LIMIT ` + wakeWalk + `) d
		WHERE (cardinality($2::text[]) = 0 OR d.queue = ANY($2)) AND (cardinality($3::text[]) = 0 OR d.handler = ANY($3))
		ORDER BY d.run_after LIMIT 1),
		(SELECT run_after FROM {s}steps WHERE ` + delayedLater + ` ORDER BY run_after OFFSET ` + wakeWalk + ` - 1 LIMIT 1)),
	(SELECT deadline FROM {s}steps WHERE status = 'waiting' AND deadline IS NOT NULL ORDER BY deadline LIMIT 1),
	(SELECT deadline FROM {s}instances WHERE status = 'running' AND deadline IS NOT NULL ORDER BY deadline LIMIT 1),
	-- a parked instance waits for a finish of its key, not a time
	(SELECT run_after FROM {s}instances WHERE deferred AND finished_at IS NULL AND NOT parked AND NOT paused
		ORDER BY run_after LIMIT 1))`

// delayedLater is nextWakeSQL's condition on a delayed step that falls
// due after now, through steps_delayed: not held back by a pause (a
// paused instance's steps are shifted past the first bound) and not held
// for a slot (the second), which wait for a resume or a slot, not a time.
const delayedLater = `status = 'pending' AND NOT promoted AND run_after > ready_at AND run_after > {now}
	AND run_after < timestamptz 'epoch' + interval '87658200 hours' AND run_after < '9999-01-01 00:00:00+00'`

// wakeWalk is how many delayed steps of other queues and handlers the
// next wake passes over at most (see nextWakeSQL).
const wakeWalk = "100"

// wakeFilters are nextWakeSQL's $2 and $3: p's queues and handlers, empty
// for any.
func wakeFilters(p storage.ClaimParams) (queues, handlers []string) {
	queues, handlers = p.Queues, p.Handlers
	if queues == nil {
		queues = []string{}
	}
	if handlers == nil {
		handlers = []string{}
	}
	return queues, handlers
}

// NextWake implements storage.Store.
func (s *Store) NextWake(ctx context.Context, p storage.ClaimParams) (time.Time, error) {
	var next *time.Time
	queues, handlers := wakeFilters(p)
	err := s.read(ctx, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, s.q(nextWakeSQL), s.now(), queues, handlers).Scan(&next)
	})
	if err != nil {
		return time.Time{}, s.fail("next wake", err)
	}
	if next == nil {
		return time.Time{}, nil
	}
	return next.UTC(), nil
}
