package sqlite

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"time"

	"github.com/dagrun/dagrun/storage"
)

// loaded is an instance as a PlanFunc sees it, plus what writing its plan
// needs (see collect).
type loaded struct {
	state    storage.InstanceState
	runAfter int64   // the instance's run_after
	paused   bool    // the instance is paused: see due
	timeout  int64   // the instance's timeout_us
	ids      []int64 // step row IDs, parallel to state.Steps
	child    bool    // it has a parent instance
}

// loadMany reads instances and their steps inside the transaction, with
// two statements whatever their number (a group commit touches many).
func (t *txn) loadMany(ids []string) (map[string]*loaded, error) {
	idsJSON, err := json.Marshal(ids)
	if err != nil {
		return nil, err
	}
	out := make(map[string]*loaded, len(ids))
	rows, err := t.query(`SELECT id, workflow, definition_hash, status, input, run_after, paused, timeout_us, failing, error, failed_step, depth, parent_id IS NOT NULL,
		coalesce(traceparent, ''), held OR deferred FROM instances
		WHERE id IN (SELECT value FROM json_each(?))`, string(idsJSON))
	if err != nil {
		return nil, err
	}
	err = eachRow(rows, func(sc scanner) error {
		l := &loaded{}
		st := &l.state
		var (
			input   []byte
			failing bool
			failure storage.Failure
		)
		if err := sc.Scan(&st.ID, &st.Workflow, &st.DefinitionHash, &st.Status, &input, &l.runAfter, &l.paused, &l.timeout,
			&failing, &failure.Error, &failure.Step, &st.Depth, &l.child, &st.TraceParent, &st.Deferred); err != nil {
			return err
		}
		if failing {
			st.Failure = &failure
		}
		st.Input = rawJSON(input)
		st.LoadDefinition = t.definition(st.DefinitionHash)
		out[st.ID] = l
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, id := range ids {
		if out[id] == nil {
			return nil, fmt.Errorf("instance %s: %w", id, storage.ErrNotFound)
		}
	}
	rows, err = t.query(`SELECT instance_id, id, name, depends_on, status, output, error, attempts FROM steps
		WHERE instance_id IN (SELECT value FROM json_each(?)) AND item_index = -1 ORDER BY instance_id, position`, string(idsJSON))
	if err != nil {
		return nil, err
	}
	err = eachRow(rows, func(sc scanner) error {
		var (
			instanceID   string
			sid          int64
			s            storage.StepState
			deps, output []byte
		)
		if err := sc.Scan(&instanceID, &sid, &s.Name, &deps, &s.Status, &output, &s.Error, &s.Attempts); err != nil {
			return err
		}
		// Most steps have no or few dependencies; skip the decoder for "[]".
		if len(deps) > 2 {
			if err := json.Unmarshal(deps, &s.DependsOn); err != nil {
				return fmt.Errorf("step %s of instance %s: depends_on: %w", s.Name, instanceID, err)
			}
		}
		s.Output = rawJSON(output)
		l := out[instanceID]
		l.state.Steps = append(l.state.Steps, s)
		l.ids = append(l.ids, sid)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// plan loads the instances, asks plan about each in turn, and applies the
// answers. A finished instance is not planned: nothing could become ready
// in it.
func (t *txn) plan(ids []string, plan storage.PlanFunc) error {
	if len(ids) == 0 {
		return nil
	}
	t.planFn = plan
	ls, err := t.loadPlanned(ids)
	if err != nil {
		return err
	}
	var b planBatch
	for _, id := range ids {
		l := ls[id]
		if l.state.Status.Finished() {
			continue
		}
		if t.timedOut[id] {
			l.state.TimedOut = time.Duration(l.timeout) * time.Microsecond
		} else if l.state.Failure != nil {
			// A failing instance keeps its deadline while its main steps
			// run an attempt, no longer.
			if _, err := t.exec(`UPDATE instances SET deadline = NULL WHERE id = ?1 AND deadline IS NOT NULL
				AND NOT EXISTS (SELECT 1 FROM steps WHERE instance_id = ?1 AND item_index = -1 AND `+inFlightMain+`)`, id); err != nil {
				return err
			}
		}
		p, err := plan(&l.state)
		if err != nil {
			return fmt.Errorf("plan instance %s: %w", id, err)
		}
		if err := t.collect(&b, l, p); err != nil {
			return err
		}
		if t.planned != nil {
			if onlyReady(p) {
				t.planned[id] = l
			} else if !localPlan(p) {
				t.spilled = true
			}
		}
	}
	if err := t.flushPlans(&b); err != nil {
		return err
	}
	// A wait step that became ready and found its signal completed at
	// once, after its instance's plan was computed, or a workflow step
	// whose child finished: plan its instance again for the dependents.
	// Each round finishes steps, so this ends.
	if replan := t.replan; len(replan) > 0 {
		t.replan = nil
		t.spilled = true
		return t.plan(replan, plan)
	}
	return nil
}

// loadPlanned returns the instances to plan: those a finish foresaw
// (planFrom, see snapshots.go) as they are, the others loaded.
func (t *txn) loadPlanned(ids []string) (map[string]*loaded, error) {
	if len(t.planFrom) == 0 {
		return t.loadMany(ids)
	}
	var missing []string
	for _, id := range ids {
		if t.planFrom[id] == nil {
			missing = append(missing, id)
		}
	}
	ls := make(map[string]*loaded, len(ids))
	if len(missing) > 0 {
		var err error
		if ls, err = t.loadMany(missing); err != nil {
			return nil, err
		}
	}
	for _, id := range ids {
		if l := t.planFrom[id]; l != nil {
			l.state.LoadDefinition = t.definition(l.state.DefinitionHash)
			ls[id] = l
		}
	}
	t.planFrom = nil // a plan again (replan) reads what this one wrote
	return ls, nil
}

// localPlan reports whether p changed its own instance and no other: it
// made steps pending or completed the instance. A failure cancels the
// instance's children, a child started or a step expanded writes rows a
// snapshot does not hold.
func localPlan(p *storage.Plan) bool {
	if p == nil {
		return true
	}
	if p.Failure != nil || p.Deferred || p.Instance != nil && p.Instance.Status != storage.InstanceCompleted {
		return false
	}
	for _, c := range p.Steps {
		if c.Status != storage.StepPending {
			return false
		}
	}
	return true
}

// onlyReady reports whether p did nothing but make steps pending: the one
// plan whose effect on an instance a snapshot follows (see snapshots.go).
func onlyReady(p *storage.Plan) bool {
	return localPlan(p) && (p == nil || p.Instance == nil)
}

// planBatch gathers the two transitions that dominate every group commit,
// steps made ready and instances completed with nothing left to cancel, so
// each is written with one statement however many instances the batch
// touched. The rest are rare and written at once.
type planBatch struct {
	ready     [][4]any // step ID, input, run_after, concurrency key (nil: none)
	completed [][3]any // instance ID, status, output
}

// collect checks a Plan against the loaded state and writes or batches its
// transitions.
func (t *txn) collect(b *planBatch, l *loaded, p *storage.Plan) error {
	if p == nil {
		return nil
	}
	id := l.state.ID
	now := us(t.now)
	for _, c := range p.Steps {
		i := l.index(c.Name)
		if i < 0 {
			return fmt.Errorf("plan for instance %s names unknown step %q", id, c.Name)
		}
		if cur := l.state.Steps[i].Status; cur != storage.StepBlocked {
			return fmt.Errorf("plan for instance %s moves step %q to %s, but it is %s, not blocked", id, c.Name, c.Status, cur)
		}
		var err error
		switch c.Status {
		case storage.StepPending:
			b.ready = append(b.ready, [4]any{l.ids[i], jsonArg(c.Input), l.due(), nullText(c.ConcurrencyKey)})
			t.madeReady = append(t.madeReady, readyStep{id, c.Name})
			t.event(id, c.Name, storage.EventStepReady, 0, "")
		case storage.StepSkipped:
			_, err = t.exec(`UPDATE steps SET status = 'skipped', input = ?, finished_at = ? WHERE id = ?`,
				jsonArg(c.Input), now, l.ids[i])
			t.event(id, c.Name, storage.EventStepSkipped, 0, "")
		case storage.StepFailed:
			_, err = t.exec(`UPDATE steps SET status = 'failed', error = ?, finished_at = ? WHERE id = ?`,
				c.Error, now, l.ids[i])
			t.event(id, c.Name, storage.EventStepFailed, 0, c.Error)
		case storage.StepRunning:
			if len(c.Items) > 0 {
				t.event(id, c.Name, storage.EventStepReady, 0, fmt.Sprintf("%d items", len(c.Items)))
			}
			if len(c.Children) > 0 {
				// A step that starts a child has started its instance,
				// as a claimed step would have.
				if l.state.Status == storage.InstancePending {
					if err = t.startInstances([]string{id}, ""); err != nil {
						return err
					}
					l.state.Status = storage.InstanceRunning
				}
				t.event(id, c.Name, storage.EventStepStarted, 0, storage.ChildrenStartedMessage(c.Children))
				err = t.startChildren(id, l.state.Depth, l.ids[i], c, max(now, l.runAfter))
			} else if err = storage.CheckExpansion(id, nil, c); err == nil {
				err = t.expand(l.ids[i], c.Items, l.due())
			}
		case storage.StepCompleted:
			_, err = t.exec(`UPDATE steps SET status = 'completed', output = ?, finished_at = ? WHERE id = ?`,
				jsonArg(c.Output), now, l.ids[i])
			t.event(id, c.Name, storage.EventStepCompleted, 0, "")
		case storage.StepWaiting:
			// A step that waits has started its instance, as a claimed
			// step would have.
			if l.state.Status == storage.InstancePending {
				if err = t.startInstances([]string{id}, ""); err != nil {
					return err
				}
				l.state.Status = storage.InstanceRunning
			}
			var status storage.StepStatus
			if status, err = t.wait(l, i, c.Input); err == nil {
				l.state.Steps[i].Status = status
				continue
			}
		default:
			return fmt.Errorf("plan for instance %s moves step %q to %q: only pending, waiting (a wait step), running (a forEach expansion), completed, skipped or failed are allowed", id, c.Name, c.Status)
		}
		if err != nil {
			return err
		}
		l.state.Steps[i].Status = c.Status
	}
	if p.Deferred {
		// A held instance (a retried one waiting for its slot): the
		// sweep starts what the plan left once it is admitted.
		if _, err := t.exec(`UPDATE instances SET deferred = 1 WHERE id = ?`, id); err != nil {
			return err
		}
	}
	if err := storage.CheckFailure(id, p, &l.state); err != nil {
		return err
	}
	if p.Failure != nil {
		// The steps this plan made ready are written at the flush, after
		// this: the failure cancels main steps only, never those.
		if err := t.recordFailure(l, p.Failure); err != nil {
			return err
		}
	}
	if ic := p.Instance; ic != nil {
		if !ic.Status.Finished() {
			return fmt.Errorf("plan for instance %s sets status %q: only completed, failed or cancelled are allowed", id, ic.Status)
		}
		unfinished := false
		for _, st := range l.state.Steps {
			unfinished = unfinished || !st.Status.Finished()
		}
		// A child's finish settles its parent's step: not batched.
		if unfinished || ic.Error != "" || l.child {
			if err := t.finishInstance(id, *ic, unfinished); err != nil {
				return err
			}
		} else {
			b.completed = append(b.completed, [3]any{id, string(ic.Status), jsonArg(ic.Output)})
			t.event(id, "", storage.InstanceEventOf(ic.Status), 0, "")
		}
		l.state.Status = ic.Status
	}
	return nil
}

// flushPlans writes the batched transitions.
func (t *txn) flushPlans(b *planBatch) error {
	now := us(t.now)
	if len(b.ready) > 0 {
		rows, err := json.Marshal(b.ready)
		if err != nil {
			return err
		}
		// The key is set with the status, so the limit triggers see it.
		if _, err := t.exec(`UPDATE steps SET status = 'pending', input = r.value->>1, run_after = r.value->>2, ready_at = ?1,
				concurrency_key = CASE WHEN concurrency_limit > 0 THEN r.value->>3 END
			FROM json_each(?2) AS r WHERE steps.id = r.value->>0`, now, string(rows)); err != nil {
			return err
		}
	}
	if len(b.completed) > 0 {
		rows, err := json.Marshal(b.completed)
		if err != nil {
			return err
		}
		// An instance done without a step claimed (every step skipped, or
		// an empty forEach) started as it finished.
		if _, err := t.exec(`UPDATE instances SET status = r.value->>1, output = r.value->>2, error = '', finished_at = ?1,
			started_at = CASE WHEN r.value->>1 = 'cancelled' THEN started_at ELSE coalesce(started_at, ?1) END
			FROM json_each(?2) AS r WHERE instances.id = r.value->>0`, now, string(rows)); err != nil {
			return err
		}
	}
	return nil
}

// due is the run_after of a step the plan makes ready now: its instance's
// run_after, held back while the instance is paused. A step made ready by
// its dependencies thus takes its instance's place among the ready steps
// (claim order is priority, then run_after): an instance that has begun
// goes on before the instances that started after it (see the storage
// package's claim order).
func (l *loaded) due() int64 {
	if l.paused {
		return l.runAfter + storage.PauseShiftMicros
	}
	return l.runAfter
}

func (l *loaded) index(name string) int {
	for i := range l.state.Steps {
		if l.state.Steps[i].Name == name {
			return i
		}
	}
	return -1
}

// finishInstance finishes the instance and, with cancelSteps, cancels
// every step not yet finished, running ones included (their claims go
// stale), and every unfinished child instance. The caller knows when there
// are none, the common case of a completed instance. It is the one place
// an instance finishes (but for a batch of completions of top-level
// instances, see collect), so it settles the parent's step of a child. A
// failed step the change names is kept; without one, the instance keeps
// the one its recorded failure named, if any.
func (t *txn) finishInstance(id string, ic storage.InstanceChange, cancelSteps bool) error {
	now := us(t.now)
	status, output, msg := ic.Status, ic.Output, ic.Error
	var (
		parentID   sql.NullString
		parentStep string
		parentItem int
	)
	if err := t.queryRow(`UPDATE instances SET status = ?1, output = ?2, error = ?3, finished_at = ?4,
			started_at = CASE WHEN ?1 = 'cancelled' THEN started_at ELSE coalesce(started_at, ?4) END,
			failed_step = coalesce(nullif(?6, ''), failed_step)
		WHERE id = ?5 RETURNING parent_id, parent_step, parent_item`,
		status, jsonArg(output), msg, now, id, ic.FailedStep).Scan(&parentID, &parentStep, &parentItem); err != nil {
		return err
	}
	if cancelSteps {
		if err := t.cancelSteps(id, msg); err != nil {
			return err
		}
	}
	if status != storage.InstanceCompleted {
		// A completed instance has no unfinished step, so no running child.
		if err := t.cancelChildren(id, status); err != nil {
			return err
		}
	}
	t.event(id, "", storage.InstanceEventOf(status), 0, msg)
	if !parentID.Valid {
		return nil
	}
	return t.childFinished(id, &storage.ParentRef{InstanceID: parentID.String, Step: parentStep, Item: parentItem}, status, output, msg)
}

// cancelSteps cancels the unfinished steps and items of a finished instance.
func (t *txn) cancelSteps(id, msg string) error {
	now := us(t.now)
	const cancel = `UPDATE steps SET status = 'cancelled', finished_at = ?, lease_until = NULL, deadline = NULL
		WHERE instance_id = ? AND status IN ('blocked', 'pending', 'running', 'waiting') RETURNING name, attempts, item_index`
	rows, err := t.query(cancel, now, id)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var (
			name            string
			attempts, index int
		)
		if err := rows.Scan(&name, &attempts, &index); err != nil {
			return err
		}
		if index < 0 { // items have no events of their own: see settleItems
			t.event(id, name, storage.EventStepCancelled, attempts, msg)
		}
	}
	return rows.Err()
}

// definition returns a loader of the definition snapshot, valid while the
// transaction is open.
func (t *txn) definition(hash string) func() ([]byte, error) {
	return func() ([]byte, error) {
		var src []byte
		if err := t.queryRow(`SELECT source FROM definitions WHERE hash = ?`, hash).Scan(&src); err != nil {
			return nil, fmt.Errorf("definition %s: %w", hash, interpretError("", err))
		}
		return src, nil
	}
}
