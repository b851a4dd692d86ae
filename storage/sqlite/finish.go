package sqlite

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/dagrun/dagrun/storage"
)

// FinishSteps implements storage.Store: every result, then one plan per
// touched instance, in one transaction (group commit).
func (s *Store) FinishSteps(ctx context.Context, results []storage.StepResult, plan storage.PlanFunc) ([]storage.FinishResult, error) {
	out, _, err := s.finishSteps(ctx, results, plan, nil)
	return out, err
}

// FinishAndClaim implements storage.FinishClaimer: FinishSteps, then a claim
// with p, in the same transaction.
func (s *Store) FinishAndClaim(ctx context.Context, results []storage.StepResult, plan storage.PlanFunc, p storage.ClaimParams) ([]storage.FinishResult, []storage.ClaimedStep, error) {
	if p.Lease <= 0 {
		return nil, nil, errors.New("sqlite: finish and claim: lease must be positive")
	}
	return s.finishSteps(ctx, results, plan, &p)
}

func (s *Store) finishSteps(ctx context.Context, results []storage.StepResult, plan storage.PlanFunc, claim *storage.ClaimParams) ([]storage.FinishResult, []storage.ClaimedStep, error) {
	if plan == nil {
		return nil, nil, errors.New("sqlite: finish steps: nil PlanFunc")
	}
	if len(results) == 0 && claim == nil {
		return nil, nil, nil
	}
	out := make([]storage.FinishResult, len(results))
	var (
		ready     bool
		claimed   []storage.ClaimedStep
		madeReady []readyStep
	)
	err := s.write(ctx, "finish steps", func(t *txn) error {
		clear(out)
		ready = false
		claimed = nil
		var touched []string // instances to plan, in first-touched order
		var parents []int64  // forEach steps whose items finished
		logRows := make([]int64, len(results))
		logsKept := make([]bool, len(results))
		var snaps map[string]*loaded // see snapshots.go
		if s.snaps != nil {
			var err error
			if snaps, err = t.usable(t.prior); err != nil {
				return err
			}
			t.planned = make(map[string]*loaded)
		}
		// instanceOf is each accepted result's instance, "" for the
		// others; completedMain tells a main step completed as claimed.
		instanceOf := make([]string, len(results))
		completedMain := make([]bool, len(results))
		completedIn, err := t.completeMany(results)
		if err != nil {
			return err
		}
		for i := range results {
			r := &results[i]
			var (
				instanceID string
				status     storage.StepStatus
				err        error
			)
			var parent int64
			if completedIn != nil && r.Outcome == storage.OutcomeCompleted {
				done := completedIn[r.Claim.StepID]
				instanceID, parent, status = done.instanceID, done.parent, storage.StepCompleted
				logsKept[i] = done.logsKept
			} else {
				instanceID, parent, status, err = t.finish(r)
			}
			if err != nil {
				return err
			}
			if instanceID == "" {
				if out[i], err = t.refused(r); err != nil {
					return err
				}
				continue
			}
			out[i].Accepted = true
			instanceOf[i] = instanceID
			completedMain[i] = completedIn != nil && r.Outcome == storage.OutcomeCompleted && parent == 0
			logRows[i] = cmp.Or(parent, r.Claim.StepID)
			if parent != 0 {
				if status == storage.StepCompleted || status == storage.StepFailed {
					if !slices.Contains(parents, parent) {
						parents = append(parents, parent)
					}
				} else if status == storage.StepPending {
					ready = true
				}
				continue
			}
			switch status {
			case storage.StepCompleted, storage.StepFailed:
				if !slices.Contains(touched, instanceID) {
					touched = append(touched, instanceID)
				}
			case storage.StepPending:
				ready = true
			}
		}
		if err := t.appendResultLogs(storage.DropRepeatedLogs(results, out), logRows, logsKept); err != nil {
			return err
		}
		settled, err := t.settleItems(parents)
		if err != nil {
			return err
		}
		for _, id := range settled {
			if !slices.Contains(touched, id) {
				touched = append(touched, id)
			}
		}
		if snaps != nil {
			t.planFrom = foreseen(snaps, results, instanceOf, completedMain)
			s.snaps.used.Add(int64(len(t.planFrom)))
		}
		if err := t.plan(touched, plan); err != nil {
			return err
		}
		ready = ready || len(touched) > 0 || t.itemSlotFreed
		if claim != nil {
			var err error
			if claimed, err = t.claim(*claim); err != nil {
				return err
			}
		}
		madeReady = t.madeReady
		if t.planned != nil && len(parents) == 0 && !t.spilled && !t.itemSlotFreed {
			t.keepSnapshots(snaps, touched, instanceOf, claimed)
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	if ready && !claimedAll(claim, claimed, madeReady) {
		s.notify()
	}
	return out, claimed, nil
}

// claimedAll reports whether an eager claim, if any, took every ready
// step (see storage.ClaimParams.TookAll), the steps the transaction made
// ready among them. An empty claim woken for nothing is a write
// transaction that holds up the next commit on SQLite's single writer;
// but a step made ready that the claim left (its time, or its queue's
// rate, has it start later) is news: the claim loop learns when it falls
// due only from a claim of its own.
func claimedAll(claim *storage.ClaimParams, claimed []storage.ClaimedStep, madeReady []readyStep) bool {
	if claim == nil || !claim.TookAll(len(claimed)) || len(claimed) < len(madeReady) {
		return false
	}
	for _, k := range madeReady {
		if !slices.ContainsFunc(claimed, func(c storage.ClaimedStep) bool {
			return c.Item < 0 && c.InstanceID == k.instanceID && c.Step == k.name
		}) {
			return false
		}
	}
	return true
}

// completeManyQuery completes the steps listed in ?2, a JSON array of
// [step ID, fence, output] rows, whose claims still hold.
const completeManyQuery = `UPDATE steps SET status = 'completed', output = c.value->>2, error = '', finished_at = ?1, lease_until = NULL
	FROM json_each(?2) AS c
	WHERE steps.id = c.value->>0 AND steps.fence = c.value->>1 AND steps.status = 'running'
	RETURNING steps.id, steps.instance_id, steps.name, steps.attempts, coalesce(steps.parent_id, 0)`

// completeMany applies every completion of a group commit with one
// statement and returns where each step it completed belongs, keyed by
// step ID; it returns nil, having done nothing, when a step appears twice
// in results (then results apply one by one, in order). A completed
// step's event carries what its attempt logged, when it can (see
// logsOfCompletion); the completion says so.
func (t *txn) completeMany(results []storage.StepResult) (map[int64]completion, error) {
	seen := make(map[int64]bool, len(results))
	var rows [][3]any
	for _, r := range results {
		if seen[r.Claim.StepID] {
			return nil, nil
		}
		seen[r.Claim.StepID] = true
		if r.Outcome == storage.OutcomeCompleted {
			rows = append(rows, [3]any{r.Claim.StepID, r.Claim.Fence, jsonArg(r.Output)})
		}
	}
	done := make(map[int64]completion, len(rows))
	if len(rows) == 0 {
		return done, nil
	}
	b, err := json.Marshal(rows)
	if err != nil {
		return nil, err
	}
	q, err := t.query(completeManyQuery, us(t.now), string(b))
	if err != nil {
		return nil, err
	}
	type completed struct {
		id, parent int64
		instanceID string
		name       string
		attempts   int
	}
	var steps []completed
	err = eachRow(q, func(sc scanner) error {
		var c completed
		if err := sc.Scan(&c.id, &c.instanceID, &c.name, &c.attempts, &c.parent); err != nil {
			return err
		}
		steps = append(steps, c)
		return nil
	})
	if err != nil {
		return nil, err
	}
	var logsOf map[int64][]storage.LogRecord
	for i := range results {
		if r := &results[i]; r.Outcome == storage.OutcomeCompleted && len(r.Logs) > 0 {
			if logsOf == nil {
				logsOf = make(map[int64][]storage.LogRecord)
			}
			logsOf[r.Claim.StepID] = r.Logs
		}
	}
	packed := make([]string, len(steps))
	var n int
	for i, c := range steps {
		if c.parent == 0 && logsOfCompletion(logsOf[c.id], c.instanceID, c.name, c.attempts) {
			packed[i] = packLogs(logsOf[c.id])
			n += len(logsOf[c.id])
		}
	}
	var seq int64
	if n > 0 {
		if seq, err = t.takeLogSeqs(n); err != nil {
			return nil, err
		}
	}
	for i, c := range steps {
		done[c.id] = completion{instanceID: c.instanceID, parent: c.parent, logsKept: packed[i] != ""}
		switch {
		case c.parent != 0: // items have no events of their own
		case packed[i] != "":
			t.eventWithLogs(c.instanceID, c.name, storage.EventStepCompleted, c.attempts, seq, packed[i])
			seq += int64(len(logsOf[c.id]))
		default:
			t.event(c.instanceID, c.name, storage.EventStepCompleted, c.attempts, "")
		}
	}
	return done, nil
}

// completion is where a completed step belongs: its instance and, for an
// item, its forEach step's row.
type completion struct {
	instanceID string
	parent     int64
	logsKept   bool // its event carries what the attempt logged
}

// refused tells what became of a result whose claim no longer held: the
// step was cancelled while the claim held it (Cancelled), or it is in the
// state this very result leaves, recorded by an earlier call whose answer
// its worker lost (Accepted and Repeated, see storage.StepResult.Recorded),
// or else it is stale.
func (t *txn) refused(r *storage.StepResult) (storage.FinishResult, error) {
	var (
		status   storage.StepStatus
		attempts int
		errText  string
	)
	err := t.queryRow(`SELECT status, attempts, error FROM steps WHERE id = ? AND fence = ? AND status <> 'running'`,
		r.Claim.StepID, r.Claim.Fence).Scan(&status, &attempts, &errText)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return storage.FinishResult{}, nil
	case err != nil:
		return storage.FinishResult{}, err
	case r.Recorded(status, attempts, errText):
		return storage.FinishResult{Accepted: true, Repeated: true}, nil
	}
	return storage.FinishResult{Cancelled: status == storage.StepCancelled}, nil
}

// finish applies one result if its claim still holds, and reports the
// step's instance (empty when the claim was stale), its forEach step's row
// for an item, and its new status.
func (t *txn) finish(r *storage.StepResult) (string, int64, storage.StepStatus, error) {
	c := r.Claim
	now := us(t.now)
	var (
		row  *sql.Row
		typ  storage.EventType
		msg  = r.Error
		held = `WHERE id = ?2 AND fence = ?3 AND status = 'running' RETURNING instance_id, name, status, attempts, coalesce(parent_id, 0)`
	)
	switch r.Outcome {
	case storage.OutcomeCompleted:
		typ, msg = storage.EventStepCompleted, ""
		row = t.queryRow(`UPDATE steps SET status = 'completed', output = ?4, error = '', finished_at = ?1,
			lease_until = NULL `+held, now, c.StepID, c.Fence, jsonArg(r.Output))
	case storage.OutcomeFailed:
		typ = storage.EventStepFailed
		row = t.queryRow(`UPDATE steps SET status = 'failed', error = ?4, finished_at = ?1,
			lease_until = NULL `+held, now, c.StepID, c.Fence, r.Error)
	case storage.OutcomeRetry:
		typ = storage.EventStepRetrying
		row = t.queryRow(`UPDATE steps SET status = `+retryStatus+`, finished_at = `+retryFinishedAt+`,
			error = ?4, run_after = ?5`+requeueHeld+`, ready_at = ?1, lease_until = NULL, worker_id = '' `+held,
			now, c.StepID, c.Fence, r.Error, max(now+r.Delay.Microseconds(), us(r.RunAfter)))
	case storage.OutcomeSnooze:
		typ = storage.EventStepSnoozed
		msg = "until " + later(t.now, r.RunAfter).Format(time.RFC3339Nano)
		row = t.queryRow(`UPDATE steps SET status = `+requeueStatus+`, finished_at = `+requeueFinishedAt+`,
			attempts = attempts - 1, run_after = ?4`+requeueHeld+`, ready_at = ?1, lease_until = NULL, worker_id = '' `+held,
			now, c.StepID, c.Fence, max(now+r.Delay.Microseconds(), us(r.RunAfter)))
	default:
		return "", 0, "", fmt.Errorf("step %d: unknown outcome %d", c.StepID, r.Outcome)
	}
	var (
		instanceID string
		name       string
		status     storage.StepStatus
		attempts   int
		parent     int64
	)
	if err := row.Scan(&instanceID, &name, &status, &attempts, &parent); errors.Is(err, sql.ErrNoRows) {
		return "", 0, "", nil // stale claim: nothing written
	} else if err != nil {
		return "", 0, "", err
	}
	switch {
	case status == storage.StepCancelled:
		typ, msg = storage.EventStepCancelled, "instance already finished"
	case status == storage.StepFailed && r.Outcome == storage.OutcomeRetry:
		typ = storage.EventStepFailed // its instance is failing: no retry
	}
	attempt := attempts
	if r.Outcome == storage.OutcomeSnooze {
		attempt++ // the attempt that snoozed, though it does not count
	}
	if parent == 0 { // items have no events of their own
		t.event(instanceID, name, typ, attempt, msg)
	}
	return instanceID, parent, status, nil
}

// RecoverExpired implements storage.Store. A limit below 1 means 1000.
func (s *Store) RecoverExpired(ctx context.Context, limit int, plan storage.PlanFunc) (int, error) {
	if plan == nil {
		return 0, errors.New("sqlite: recover expired: nil PlanFunc")
	}
	if limit < 1 {
		limit = 1000
	}
	var n int
	err := s.write(ctx, "recover expired", func(t *txn) error {
		n = 0
		now := us(t.now)
		rows, err := t.query(`SELECT id, instance_id, name, attempts, max_attempts, backoff_us, max_backoff_us, worker_id,
				coalesce(parent_id, 0)
			FROM steps WHERE status = 'running' AND lease_until < ? ORDER BY lease_until LIMIT CAST(? AS INTEGER)`, now, limit)
		if err != nil {
			return err
		}
		type expired struct {
			id                  int64
			instanceID, name    string
			attempts, max       int
			backoff, maxBackoff int64
			worker              string
			parent              int64
		}
		var exp []expired
		for rows.Next() {
			var e expired
			if err := rows.Scan(&e.id, &e.instanceID, &e.name, &e.attempts, &e.max, &e.backoff, &e.maxBackoff, &e.worker, &e.parent); err != nil {
				rows.Close()
				return err
			}
			exp = append(exp, e)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		var (
			failed  []string
			parents []int64
		)
		for _, e := range exp {
			msg := fmt.Sprintf("lease expired on attempt %d: worker %q presumed lost", e.attempts, e.worker)
			item := e.parent != 0 // items have no events of their own
			if !item {
				t.event(e.instanceID, e.name, storage.EventStepLeaseExpired, e.attempts, msg)
			}
			if e.attempts >= e.max {
				if _, err := t.exec(`UPDATE steps SET status = 'failed', error = ?, finished_at = ?, lease_until = NULL WHERE id = ?`,
					msg, now, e.id); err != nil {
					return err
				}
				if item {
					if !slices.Contains(parents, e.parent) {
						parents = append(parents, e.parent)
					}
					continue
				}
				t.event(e.instanceID, e.name, storage.EventStepFailed, e.attempts, msg)
				if !slices.Contains(failed, e.instanceID) {
					failed = append(failed, e.instanceID)
				}
				continue
			}
			policy := storage.RetryPolicy{
				MaxAttempts: e.max,
				Backoff:     time.Duration(e.backoff) * time.Microsecond,
				MaxBackoff:  time.Duration(e.maxBackoff) * time.Microsecond,
			}
			runAfter := us(t.now.Add(policy.Delay(e.attempts, rand.Float64())))
			var status storage.StepStatus
			if err := t.queryRow(`UPDATE steps SET status = `+retryStatus+`, finished_at = `+retryFinishedAt+`,
				error = ?2, run_after = ?3`+requeueHeld+`, ready_at = ?1, lease_until = NULL, worker_id = '' WHERE id = ?4 RETURNING status`,
				now, msg, runAfter, e.id).Scan(&status); err != nil {
				return err
			}
			if !item {
				t.event(e.instanceID, e.name, requeueEvent(status, storage.EventStepRetrying), e.attempts, msg)
			}
			if status == storage.StepFailed && !slices.Contains(failed, e.instanceID) {
				failed = append(failed, e.instanceID) // its instance is failing: no retry
			}
		}
		settled, err := t.settleItems(parents)
		if err != nil {
			return err
		}
		for _, id := range settled {
			if !slices.Contains(failed, id) {
				failed = append(failed, id)
			}
		}
		if err := t.plan(failed, plan); err != nil {
			return err
		}
		n = len(exp)
		return nil
	})
	if err != nil {
		return 0, err
	}
	if n > 0 {
		s.notify()
	}
	return n, nil
}
