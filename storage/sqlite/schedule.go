package sqlite

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/dagrun/dagrun/storage"
)

// registerScheduleSQL creates a schedule's row, or starts it over from ?4
// when its fingerprint changed, with ?6, the latest instance of a row with
// its fingerprint, as its last instance; an unchanged row takes ?6 only
// when it is later than its own (a row left behind while the schedule sat
// at another position).
const registerScheduleSQL = `INSERT INTO schedules (workflow, position, fingerprint, last_tick, updated_at, last_instance_id)
VALUES (?1, ?2, ?3, ?4, ?5, ?6)
ON CONFLICT (workflow, position) DO UPDATE SET fingerprint = excluded.fingerprint,
	last_tick = CASE WHEN fingerprint <> excluded.fingerprint THEN max(last_tick, excluded.last_tick) ELSE last_tick END,
	updated_at = excluded.updated_at,
	last_instance_id = CASE WHEN fingerprint <> excluded.fingerprint THEN excluded.last_instance_id
		ELSE max(last_instance_id, excluded.last_instance_id) END
WHERE fingerprint <> excluded.fingerprint OR last_instance_id < excluded.last_instance_id`

// registerNewScheduleSQL creates a schedule's row and leaves a registered
// one as it is (RegisterSchedulesParams.OnlyNew).
const registerNewScheduleSQL = `INSERT INTO schedules (workflow, position, fingerprint, last_tick, updated_at, last_instance_id)
VALUES (?1, ?2, ?3, ?4, ?5, ?6)
ON CONFLICT (workflow, position) DO NOTHING`

const scheduleColumns = `s.workflow, s.position, s.fingerprint, s.last_tick, s.paused, s.last_instance_id,
	coalesce(i.status, ''), s.fired, s.skipped`

const scheduleFrom = ` FROM schedules s LEFT JOIN instances i ON i.id = s.last_instance_id`

func scanSchedule(sc scanner) (storage.Schedule, error) {
	var (
		s        storage.Schedule
		lastTick int64
	)
	if err := sc.Scan(&s.Workflow, &s.Index, &s.Fingerprint, &lastTick, &s.Paused, &s.LastInstanceID,
		&s.LastInstanceStatus, &s.Fired, &s.Skipped); err != nil {
		return s, err
	}
	s.LastTick = fromUS(lastTick)
	return s, nil
}

// RegisterSchedules implements storage.Store.
func (s *Store) RegisterSchedules(ctx context.Context, p storage.RegisterSchedulesParams) ([]storage.Schedule, error) {
	for _, sp := range p.Specs {
		if err := sp.Check(); err != nil {
			return nil, fmt.Errorf("sqlite: register schedules: %w", err)
		}
	}
	out := make([]storage.Schedule, 0, len(p.Specs))
	err := s.write(ctx, "register schedules", func(t *txn) error {
		out = out[:0]
		lastOf, err := t.lastInstances(p.Specs)
		if err != nil {
			return err
		}
		register := registerScheduleSQL
		if p.OnlyNew {
			register = registerNewScheduleSQL
		}
		for _, sp := range p.Specs {
			last := lastOf[[2]string{sp.Workflow, sp.Fingerprint}]
			if _, err := t.exec(register, sp.Workflow, sp.Index, sp.Fingerprint, us(p.Now), us(t.now), last); err != nil {
				return err
			}
			sch, err := scanSchedule(t.queryRow(`SELECT `+scheduleColumns+scheduleFrom+` WHERE s.workflow = ? AND s.position = ?`,
				sp.Workflow, sp.Index))
			if err != nil {
				return err
			}
			out = append(out, sch)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// lastInstances returns, by workflow and fingerprint, the last instance
// of the schedules of specs' workflows as they are registered now, before
// any moved in the list.
func (t *txn) lastInstances(specs []storage.ScheduleSpec) (map[[2]string]string, error) {
	out := map[[2]string]string{}
	seen := map[string]bool{}
	for _, sp := range specs {
		if seen[sp.Workflow] {
			continue
		}
		seen[sp.Workflow] = true
		// Instance IDs sort by creation: the greatest is the latest.
		rows, err := t.query(`SELECT fingerprint, max(last_instance_id) FROM schedules WHERE workflow = ? GROUP BY fingerprint`, sp.Workflow)
		if err != nil {
			return nil, err
		}
		err = eachRow(rows, func(sc scanner) error {
			var fingerprint, last string
			if err := sc.Scan(&fingerprint, &last); err != nil {
				return err
			}
			out[[2]string{sp.Workflow, fingerprint}] = last
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// ListSchedules implements storage.Store.
func (s *Store) ListSchedules(ctx context.Context) ([]storage.Schedule, error) {
	var out []storage.Schedule
	err := s.read(ctx, "list schedules", func(tx *sql.Tx) error {
		out = nil
		rows, err := tx.QueryContext(ctx, `SELECT `+scheduleColumns+scheduleFrom+` ORDER BY s.workflow, s.position`)
		if err != nil {
			return err
		}
		return eachRow(rows, func(sc scanner) error {
			sch, err := scanSchedule(sc)
			out = append(out, sch)
			return err
		})
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// FireSchedule implements storage.Store. BEGIN IMMEDIATE serialises it with
// every other writer, so the row read here is still the row when the
// instance is created and the tick recorded.
func (s *Store) FireSchedule(ctx context.Context, p storage.FireParams, plan storage.PlanFunc) (storage.FireResult, error) {
	if err := p.Check(); err != nil {
		return storage.FireResult{}, fmt.Errorf("sqlite: fire schedule: %w", err)
	}
	if err := checkCreate([]storage.CreateParams{p.Instance}, plan); err != nil {
		return storage.FireResult{}, err
	}
	var res storage.FireResult
	err := s.write(ctx, "fire schedule", func(t *txn) error {
		sch, err := scanSchedule(t.queryRow(`SELECT `+scheduleColumns+scheduleFrom+` WHERE s.workflow = ? AND s.position = ?`,
			p.Schedule.Workflow, p.Schedule.Index))
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("schedule %d of workflow %s is not registered: %w", p.Schedule.Index, p.Schedule.Workflow, storage.ErrNotFound)
		}
		if err != nil {
			return err
		}
		if res = storage.FireDecision(&sch, &p); res.Outcome != storage.FireStarted {
			if res.Outcome == storage.FireSkipped {
				_, err = t.exec(`UPDATE schedules SET last_tick = ?, skipped = skipped + 1, updated_at = ? WHERE workflow = ? AND position = ?`,
					us(p.Tick), us(t.now), p.Schedule.Workflow, p.Schedule.Index)
			}
			return err
		}
		created, err := t.createMany([]storage.CreateParams{p.Instance}, plan)
		if err != nil {
			return err
		}
		res = storage.FireResult{Outcome: storage.FireStarted, InstanceID: created[0].ID}
		fired := 1
		if created[0].Existed {
			res.Outcome, fired = storage.FireStale, 0
		}
		_, err = t.exec(`UPDATE schedules SET last_tick = ?, last_instance_id = ?, fired = fired + ?, updated_at = ?
			WHERE workflow = ? AND position = ?`, us(p.Tick), res.InstanceID, fired, us(t.now), p.Schedule.Workflow, p.Schedule.Index)
		return err
	})
	if err != nil {
		return storage.FireResult{}, err
	}
	if res.Outcome == storage.FireStarted {
		s.notify()
	}
	return res, nil
}

// SetSchedulePaused implements storage.Store.
func (s *Store) SetSchedulePaused(ctx context.Context, p storage.SetPausedParams) error {
	return s.write(ctx, "pause schedule", func(t *txn) error {
		res, err := t.exec(`UPDATE schedules SET
				last_tick = CASE WHEN paused AND NOT ?1 THEN max(last_tick, ?2) ELSE last_tick END,
				paused = ?1, updated_at = ?3
			WHERE workflow = ?4 AND position = ?5`, p.Paused, us(p.Now), us(t.now), p.Workflow, p.Index)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			return cmp.Or(err, fmt.Errorf("schedule %d of workflow %s is not registered: %w", p.Index, p.Workflow, storage.ErrNotFound))
		}
		return nil
	})
}
