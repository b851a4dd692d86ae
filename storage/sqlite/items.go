package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/dagrun/dagrun/storage"
)

const insertItemsSQL = `INSERT INTO steps (instance_id, position, name, handler, queue, workflow, priority, status,
	max_attempts, backoff_us, max_backoff_us, timeout_us, input, run_after, ready_at, parent_id, item_index,
	for_each, item_concurrency, continue_on_error, held_by_instance) VALUES `

const itemColumns = 21

// expand makes the forEach step of row parentID running (with no lease: it
// is never claimed, only its items are) and inserts one pending item per
// input, copying what a claim needs from the step.
func (t *txn) expand(parentID int64, items []json.RawMessage, runAfter int64) error {
	now := us(t.now)
	var (
		instanceID, name, handler, queue, workflow string
		position, priority, maxAttempts, cap       int
		backoff, maxBackoff, timeout               int64
		forEach, continueOnError, heldByInstance   bool
	)
	err := t.queryRow(`UPDATE steps SET status = 'running', started_at = ?1, first_started_at = ?1, ready_at = ?1,
			run_after = ?2, lease_until = NULL
		WHERE id = ?3 RETURNING instance_id, position, name, handler, queue, workflow, priority, max_attempts,
			backoff_us, max_backoff_us, timeout_us, for_each, item_concurrency, continue_on_error, held_by_instance`, now, runAfter, parentID).
		Scan(&instanceID, &position, &name, &handler, &queue, &workflow, &priority, &maxAttempts,
			&backoff, &maxBackoff, &timeout, &forEach, &cap, &continueOnError, &heldByInstance)
	if err != nil {
		return fmt.Errorf("expand step %d: %w", parentID, err)
	}
	if !forEach {
		return fmt.Errorf("plan for instance %s expands step %q, which is not a forEach step", instanceID, name)
	}
	rows := make([]any, 0, itemColumns*len(items))
	for i, in := range items {
		rows = append(rows, instanceID, position, name, handler, queue, workflow, priority, "pending",
			maxAttempts, backoff, maxBackoff, timeout, jsonArg(in), runAfter, now, parentID, i,
			false, cap, continueOnError, heldByInstance)
	}
	if err := t.insertRows(insertItemsSQL, itemColumns, rows); err != nil {
		return fmt.Errorf("insert items of step %s: %w", name, err)
	}
	return nil
}

// settleItems brings the forEach steps whose items changed (parents) up to
// date, in the transaction of that change: a terminal item failure without
// continueOnError fails its step at once and cancels the step's unfinished
// items; a step whose items are all finished completes with their outputs
// in index order, or fails when one failed (null for it in the output).
// It returns the instances whose steps it finished, to plan, and sets
// t.itemSlotFreed when an item under a cap may run in a sibling's slot.
func (t *txn) settleItems(parents []int64) ([]string, error) {
	var touched []string
	now := us(t.now)
	for _, id := range parents {
		var (
			instanceID, name string
			status           storage.StepStatus
			continueOnError  bool
			capped           bool
		)
		if err := t.queryRow(`SELECT instance_id, name, status, continue_on_error, item_concurrency > 0 FROM steps WHERE id = ?`, id).
			Scan(&instanceID, &name, &status, &continueOnError, &capped); err != nil {
			return nil, fmt.Errorf("forEach step %d: %w", id, err)
		}
		if status != storage.StepRunning {
			continue // already settled (failed by a sibling, or its instance finished)
		}
		var (
			failedIndex int
			failedError string
		)
		// min() reads the few failed and cancelled entries of the status
		// index; ORDER BY item_index LIMIT 1 could walk every item.
		err := t.queryRow(`SELECT item_index, error FROM steps WHERE parent_id = +?1 AND item_index =
			(SELECT min(item_index) FROM steps WHERE parent_id = +?1 AND status IN ('failed', 'cancelled'))`, id).Scan(&failedIndex, &failedError)
		failed := err == nil
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return nil, err
		}
		if !failed || continueOnError {
			var unfinished int
			if err := t.queryRow(`SELECT EXISTS (SELECT 1 FROM steps WHERE parent_id = ? AND status IN ('pending', 'running'))`, id).
				Scan(&unfinished); err != nil {
				return nil, err
			}
			if unfinished != 0 {
				// An item under the cap may run in the slot a finished
				// sibling left: news for the claimers.
				t.itemSlotFreed = t.itemSlotFreed || capped
				continue
			}
		}
		msg := ""
		if failed {
			msg = fmt.Sprintf("item %d failed: %s", failedIndex, failedError)
			if !continueOnError {
				if err := t.cancelItems(id, msg); err != nil {
					return nil, err
				}
			}
		}
		newStatus := storage.StepCompleted
		if failed {
			newStatus = storage.StepFailed
		}
		output := `(SELECT json_group_array(json(coalesce(output, 'null'))) FROM
			(SELECT output FROM steps WHERE parent_id = +?1 ORDER BY item_index))`
		if failed && !continueOnError {
			output = `NULL`
		}
		if _, err := t.exec(`UPDATE steps SET status = ?2, error = ?3, finished_at = ?4, output = `+output+` WHERE id = ?1`,
			id, newStatus, msg, now); err != nil {
			return nil, err
		}
		typ := storage.EventStepCompleted
		if failed {
			typ = storage.EventStepFailed
		}
		t.event(instanceID, name, typ, 0, msg)
		touched = append(touched, instanceID)
	}
	return touched, nil
}

// cancelItems cancels the unfinished items of one forEach step; running
// ones lose their claims, which their workers see at the next heartbeat.
func (t *txn) cancelItems(parentID int64, reason string) error {
	_, err := t.exec(`UPDATE steps SET status = 'cancelled', finished_at = ?, lease_until = NULL
		WHERE parent_id = ? AND status IN ('pending', 'running')`, us(t.now), parentID)
	return err
}

// ListItems implements storage.Store.
func (s *Store) ListItems(ctx context.Context, p storage.ItemsParams) ([]storage.Item, error) {
	limit := p.Limit
	if limit <= 0 {
		limit = 100
	}
	var out []storage.Item
	err := s.read(ctx, "list items", func(tx *sql.Tx) error {
		out = nil
		var (
			parentID  int64
			callsFlow bool
		)
		err := tx.QueryRowContext(ctx, `SELECT id, child_workflow <> '' FROM steps WHERE instance_id = ? AND item_index = -1 AND name = ?`,
			p.InstanceID, p.Step).Scan(&parentID, &callsFlow)
		if errors.Is(err, sql.ErrNoRows) {
			var n int
			if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM instances WHERE id = ?`, p.InstanceID).Scan(&n); err != nil {
				return err
			}
			if n == 0 {
				return fmt.Errorf("instance %s: %w", p.InstanceID, storage.ErrNotFound)
			}
			return fmt.Errorf("step %s of instance %s: %w", p.Step, p.InstanceID, storage.ErrNotFound)
		}
		if err != nil {
			return err
		}
		status, started := "status", attemptStartedAt
		if callsFlow {
			status, started = itemStatusSQL, itemChildStartedSQL
		}
		q := `SELECT item_index, ` + status + `, attempts, input, output, error, ` + started + ` AS started_at, finished_at, worker_id, child_id
			FROM steps WHERE parent_id = +?1`
		if p.Status != "" {
			q += ` AND ` + status + ` = ?4`
		}
		q += ` ORDER BY item_index LIMIT CAST(?2 AS INTEGER) OFFSET CAST(?3 AS INTEGER)`
		args := []any{parentID, limit, max(p.Offset, 0)}
		if p.Status != "" {
			args = append(args, string(p.Status))
		}
		rows, err := tx.QueryContext(ctx, q, args...)
		if err != nil {
			return err
		}
		return eachRow(rows, func(sc scanner) error {
			var (
				it                storage.Item
				input, output     []byte
				started, finished sql.NullInt64
			)
			if err := sc.Scan(&it.Index, &it.Status, &it.Attempts, &input, &output, &it.Error, &started, &finished, &it.WorkerID, &it.Child); err != nil {
				return err
			}
			it.Input, it.Output = rawJSON(input), rawJSON(output)
			it.StartedAt, it.FinishedAt = ptrUS(started), ptrUS(finished)
			out = append(out, it)
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// itemChildStartedSQL is when an item of a forEach workflow step started:
// when its child did, none while the child waits to be admitted, as an
// item of a handler starts when it is claimed.
const itemChildStartedSQL = `(SELECT i.started_at FROM instances i WHERE i.id = steps.child_id)`

// itemStatusSQL is the status shown of an item of a forEach workflow
// step: running from the start, it is pending while its child waits to be
// admitted under its concurrency limit, since nothing of it runs yet.
const itemStatusSQL = `CASE WHEN status = 'running' AND EXISTS (SELECT 1 FROM instances i
	WHERE i.id = steps.child_id AND i.held = 1) THEN 'pending' ELSE status END`

// itemCounts fills in the item counts of the forEach steps of instances,
// with one grouped query that reads only the items' status index, then
// moves the items whose child is held (itemStatusSQL) from running to
// pending, reading only the items of forEach workflow steps.
func itemCounts(ctx context.Context, tx *sql.Tx, instances []storage.Instance) error {
	byID, ids := forEachSteps(instances, func(*storage.Step) bool { return true })
	if len(byID) == 0 {
		return nil
	}
	rows, err := tx.QueryContext(ctx, `SELECT parent_id, status, count(*) FROM steps
		WHERE parent_id IN (SELECT value FROM json_each(?)) GROUP BY parent_id, status`, ids)
	if err != nil {
		return err
	}
	if err := eachRow(rows, func(sc scanner) error {
		var (
			id     int64
			status storage.StepStatus
			n      int
		)
		if err := sc.Scan(&id, &status, &n); err != nil {
			return err
		}
		storage.CountItem(byID[id].Items, status, n)
		return nil
	}); err != nil {
		return err
	}
	calling, ids := forEachSteps(instances, func(st *storage.Step) bool { return st.Workflow != "" })
	if len(calling) == 0 {
		return nil
	}
	rows, err = tx.QueryContext(ctx, `SELECT s.parent_id, count(*) FROM steps s JOIN instances i ON i.id = s.child_id
		WHERE s.parent_id IN (SELECT value FROM json_each(?)) AND s.status = 'running' AND i.held = 1 GROUP BY s.parent_id`, ids)
	if err != nil {
		return err
	}
	return eachRow(rows, func(sc scanner) error {
		var id, n int64
		if err := sc.Scan(&id, &n); err != nil {
			return err
		}
		storage.HoldItems(calling[id].Items, int(n))
		return nil
	})
}

// itemChildren fills in the child IDs of the forEach workflow steps of
// instances, in item order.
func itemChildren(ctx context.Context, tx *sql.Tx, instances []storage.Instance) error {
	byID, ids := forEachSteps(instances, func(st *storage.Step) bool { return st.Workflow != "" })
	if len(byID) == 0 {
		return nil
	}
	rows, err := tx.QueryContext(ctx, `SELECT parent_id, child_id FROM steps
		WHERE parent_id IN (SELECT value FROM json_each(?)) AND child_id <> '' ORDER BY parent_id, item_index`, ids)
	if err != nil {
		return err
	}
	return eachRow(rows, func(sc scanner) error {
		var (
			id    int64
			child string
		)
		if err := sc.Scan(&id, &child); err != nil {
			return err
		}
		byID[id].Children = append(byID[id].Children, child)
		return nil
	})
}

// forEachSteps is storage.ForEachSteps with the IDs as a JSON array, for
// json_each.
func forEachSteps(instances []storage.Instance, keep func(*storage.Step) bool) (map[int64]*storage.Step, string) {
	byID, ids := storage.ForEachSteps(instances, keep)
	b, _ := json.Marshal(ids) // integers always marshal
	return byID, string(b)
}
