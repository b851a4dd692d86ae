package sqlite

import (
	"context"
	"encoding/json"

	"github.com/dagrun/dagrun/storage"
)

// startableDeferredSQL finds the instances StartDeferred may plan: marked
// deferred, unfinished, not paused, their time come, and admitted or
// admissible (their keys have room). Held instances whose keys are full
// are left out, so that however many of them wait, they never crowd out
// one whose key is empty.
const startableDeferredSQL = `SELECT id, held FROM instances
	WHERE deferred = 1 AND finished_at IS NULL AND paused = 0 AND run_after <= ?1 AND (held = 0 OR ` + keyHasRoomSQL + `)`

// StartDeferred implements storage.Store. A limit below 1 means 1000.
func (s *Store) StartDeferred(ctx context.Context, limit int, plan storage.PlanFunc) (int, error) {
	return s.sweep(ctx, "start deferred", plan, limit, `SELECT EXISTS (`+startableDeferredSQL+`)`, func(t *txn, limit int) (int, error) {
		rows, err := t.query(startableDeferredSQL+` ORDER BY held, priority DESC, id LIMIT CAST(?2 AS INTEGER)`, us(t.now), limit)
		if err != nil {
			return 0, err
		}
		var (
			ids  []string
			held []bool
		)
		if err := eachRow(rows, func(sc scanner) error {
			var (
				id string
				h  bool
			)
			if err := sc.Scan(&id, &h); err != nil {
				return err
			}
			ids, held = append(ids, id), append(held, h)
			return nil
		}); err != nil {
			return 0, err
		}
		var start []string
		for i, id := range ids {
			if held[i] {
				admitted, err := t.admitDeferred(id)
				if err != nil {
					return 0, err
				}
				if !admitted {
					continue // a finish of its key admits it later
				}
			}
			start = append(start, id)
		}
		if len(start) == 0 {
			return 0, nil
		}
		b, _ := json.Marshal(start) // strings always marshal
		if _, err := t.exec(`UPDATE instances SET deferred = 0 WHERE id IN (SELECT value FROM json_each(?))`, string(b)); err != nil {
			return 0, err
		}
		return len(start), t.plan(start, plan)
	})
}

// keyHasRoomSQL holds for an instance row (of instances) whose workflow
// key admits fewer instances than its limit.
const keyHasRoomSQL = `(SELECT count(*) FROM instances a WHERE a.workflow = instances.workflow
	AND a.concurrency_key = instances.concurrency_key AND a.finished_at IS NULL AND a.held = 0) < instances.concurrency_limit`

// admitDeferred admits a held instance whose time has come if its key has
// room, as the promotion of its first step would (a deferred instance may
// have none), and releases its held steps that fit. It reports whether
// the instance is admitted.
func (t *txn) admitDeferred(id string) (bool, error) {
	res, err := t.exec(`UPDATE instances SET held = 0 WHERE id = ? AND held = 1 AND `+keyHasRoomSQL, id)
	if err != nil {
		return false, err
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return false, err
	}
	_, err = t.exec(`UPDATE steps SET held_by_instance = 0 WHERE instance_id = ? AND held_by_instance = 1`, id)
	return err == nil, err
}
