package postgres

import (
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/dagrun/dagrun/storage"
)

// A finish and its hand-off in one statement. On a chain, a finish
// planned from a snapshot (speculate.go) by a settled worker (handoff.go)
// completes its step, makes the next one ready and claims it: two
// statements that each write a row of steps and insert events. Every
// statement that writes steps pays, once per statement and not per row,
// for what guards the table: the limit triggers' WHEN clauses, the status
// CHECKs and the partial indexes' predicates are read and compiled, the
// table's and the events' indexes opened, the executor started and ended.
// So such a finish writes both rows in one UPDATE and both events in one
// INSERT: the completed step and the step it hands off (or makes pending,
// when the claim may not take it).
//
// It serves exactly one result, a completion (the only result a snapshot
// foresees), and exactly one change of the plans: a chain's transition.
// The statement checks the snapshots as verifiedFinishOneSQL does, and
// also that it wrote both rows; either failing raises staleSnapshot, the
// transaction rolls back and the finish runs again the usual way. A
// finish that readies several steps, or none, or whose worker is not
// settled, sends its finish and its hand-off (or plans) as before.
//
// latency4 on PostgreSQL (1,000 instances, three rounds alternating with
// the build before, server CPU read from /proc): 4.52 / 4.43 / 3.64 ms of
// the server's CPU an instance before, 4.06 / 3.92 / 3.01 after; p50 5.75
// / 6.26 / 4.73 ms before, 5.14 / 5.35 / 4.50 after.

// finishHandoffArgs number a finish-and-hand-off's claim arguments, after
// the finish's (heldFinish.args) and the change's (finishHandoffChange).
var finishHandoffArgs = claimArgs{lease: "$16", worker: "$17", limit: "$18", next: 19}

// finishHandoffChange is the plans' one change, as applyRow has it.
const finishHandoffChange = `SELECT $10::text AS instance_id, $11::text AS name, $12::text AS status, $13::json AS input,
		$14::text AS error, $15::text AS ckey, 1::bigint AS ord`

// finishHandoffSQL returns the statement for a claim's filter shape. Its
// rows (one when it succeeds) are the check's ok and the transaction's ID,
// the finished step's queue and whether it is an item under a cap, whether
// the claim took the changed step, and the changed step's claim columns.
//
// Each column of the UPDATE is what finishSQL writes for a completion
// (c.finish) or what handoffApply writes, evaluated on the row the UPDATE
// locked, as in those statements. The finished step is locked first (l),
// as finishSQL locks it, then the changed one, as the hand-off would
// after it.
func finishHandoffSQL(c claimShape) string {
	a := finishHandoffArgs
	return `
WITH ` + handoffChanges(c, a, finishHandoffChange) + `,
` + settledPick(a) + `,
l AS MATERIALIZED (
	SELECT s.id, s.status FROM {s}steps s
	WHERE s.id = $2::bigint
	FOR NO KEY UPDATE
),
x AS (
	SELECT true AS finish, l.id, NULL AS status, NULL::json AS input, NULL AS error, NULL AS ckey, false AS handed, 1::bigint AS ord
	FROM l WHERE l.status = 'running'
	UNION ALL
	SELECT false, r.id, r.status, r.input, r.error, r.ckey, k.id IS NOT NULL, r.ord
	FROM r LEFT JOIN pick k ON k.id = r.id
),
u AS (
	UPDATE {s}steps s SET
		status = CASE WHEN c.finish THEN 'completed' WHEN c.handed THEN 'running' ELSE c.status END,
		input = CASE WHEN c.finish OR c.status IN ('failed', 'completed') THEN s.input ELSE c.input END,
		output = CASE WHEN c.finish THEN $5::json WHEN c.status = 'completed' THEN c.input ELSE s.output END,
		error = CASE WHEN c.finish THEN '' WHEN c.status = 'failed' THEN c.error ELSE s.error END,
		run_after = CASE WHEN NOT c.finish AND c.status = 'pending'
			THEN (SELECT i.run_after + ` + heldSQL + ` FROM {s}instances i WHERE i.id = s.instance_id)
			ELSE s.run_after END,
		ready_at = CASE WHEN NOT c.finish AND c.status IN ('pending', 'waiting') THEN {now} ELSE s.ready_at END,
		deadline = CASE WHEN c.finish THEN s.deadline END,
		finished_at = CASE WHEN NOT c.finish AND c.status IN ('pending', 'waiting') THEN NULL ELSE {now} END,
		-- Set with the status, so the limit triggers see it.
		concurrency_key = CASE WHEN c.finish THEN s.concurrency_key
			WHEN c.status = 'pending' AND s.concurrency_limit > 0 THEN c.ckey END,
		attempts = CASE WHEN c.handed THEN s.attempts + 1 ELSE s.attempts END,
		fence = CASE WHEN c.handed THEN s.fence + 1 ELSE s.fence END,
		started_at = CASE WHEN c.handed THEN {now} ELSE s.started_at END,
		first_started_at = CASE WHEN c.handed THEN coalesce(s.first_started_at, {now}) ELSE s.first_started_at END,
		lease_until = CASE WHEN c.handed THEN {clock} + ` + a.lease + `::bigint * interval '1 microsecond'
			WHEN c.finish THEN NULL ELSE s.lease_until END,
		worker_id = CASE WHEN c.handed THEN ` + a.worker + ` ELSE s.worker_id END,
		promoted = CASE WHEN c.handed THEN false ELSE s.promoted END
	FROM x c
	WHERE s.id = c.id AND CASE WHEN c.finish THEN s.fence = $4::bigint AND s.instance_id = $3::text ELSE s.status = 'blocked' END
	RETURNING c.finish, ` + claimReturning + `, c.status AS change, s.error, s.wait_signal, s.parent_id, s.item_concurrency,
		c.ord, c.handed
),
ev AS (
	INSERT INTO {s}events (instance_id, step, type, attempt, message, at)
	SELECT e.instance_id, e.step, e.type, e.attempt, e.message, {now} FROM (
		SELECT u.instance_id, u.name AS step, 'step.completed' AS type, $6::text AS message, u.attempts AS attempt, 0 AS part
		FROM u WHERE u.finish AND u.parent_id IS NULL -- items have no events of their own
		UNION ALL
		SELECT u.instance_id, u.name, ` + planEvent("u.change") + `, 0, 1 FROM u WHERE NOT u.finish
		UNION ALL
		SELECT u.instance_id, u.name, 'step.started', ` + a.worker + `, u.attempts, 2 FROM u WHERE u.handed AND u.item_index = -1
	) e
	ORDER BY e.part
),
checked AS (` + verifySnapshots("$7", "$8", "$9",
		"(SELECT count(*) FROM u WHERE u.finish) = 1 AND (SELECT count(*) FROM u WHERE NOT u.finish) = 1") + `
)
SELECT ok, txid, finished_queue, finished_capped, took, ` + claimedColumns(c, "x") + ` FROM (
	SELECT checked.ok, checked.txid, f.queue AS finished_queue, f.slot_wanted AS finished_capped,
		h.handed AS took, ` + claimColumnsOf("h", true) + `
	FROM checked
	LEFT JOIN (SELECT u.*, ` + slotWanted + ` AS slot_wanted FROM u WHERE u.finish) f ON true
	LEFT JOIN (SELECT * FROM u WHERE NOT u.finish) h ON true
) x`
}

// finishHandoffQueries are the finish-and-hand-off statements by claim
// shape.
var finishHandoffQueries = byShape(finishHandoffSQL)

// heldFinish is a finish planned from a snapshot, held back from the
// transaction's statements until its plans show whether it can go with
// their hand-off (queueFinishHandoff); if not, its owner queues it as
// verifiedFinishOneSQL.
type heldFinish struct {
	// args are the statement's $1 to $9: the transaction's time, the
	// step's ID, instance and fence, its output and message, and the
	// snapshots' checks (snapshotChecks).
	args []any
	// accept hears that the step finished: its queue, whether it is an
	// item under a cap, and the transaction's ID.
	accept func(queue string, capped bool, txid string)
	// merged is set once the hand-off took the finish in.
	merged bool
}

// queueFinishHandoff queues f and the hand-off of the plans' one change
// sc in one statement, for a settled worker's claim with filter shape
// shape and arguments rest (claimArguments).
func (s *Store) queueFinishHandoff(st *txState, f *heldFinish, sc *stepChanges, shape claimShape, rest []any) {
	h := st.handoff
	f.merged = true
	args := make([]any, 0, len(f.args)+6+len(rest))
	args = append(args, f.args...)
	args = append(args, sc.ids[0], sc.names[0], sc.statuses[0], sc.inputs[0], sc.errors[0], sc.keys[0])
	args = append(args, rest...)
	st.tail.Queue(s.q(finishHandoffQueries.of(shape)), args...).Query(func(rows pgx.Rows) error {
		var (
			claimed []storage.ClaimedStep
			ok      int
			txid    string
			queue   string
			capped  bool
			took    bool
			n       int
		)
		_, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (struct{}, error) {
			c, err := scanClaimedAfter(row, &ok, &txid, &queue, &capped, &took)
			n++
			if took {
				claimed = append(claimed, c)
			}
			return struct{}{}, err
		})
		if err != nil {
			return err
		}
		// The check raises unless both rows were written: only a bug
		// gets here.
		if n != 1 {
			return fmt.Errorf("a finish handed off from a snapshot returned %d rows, want 1", n)
		}
		f.accept(queue, capped, txid)
		*h.into, st.claimed = claimed, claimed
		st.quiet = false // a settled hand-off saw only what its plans made ready
		return nil
	})
}

// mayHoldFinish reports whether a finish of results planned from
// snapshots may wait for its plans to go with their hand-off h: one
// completion.
func mayHoldFinish(results []storage.StepResult, predicted bool, h *handoff) bool {
	return predicted && h != nil && len(results) == 1 && results[0].Outcome == storage.OutcomeCompleted
}
