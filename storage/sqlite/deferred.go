package sqlite

import (
	"context"
	"encoding/json"

	"github.com/dagrun/dagrun/storage"
)

// startableDeferredSQL finds the instances StartDeferred may plan: marked
// deferred, unfinished, not parked, not paused, their time come. A held
// one among them is admitted if its key has room and parked if not
// (admitDeferred): then only a finish of its key admits it, and no sweep
// reads it again. However many instances wait behind a full key, the
// sweep reads each once, and a backlog never crowds out an instance whose
// key is empty.
const startableDeferredSQL = `SELECT id, held FROM instances
	WHERE deferred = 1 AND finished_at IS NULL AND parked = 0 AND paused = 0 AND run_after <= ?1`

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
					continue // parked: a finish of its key admits it
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
// have none), and releases its held steps that fit; it parks the instance
// if not, with the other held instances of its key whose time has come.
// It reports whether the instance is admitted.
func (t *txn) admitDeferred(id string) (bool, error) {
	// A parked instance (by an earlier admission of this sweep) waits for
	// a finish of its key, which admits it.
	res, err := t.exec(`UPDATE instances SET held = 0 WHERE id = ? AND held = 1 AND parked = 0 AND `+keyHasRoomSQL, id)
	if err != nil {
		return false, err
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		if err == nil {
			// The key is full: so are its other held instances whose time
			// has come parked.
			_, err = t.exec(`UPDATE instances SET parked = 1 WHERE (workflow, concurrency_key) = (
				SELECT workflow, concurrency_key FROM instances WHERE id = ?1 AND held = 1 AND parked = 0)
				AND finished_at IS NULL AND held = 1 AND parked = 0 AND run_after <= ?2`, id, us(t.now))
		}
		return false, err
	}
	_, err = t.exec(`UPDATE steps SET held_by_instance = 0 WHERE instance_id = ? AND held_by_instance = 1`, id)
	return err == nil, err
}
