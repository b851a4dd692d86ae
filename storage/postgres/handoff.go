package postgres

import (
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dagrun/dagrun/storage"
)

// A hand-off applies a finish's plans and its claim in one statement, so
// that a step the plans make ready and the claim takes is written once,
// blocked to running, instead of blocked to pending and then pending to
// running. Every update of a step is a new row version with an entry in
// each of its indexes (its status is in the partial indexes' predicates,
// so none is HOT): a one-row update of steps cost the server 135-144 µs
// here, against 40 µs for SELECT 1.
//
// The claim keeps its order: its candidates are the ready steps of the
// claim's index walk and the steps the plans make ready that it may take
// at once, each at its priority and the time it is due (its instance's
// run_after, which is what the plan writes to a step it makes pending),
// and it takes the first of them in claim order. A step the plans make
// ready that a step of a higher priority, or of an instance that started
// earlier, precedes is made pending as before.
//
// A step made ready is taken at once only if nothing would hold it: no
// concurrency key, no queue limit or instance admission, its instance
// running, not paused and not delayed, no forEach cap; and only if the
// claim's filters admit it. The hand-off serves the plans of a finish
// that only make steps ready, skip, complete or fail them (a wait, an
// expansion, children, a failure or an instance's end go the usual way,
// an apply and then a claim), which is what a chain's or a fan-out's
// steps are.
//
// A finish hands off only while its claimer's last finish and claim came
// back short (claimers.lastShort): a worker that keeps up with its work.
// One that works off a backlog applies its plans and then claims, in the
// same transaction; its claim takes the steps the plans made ready first
// all the same, as they are due from their instances' starts, before the
// backlog's. When such a claimer took older ready steps first (before
// steps made ready took their instance's place), the hand-off handed
// little off and cost more than an apply and a claim (chain4 on
// PostgreSQL 6,252 and 6,340 steps/s against 6,635 and 6,732 when every
// finish handed off). Now that it would hand them off, handing off in a
// backlog too was measured and not kept: chain4 (12,000 instances, three
// rounds alternating) 5,910 / 5,773 / 5,801 steps/s against 5,683 /
// 5,448 / 5,320, but two directly connected fleet workers draining 4,000
// instances 802 / 906 / 805 / 769 / 806 instances/s once up against 913 /
// 836 / 823 / 942 / 844.
//
// A worker whose claim loop last found nothing to claim and nothing due
// later, with nothing signalled since (Store.settled), hands off without
// the index walk: its claim could find only steps whose news is on its way
// to the claim loop, which takes them then. Its statement
// (settledHandoffSQL) then has no UPDATE of walked steps and of their
// instances to initialise, nor the promotion before it: latency4 on
// PostgreSQL 3.73 / 3.64 / 4.03 / 3.69 / 3.87 / 4.13 ms p50 against 4.69
// / 4.28 / 4.13 / 4.15 / 4.06 / 4.03 walking, alternating, once every
// connection kept its freed memory (keepFreedMemorySQL).

// handoff is the claim a finish asks its plans to make with them.
type handoff struct {
	p    storage.ClaimParams
	into *[]storage.ClaimedStep
	// done is set when the plans' statement made the claim.
	done bool
	// finish, when not nil, is the transaction's finish, held back so
	// that it may go with the hand-off (finishhandoff.go).
	finish *heldFinish
}

// made reports whether the plans made h's claim; a nil h asks for none.
func (h *handoff) made() bool { return h != nil && h.done }

// handoffSQL returns the hand-off statement for a claim's filter shape:
// $1 is the transaction's time, $2 to $7 the plans' changes as
// applyRows has them, and the claim's arguments follow (handoffArgs). It
// returns every step the plans changed (planned) and every step it
// claimed (took), in claim order; a changed step it did not claim has no
// lease, read as now, which no one reads.
func handoffSQL(c claimShape) string {
	a := handoffArgs
	return `
WITH ` + handoffChanges(c, a, applyRows) + `,
` + candidatesSQL(c, a) + `,
pick AS MATERIALIZED (
	SELECT id, handed FROM (
		SELECT id, priority, instance_run_after AS run_after, true AS handed FROM r WHERE claimable
		UNION ALL
		SELECT id, priority, run_after, false FROM cand
	) x
	ORDER BY priority DESC, run_after, id
	LIMIT ` + a.limit + `
),
-- The changes with their steps, and whether the claim took each. Joining
-- c to r again instead, by ord, made the plan of many changes quadratic
-- in their number; this join is bounded by the claim's limit.
rk AS (
	SELECT r.*, k.id IS NOT NULL AS handed FROM r LEFT JOIN pick k ON k.id = r.id AND k.handed
),
u AS (` + handoffApply() + `),
w AS (
	UPDATE {s}steps s SET ` + a.claimSet() + `
	FROM pick k WHERE s.id = k.id AND NOT k.handed
	RETURNING ` + claimReturning + `
),
claimed AS (
	SELECT ` + claimColumnsOf("u", true) + ` FROM u WHERE handed
	UNION ALL
	SELECT ` + claimColumnsOf("w", true) + ` FROM w
),
started AS (` + startClaimedInstances("w") + `),
ev AS (` + handoffEvents("claimed", "started") + `)
SELECT planned, took, ` + claimedColumns(c, "x") + ` FROM (
	SELECT true AS planned, handed AS took, ` + claimColumnsOf("u", true) + ` FROM u
	UNION ALL
	SELECT false, true, ` + claimColumnsOf("w", true) + ` FROM w
) x
ORDER BY took DESC, priority DESC, run_after, id`
}

// handoffChanges are a hand-off's first CTEs: the plans' changes (c, the
// rows of changes) and the steps they change, each with whether the claim
// (numbered by a) may take it (r).
func handoffChanges(c claimShape, a claimArgs, changes string) string {
	return `c AS (
	` + changes + `
),
r AS (
	SELECT c.*, s.id, s.priority, i.run_after AS instance_run_after,
		c.status = 'pending' AND c.ckey IS NULL AND NOT s.held_by_instance AND NOT s.queue_limited
			AND i.status = 'running' AND NOT i.paused AND i.run_after <= {now}` + a.filters(c, "s") + ` AS claimable
	FROM c
	JOIN {s}steps s ON s.instance_id = c.instance_id AND s.name = c.name AND s.status = 'blocked'
	JOIN {s}instances i ON i.id = s.instance_id
)`
}

// handoffApply is a hand-off's UPDATE of the steps its plans change (rk:
// r with whether the claim took each), the ones it took running.
func handoffApply() string {
	a := handoffArgs
	return `
	UPDATE {s}steps s SET
		status = CASE WHEN c.handed THEN 'running' ELSE c.status END,
		` + applySet("NULL") + `,
		attempts = CASE WHEN c.handed THEN s.attempts + 1 ELSE s.attempts END,
		fence = CASE WHEN c.handed THEN s.fence + 1 ELSE s.fence END,
		started_at = CASE WHEN c.handed THEN {now} ELSE s.started_at END,
		first_started_at = CASE WHEN c.handed THEN coalesce(s.first_started_at, {now}) ELSE s.first_started_at END,
		lease_until = CASE WHEN c.handed THEN {clock} + ` + a.lease + `::bigint * interval '1 microsecond'
			ELSE s.lease_until END,
		worker_id = CASE WHEN c.handed THEN ` + a.worker + ` ELSE s.worker_id END,
		promoted = CASE WHEN c.handed THEN false ELSE s.promoted END
	FROM rk c
	WHERE s.id = c.id AND s.status = 'blocked'
	RETURNING ` + claimReturning + `, c.status AS change, s.error, s.wait_signal, c.ord, c.handed
`
}

// handoffEvents is a hand-off's INSERT of its events: the plans' changes
// (u), then the steps claimed (the relation claimed, with claimReturning's
// columns), then the instances started (the relation started, unless "").
func handoffEvents(claimed, started string) string {
	a := handoffArgs
	instances := ""
	if started != "" {
		instances = `
		UNION ALL
		SELECT started.id, '', 'instance.started', ` + a.worker + `, 0, 2, 0, 0, NULL, 0 FROM ` + started
	}
	return `
	INSERT INTO {s}events (instance_id, step, type, attempt, message, at)
	SELECT e.instance_id, e.step, e.type, e.attempt, e.message, {now} FROM (
		SELECT u.instance_id, u.name AS step, ` + planEvent("u.change") + `, 0 AS attempt,
			0 AS part, u.ord AS k0, 0 AS k1, NULL::timestamptz AS k2, 0::bigint AS k3
		FROM u
		UNION ALL
		SELECT k.instance_id, k.name, 'step.started', ` + a.worker + `, k.attempts, 1, 0, -k.priority, k.run_after, k.id
		FROM ` + claimed + ` k WHERE k.item_index = -1 -- items have no events of their own` + instances + `
	) e
	ORDER BY e.part, e.k0, e.k1, e.k2, e.k3, e.instance_id
`
}

// settledHandoffSQL is handoffSQL for a settled worker (Store.settled):
// the claim takes the claimable steps the plans make ready, in claim
// order, and nothing else. Without the index walk the statement has no
// UPDATE of walked steps nor of their instances, each of which opens its
// table's indexes and, for instances, fires the counting trigger at every
// execution, also when it changes nothing. Its parameters and rows are
// handoffSQL's.
func settledHandoffSQL(c claimShape) string {
	a := handoffArgs
	return `
WITH ` + handoffChanges(c, a, applyRows) + `,
` + settledPick(a) + `,
rk AS (
	SELECT r.*, k.id IS NOT NULL AS handed FROM r LEFT JOIN pick k ON k.id = r.id
),
u AS (` + handoffApply() + `),
ev AS (` + handoffEvents("(SELECT * FROM u WHERE handed)", "") + `)
SELECT true AS planned, handed AS took, ` + claimedColumns(c, "u") + ` FROM (
	SELECT handed, ` + claimColumnsOf("u", true) + ` FROM u
) u
ORDER BY took DESC, priority DESC, run_after, id`
}

// settledPick is a settled hand-off's pick: the claimable steps the plans
// make ready, in claim order, up to the claim's limit.
func settledPick(a claimArgs) string {
	return `pick AS MATERIALIZED (
	SELECT id FROM r WHERE claimable
	ORDER BY priority DESC, id
	LIMIT ` + a.limit + `
)`
}

// handoffArgs number the claim's arguments after the plans' changes.
var handoffArgs = claimArgs{lease: "$8", worker: "$9", limit: "$10", next: 11}

// handoffQueries and handoffOneQueries are the hand-off statements by
// claim shape, of many changes and of one (see oneRow). A capped claim
// (items under a cap) never hands off.
var (
	handoffQueries    = byShape(handoffSQL)
	handoffOneQueries = byShape(func(c claimShape) string { return oneRow(handoffQueries.of(c), applyRows, applyRow) })
)

// settledHandoffQueries and settledHandoffOneQueries are their settled
// versions.
var (
	settledHandoffQueries    = byShape(settledHandoffSQL)
	settledHandoffOneQueries = byShape(func(c claimShape) string {
		return oneRow(settledHandoffQueries.of(c), applyRows, applyRow)
	})
)

// planAndHandOff is planAndApply, whose plans may make h's claim with
// their changes (h.made); a nil h asks for none.
func (s *Store) planAndHandOff(st *txState, now *time.Time, ls []*loaded, plan storage.PlanFunc, h *handoff) error {
	st.handoff = h
	defer func() { st.handoff = nil }()
	return s.planAndApply(st, now, ls, plan)
}

// canHandOff reports whether a claim may go with the plans' changes sc in
// one statement: sc makes a step pending and only skips, completes or
// fails others, and nothing else of the plans was queued since the tail
// held tailLen statements.
func (st *txState) canHandOff(sc *stepChanges, tailLen int) bool {
	if st.handoff == nil || sc.waits || st.tail.Len() != tailLen {
		return false
	}
	for _, status := range sc.statuses {
		if status == string(storage.StepPending) {
			return true
		}
	}
	return false
}

// queueHandoff queues the plans' changes sc and st.handoff's claim in one
// statement, after the promotion of the delayed steps now due, which the
// claim's index walk must see; a settled worker's (Store.settled) walks
// nothing.
func (s *Store) queueHandoff(st *txState, now *time.Time, sc *stepChanges) {
	h := st.handoff
	h.done = true
	p := h.p
	shape, rest := claimArguments(p, nil)
	n := len(sc.ids)
	args := []any{now, sc.ids, sc.names, sc.statuses, sc.inputs, sc.errors, sc.keys}
	many, one := handoffQueries, handoffOneQueries
	// A settled worker's claim could find nothing but what the plans make
	// ready, unless the transaction made steps ready otherwise.
	settled := !st.otherReady && !st.itemSlotFreed && s.settled(p)
	if settled {
		many, one = settledHandoffQueries, settledHandoffOneQueries
		s.settledHandoffs.Add(1)
		if h.finish != nil && n == 1 {
			s.queueFinishHandoff(st, h.finish, sc, shape, rest)
			return
		}
	} else {
		// The claim's index walk must see the delayed steps now due.
		s.queuePromotion(&st.tail, now, &st.promoted)
		shape.heads = s.readsHeads(p)
	}
	sql := many.of(shape)
	if n == 1 {
		args = []any{now, sc.ids[0], sc.names[0], sc.statuses[0], sc.inputs[0], sc.errors[0], sc.keys[0]}
		sql = one.of(shape)
	}
	args = append(args, rest...)
	st.tail.Queue(s.q(sql), args...).Query(func(rows pgx.Rows) error {
		var (
			claimed       []storage.ClaimedStep
			changed       int
			planned, took bool
		)
		_, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (struct{}, error) {
			c, err := scanClaimedAfter(row, &planned, &took)
			if planned {
				changed++
			}
			if took {
				claimed = append(claimed, c)
			}
			return struct{}{}, err
		})
		if err != nil {
			return err
		}
		// Checked against the locked state: only a bug gets a count
		// other than n.
		if changed != n {
			return fmt.Errorf("applying plans changed %d steps, want %d", changed, n)
		}
		*h.into, st.claimed = claimed, claimed
		st.promotedLeft = st.promotedLeft || promotedLeft(p, st.promoted, len(claimed))
		// A settled hand-off saw only the steps its plans made ready. Any
		// hand-off's index walk sees none of those, so one they made ready
		// and the claim did not hand over (a step under a limit, which the
		// triggers hold or let run as the statement changes it) may be
		// ready for this process's other claimers, as after queueClaim.
		st.quiet = !settled && p.TookAll(len(claimed)) && st.claimedPlanReady()
		return nil
	})
}
