package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dagrun/dagrun/storage"
)

// registerScheduleSQL creates a schedule's row, or starts it over from $5
// when its fingerprint changed, with $6, the latest instance of a row with
// its fingerprint, as its last instance; an unchanged row takes $6 only
// when it is later than its own (a row left behind while the schedule sat
// at another position), and is otherwise left as it is, not rewritten, so
// every process's start adds no dead row versions. The greater of two
// instance IDs is the later (they sort by creation in byte order); the
// row's own is read after its lock, so a fire that committed meanwhile is
// kept.
const registerScheduleSQL = `
INSERT INTO {s}schedules AS s (workflow, position, fingerprint, last_tick, updated_at, last_instance_id)
VALUES ($2, $3, $4, $5, {now}, $6)
ON CONFLICT (workflow, position) DO UPDATE SET fingerprint = excluded.fingerprint,
	last_tick = CASE WHEN s.fingerprint <> excluded.fingerprint THEN greatest(s.last_tick, excluded.last_tick) ELSE s.last_tick END,
	updated_at = excluded.updated_at,
	last_instance_id = CASE WHEN s.fingerprint <> excluded.fingerprint THEN excluded.last_instance_id
		ELSE greatest(s.last_instance_id COLLATE "C", excluded.last_instance_id COLLATE "C") END
WHERE s.fingerprint <> excluded.fingerprint OR s.last_instance_id COLLATE "C" < excluded.last_instance_id COLLATE "C"`

// registerNewScheduleSQL creates a schedule's row and leaves a registered
// one as it is (RegisterSchedulesParams.OnlyNew).
const registerNewScheduleSQL = `
INSERT INTO {s}schedules AS s (workflow, position, fingerprint, last_tick, updated_at, last_instance_id)
VALUES ($2, $3, $4, $5, {now}, $6)
ON CONFLICT (workflow, position) DO NOTHING`

// lastInstancesSQL reads the last instance of the schedules of workflows
// $1 by fingerprint, before any moved in the list.
const lastInstancesSQL = `SELECT workflow, fingerprint, max(last_instance_id COLLATE "C") FROM {s}schedules
	WHERE workflow = ANY($1) GROUP BY workflow, fingerprint`

const scheduleColumns = `s.workflow, s.position, s.fingerprint, s.last_tick, s.paused, s.last_instance_id,
	coalesce(i.status, ''), s.fired, s.skipped`

const scheduleFrom = ` FROM {s}schedules s LEFT JOIN {s}instances i ON i.id = s.last_instance_id`

func scanSchedule(row pgx.Row) (storage.Schedule, error) {
	var (
		s        storage.Schedule
		lastTick time.Time
	)
	err := row.Scan(&s.Workflow, &s.Index, &s.Fingerprint, &lastTick, &s.Paused, &s.LastInstanceID,
		&s.LastInstanceStatus, &s.Fired, &s.Skipped)
	s.LastTick = lastTick.UTC()
	return s, err
}

// RegisterSchedules implements storage.Store.
func (s *Store) RegisterSchedules(ctx context.Context, p storage.RegisterSchedulesParams) ([]storage.Schedule, error) {
	workflows := make([]string, len(p.Specs))
	indexes := make([]int32, len(p.Specs))
	for i, sp := range p.Specs {
		if err := sp.Check(); err != nil {
			return nil, fmt.Errorf("postgres: register schedules: %w", err)
		}
		workflows[i], indexes[i] = sp.Workflow, int32(sp.Index)
	}
	var out []storage.Schedule
	err := s.inTx(ctx, func(tx pgx.Tx, _ *txState) error {
		rows, err := tx.Query(ctx, s.q(lastInstancesSQL), workflows)
		if err != nil {
			return err
		}
		lastOf := map[[2]string]string{}
		var workflow, fingerprint, last string
		if _, err := pgx.ForEachRow(rows, []any{&workflow, &fingerprint, &last}, func() error {
			lastOf[[2]string{workflow, fingerprint}] = last
			return nil
		}); err != nil {
			return err
		}
		register := registerScheduleSQL
		if p.OnlyNew {
			register = registerNewScheduleSQL
		}
		var b pgx.Batch
		for _, sp := range p.Specs {
			b.Queue(s.q(register), s.now(), sp.Workflow, sp.Index, sp.Fingerprint, p.Now, lastOf[[2]string{sp.Workflow, sp.Fingerprint}])
		}
		if err := tx.SendBatch(ctx, &b).Close(); err != nil {
			return err
		}
		rows, err = tx.Query(ctx, s.q(`SELECT `+scheduleColumns+scheduleFrom+`
			JOIN unnest($1::text[], $2::int[]) WITH ORDINALITY AS k(workflow, position, ord)
				ON k.workflow = s.workflow AND k.position = s.position
			ORDER BY k.ord`), workflows, indexes)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (storage.Schedule, error) { return scanSchedule(row) })
		return err
	})
	if err != nil {
		return nil, s.fail("register schedules", err)
	}
	return out, nil
}

// ListSchedules implements storage.Store.
func (s *Store) ListSchedules(ctx context.Context) ([]storage.Schedule, error) {
	var out []storage.Schedule
	err := s.retry(ctx, func() error {
		rows, err := s.db.Query(ctx, s.q(`SELECT `+scheduleColumns+scheduleFrom+` ORDER BY s.workflow, s.position`))
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (storage.Schedule, error) { return scanSchedule(row) })
		return err
	})
	if err != nil {
		return nil, s.fail("list schedules", err)
	}
	return out, nil
}

// lockScheduleSQL locks a schedule's row: a second scheduler firing the
// same tick waits here, then reads the tick the first one recorded. The
// last instance's status is read by a statement of its own, after the
// lock, so that it belongs to the row as it is once locked.
const lockScheduleSQL = `
SELECT s.workflow, s.position, s.fingerprint, s.last_tick, s.paused, s.last_instance_id, '', s.fired, s.skipped
FROM {s}schedules s WHERE s.workflow = $1 AND s.position = $2 FOR UPDATE`

// FireSchedule implements storage.Store.
func (s *Store) FireSchedule(ctx context.Context, p storage.FireParams, plan storage.PlanFunc) (storage.FireResult, error) {
	if err := p.Check(); err != nil {
		return storage.FireResult{}, fmt.Errorf("postgres: fire schedule: %w", err)
	}
	if err := checkCreate([]storage.CreateParams{p.Instance}, plan); err != nil {
		return storage.FireResult{}, err
	}
	var res storage.FireResult
	err := s.inTx(ctx, func(tx pgx.Tx, st *txState) error {
		sch, err := scanSchedule(tx.QueryRow(ctx, s.q(lockScheduleSQL), p.Schedule.Workflow, p.Schedule.Index))
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("schedule %d of workflow %s is not registered: %w", p.Schedule.Index, p.Schedule.Workflow, storage.ErrNotFound)
		}
		if err != nil {
			return err
		}
		if sch.LastInstanceID != "" {
			err := tx.QueryRow(ctx, s.q(`SELECT status FROM {s}instances WHERE id = $1`), sch.LastInstanceID).Scan(&sch.LastInstanceStatus)
			if err != nil && !errors.Is(err, pgx.ErrNoRows) { // a pruned instance is a finished one
				return err
			}
		}
		if res = storage.FireDecision(&sch, &p); res.Outcome != storage.FireStarted {
			if res.Outcome == storage.FireSkipped {
				_, err = tx.Exec(ctx, s.q(`UPDATE {s}schedules SET last_tick = $2, skipped = skipped + 1, updated_at = {now}
					WHERE workflow = $3 AND position = $4`), s.now(), p.Tick, p.Schedule.Workflow, p.Schedule.Index)
			}
			return err
		}
		created, err := s.create(ctx, tx, st, s.now(), []storage.CreateParams{p.Instance}, plan, false)
		if err != nil {
			return err
		}
		res = storage.FireResult{Outcome: storage.FireStarted, InstanceID: created[0].ID}
		fired := 1
		if created[0].Existed {
			res.Outcome, fired = storage.FireStale, 0
		}
		_, err = tx.Exec(ctx, s.q(`UPDATE {s}schedules SET last_tick = $2, last_instance_id = $3, fired = fired + $4, updated_at = {now}
			WHERE workflow = $5 AND position = $6`), s.now(), p.Tick, res.InstanceID, fired, p.Schedule.Workflow, p.Schedule.Index)
		return err
	})
	if err != nil {
		return storage.FireResult{}, s.fail("fire schedule", err)
	}
	return res, nil
}

// SetSchedulePaused implements storage.Store.
func (s *Store) SetSchedulePaused(ctx context.Context, p storage.SetPausedParams) error {
	var tag pgconn.CommandTag
	err := s.retry(ctx, func() (err error) {
		tag, err = s.db.Exec(ctx, s.q(`UPDATE {s}schedules SET
				last_tick = CASE WHEN paused AND NOT $2 THEN greatest(last_tick, $3) ELSE last_tick END,
				paused = $2, updated_at = {now}
			WHERE workflow = $4 AND position = $5`), s.now(), p.Paused, p.Now, p.Workflow, p.Index)
		return err
	})
	if err != nil {
		return s.fail("pause schedule", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("schedule %d of workflow %s is not registered: %w", p.Index, p.Workflow, storage.ErrNotFound)
	}
	return nil
}
