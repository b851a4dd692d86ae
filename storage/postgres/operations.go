package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dagrun/dagrun/storage"
)

var _ storage.Operator = (*Store)(nil)

// actorSQL sets, for the rest of the transaction, the actor ($1) that
// every event it writes takes (the default of events.actor, migration 31):
// those of the instance an operation names and of every other one it
// changes with it.
const actorSQL = `SELECT set_config('dagrun.actor', $1, true)`

// actAs makes the events of the operation's transaction tx carry the actor
// of ctx, if any: it sets it with the BEGIN when tx has not begun yet, as
// every operation's has not, and at once otherwise. Transactions that are
// not operations never set it: a start through the API keeps no actor,
// whatever its request's.
func actAs(ctx context.Context, tx pgx.Tx) error {
	actor := storage.ActorOf(ctx)
	if actor == "" {
		return nil
	}
	if l, ok := tx.(*lazyTx); ok && l.Tx == nil {
		l.actor = actor
		return nil
	}
	_, err := tx.Exec(ctx, actorSQL, actor)
	return err
}

// rearmSQL makes the steps $2 of instance $1 blocked as if they had never
// run, deletes their items and forgets the signals $3 their wait steps
// received, so that they wait for new ones.
const rearmSQL = `
WITH items AS (
	DELETE FROM {s}steps WHERE instance_id = $1 AND item_index >= 0 AND name = ANY($2)
),
sig AS (
	DELETE FROM {s}signals WHERE instance_id = $1 AND name = ANY($3)
)
UPDATE {s}steps SET status = 'blocked', attempts = 0, input = NULL, output = NULL, error = '',
	run_after = NULL, ready_at = NULL, first_started_at = NULL, started_at = NULL, finished_at = NULL,
	lease_until = NULL, worker_id = '', deadline = NULL
WHERE instance_id = $1 AND item_index = -1 AND name = ANY($2)`

// reviveStatusSQL is the status an instance that finished takes when it
// is made to run again: running if it had started, pending if no claim
// (nor wait or child) ever started it, so that its first claim starts it
// as it would a new instance, with its instance.started event and its
// workflow timeout counted from then.
const reviveStatusSQL = `CASE WHEN started_at IS NULL THEN 'pending' ELSE 'running' END`

// revivedStatusSQL reads the status reviveStatusSQL gives instance $1.
const revivedStatusSQL = `SELECT ` + reviveStatusSQL + ` FROM {s}instances WHERE id = $1`

// revivedStatus returns the status instance id, locked, takes when it is
// made to run again: the plan sees it before the revive is written.
func (s *Store) revivedStatus(ctx context.Context, tx pgx.Tx, id string) (storage.InstanceStatus, error) {
	var status storage.InstanceStatus
	err := tx.QueryRow(ctx, s.q(revivedStatusSQL), id).Scan(&status)
	return status, err
}

// reviveRunAfterSQL is the run_after of an instance made to run again,
// which the steps it makes ready take: its own if it has come, so that
// they keep its place among the ready steps, and now if not, so that an
// instance cancelled before its delayed start runs at once rather than
// at that start.
const reviveRunAfterSQL = `least(run_after, {now})`

// reviveSQL makes a finished instance $2 unfinished again (see
// reviveStatusSQL and reviveRunAfterSQL), not paused, with an
// instance.retried event saying why ($3).
const reviveSQL = `
WITH i AS (
	UPDATE {s}instances SET status = ` + reviveStatusSQL + `, output = NULL, error = '', finished_at = NULL,
		paused = false, run_after = ` + reviveRunAfterSQL + `
	WHERE id = $2
)
INSERT INTO {s}events (instance_id, type, message, at) VALUES ($2, 'instance.retried', $3, {now})`

// rerun queues rearmSQL for the steps at indexes of l and reviveSQL for
// l, which says why (msg), and shows the plan the state they leave.
func (s *Store) rerun(ctx context.Context, tx pgx.Tx, st *txState, l *loaded, indexes []int, msg string) error {
	status, err := s.revivedStatus(ctx, tx, l.state.ID)
	if err != nil {
		return err
	}
	var names, signals []string
	for _, i := range indexes {
		ss := &l.state.Steps[i]
		names = append(names, ss.Name)
		if sig := l.waitSignals[i]; sig != "" {
			signals = append(signals, sig)
			delete(l.signals, sig)
		}
		*ss = storage.StepState{Name: ss.Name, DependsOn: ss.DependsOn, Status: storage.StepBlocked}
	}
	if len(names) > 0 {
		st.tail.Queue(s.q(rearmSQL), l.state.ID, names, signals)
	}
	st.tail.Queue(s.q(reviveSQL), s.now(), l.state.ID, msg)
	l.state.Status = status
	// Its onFailure steps run again only if it fails again.
	s.rearmFailure(st, s.now(), l)
	return nil
}

// RetryFrom implements storage.Operator.
func (s *Store) RetryFrom(ctx context.Context, id, step string, plan storage.PlanFunc) error {
	if plan == nil {
		return errors.New("postgres: retry from: nil PlanFunc")
	}
	err := s.inTx(ctx, func(tx pgx.Tx, st *txState) error {
		if err := actAs(ctx, tx); err != nil {
			return err
		}
		l, err := s.lockOne(ctx, tx, id, true)
		if err != nil {
			return err
		}
		if status := l.state.Status; !status.Finished() {
			return storage.RetryFromRefusal(id, status)
		}
		if l.state.Depth > 0 {
			if err := s.refuseChild(ctx, tx, id); err != nil {
				return err
			}
		}
		if l.index(step) < 0 {
			return storage.UnknownStepError(id, step, l.state.Steps)
		}
		// The step and what depends on it run afresh; the other failed and
		// cancelled steps run again as a retry runs them, keeping what
		// their items and children completed.
		fresh := storage.Downstream(l.state.Steps, step)
		if err := s.rerun(ctx, tx, st, l, storage.Indexes(l.state.Steps, fresh), "from "+step); err != nil {
			return err
		}
		now := s.now()
		st.plan = plan // a child retried that had completed settles its step
		ls, err := s.rearmFailed(ctx, tx, st, now, l, fresh, rearmStepsSQL)
		if err != nil {
			return err
		}
		if err := s.planAndApply(st, now, ls, plan); err != nil {
			return err
		}
		return nil
	})
	if err != nil {
		return s.fail("retry from", err)
	}
	return nil
}

// lockStepSQL locks one step of an instance and reads its status: a claim
// that took it first is waited for, one that comes later skips it.
const lockStepSQL = `
SELECT id, status, on_failure FROM {s}steps WHERE instance_id = $1 AND item_index = -1 AND name = $2 FOR NO KEY UPDATE`

// skipSQL completes step $3 of instance $2 by hand with output $4.
const skipSQL = `
WITH items AS (
	DELETE FROM {s}steps WHERE parent_id = $5
),
u AS (
	UPDATE {s}steps SET status = 'completed', output = $4, error = '', finished_at = {now},
		lease_until = NULL, worker_id = '', deadline = NULL
	WHERE id = $5
)
INSERT INTO {s}events (instance_id, step, type, message, at) VALUES ($2, $3, 'step.completed', $6, {now})`

// SkipStep implements storage.Operator.
func (s *Store) SkipStep(ctx context.Context, id, step string, output json.RawMessage, plan storage.PlanFunc) error {
	if plan == nil {
		return errors.New("postgres: skip step: nil PlanFunc")
	}
	if len(output) == 0 {
		output = json.RawMessage("null")
	}
	err := s.inTx(ctx, func(tx pgx.Tx, st *txState) error {
		if err := actAs(ctx, tx); err != nil {
			return err
		}
		l, err := s.lockOne(ctx, tx, id, true)
		if err != nil {
			return err
		}
		i := l.index(step)
		if i < 0 {
			return storage.UnknownStepError(id, step, l.state.Steps)
		}
		var (
			stepID    int64
			status    storage.StepStatus
			onFailure bool
		)
		if err := tx.QueryRow(ctx, s.q(lockStepSQL), id, step).Scan(&stepID, &status, &onFailure); err != nil {
			return err
		}
		instance := l.state.Status
		if instance == storage.InstanceCompleted || instance == storage.InstanceCancelled || !storage.Skippable(status) {
			return storage.SkipRefusal(id, step, instance, status)
		}
		if instance == storage.InstanceRunning && l.state.Failure != nil && !onFailure {
			return storage.SkipWhileFailingRefusal(id)
		}
		if instance == storage.InstanceFailed && l.state.Depth > 0 {
			// Skipping in a failed child would run it again while its
			// parent step stays failed.
			if err := s.refuseChild(ctx, tx, id); err != nil {
				return err
			}
		}
		st.tail.Queue(s.q(skipSQL), s.now(), id, step, output, stepID, storage.SkippedByHand)
		l.state.Steps[i] = storage.StepState{Name: step, DependsOn: l.state.Steps[i].DependsOn, Status: storage.StepCompleted, Output: output}
		if instance == storage.InstanceFailed {
			if err := s.rerun(ctx, tx, st, l, storage.Rerun(l.state.Steps, i, nil), "skip of "+step); err != nil {
				return err
			}
		}
		if err := s.planAndApply(st, s.now(), []*loaded{l}, plan); err != nil {
			return err
		}
		return nil
	})
	if err != nil {
		return s.fail("skip step", err)
	}
	return nil
}

// lockPauseSQL locks an instance and reads what pausing and resuming
// check.
const lockPauseSQL = `SELECT status, paused FROM {s}instances WHERE id = $1 FOR NO KEY UPDATE`

// pauseSQL holds back the pending steps of instance $2 ($3: pause, or
// resume) and records it; the steps that become pending later are held
// back by the statements that make them so (see heldSQL). A claim that
// took a step first is waited for (the step is then running and finishes),
// one that comes later skips the step.
const pauseSQL = `
WITH i AS (
	UPDATE {s}instances SET paused = $3 WHERE id = $2
),
u AS (
	UPDATE {s}steps SET run_after = CASE WHEN $3 THEN run_after + interval '87658200 hours'
		ELSE run_after - interval '87658200 hours' END
	WHERE instance_id = $2 AND status = 'pending'
		AND ($3 OR run_after > timestamptz 'epoch' + interval '87658200 hours')
	RETURNING queue
)
INSERT INTO {s}events (instance_id, type, at)
SELECT $2, CASE WHEN $3 THEN 'instance.paused' ELSE 'instance.resumed' END, {now}
RETURNING (SELECT array_agg(DISTINCT queue) FROM u)`

func (s *Store) setPaused(ctx context.Context, id string, pause bool) error {
	return s.inTx(ctx, func(tx pgx.Tx, st *txState) error {
		if err := actAs(ctx, tx); err != nil {
			return err
		}
		var (
			status storage.InstanceStatus
			paused bool
		)
		if err := tx.QueryRow(ctx, s.q(lockPauseSQL), id).Scan(&status, &paused); err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				return fmt.Errorf("instance %s: %w", id, storage.ErrNotFound)
			}
			return err
		}
		switch {
		case pause && (status.Finished() || paused):
			return storage.PauseRefusal(id, status)
		case !pause && (status.Finished() || !paused):
			return storage.ResumeRefusal(id, status)
		}
		if err := s.pauseTree(ctx, tx, st, []string{id}, pause); err != nil {
			return err
		}
		return nil
	})
}

// pauseTreeSQL locks, in id order, the unfinished instances of $1 and
// their descendants not yet paused ($2) or resumed. Children are held
// with their parent, as a cancel reaches them: a paused parent whose
// children ran on would finish while paused.
const pauseTreeSQL = `
WITH RECURSIVE tree (id) AS (
	SELECT unnest($1::text[])
	UNION
	SELECT i.id FROM {s}instances i JOIN tree ON i.parent_id = tree.id
)
SELECT i.id FROM {s}instances i
WHERE i.id IN (SELECT id FROM tree) AND i.finished_at IS NULL AND i.paused <> $2
ORDER BY i.id FOR NO KEY UPDATE`

// pauseTree pauses (or resumes) the instances of roots and their
// unfinished descendants, each with its event.
func (s *Store) pauseTree(ctx context.Context, tx pgx.Tx, st *txState, roots []string, pause bool) error {
	rows, err := tx.Query(ctx, s.q(pauseTreeSQL), roots, pause)
	if err != nil {
		return err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	freed := map[string]time.Time{}
	for _, id := range ids {
		if pause {
			if err := s.giveUpRateSlots(ctx, tx, id, freed); err != nil {
				return err
			}
		}
		var queues []string
		if err := tx.QueryRow(ctx, s.q(pauseSQL), s.now(), id, pause).Scan(&queues); err != nil {
			return err
		}
		if !pause {
			for _, q := range queues {
				st.ready(q)
			}
		}
	}
	if pause {
		return s.compactRates(ctx, tx, st, freed)
	}
	if _, err := tx.Exec(ctx, s.q(retakeSlotsSQL), s.now(), ids); err != nil {
		return err
	}
	for _, id := range ids {
		if err := s.admitResumed(ctx, tx, id); err != nil {
			return err
		}
	}
	return s.releaseResumed(ctx, tx, ids)
}

// rateSlotSQL holds for a pending step of table steps that starts at
// the slot its queue's rate gave it: not one that waits for a time of its
// own and takes its slot then (rate_slot_due), nor a held or paused one.
const rateSlotSQL = `steps.status = 'pending' AND steps.queue_limited AND NOT steps.rate_slot_due
	AND steps.run_after < ` + heldAt + ` AND EXISTS (SELECT 1 FROM {s}queue_limits q WHERE q.queue = steps.queue AND q.interval_us > 0)`

// giveUpRateSlotsSQL makes the pending steps of instance $2, being
// paused, give up the slots their queues' rates gave them that are still
// ahead: they wait for no time of their own, so they become due now, and
// a resume gives them new slots (retakeSlotsSQL). It returns, by queue,
// the earliest slot given up.
const giveUpRateSlotsSQL = `
WITH g AS (
	SELECT id, queue, run_after FROM {s}steps WHERE instance_id = $2 AND run_after > {now} AND ` + rateSlotSQL + `
),
u AS (
	UPDATE {s}steps s SET run_after = {now} FROM g WHERE s.id = g.id
)
SELECT queue, min(run_after) FROM g GROUP BY queue`

func (s *Store) giveUpRateSlots(ctx context.Context, tx pgx.Tx, id string, freed map[string]time.Time) error {
	rows, err := tx.Query(ctx, s.q(giveUpRateSlotsSQL), s.now(), id)
	if err != nil {
		return err
	}
	var (
		queue string
		from  time.Time
	)
	_, err = pgx.ForEachRow(rows, []any{&queue, &from}, func() error {
		if f, ok := freed[queue]; !ok || from.Before(f) {
			freed[queue] = from
		}
		return nil
	})
	return err
}

// compactRateSQL moves the steps of queue $1 that start at slots of its
// rate from the slot $2 on, which a paused step gave up, up to the slots
// from $2 on, in their order, and leaves the rate's next start after the
// last: a paused instance holds no slot that the steps spaced out after
// it would wait for. A step another transaction has locked keeps its
// slot, as respace_queue passes it.
const compactRateSQL = `
WITH l AS (
	SELECT id, run_after FROM {s}steps WHERE queue = $1 AND run_after >= $2 AND ` + rateSlotSQL + `
	FOR NO KEY UPDATE SKIP LOCKED
),
c AS (
	SELECT l.id, $2 + (row_number() OVER (ORDER BY l.run_after, l.id) - 1) * q.interval_us * interval '1 microsecond' AS slot
	FROM l, {s}queue_limits q WHERE q.queue = $1
),
u AS (
	UPDATE {s}steps s SET run_after = c.slot FROM c WHERE s.id = c.id
)
UPDATE {s}queue_limits SET tat = $2 + (SELECT count(*) FROM l) * interval_us * interval '1 microsecond' WHERE queue = $1`

// compactRates applies compactRateSQL to each queue of freed, under the
// queue's lock, which the statements that give slots take too, so that
// it reads every slot given before it; the steps moved up are news for
// the queue's workers.
func (s *Store) compactRates(ctx context.Context, tx pgx.Tx, st *txState, freed map[string]time.Time) error {
	queues := slices.Sorted(maps.Keys(freed))
	for _, q := range queues {
		if _, err := tx.Exec(ctx, s.q(`SELECT {s}limits_lock('q', $1, '', '')`), q); err != nil {
			return err
		}
	}
	for _, q := range queues {
		if _, err := tx.Exec(ctx, s.q(compactRateSQL), q, freed[q]); err != nil {
			return err
		}
		st.ready(q)
	}
	return nil
}

// retakeSlotsSQL makes the pending steps of the resumed instances $2
// under a limit (a step key, their queue's concurrency or rate) take
// their slots again, as steps made ready now would: while paused they
// held none (every count of a limit's slots leaves out a paused step),
// and another step may have taken theirs. Those that are due are held,
// for releaseResumed to release those that fit, in release order, each
// with the rate's next slot from now (limits_release_step): they gave up
// their rate slots when paused, or the slots passed, or they were made
// ready while paused, which limits_hold marks as if they waited for a
// time of their own although they are due from their instance's start.
// Those that start later (a retry's backoff) take their slots when their
// time comes, as delayed steps do (slots_due, rate_slot_due); those
// marked so already are left to that.
const retakeSlotsSQL = `
WITH due AS (
	UPDATE {s}steps SET run_after = ` + heldAt + `, slots_due = false, rate_slot_due = false, promoted = false
	WHERE instance_id = ANY($2) AND status = 'pending' AND run_after <= {now}
		AND (concurrency_key IS NOT NULL OR queue_limited)
		AND NOT ((slots_due OR rate_slot_due) AND coalesce(run_after > ready_at, false))
)
UPDATE {s}steps SET slots_due = true, rate_slot_due = queue_limited
WHERE instance_id = ANY($2) AND status = 'pending' AND run_after > {now} AND run_after < ` + heldAt + `
	AND NOT promoted AND NOT slots_due AND (concurrency_key IS NOT NULL OR queue_limited)`

// resumedRoomSQL tells whether the resumed instance $2, held by its
// workflow's concurrency limit and due by the terms of a finish's
// admission (limits_instance_release), finds room under its key, whose
// lock it takes; no row when it is not such an instance.
const resumedRoomSQL = `
SELECT {s}limits_admitted(i.workflow, i.concurrency_key) < i.concurrency_limit FROM {s}instances i
WHERE i.id = $2 AND i.held AND i.finished_at IS NULL AND i.concurrency_key IS NOT NULL
	AND (i.parked OR i.run_after <= {now} OR i.run_after <= i.created_at
		OR EXISTS (SELECT 1 FROM {s}steps s WHERE s.instance_id = i.id AND s.status = 'pending'
			AND s.run_after = '9999-01-01 00:00:00+00' AND NOT s.slots_due))`

// admitResumed admits a resumed instance held by its workflow's
// concurrency limit when its key has room, as a finish of its key would
// have, had it not passed over the paused instance; releaseResumed then
// releases its steps.
func (s *Store) admitResumed(ctx context.Context, tx pgx.Tx, id string) error {
	var room bool
	err := tx.QueryRow(ctx, s.q(resumedRoomSQL), s.now(), id).Scan(&room)
	if errors.Is(err, pgx.ErrNoRows) || err == nil && !room {
		return nil
	}
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, s.q(`UPDATE {s}instances SET held = false WHERE id = $1`), id); err != nil {
		return err
	}
	_, err = tx.Exec(ctx, s.q(`UPDATE {s}steps SET held_by_instance = false WHERE instance_id = $1 AND held_by_instance`), id)
	return err
}

// resumedHeldSQL lists the held steps of the instances $1, in release
// order: highest priority first, then oldest.
const resumedHeldSQL = `
SELECT id FROM {s}steps WHERE instance_id = ANY($1) AND status = 'pending'
	AND run_after = '9999-01-01 00:00:00+00' AND NOT held_by_instance
ORDER BY priority DESC, id`

// releaseResumed releases the held steps of resumed instances that fit
// now (limits_release_step locks their limits and checks). A step that
// was paused while held was passed over by the releases of its limits,
// which take only steps held and not paused: its slot may have freed (or
// its instance been admitted by its workflow's limit) meanwhile, and no
// finish would come to release it.
func (s *Store) releaseResumed(ctx context.Context, tx pgx.Tx, ids []string) error {
	rows, err := tx.Query(ctx, s.q(resumedHeldSQL), ids)
	if err != nil {
		return err
	}
	held, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return err
	}
	for _, id := range held {
		if _, err := tx.Exec(ctx, s.q(`SELECT {s}limits_release_step(s, {now}) FROM {s}steps s WHERE s.id = $2`), s.now(), id); err != nil {
			return err
		}
	}
	return nil
}

// PauseInstance implements storage.Operator.
func (s *Store) PauseInstance(ctx context.Context, id string) error {
	if err := s.setPaused(ctx, id, true); err != nil {
		return s.fail("pause instance", err)
	}
	return nil
}

// ResumeInstance implements storage.Operator.
func (s *Store) ResumeInstance(ctx context.Context, id string) error {
	if err := s.setPaused(ctx, id, false); err != nil {
		return s.fail("resume instance", err)
	}
	return nil
}

func (l *loaded) index(name string) int {
	for i := range l.state.Steps {
		if l.state.Steps[i].Name == name {
			return i
		}
	}
	return -1
}

// MatchInstances implements storage.Operator.
func (s *Store) MatchInstances(ctx context.Context, f storage.InstanceFilter) ([]string, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = 1000
	}
	var before *time.Time
	if !f.CreatedBefore.IsZero() {
		before = &f.CreatedBefore
	}
	var ids []string
	err := s.read(ctx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, s.q(`SELECT id FROM {s}instances
			WHERE ($1 = '' OR workflow = $1) AND ($2 = '' OR status = $2) AND ($3::timestamptz IS NULL OR created_at < $3)
				AND id > $5 AND (NOT $6 OR parent_id IS NULL)
			ORDER BY id LIMIT $4`), f.Workflow, string(f.Status), before, limit, f.AfterID, f.TopLevel)
		if err != nil {
			return err
		}
		ids, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	if err != nil {
		return nil, s.fail("match instances", err)
	}
	return ids, nil
}
