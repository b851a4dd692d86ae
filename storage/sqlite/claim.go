package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/internal/lookahead"
)

// claimReturning lists what a claim hands the worker.
const claimReturning = ` RETURNING id, instance_id, name, workflow, handler, queue, input, attempts, fence,
	max_attempts, backoff_us, max_backoff_us, timeout_us, first_started_at, ready_at, lease_until, priority, run_after, item_index + 1`

// claimTraceParent is the column a claim with ClaimParams.TraceParent
// returns last.
const claimTraceParent = `, (SELECT traceparent FROM instances i WHERE i.id = steps.instance_id)`

// claimShape is a claim's filter shape: how many queues (0, 1, several),
// whether it is bound to one instance, whether it names handlers.
type claimShape struct {
	queues     int
	byInstance bool
	byHandler  bool
	trace      bool
	// picked takes the steps whose IDs ?7 lists (a JSON array), which
	// pickByHandler chose with the shape's filters, instead of walking.
	picked bool
}

// trim cuts the claim arguments ?1..?7 down to the highest one the
// shape's statement uses: SQLite counts parameters up to the highest
// number, and the driver wants exactly that many.
func (c claimShape) trim(args []any) []any {
	switch {
	case c.byHandler:
		return args[:7]
	case c.byInstance:
		return args[:6]
	case c.queues > 0:
		return args[:5]
	}
	return args[:4]
}

func shapeOf(p storage.ClaimParams) claimShape {
	return claimShape{queues: min(len(p.Queues), 2), byInstance: p.InstanceID != "", byHandler: len(p.Handlers) > 0, trace: p.TraceParent}
}

// claimQuery returns the claim statement for one filter shape. The inner
// SELECT walks a partial index of pending steps in claim order
// (steps_ready, or steps_ready_queue for one queue), so it reads only
// ready rows however many finished ones the table holds; see
// TestClaimUsesPartialIndex. The handler filter is checked on the rows the
// walk meets: ready steps of handlers no worker of this kind has are
// skipped, not claimed. When many of them come first, pickByHandler reads
// past them and the claim takes the steps it picked (c.picked).
func claimQuery(c claimShape) string {
	var b strings.Builder
	b.WriteString(`UPDATE steps SET status = 'running', attempts = attempts + 1, fence = fence + 1,
	started_at = ?1, first_started_at = coalesce(first_started_at, ?1), lease_until = ?2, worker_id = ?3, promoted = 0
WHERE id IN (`)
	if c.picked {
		b.WriteString(`SELECT value FROM json_each(?7))`)
	} else {
		b.WriteString(`SELECT id FROM steps WHERE ` + readyToClaim + claimFilters(c))
		if c.byHandler {
			b.WriteString(` AND handler IN (SELECT value FROM json_each(?7))`)
		}
		b.WriteString(` ORDER BY priority DESC, run_after, id LIMIT ` + boundLimit + `)`)
	}
	b.WriteString(claimReturning)
	if c.trace {
		b.WriteString(claimTraceParent)
	}
	return b.String()
}

// readyToClaim is the condition every step a claim may take meets,
// whatever its filters: pending, ready, due by ?1, and not an item of a
// capped forEach step (claimCapped takes those).
const readyToClaim = `status = 'pending' AND ` + readyTerm + ` AND run_after <= ?1 AND item_concurrency = 0`

// claimFilters is the queue and instance filters of a claim of shape c.
func claimFilters(c claimShape) string {
	f := ""
	switch {
	case c.queues == 1:
		f += ` AND queue = +?5`
	case c.queues > 1:
		f += ` AND queue IN (SELECT value FROM json_each(?5))`
	}
	if c.byInstance {
		f += ` AND instance_id = +?6`
	}
	return f
}

// A claim that names its handlers walks the ready index in claim order and
// passes over the steps of other handlers, which is cheap as long as few
// of them come first. When the store last saw ready steps of handlers the
// claimer lacks among the first ?4 (servedHeadQuery, at most once a
// second: see package storage/internal/lookahead), the claim reads the
// head of each of its handlers through steps_ready_handler instead
// (handlerHeadQuery) and takes the first ?4 of them in claim order
// (pickByHandler), however many of the others wait: a backlog of a
// handler no live worker has, or of one whose own pool of workers fell
// behind, no longer costs every other claim its length. A claim of
// several queues reads their ready steps whatever their handler (see
// TestClaimUsesPartialIndex), and does not look.

// servedHeadQuery returns 1 when the first ?4 ready steps a claim of shape
// c walks, whatever their handler, are all of the handlers ?7, or there
// are none.
func servedHeadQuery(c claimShape) string {
	return `SELECT coalesce(min(handler IN (SELECT value FROM json_each(?7))), 1) FROM (
	SELECT handler FROM steps WHERE ` + readyToClaim + claimFilters(c) + `
	ORDER BY priority DESC, run_after, id LIMIT ` + boundLimit + `)`
}

// handlerHeadQuery returns the first ?4 ready steps of the handler ?7 that
// a claim of shape c may take, in claim order.
func handlerHeadQuery(c claimShape) string {
	return `SELECT id, priority, run_after FROM steps INDEXED BY steps_ready_handler
	WHERE handler = +?7 AND ` + readyToClaim + claimFilters(c) + `
	ORDER BY priority DESC, run_after, id LIMIT ` + boundLimit
}

// readsHeads reports whether a claim with p's filters, of shape c and
// arguments args, reads its handlers' heads (pickByHandler): it looks
// ahead first when its verdict is due.
func (t *txn) readsHeads(p storage.ClaimParams, c claimShape, args []any) (bool, error) {
	if t.heads == nil || c.queues > 1 || !lookahead.MayHelp(p) {
		return false, nil
	}
	if now := time.Now(); t.heads.Begin(p, now) {
		var served bool
		err := t.queryRow(servedHeadQueries()[c], args...).Scan(&served)
		t.heads.Done(p, !served, err == nil, now)
		if err != nil {
			return false, err
		}
	}
	return t.heads.Heads(p), nil
}

// pickByHandler returns the IDs (a JSON array) of the steps a claim of
// shape c with arguments args takes, read handler by handler.
func (t *txn) pickByHandler(c claimShape, args []any, handlers []string, limit int) (ids string, err error) {
	var heads []claimedRow
	one := slices.Clone(args)
	for _, h := range handlers {
		one[6] = h
		rows, err := t.query(handlerHeadQueries()[c], one...)
		if err != nil {
			return "", err
		}
		for rows.Next() {
			var r claimedRow
			if err := rows.Scan(&r.StepID, &r.priority, &r.runAfter); err != nil {
				rows.Close()
				return "", err
			}
			heads = append(heads, r)
		}
		if err := rows.Close(); err != nil {
			return "", err
		}
	}
	slices.SortFunc(heads, byClaimOrder)
	heads = slices.CompactFunc(heads, func(a, b claimedRow) bool { return a.StepID == b.StepID }) // a handler named twice
	picked := make([]int64, 0, min(len(heads), limit))
	for _, r := range heads[:min(len(heads), limit)] {
		picked = append(picked, r.StepID)
	}
	b, err := json.Marshal(picked)
	return string(b), err
}

// byClaimOrder orders claimed rows as a claim takes them: higher priority
// first, then earlier run_after, then lower ID.
func byClaimOrder(a, b claimedRow) int {
	if a.priority != b.priority {
		return b.priority - a.priority
	}
	if a.runAfter != b.runAfter {
		if a.runAfter < b.runAfter {
			return -1
		}
		return 1
	}
	return int(a.StepID - b.StepID)
}

// readyTerm is the partial-index term of the claim indexes: a pending step
// that was due when it was made pending, or whose time promote found had
// come. A claim names it so that the planner may use those indexes.
const readyTerm = `(promoted = 1 OR run_after <= ready_at)`

// readySteps is the ready (pending and due) steps and items as a FROM
// item with the columns the figures need: read from the claims' index and
// the delayed steps' (due, not promoted yet by a claim), never from the
// whole table. ?1 is now. ready_since is when each became ready: its
// run_after orders it (a step made ready by its dependencies has its
// instance's), so the later of that and the time it was made pending. n
// is how many ready steps a row stands for: the figures sum it.
//
// The items of a forEach step with a concurrency cap count as far as the
// cap leaves room, as claimCapped has a claim take them: as many of the due
// ones as the cap less the step's running items, in one row per step. The
// others wait for those to finish, held as a limit holds steps, and no
// worker can take them sooner.
const readySteps = `(
	SELECT workflow, queue, handler, ` + readySince + ` AS ready_since, 1 AS n FROM steps
	WHERE status = 'pending' AND ` + readyTerm + ` AND run_after <= ?1 AND item_concurrency = 0
	UNION ALL
	SELECT workflow, queue, handler, ` + readySince + ` AS ready_since, 1 AS n FROM steps
	WHERE status = 'pending' AND promoted = 0 AND run_after > ready_at AND run_after <= ?1 AND item_concurrency = 0
	UNION ALL
	SELECT workflow, queue, handler, ready_since, min(due, room) AS n FROM (` + cappedSteps + cappedStepsGroup + `)
	WHERE room > 0
) ready`

// cappedSteps, ended by cappedStepsGroup, gives one row per forEach step
// with a concurrency cap and due pending items: its workflow, queue and
// handler, when its oldest due item became ready, how many are due, and
// the room its cap leaves (the cap less its running items). The ready
// figures count min(due, room) of them, Queues the rest as held. A
// caller may add conditions on c between the two. ?1 is now.
const cappedSteps = `SELECT workflow, queue, handler, min(` + readySince + `) AS ready_since, count(*) AS due,
		max(item_concurrency - (SELECT count(*) FROM steps r WHERE r.parent_id = c.parent_id AND r.status = 'running'), 0) AS room
	FROM steps c WHERE c.status = 'pending' AND c.item_concurrency > 0 AND c.run_after <= ?1`

const cappedStepsGroup = ` GROUP BY c.parent_id`

// readySince is when a step of readySteps became ready (a NULL ready_at
// reads as run_after).
const readySince = `max(run_after, coalesce(ready_at, run_after))`

// dueSQL lists the delayed steps whose time has come (?1 is now), so that
// promote moves them into the claim indexes: a bounded number per claim,
// earliest first, so that no claim holds the writer for long when very
// many fall due at once. It reads only steps_delayed, one seek when none
// is due. The batch is listed in claim order because a step under limits
// takes its slots as it is promoted (slots_due: migration 17), or is held
// until one frees, and then its slot of its queue's rate (rate_slot_due),
// staying delayed until that slot when the rate is behind: of the steps
// that fall due together, the one a claim would take first must take a
// free slot first.
const dueSQL = `SELECT id FROM (SELECT id, priority, run_after FROM steps
	WHERE status = 'pending' AND promoted = 0 AND run_after > ready_at AND run_after <= ?1
	ORDER BY run_after LIMIT 1000)
	ORDER BY priority DESC, run_after, id`

// promoteSQL promotes one step of dueSQL's. One statement a step, rather
// than one for the batch, because SQLite runs an UPDATE's row triggers in
// the order it visits the rows, which for id IN (...) is by id.
const promoteSQL = `UPDATE steps SET promoted = 1, rate_slot_due = 0, slots_due = 0 WHERE id = ?1`

// promote moves the steps of dueSQL into the claim indexes, in claim
// order. First, a rated queue that has been idle gives its waiting steps
// their slots again from now (respaceIdleRates), so that those whose
// slots passed while no worker ran start the rate's interval apart rather
// than together.
func (t *txn) promote(now int64) error {
	if err := t.respaceIdleRates(now); err != nil {
		return err
	}
	due, err := t.dueSteps(now)
	if err != nil {
		return err
	}
	for _, id := range due {
		if _, err := t.exec(promoteSQL, id); err != nil {
			return err
		}
	}
	return nil
}

// dueSteps lists the steps of dueSQL.
func (t *txn) dueSteps(now int64) ([]int64, error) {
	rows, err := t.query(dueSQL, now)
	if err != nil {
		return nil, err
	}
	return column[int64](rows)
}

// idleRatesSQL lists the rated queues (?1 is now) with two steps or more
// that a claim could start now (ready, or delayed and due: their slots or
// their own times passed) and no start for longer than the rate's
// interval or a second, whichever is longer: a queue no worker served for
// a while, whose steps would otherwise all start at once. A busy queue's
// late claims keep their slots, so the rate holds on average under load.
// A queue respaced so is not idle again until a step has started since
// (migration 26): the claimers present may not take the first steps (a
// following start's claims take only its instance's), and a respace at
// each of their claims moved the slot of the step they could take on for
// ever. The late steps are read from steps_queue_limited, whose status
// term the query repeats; the latest start is one entry of
// steps_rate_starts. With no rated queue, the query reads queue_limits
// alone.
const idleRatesSQL = `SELECT queue, interval_us FROM (SELECT q.queue, q.interval_us, q.respaced_at,
		coalesce((SELECT max(r.started_at) FROM steps r
			WHERE r.queue = q.queue AND r.queue_limited = 1 AND r.started_at IS NOT NULL), 0) AS last_start
	FROM queue_limits q
	WHERE q.interval_us > 0
	AND (SELECT count(*) FROM (SELECT 1 FROM steps s WHERE s.queue = q.queue AND s.queue_limited = 1
		AND s.status = 'pending' AND s.status IN ('pending', 'running') AND s.run_after <= ?1 LIMIT 2)) = 2)
	WHERE last_start < ?1 - max(interval_us, 1000000) AND respaced_at <= last_start`

// respaceIdleRates gives the waiting steps of each queue of idleRatesSQL,
// and those whose own time has come, their slots again from now
// (respace).
func (t *txn) respaceIdleRates(now int64) error {
	rows, err := t.query(idleRatesSQL, now)
	if err != nil {
		return err
	}
	type rated struct {
		queue    string
		interval int64
	}
	var idle []rated
	if err := eachRow(rows, func(sc scanner) error {
		var r rated
		err := sc.Scan(&r.queue, &r.interval)
		idle = append(idle, r)
		return err
	}); err != nil {
		return err
	}
	for _, r := range idle {
		if err := t.respace(r.queue, now, r.interval, true); err != nil {
			return err
		}
	}
	return nil
}

// cappedParentsQuery lists the forEach steps with pending items under a
// concurrency cap, one index seek each (steps_capped_pending), however
// many items wait.
const cappedParentsQuery = `WITH RECURSIVE p (id) AS (
	SELECT min(parent_id) FROM steps WHERE status = 'pending' AND item_concurrency > 0
	UNION ALL
	SELECT (SELECT min(parent_id) FROM steps WHERE status = 'pending' AND item_concurrency > 0 AND parent_id > p.id)
	FROM p WHERE p.id IS NOT NULL
)
SELECT id FROM p WHERE id IS NOT NULL`

// cappedRoomQuery is the room the cap of forEach step ?1 leaves: its cap
// less its running items.
const cappedRoomQuery = `SELECT item_concurrency - (SELECT count(*) FROM steps r WHERE r.parent_id = +?1 AND r.status = 'running')
	FROM steps WHERE parent_id = +?1 AND status = 'pending' AND item_concurrency > 0 LIMIT 1`

// cappedItemsQuery is the claimable items of forEach step ?1, the first
// ?2 due ones by index, read through the step's own pending items
// (steps_capped_pending): a few entries per claim. ?3 is now; ?4 queues,
// ?5 instance and ?6 handlers filter as a claim's do (null for none).
const cappedItemsQuery = `SELECT id FROM steps
	WHERE parent_id = +?1 AND status = 'pending' AND item_concurrency > 0 AND run_after <= ?3 AND ` + readyTerm + `
		AND (?4 IS NULL OR queue IN (SELECT value FROM json_each(?4)))
		AND (?5 IS NULL OR instance_id = ?5)
		AND (?6 IS NULL OR handler IN (SELECT value FROM json_each(?6)))
	ORDER BY item_index LIMIT CAST(?2 AS INTEGER)`

// cappedClaimQuery takes the items ?4 (a JSON array of IDs) as a claim
// takes steps; with trace, it returns their instance's traceparent too.
func cappedClaimQuery(trace bool) string {
	q := `UPDATE steps SET status = 'running', attempts = attempts + 1, fence = fence + 1,
	started_at = ?1, first_started_at = coalesce(first_started_at, ?1), lease_until = ?2, worker_id = ?3, promoted = 0
WHERE id IN (SELECT value FROM json_each(?4))` + claimReturning
	if trace {
		q += claimTraceParent
	}
	return q
}

var cappedClaimQueries = [2]string{cappedClaimQuery(false), cappedClaimQuery(true)}

// claimCapped claims up to limit items of forEach steps with a
// concurrency cap, which the claim statement leaves alone: of each such
// step, its first due items by index, as many as its cap less its running
// items leaves room for. Writes are serial, so no other claim counts the
// same room meanwhile. Counting, for every pending item, the pending ones
// before it (as the claim statement once did) read every item's
// predecessors at each claim: a step of 2,000 items capped at 3 ran for
// minutes.
func (t *txn) claimCapped(p storage.ClaimParams, limit int, now int64) ([]claimedRow, error) {
	rows, err := t.query(cappedParentsQuery)
	if err != nil {
		return nil, err
	}
	parents, err := column[int64](rows)
	if err != nil || len(parents) == 0 {
		return nil, err
	}
	var queues, instance, handlerList any
	if len(p.Queues) > 0 {
		b, err := json.Marshal(p.Queues)
		if err != nil {
			return nil, err
		}
		queues = string(b)
	}
	if p.InstanceID != "" {
		instance = p.InstanceID
	}
	if len(p.Handlers) > 0 {
		b, err := json.Marshal(p.Handlers)
		if err != nil {
			return nil, err
		}
		handlerList = string(b)
	}
	var ids []int64
	for _, parent := range parents {
		if len(ids) >= limit {
			break
		}
		var room int
		if err := t.queryRow(cappedRoomQuery, parent).Scan(&room); err != nil {
			return nil, err
		}
		if room = min(room, limit-len(ids)); room <= 0 {
			continue
		}
		rows, err := t.query(cappedItemsQuery, parent, room, now, queues, instance, handlerList)
		if err != nil {
			return nil, err
		}
		items, err := column[int64](rows)
		if err != nil {
			return nil, err
		}
		ids = append(ids, items...)
	}
	if len(ids) == 0 {
		return nil, nil
	}
	list, err := json.Marshal(ids)
	if err != nil {
		return nil, err
	}
	trace := 0
	if p.TraceParent {
		trace = 1
	}
	rows, err = t.query(cappedClaimQueries[trace], now, us(t.now.Add(p.Lease)), p.WorkerID, string(list))
	if err != nil {
		return nil, err
	}
	return scanClaimed(rows, p.TraceParent)
}

// boundLimit is ?4, the claim's limit, as the subquery's LIMIT. SQLite
// plans the LIMIT of an IN (SELECT ... LIMIT ?) around the parameter's
// value and so prepares the whole statement (triggers and all) anew each
// time the parameter is bound: about 100 µs per claim. An expression is
// not planned around, and the statement stays prepared. The store writes
// every parameter SQLite's planner would read so: a LIMIT or OFFSET as
// CAST(? AS INTEGER), an equality an ORDER BY relies on (col = ? ORDER BY
// the index's next column, as the queue and instance filters here) as
// col = +? (TestStatementsStayPrepared).
const boundLimit = `CAST(?4 AS INTEGER)`

// claimQueries are built once: the statement text must stay constant to
// stay in the driver's prepared-statement cache. They are built at first
// use, not at init, which every dagrun process would pay for.
var claimQueries = sync.OnceValue(func() map[claimShape]string {
	m := map[claimShape]string{}
	for q := 0; q <= 2; q++ {
		for _, i := range []bool{false, true} {
			for _, h := range []bool{false, true} {
				for _, tr := range []bool{false, true} {
					c := claimShape{queues: q, byInstance: i, byHandler: h, trace: tr}
					m[c] = claimQuery(c)
					if h && !i && q < 2 {
						c.picked = true
						m[c] = claimQuery(c)
					}
				}
			}
		}
	}
	return m
})

// servedHeadQueries and handlerHeadQueries are pickByHandler's
// statements by the claim's shape, built once as claimQueries are.
var (
	servedHeadQueries  = headQueries(servedHeadQuery)
	handlerHeadQueries = headQueries(handlerHeadQuery)
)

func headQueries(build func(claimShape) string) func() map[claimShape]string {
	return sync.OnceValue(func() map[claimShape]string {
		m := map[claimShape]string{}
		for q := 0; q <= 1; q++ {
			for _, tr := range []bool{false, true} {
				c := claimShape{queues: q, byHandler: true, trace: tr}
				m[c] = build(c)
			}
		}
		return m
	})
}

type claimedRow struct {
	storage.ClaimedStep
	priority int
	runAfter int64
}

// ClaimSteps implements storage.Store: one UPDATE ... RETURNING picks and
// takes the steps, then the instances they start move to running, all in one
// BEGIN IMMEDIATE transaction.
func (s *Store) ClaimSteps(ctx context.Context, p storage.ClaimParams) ([]storage.ClaimedStep, error) {
	out, _, err := s.claimSteps(ctx, p, false)
	return out, err
}

// ClaimStepsAndWake implements storage.WakeClaimer: a claim that comes
// back short reads the next wake in its own transaction, instead of a
// reader's of its own after it.
func (s *Store) ClaimStepsAndWake(ctx context.Context, p storage.ClaimParams) ([]storage.ClaimedStep, time.Time, error) {
	return s.claimSteps(ctx, p, true)
}

func (s *Store) claimSteps(ctx context.Context, p storage.ClaimParams, wake bool) ([]storage.ClaimedStep, time.Time, error) {
	if p.Lease <= 0 {
		return nil, time.Time{}, errors.New("sqlite: claim steps: lease must be positive")
	}
	var (
		out  []storage.ClaimedStep
		next time.Time
	)
	err := s.write(ctx, "claim steps", func(t *txn) error {
		var err error
		next = time.Time{} // an attempt tried again starts afresh
		if out, err = t.claim(p); err != nil || !wake || len(out) >= max(p.Limit, 1) {
			return err
		}
		next, err = nextWake(p, t.now, t.queryRow)
		return err
	})
	if err != nil {
		return nil, time.Time{}, err
	}
	return out, next, nil
}

// claim claims inside the transaction: one UPDATE ... RETURNING picks and
// takes the steps, then the instances they start move to running.
func (t *txn) claim(p storage.ClaimParams) ([]storage.ClaimedStep, error) {
	limit := max(p.Limit, 1)
	now := us(t.now)
	// ?1..?4 always; ?5 queues, ?6 instance, ?7 handlers when the shape has
	// them.
	args := []any{now, us(t.now.Add(p.Lease)), p.WorkerID, limit, nil, nil, nil}
	switch len(p.Queues) {
	case 0:
	case 1:
		args[4] = p.Queues[0]
	default:
		b, err := json.Marshal(p.Queues)
		if err != nil {
			return nil, err
		}
		args[4] = string(b)
	}
	if p.InstanceID != "" {
		args[5] = p.InstanceID
	}
	if len(p.Handlers) > 0 {
		b, err := json.Marshal(p.Handlers)
		if err != nil {
			return nil, err
		}
		args[6] = string(b)
	}
	if err := t.promote(now); err != nil {
		return nil, err
	}
	shape := shapeOf(p)
	args = shape.trim(args)
	heads, err := t.readsHeads(p, shape, args)
	if err != nil {
		return nil, err
	}
	if heads {
		ids, err := t.pickByHandler(shape, args, p.Handlers, limit)
		if err != nil {
			return nil, err
		}
		shape.picked = true
		args[6] = ids
		t.headClaims.Add(1)
	}
	rows, err := t.query(claimQueries()[shape], args...)
	if err != nil {
		return nil, err
	}
	claimed, err := scanClaimed(rows, shape.trace)
	if err != nil {
		return nil, err
	}
	if len(claimed) < limit {
		capped, err := t.claimCapped(p, limit-len(claimed), now)
		if err != nil {
			return nil, err
		}
		claimed = append(claimed, capped...)
	}
	if len(claimed) == 0 {
		return nil, nil
	}
	// RETURNING order is unspecified: restore the claim order.
	slices.SortFunc(claimed, byClaimOrder)
	ids := make([]string, 0, len(claimed))
	out := make([]storage.ClaimedStep, len(claimed))
	for i, c := range claimed {
		out[i] = c.ClaimedStep
		if c.Item < 0 { // items have no events of their own
			t.event(c.InstanceID, c.Step, storage.EventStepStarted, c.Attempt, p.WorkerID)
		}
		if !slices.Contains(ids, c.InstanceID) {
			ids = append(ids, c.InstanceID)
		}
	}
	return out, t.startInstances(ids, p.WorkerID)
}

func scanClaimed(rows *sql.Rows, withTrace bool) ([]claimedRow, error) {
	defer rows.Close()
	var out []claimedRow
	for rows.Next() {
		var (
			c                        claimedRow
			input                    []byte
			backoff, maxBackoff, tmo int64
			first, ready             sql.NullInt64
			lease                    int64
			// item_index + 1: 0 for a step, which the driver returns
			// without allocating, into an int64, which database/sql sets
			// without formatting it as text first.
			itemPlus1   int64
			traceParent sql.NullString
		)
		dest := [...]any{&c.StepID, &c.InstanceID, &c.Step, &c.Workflow, &c.Handler, &c.Queue, &input, &c.Attempt, &c.Fence,
			&c.Retry.MaxAttempts, &backoff, &maxBackoff, &tmo, &first, &ready, &lease, &c.priority, &c.runAfter, &itemPlus1, &traceParent}
		n := len(dest)
		if !withTrace {
			n--
		}
		if err := rows.Scan(dest[:n]...); err != nil {
			return nil, err
		}
		c.Input = rawJSON(input)
		c.Item = int(itemPlus1) - 1
		c.Retry.Backoff = time.Duration(backoff) * time.Microsecond
		c.Retry.MaxBackoff = time.Duration(maxBackoff) * time.Microsecond
		c.Timeout = time.Duration(tmo) * time.Microsecond
		c.FirstStartedAt = timeUS(first)
		c.ReadyAt = timeUS(ready)
		c.LeaseUntil = fromUS(lease)
		c.TraceParent = traceParent.String
		out = append(out, c)
	}
	return out, rows.Err()
}

// startInstances moves the given instances from pending to running, by
// worker when a claim of its steps starts them (the event names it, as a
// step's start does).
func (t *txn) startInstances(ids []string, worker string) error {
	b, err := json.Marshal(ids)
	if err != nil {
		return err
	}
	// A workflow timeout counts from here.
	rows, err := t.query(`UPDATE instances SET status = 'running', started_at = ?1,
			deadline = CASE WHEN timeout_us > 0 THEN ?1 + timeout_us END
		WHERE status = 'pending' AND id IN (SELECT value FROM json_each(?2)) RETURNING id`, us(t.now), string(b))
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return err
		}
		t.event(id, "", storage.EventInstanceStarted, 0, worker)
	}
	return rows.Err()
}

// ExtendLeases implements storage.Store.
func (s *Store) ExtendLeases(ctx context.Context, claims []storage.Claim, lease time.Duration) ([]storage.Claim, error) {
	if len(claims) == 0 {
		return nil, nil
	}
	if lease <= 0 {
		return nil, errors.New("sqlite: extend leases: lease must be positive")
	}
	var lost []storage.Claim
	err := s.write(ctx, "extend leases", func(t *txn) error {
		lost = lost[:0]
		until := us(t.now.Add(lease))
		for _, c := range claims {
			res, err := t.exec(`UPDATE steps SET lease_until = ? WHERE id = ? AND fence = ? AND status = 'running'`, until, c.StepID, c.Fence)
			if err != nil {
				return err
			}
			if n, err := res.RowsAffected(); err != nil {
				return err
			} else if n == 0 {
				lost = append(lost, c)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return lost, nil
}

// ReleaseSteps implements storage.Store.
func (s *Store) ReleaseSteps(ctx context.Context, claims []storage.Claim) error {
	if len(claims) == 0 {
		return nil
	}
	err := s.write(ctx, "release steps", func(t *txn) error {
		now := us(t.now)
		for _, c := range claims {
			var (
				status          storage.StepStatus
				attempts, index int
			)
			err := t.queryRow(`UPDATE steps SET status = `+requeueStatus+`, finished_at = `+requeueFinishedAt+`,
					attempts = attempts - 1, run_after = min(run_after, ?1)`+requeueHeld+`, ready_at = ?1, lease_until = NULL, worker_id = ''
				WHERE id = ?2 AND fence = ?3 AND status = 'running' RETURNING status, attempts, item_index`, now, c.StepID, c.Fence).Scan(&status, &attempts, &index)
			if errors.Is(err, sql.ErrNoRows) {
				continue // not held any more: nothing to release
			}
			if err != nil {
				return err
			}
			if index < 0 {
				t.event(c.InstanceID, c.Step, requeueEvent(status, storage.EventStepReleased), attempts, "")
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	s.notify()
	return nil
}

// A step put back in the queue while its instance is already finished (it
// was running when a plan failed the instance) is cancelled instead, so
// that a pending step always belongs to an unfinished instance and claims
// need not join instances. ?1 is now.
const (
	requeueStatus     = `CASE WHEN (SELECT finished_at FROM instances i WHERE i.id = steps.instance_id) IS NULL THEN 'pending' ELSE 'cancelled' END`
	requeueFinishedAt = `CASE WHEN (SELECT finished_at FROM instances i WHERE i.id = steps.instance_id) IS NULL THEN NULL ELSE ?1 END`
	// requeueHeld is added to the run_after of a step put back in the
	// queue: a paused instance's steps are held back (see
	// storage.PauseShiftMicros).
	// retryStatus and retryFinishedAt are requeueStatus and
	// requeueFinishedAt for a failed attempt with attempts left (a retry,
	// an expired lease): a main step of a failing instance (see
	// storage.Plan.Failure) is failed for good instead, as nothing new
	// starts in an instance that failed.
	retryStatus = `CASE WHEN (SELECT finished_at FROM instances i WHERE i.id = steps.instance_id) IS NOT NULL THEN 'cancelled'
		WHEN ` + failingMain + ` THEN 'failed' ELSE 'pending' END`
	retryFinishedAt = `CASE WHEN (SELECT finished_at FROM instances i WHERE i.id = steps.instance_id) IS NULL AND NOT ` + failingMain + ` THEN NULL ELSE ?1 END`
	failingMain     = `(steps.parent_id IS NULL AND NOT steps.on_failure AND (SELECT failing FROM instances i WHERE i.id = steps.instance_id))`
	requeueHeld     = ` + CASE WHEN (SELECT paused FROM instances i WHERE i.id = steps.instance_id) THEN ` + pauseShift + ` ELSE 0 END`
	pauseShift      = `315569520000000000` // storage.PauseShiftMicros, checked by a test
)

func requeueEvent(status storage.StepStatus, pending storage.EventType) storage.EventType {
	switch status {
	case storage.StepCancelled:
		return storage.EventStepCancelled
	case storage.StepFailed:
		return storage.EventStepFailed
	}
	return pending
}
