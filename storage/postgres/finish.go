package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dagrun/dagrun/storage"
)

// finishSQL applies finished attempts whose claims still hold: the step is
// running with the claim's fence. The steps are locked in id order (see
// extendSQL); the caller already holds their instances' locks. A retried
// or snoozed step whose instance already finished is cancelled instead.
//
// The steps are looked up by ID alone and their status checked on what the
// lock read (l.status). Filtering the scan on status = 'running' would let
// a generic plan reach them through steps_running_lease instead, reading
// every running step's entry at each finish whenever the statistics were
// gathered with little running. The store's other keyed writes do the same
// (TestKeyedWritesSkipInFlightIndexes).
const finishSQL = `
WITH r AS (
	` + finishRows + `
),
l AS MATERIALIZED (
	SELECT s.id, s.status FROM {s}steps s
	WHERE ` + finishLocked + `
	ORDER BY s.id
	FOR NO KEY UPDATE
),
u AS (
	UPDATE {s}steps s SET
		status = CASE WHEN r.outcome = 1 THEN 'completed' WHEN r.outcome = 3 OR r.outcome = 2 AND ` + failingMainSQL + ` THEN 'failed'
			ELSE ` + requeueStatus + ` END,
		output = CASE WHEN r.outcome = 1 THEN r.output ELSE s.output END,
		error = CASE r.outcome WHEN 1 THEN '' WHEN 4 THEN s.error ELSE r.error END,
		attempts = CASE WHEN r.outcome = 4 THEN s.attempts - 1 ELSE s.attempts END,
		run_after = CASE WHEN r.outcome IN (2, 4) THEN greatest({now} + r.delay_us * interval '1 microsecond', r.run_after) + ` + heldSQL + `
			ELSE s.run_after END,
		ready_at = CASE WHEN r.outcome IN (2, 4) THEN {now} ELSE s.ready_at END,
		finished_at = CASE WHEN r.outcome IN (1, 3) OR r.outcome = 2 AND ` + failingMainSQL + ` THEN {now} ELSE ` + requeueFinishedAt + ` END,
		lease_until = NULL,
		worker_id = CASE WHEN r.outcome IN (2, 4) THEN '' ELSE s.worker_id END
	FROM r, l, {s}instances i
	WHERE s.id = l.id AND s.id = r.step_id AND s.fence = r.fence AND s.instance_id = r.instance_id
		AND l.status = 'running' AND i.id = s.instance_id
	RETURNING r.ord, s.instance_id, s.name, s.status, s.attempts, s.queue, s.run_after, r.outcome, r.message,
		s.parent_id, s.item_concurrency
),
ev AS (
	INSERT INTO {s}events (instance_id, step, type, attempt, message, at)
	SELECT instance_id, name,
		CASE WHEN status = 'cancelled' THEN 'step.cancelled' WHEN status = 'failed' THEN 'step.failed'
			ELSE (ARRAY['step.completed', 'step.retrying', 'step.failed', 'step.snoozed'])[outcome] END,
		CASE WHEN outcome = 4 THEN attempts + 1 ELSE attempts END,
		CASE WHEN status = 'cancelled' THEN 'instance already finished'
			WHEN outcome = 4 THEN ` + snoozedUntilSQL + `
			ELSE message END,
		{now}
	FROM u WHERE u.parent_id IS NULL -- items have no events of their own
	ORDER BY ord
)
` + finishSelect

// finishSelect is what finishSQL returns of each step it finished.
const finishSelect = `
SELECT ord, instance_id, status, queue, coalesce(parent_id, 0), ` + slotWanted + ` FROM u`

// slotWanted tells whether the row u, a capped item that finished or lost
// its lease, leaves its slot to a sibling still pending: only then may a
// claim loop take something the eager claim never takes (see
// txState.itemSlotFreed). A capped forEach step's last items otherwise woke
// this process's claim loops for an empty claim at each finish.
const slotWanted = `u.item_concurrency > 0 AND EXISTS (SELECT 1 FROM {s}steps w
	WHERE w.parent_id = u.parent_id AND w.status = 'pending' AND w.item_concurrency > 0)`

// finishRows and finishLocked are finishSQL's rows and the steps it locks,
// as arrays; finishOneSQL has them as scalars.
const (
	finishRows = `SELECT * FROM unnest($2::bigint[], $3::text[], $4::bigint[], $5::int[], $6::json[], $7::text[], $8::text[], $9::timestamptz[], $10::bigint[])
		WITH ORDINALITY AS r(step_id, instance_id, fence, outcome, output, error, message, run_after, delay_us, ord)`
	finishLocked = `s.id = ANY($2::bigint[])`
)

// snoozedUntilSQL is a snooze event's message: the time its step is
// pending again, which only the statement knows, formatted as Go's
// time.RFC3339Nano does in UTC, as SQLite's events have it
// ("until 2026-01-02T15:04:05.5Z").
const snoozedUntilSQL = `'until ' || regexp_replace(to_char(run_after AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US'), '\.?0+$', '') || 'Z'`

// FinishSteps implements storage.Store: every result, then one plan per
// touched unfinished instance, in one transaction (group commit) of two
// round trips however many results: lock the instances, apply the results
// and load the touched instances' steps; then apply the plans (and claim,
// for FinishAndClaim) with the COMMIT. A plan that ends a child instance,
// or ends one otherwise than completed, takes one more, for the parent's
// step to settle or the children to cancel (see txState.finish).
func (s *Store) FinishSteps(ctx context.Context, results []storage.StepResult, plan storage.PlanFunc) ([]storage.FinishResult, error) {
	out, _, err := s.finishSteps(ctx, results, plan, nil)
	return out, err
}

// FinishAndClaim implements storage.FinishClaimer: FinishSteps, then a claim
// with p, in the same transaction.
func (s *Store) FinishAndClaim(ctx context.Context, results []storage.StepResult, plan storage.PlanFunc, p storage.ClaimParams) ([]storage.FinishResult, []storage.ClaimedStep, error) {
	if p.Lease <= 0 {
		return nil, nil, errors.New("postgres: finish and claim: lease must be positive")
	}
	return s.finishSteps(ctx, results, plan, &p)
}

func (s *Store) finishSteps(ctx context.Context, results []storage.StepResult, plan storage.PlanFunc, claim *storage.ClaimParams) ([]storage.FinishResult, []storage.ClaimedStep, error) {
	if plan == nil {
		return nil, nil, errors.New("postgres: finish steps: nil PlanFunc")
	}
	if len(results) == 0 {
		if claim == nil {
			return nil, nil, nil
		}
		claimed, err := s.ClaimSteps(ctx, *claim)
		return nil, claimed, err
	}
	if claim != nil {
		s.lookAhead(ctx, *claim)
	}
	var claimed []storage.ClaimedStep
	n := len(results)
	var (
		stepIDs, fences = make([]int64, n), make([]int64, n)
		instanceIDs     = make([]string, n)
		outcomes        = make([]int32, n)
		outputs         = make([]json.RawMessage, n)
		errs, messages  = make([]string, n), make([]string, n)
		runAfters       = make([]*time.Time, n)
		delays          = make([]int64, n)
		out             = make([]storage.FinishResult, n)
	)
	for i, r := range results {
		switch r.Outcome {
		case storage.OutcomeCompleted, storage.OutcomeRetry, storage.OutcomeFailed, storage.OutcomeSnooze:
		default:
			return nil, nil, fmt.Errorf("postgres: finish steps: step %d: unknown outcome %d", r.Claim.StepID, r.Outcome)
		}
		stepIDs[i], fences[i], instanceIDs[i] = r.Claim.StepID, r.Claim.Fence, r.Claim.InstanceID
		outcomes[i] = int32(r.Outcome)
		outputs[i] = jsonOrNil(r.Output)
		errs[i] = r.Error
		if r.Outcome != storage.OutcomeCompleted {
			messages[i] = r.Error
		}
		delays[i] = r.Delay.Microseconds()
		if !r.RunAfter.IsZero() {
			runAfters[i] = &results[i].RunAfter
		}
	}
	// A finish foreseen from snapshots plans before it reads: see
	// speculate.go.
	predicted, used := s.snapshots.predict(results, time.Now())
	var (
		txid    string
		planned []*loaded
		rec     *planRecorder
		skipped bool // the eager claim was left out (eagerClaimNeeded)
		held    *heldFinish
		// claimRead holds the instances the eager claim took steps of but
		// the plans did not touch (claimsnapshot.go).
		claimRead map[string]*loaded
	)
	run := func(tx pgx.Tx, st *txState) error {
		clear(out)
		claimed, txid, planned, rec, skipped, claimRead = nil, "", nil, nil, false, nil
		now := s.now()
		// eagerClaim queues the claim on the tail, after the plans it may
		// claim from, unless it could find only what its worker's claim
		// loop will be told of (eagerClaimNeeded).
		eagerClaim := func() {
			if skipped = !s.eagerClaimNeeded(st, *claim); !skipped {
				claimRead = make(map[string]*loaded)
				s.queueClaim(st, *claim, now, &claimed, claimRead, instanceIDsOf(planned))
			}
		}
		// The plans of the finished steps' instances may make the claim
		// with their changes (see handoff.go), unless the claimer works
		// off a backlog; the claim is queued here unless they did.
		var h *handoff
		if claim != nil && s.claimers.lastShort(*claim, true) {
			h = &handoff{p: *claim, into: &claimed}
		}
		// One round trip: lock the instances, apply the results, and load
		// the instances' steps as they are after the results (a few of
		// those may turn out not to need a plan).
		locked := make(map[string]*loaded, len(instanceIDs))
		var (
			touched []*loaded
			parents []int64 // forEach steps whose items finished
		)
		var b pgx.Batch
		s.queueLock(&b, instanceIDs, locked)
		sql, args := finishSQL, []any{now, stepIDs, instanceIDs, fences, outcomes, outputs, errs, messages, runAfters, delays}
		if n == 1 {
			sql, args = finishOneSQL, []any{now, stepIDs[0], instanceIDs[0], fences[0], outcomes[0], outputs[0], errs[0], messages[0], runAfters[0], delays[0]}
		}
		var (
			ord, parent       int64
			instanceID, queue string
			status            storage.StepStatus
			capped            bool
			checked           int
			row               = []any{&ord, &instanceID, &status, &queue, &parent, &capped}
			ids, xmins, steps []string // the snapshots' checks
		)
		if predicted != nil {
			// The snapshots are checked in the finishing statement.
			sql = verifiedFinishSQL
			if n == 1 {
				sql = verifiedFinishOneSQL
			}
			ids, xmins, steps = snapshotChecks(used)
			args = append(args, ids, xmins, steps)
			row = append(row, &checked, &txid)
		}
		queueFinish := func() {
			b.Queue(s.q(sql), args...).Query(func(rows pgx.Rows) error {
				accepted := 0
				_, err := pgx.ForEachRow(rows, row, func() error {
					out[ord-1].Accepted = true
					accepted++
					if capped && status != storage.StepPending {
						st.freedItemSlot(queue)
					}
					if predicted != nil {
						return nil // planned already
					}
					if parent != 0 && status != storage.StepPending {
						if (status == storage.StepCompleted || status == storage.StepFailed) && !slices.Contains(parents, parent) {
							parents = append(parents, parent)
						}
						return nil
					}
					switch status {
					case storage.StepCompleted, storage.StepFailed:
						if l := locked[instanceID]; l != nil && !slices.Contains(touched, l) {
							touched = append(touched, l)
						}
					case storage.StepPending:
						st.ready(queue)
					}
					return nil
				})
				if err == nil && predicted != nil && accepted != n {
					// The check counts the finished rows: only a bug gets here,
					// after the transaction committed.
					err = fmt.Errorf("a finish planned from snapshots recorded %d of %d results", accepted, n)
				}
				return err
			})
		}
		held = nil
		if mayHoldFinish(results, predicted != nil, h) {
			// It may go with its plans' hand-off (finishhandoff.go).
			held = &heldFinish{args: []any{now, stepIDs[0], instanceIDs[0], fences[0], outputs[0], messages[0], ids, xmins, steps}, accept: func(queue string, capped bool, id string) {
				out[0].Accepted = true
				if capped {
					st.freedItemSlot(queue)
				}
				txid = id
			}}
			h.finish = held
		} else {
			queueFinish()
		}
		if predicted == nil {
			s.queueLoadSteps(ctx, tx, &b, instanceIDs, locked)
		} else {
			// Every result is recorded now (the snapshots' check counts
			// them); otherwise their logs wait for markRefused.
			s.queueResultLogs(&b, results)
		}
		// Only a finish that claims keeps snapshots (see derive), and
		// needs to know what its plans answered.
		planFn := plan
		if claim != nil {
			rec = newPlanRecorder(plan)
			planFn = rec.record
		}
		if predicted != nil {
			planned = clonePredicted(predicted)
			for _, l := range planned {
				l.state.LoadDefinition = s.definitionLoader(ctx, tx, l.state.DefinitionHash)
				touched = append(touched, l)
			}
			if err := s.planAndHandOff(st, now, touched, planFn, h); err != nil {
				return err
			}
			if held != nil && !held.merged {
				queueFinish()
			}
			if claim != nil && !h.made() {
				eagerClaim()
			}
			// The reads and writes go first, on the tail's round trip.
			st.tail.QueuedQueries = append(b.QueuedQueries, st.tail.QueuedQueries...)
			return nil
		}
		if err := tx.SendBatch(ctx, &b).Close(); err != nil {
			return err
		}
		if err := s.markRefused(ctx, tx, out, results); err != nil {
			return err
		}
		// A result recorded already stored its logs with it; the others'
		// go first on the tail.
		s.queueResultLogs(&st.tail, storage.DropRepeatedLogs(results, out))
		settled, err := s.settle(ctx, tx, now, parents, locked)
		if err != nil {
			return err
		}
		for _, l := range settled {
			if !slices.Contains(touched, l) {
				touched = append(touched, l)
			}
		}
		planned = touched
		if err := s.planAndHandOff(st, now, touched, planFn, h); err != nil {
			return err
		}
		if claim == nil {
			return nil
		}
		// The rows this transaction wrote carry its ID, as the steps it
		// finished show.
		for i := range out {
			if l := locked[instanceIDs[i]]; out[i].Accepted && !out[i].Repeated && l != nil {
				if k := slices.Index(l.ids, stepIDs[i]); k >= 0 {
					txid = l.xmins[k]
					break
				}
			}
		}
		if !h.made() {
			eagerClaim()
		}
		return nil
	}
	err := s.inTx(ctx, run)
	if predicted != nil && isStaleSnapshot(err) {
		s.staleSnapshots.Add(1)
		predicted = nil
		err = s.inTx(ctx, run)
	}
	if err != nil {
		return nil, nil, s.fail("finish steps", err)
	}
	if predicted != nil {
		s.speculated.Add(1)
		if held != nil && held.merged {
			s.finishHandoffs.Add(1)
		}
	}
	switch {
	case skipped:
		s.skippedClaims.Add(1)
	case claim != nil:
		taken := time.Now()
		s.snapshots.put(claimedSnapshots(claimRead, claimed, taken))
		s.snapshots.put(derive(planned, rec, results, claimed, txid, taken))
		s.claimers.claimed(*claim, true, len(claimed))
	}
	return out, claimed, nil
}

// eagerClaimNeeded reports whether a finish's eager claim may find what
// its worker's claim loop will not be told of. It need not when the
// finish made nothing ready, and the claim loop's last claim found
// nothing to claim and nothing due later with nothing signalled since,
// while the listener listens (see claimers.settledSince): then it could
// find only steps another process made ready, whose NOTIFY wakes the claim
// loop. An idle worker's last finish of an instance thus commits without
// a claim that would find nothing, a hundred microseconds of the server's
// time an instance of a chain. Behind PgBouncer there is no listener and
// the claim is always made: there it is how a worker hears of the steps
// other processes made ready before its next poll.
func (s *Store) eagerClaimNeeded(st *txState, p storage.ClaimParams) bool {
	return len(st.readyQueues) > 0 || st.itemSlotFreed || !s.settled(p)
}

// settled reports whether p's worker's claim loop found nothing to claim
// and nothing due later at its last claim, nothing was signalled since,
// and the listener listens: then every step that became claimable since
// is one whose news is on its way to the claim loop (claimers.settledSince).
func (s *Store) settled(p storage.ClaimParams) bool {
	return s.listenerPID() != 0 && s.claimers.settledSince(p, s.signals.Load())
}

// markRefused tells what became of the results that were refused: the
// step was cancelled under the same claim (Cancelled), an expected
// cancellation rather than a claim another attempt took over; or it is in
// the state this very result leaves, recorded by an earlier call whose
// answer its worker lost (Accepted and Repeated, see
// storage.StepResult.Recorded). Refusals are rare, so this costs a round
// trip only when there is one.
func (s *Store) markRefused(ctx context.Context, tx pgx.Tx, out []storage.FinishResult, results []storage.StepResult) error {
	var ids, fs []int64
	var at []int
	for i := range out {
		if !out[i].Accepted {
			ids, fs, at = append(ids, results[i].Claim.StepID), append(fs, results[i].Claim.Fence), append(at, i)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	rows, err := tx.Query(ctx, s.q(`SELECT r.ord, st.status, st.attempts, st.error
		FROM unnest($1::bigint[], $2::bigint[]) WITH ORDINALITY AS r(id, fence, ord)
		JOIN {s}steps st ON st.id = r.id AND st.fence = r.fence AND st.status <> 'running'`), ids, fs)
	if err != nil {
		return err
	}
	var (
		ord      int64
		status   storage.StepStatus
		attempts int
		errText  string
	)
	_, err = pgx.ForEachRow(rows, []any{&ord, &status, &attempts, &errText}, func() error {
		i := at[ord-1]
		if results[i].Recorded(status, attempts, errText) {
			out[i] = storage.FinishResult{Accepted: true, Repeated: true}
		} else {
			out[i].Cancelled = status == storage.StepCancelled
		}
		return nil
	})
	return err
}

// expiredSQL finds running steps whose lease ended, oldest first. It locks
// nothing: the caller locks their instances, then recoverSQL re-checks each
// step under its row lock, so concurrent recoverers take each step once.
const expiredSQL = `
SELECT id, instance_id, fence, attempts, max_attempts, backoff_us, max_backoff_us, worker_id
FROM {s}steps WHERE status = 'running' AND lease_until < {now}
ORDER BY lease_until, id LIMIT $2`

// recoverSQL takes back expired steps: failed for good ($5 terminal), or
// pending again after their retry delay ($6, in microseconds) (cancelled if
// their instance already finished), each with a step.lease_expired event
// and then the outcome's.
const recoverSQL = `
WITH r AS (
	SELECT * FROM unnest($2::bigint[], $3::bigint[], $4::text[], $5::bool[], $6::bigint[])
		WITH ORDINALITY AS r(step_id, fence, message, terminal, delay_us, ord)
),
l AS MATERIALIZED (
	SELECT s.id FROM {s}steps s
	WHERE s.id = ANY($2::bigint[]) AND s.status = 'running'
	ORDER BY s.id
	FOR NO KEY UPDATE
),
u AS (
	UPDATE {s}steps s SET
		status = CASE WHEN r.terminal OR ` + failingMainSQL + ` THEN 'failed' ELSE ` + requeueStatus + ` END,
		error = r.message,
		run_after = CASE WHEN r.terminal THEN s.run_after ELSE {now} + r.delay_us * interval '1 microsecond' + ` + heldSQL + ` END,
		ready_at = CASE WHEN r.terminal THEN s.ready_at ELSE {now} END,
		finished_at = CASE WHEN r.terminal OR ` + failingMainSQL + ` THEN {now} ELSE ` + requeueFinishedAt + ` END,
		lease_until = NULL,
		worker_id = CASE WHEN r.terminal THEN s.worker_id ELSE '' END
	FROM r, l, {s}instances i
	WHERE s.id = l.id AND s.id = r.step_id AND s.fence = r.fence AND s.status = 'running'
		AND s.lease_until < {now} AND i.id = s.instance_id
	RETURNING r.ord, s.instance_id, s.name, s.status, s.attempts, s.queue, r.message, s.parent_id, s.item_concurrency
),
ev AS (
	INSERT INTO {s}events (instance_id, step, type, attempt, message, at)
	SELECT e.instance_id, e.name, e.type, e.attempts, e.message, {now} FROM (
		SELECT u.instance_id, u.name, 'step.lease_expired' AS type, u.attempts, u.message, u.ord, 0 AS sub FROM u
		WHERE u.parent_id IS NULL -- items have no events of their own
		UNION ALL
		SELECT u.instance_id, u.name,
			CASE u.status WHEN 'failed' THEN 'step.failed' WHEN 'cancelled' THEN 'step.cancelled' ELSE 'step.retrying' END,
			u.attempts, u.message, u.ord, 1 FROM u
		WHERE u.parent_id IS NULL
	) e ORDER BY e.ord, e.sub
)
SELECT instance_id, status, queue, coalesce(parent_id, 0), ` + slotWanted + ` FROM u`

// RecoverExpired implements storage.Store. A limit below 1 means 1000.
func (s *Store) RecoverExpired(ctx context.Context, limit int, plan storage.PlanFunc) (int, error) {
	if plan == nil {
		return 0, errors.New("postgres: recover expired: nil PlanFunc")
	}
	if limit < 1 {
		limit = 1000
	}
	var recovered int
	err := s.inTx(ctx, func(tx pgx.Tx, st *txState) error {
		recovered = 0
		now := s.now()
		rows, err := tx.Query(ctx, s.q(expiredSQL), now, limit)
		if err != nil {
			return err
		}
		var (
			ids, fences         []int64
			instanceIDs, msgs   []string
			terminal            []bool
			delays              []int64
			id, fence           int64
			instanceID, worker  string
			attempts, maxAtt    int
			backoff, maxBackoff int64
		)
		_, err = pgx.ForEachRow(rows, []any{&id, &instanceID, &fence, &attempts, &maxAtt, &backoff, &maxBackoff, &worker}, func() error {
			policy := storage.RetryPolicy{
				MaxAttempts: maxAtt,
				Backoff:     time.Duration(backoff) * time.Microsecond,
				MaxBackoff:  time.Duration(maxBackoff) * time.Microsecond,
			}
			ids, fences, instanceIDs = append(ids, id), append(fences, fence), append(instanceIDs, instanceID)
			msgs = append(msgs, fmt.Sprintf("lease expired on attempt %d: worker %q presumed lost", attempts, worker))
			terminal = append(terminal, attempts >= maxAtt)
			delays = append(delays, policy.Delay(attempts, rand.Float64()).Microseconds())
			return nil
		})
		if err != nil || len(ids) == 0 {
			return err
		}
		locked := make(map[string]*loaded, len(instanceIDs))
		var (
			touched []*loaded
			parents []int64
		)
		var b pgx.Batch
		s.queueLock(&b, instanceIDs, locked)
		b.Queue(s.q(recoverSQL), now, ids, fences, msgs, terminal, delays).Query(func(rows pgx.Rows) error {
			var (
				status storage.StepStatus
				queue  string
				parent int64
				capped bool
			)
			_, err := pgx.ForEachRow(rows, []any{&instanceID, &status, &queue, &parent, &capped}, func() error {
				recovered++
				if capped && status != storage.StepPending {
					st.freedItemSlot(queue)
				}
				if parent != 0 && status == storage.StepFailed {
					if !slices.Contains(parents, parent) {
						parents = append(parents, parent)
					}
					return nil
				}
				switch status {
				case storage.StepFailed:
					if l := locked[instanceID]; l != nil && !slices.Contains(touched, l) {
						touched = append(touched, l)
					}
				case storage.StepPending:
					st.ready(queue)
				}
				return nil
			})
			return err
		})
		s.queueLoadSteps(ctx, tx, &b, instanceIDs, locked)
		if err := tx.SendBatch(ctx, &b).Close(); err != nil {
			return err
		}
		settled, err := s.settle(ctx, tx, now, parents, locked)
		if err != nil {
			return err
		}
		for _, l := range settled {
			if !slices.Contains(touched, l) {
				touched = append(touched, l)
			}
		}
		return s.planAndApply(st, now, touched, plan)
	})
	if err != nil {
		return 0, s.fail("recover expired", err)
	}
	return recovered, nil
}
