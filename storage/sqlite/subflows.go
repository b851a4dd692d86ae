package sqlite

import (
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/dagrun/dagrun/storage"
)

// Child instances. A workflow step (or item) that starts is running with
// no lease and its child's ID on its row; the child names it back through
// parent_id, parent_step and parent_item. Every way an instance finishes
// goes through finishInstance, which settles the parent step in the same
// transaction (childFinished) and cancels the instance's own unfinished
// children; so a parent never runs on with a finished child, nor a child
// with a finished parent.

// startChildren makes the workflow step of row stepID (of instance
// parentID, at depth) running, with no lease, expanding its items first
// for a forEach step, records each child's ID on its row, and creates the
// children, at the parent's priority, with the transaction's PlanFunc. A child that finished at once
// settles the step there and then.
func (t *txn) startChildren(parentID string, depth int, stepID int64, c storage.StepChange, runAfter int64) error {
	var (
		name, childWorkflow string
		forEach             bool
		priority            int
	)
	if err := t.queryRow(`SELECT name, child_workflow, for_each, priority FROM steps WHERE id = ?`, stepID).Scan(&name, &childWorkflow, &forEach, &priority); err != nil {
		return fmt.Errorf("workflow step %d: %w", stepID, err)
	}
	if err := storage.CheckChildren(parentID, &storage.StepSpec{Name: name, Workflow: childWorkflow, ForEach: forEach}, c); err != nil {
		return err
	}
	children := storage.ChildParams(parentID, depth, priority, name, c, fromUS(runAfter))
	for i := range children {
		if err := validateCreate(&children[i]); err != nil {
			return fmt.Errorf("plan for instance %s starts a child of step %s: %w", parentID, name, err)
		}
	}
	now := us(t.now)
	if forEach {
		if err := t.expand(stepID, c.Items, runAfter); err != nil {
			return err
		}
		ids := make([]string, len(children))
		for i, ch := range children {
			ids[i] = ch.ID
		}
		b, err := json.Marshal(ids)
		if err != nil {
			return err
		}
		if _, err := t.exec(`UPDATE steps SET status = 'running', started_at = ?1, first_started_at = ?1, child_id = c.value
			FROM json_each(?2) AS c WHERE steps.parent_id = ?3 AND steps.item_index = c.key`, now, string(b), stepID); err != nil {
			return err
		}
	} else if _, err := t.exec(`UPDATE steps SET status = 'running', input = ?1, started_at = ?2, first_started_at = ?2,
			ready_at = ?2, run_after = ?3, lease_until = NULL, child_id = ?4 WHERE id = ?5`,
		jsonArg(c.Input), now, runAfter, children[0].ID, stepID); err != nil {
		return err
	}
	created, err := t.create(children, t.planFn)
	if err != nil {
		return err
	}
	var paused bool
	if err := t.queryRow(`SELECT paused FROM instances WHERE id = ?`, parentID).Scan(&paused); err != nil || !paused {
		return err
	}
	// A paused parent's running step started them: they wait with it.
	ids := make([]string, len(created))
	for i, r := range created {
		ids[i] = r.ID
	}
	return t.pauseTree(ids, true)
}

// childFinished settles the workflow step (or item) whose child id just
// finished with status: completed with the child's output, or failed for
// good naming the child. Its instance is then planned (t.replan), which
// may finish it in turn and so settle its own parent. A step that is no
// longer running for this child (its instance finished first, which is
// what cancelled the child) is left as it is.
func (t *txn) childFinished(id string, parent *storage.ParentRef, status storage.InstanceStatus, output json.RawMessage, msg string) error {
	var (
		rowID, forEachRow int64
		stepStatus        storage.StepStatus
	)
	err := t.queryRow(`SELECT id, coalesce(parent_id, 0), status FROM steps
		WHERE instance_id = ? AND item_index = ? AND name = ? AND child_id = ?`,
		parent.InstanceID, parent.Item, parent.Step, id).Scan(&rowID, &forEachRow, &stepStatus)
	if errors.Is(err, sql.ErrNoRows) || (err == nil && stepStatus != storage.StepRunning) {
		return nil
	}
	if err != nil {
		return err
	}
	now := us(t.now)
	typ, errText := storage.EventStepCompleted, ""
	if status == storage.InstanceCompleted {
		_, err = t.exec(`UPDATE steps SET status = 'completed', output = ?, error = '', finished_at = ? WHERE id = ?`,
			jsonArg(output), now, rowID)
	} else {
		typ, errText = storage.EventStepFailed, storage.ChildError(id, status, msg)
		_, err = t.exec(`UPDATE steps SET status = 'failed', output = NULL, error = ?, finished_at = ? WHERE id = ?`,
			errText, now, rowID)
	}
	if err != nil {
		return err
	}
	if forEachRow == 0 {
		t.event(parent.InstanceID, parent.Step, typ, 0, errText)
		t.replan = appendOnce(t.replan, parent.InstanceID)
		return nil
	}
	settled, err := t.settleItems([]int64{forEachRow})
	for _, p := range settled {
		t.replan = appendOnce(t.replan, p)
	}
	return err
}

// cancelChildren cancels the unfinished children of an instance that
// finished first, and theirs, recursively.
func (t *txn) cancelChildren(id string, status storage.InstanceStatus) error {
	rows, err := t.query(`SELECT id FROM instances WHERE parent_id = ? AND finished_at IS NULL`, id)
	if err != nil {
		return err
	}
	children, err := column[string](rows)
	if err != nil {
		return err
	}
	if len(children) > 0 {
		t.spilled = true // other instances than those planned changed
	}
	for _, child := range children {
		if err := t.finishInstance(child, storage.InstanceChange{Status: storage.InstanceCancelled, Error: storage.ParentFinishedMessage(id, status)}, true); err != nil {
			return err
		}
	}
	return nil
}

// planReplan plans the instances left in t.replan by a transition that was
// no plan of theirs (a creation, a cancellation, a retry).
func (t *txn) planReplan(plan storage.PlanFunc) error {
	replan := t.replan
	t.replan = nil
	return t.plan(replan, plan)
}

// retryChildren re-arms the failed and cancelled workflow steps and items
// of instance id that have a child: each runs again, with no lease, and
// its child is retried (recursively) instead of a new one started. It
// returns the instances it re-armed, to plan. Each starts again now, as
// its child runs again, so that its time counts this run.
func (t *txn) retryChildren(id string) ([]string, error) {
	rows, err := t.query(`UPDATE steps SET status = 'running', output = NULL, error = '', started_at = ?1, first_started_at = ?1,
			finished_at = NULL, lease_until = NULL
		WHERE instance_id = ?2 AND child_id <> '' AND status IN ('failed', 'cancelled')
		RETURNING child_id, name, item_index, coalesce(parent_id, 0)`, us(t.now), id)
	if err != nil {
		return nil, err
	}
	type rearmed struct {
		child     string
		ref       storage.ParentRef
		forEachID int64
	}
	var list []rearmed
	if err := eachRow(rows, func(sc scanner) error {
		r := rearmed{ref: storage.ParentRef{InstanceID: id}}
		err := sc.Scan(&r.child, &r.ref.Step, &r.ref.Item, &r.forEachID)
		list = append(list, r)
		return err
	}); err != nil {
		return nil, err
	}
	var retried []string
	for _, r := range list {
		var (
			status storage.InstanceStatus
			output []byte
		)
		if err := t.queryRow(`SELECT status, output FROM instances WHERE id = ?`, r.child).Scan(&status, &output); err != nil {
			return nil, fmt.Errorf("child instance %s: %w", r.child, interpretError("", err))
		}
		switch status {
		case storage.InstanceFailed, storage.InstanceCancelled:
			more, err := t.retryOne(r.child)
			if err != nil {
				return nil, err
			}
			retried = append(retried, more...)
		case storage.InstanceCompleted:
			// Settled as it would have been when the child completed.
			if err := t.childFinished(r.child, &r.ref, status, rawJSON(output), ""); err != nil {
				return nil, err
			}
		}
	}
	return retried, nil
}
