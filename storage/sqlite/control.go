package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/dagrun/dagrun/storage"
)

// CancelInstance implements storage.Store.
func (s *Store) CancelInstance(ctx context.Context, id, reason string, plan storage.PlanFunc) error {
	if plan == nil {
		return errors.New("sqlite: cancel instance: nil PlanFunc")
	}
	return s.writeBy(ctx, "cancel instance", func(t *txn) error {
		status, err := t.instanceStatus(id)
		if err != nil {
			return err
		}
		if status.Finished() {
			return storage.Refuse(storage.ErrConflict, "instance %s is already %s", id, status)
		}
		if err := t.finishInstance(id, storage.InstanceChange{Status: storage.InstanceCancelled, Error: reason}, true); err != nil {
			return err
		}
		return t.planReplan(plan)
	})
}

// RetryInstance implements storage.Store.
func (s *Store) RetryInstance(ctx context.Context, id string, plan storage.PlanFunc) error {
	if plan == nil {
		return errors.New("sqlite: retry instance: nil PlanFunc")
	}
	err := s.writeBy(ctx, "retry instance", func(t *txn) error {
		t.planFn = plan
		if err := t.refuseChild(id); err != nil {
			return err
		}
		retried, err := t.retryOne(id)
		if err != nil {
			return err
		}
		return t.plan(retried, plan)
	})
	if err != nil {
		return err
	}
	s.notify()
	return nil
}

// retryOne re-arms a failed or cancelled instance and, through its
// workflow steps, its failed and cancelled children; it returns the
// instances it re-armed, to plan.
func (t *txn) retryOne(id string) ([]string, error) {
	status, err := t.instanceStatus(id)
	if err != nil {
		return nil, err
	}
	if status != storage.InstanceFailed && status != storage.InstanceCancelled {
		return nil, storage.Refuse(storage.ErrConflict, "instance %s is %s; only a failed or cancelled instance can be retried", id, status)
	}
	if err := t.rearmItems(id); err != nil {
		return nil, err
	}
	if _, err := t.exec(`UPDATE instances SET status = `+revivedStatus+`, output = NULL, error = '', finished_at = NULL,
		paused = 0, run_after = `+revivedRunAfter+` WHERE id = ?1`, id, us(t.now)); err != nil {
		return nil, err
	}
	if err := t.rearmFailure(id); err != nil {
		return nil, err
	}
	t.event(id, "", storage.EventInstanceRetried, 0, "")
	children, err := t.rearmFailedSteps(id)
	if err != nil {
		return nil, err
	}
	return append([]string{id}, children...), nil
}

// rearmItems makes the failed and cancelled forEach steps of instance id
// that expanded run again: their failed and cancelled items are pending,
// their completed ones keep their outputs. Re-armed items start over
// (attempts, error and timings reset); the fence is kept so that claims
// from before stay stale.
func (t *txn) rearmItems(id string) error {
	now := us(t.now)
	if _, err := t.exec(`UPDATE steps SET status = 'pending', attempts = 0, output = NULL, error = '',
			run_after = ?2, ready_at = ?2, first_started_at = NULL, started_at = NULL, finished_at = NULL,
			lease_until = NULL, worker_id = ''
		WHERE parent_id IN (SELECT id FROM steps WHERE instance_id = ?1 AND item_index = -1 AND for_each
			AND status IN ('failed', 'cancelled')) AND status IN ('failed', 'cancelled') AND child_id = ''`, id, now); err != nil {
		return err
	}
	_, err := t.exec(`UPDATE steps SET status = 'running', output = NULL, error = '', finished_at = NULL
		WHERE instance_id = ? AND item_index = -1 AND for_each AND status IN ('failed', 'cancelled')
			AND EXISTS (SELECT 1 FROM steps i WHERE i.parent_id = steps.id)`, id)
	return err
}

// rearmFailedSteps makes the other failed and cancelled steps of instance
// id run again: a workflow step (or item) with a child by retrying its
// child, any other step from the start. It returns the children it
// re-armed, to plan.
func (t *txn) rearmFailedSteps(id string) ([]string, error) {
	children, err := t.retryChildren(id)
	if err != nil {
		return nil, err
	}
	if _, err := t.exec(`UPDATE steps SET status = 'blocked', attempts = 0, input = NULL, output = NULL, error = '',
			run_after = 0, ready_at = NULL, first_started_at = NULL, started_at = NULL, finished_at = NULL,
			lease_until = NULL, worker_id = '', deadline = NULL, child_id = ''
		WHERE instance_id = ? AND item_index = -1 AND status IN ('failed', 'cancelled')`, id); err != nil {
		return nil, err
	}
	return children, nil
}

// refuseChild refuses an operation that would run child instance id again
// by itself (see storage.RetryChildError); nil for a top-level instance.
func (t *txn) refuseChild(id string) error {
	var (
		parent     sql.NullString
		parentStep string
	)
	if err := t.queryRow(`SELECT parent_id, parent_step FROM instances WHERE id = ?`, id).Scan(&parent, &parentStep); err != nil {
		return fmt.Errorf("instance %s: %w", id, interpretError("", err))
	}
	if !parent.Valid {
		return nil
	}
	return storage.RetryChildError(id, &storage.ParentRef{InstanceID: parent.String, Step: parentStep})
}

func (t *txn) instanceStatus(id string) (storage.InstanceStatus, error) {
	var status storage.InstanceStatus
	if err := t.queryRow(`SELECT status FROM instances WHERE id = ?`, id).Scan(&status); err != nil {
		return "", fmt.Errorf("instance %s: %w", id, interpretError("", err))
	}
	return status, nil
}
