package postgres

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/dagrun/dagrun/storage"
)

// claimSQL returns the claim statement for one filter shape: no queue, one
// queue, several queues; any instance or one. It is one statement, so one
// short transaction: pick the ready steps in claim order through a partial
// index of pending steps (steps_ready, or steps_ready_queue for one queue;
// see TestClaimUsesPartialIndex) skipping rows other claimers hold, take
// them, record step.started, and start their instances. Pending steps always
// belong to unfinished instances (finishing one cancels them), so the pick
// needs no join.
//
// An instance is started only if its row is not locked: the only other
// writers of a pending instance are a concurrent claim of a sibling (which
// starts it) and CancelInstance (which cancels it), and waiting for them
// would let a claim, which locks steps first, deadlock with a cancel, which
// locks the instance first.
//
// The lease counts from {clock}, as each step is taken: a claim on the
// tail of a transaction that waited for locks still gets a full lease.
//
// Ready steps of handlers the claimer lacks are passed over, never
// claimed; candidatesSQL reads past them without walking each.
func claimSQL(c claimShape) string {
	a := claimArgs{lease: "$2", worker: "$3", limit: "$4", next: 5}
	return `
WITH ` + candidatesSQL(c, a) + `,
u AS (
	UPDATE {s}steps s SET ` + a.claimSet() + `
	FROM cand WHERE s.id = cand.id
	RETURNING ` + claimReturning + `
),
started AS (` + startClaimedInstances("u") + `),
ev AS (
	INSERT INTO {s}events (instance_id, step, type, attempt, message, at)
	SELECT e.instance_id, e.step, e.type, e.attempt, ` + a.worker + `, {now} FROM (
		SELECT u.instance_id, u.name AS step, 'step.started' AS type, u.attempts AS attempt,
			0 AS ord, -u.priority AS k1, u.run_after AS k2, u.id AS k3
		FROM u WHERE u.item_index = -1 -- items have no events of their own
		UNION ALL
		SELECT started.id, '', 'instance.started', 0, 1, 0, NULL, 0 FROM started
	) e
	ORDER BY e.ord, e.k1, e.k2, e.k3, e.instance_id
)` + markClaimed(c) + `
SELECT ` + claimedColumns(c, "u") + `
FROM u` + markedBy(c) + ` ORDER BY priority DESC, run_after, id`
}

// candidatesSQL returns the CTE cand (id, priority, run_after): the up to
// a.limit ready steps a claim of shape c (numbered by a) takes, in claim
// order, locked, skipping rows other claimers hold.
//
// A claim that names its handlers walks the ready index in claim order
// and passes over the steps of other handlers one entry at a time, which
// is cheap as long as few of them come first. When many do (a backlog of
// a handler no live worker has, or of one whose own pool of workers fell
// behind: see lookAhead), a claim of shape heads reads the head of each
// of its handlers through steps_ready_handler instead, and keeps the first
// a.limit of them in claim order, however many of the others wait. Each
// head is locked as it is read, so such a claim may hold up to a.limit
// rows of each of its handlers until it commits; it takes only the first
// a.limit.
func candidatesSQL(c claimShape, a claimArgs) string {
	if !c.heads || !c.byHandler || c.capped || c.byInstance {
		return `cand AS (
	SELECT id, priority, run_after FROM {s}steps
	WHERE ` + readyToClaim + a.filters(c, "") + `
	ORDER BY priority DESC, run_after, id
	LIMIT ` + a.limit + `
	FOR NO KEY UPDATE SKIP LOCKED
)`
	}
	anyHandler := c
	anyHandler.byHandler = false
	return `cand AS (
	SELECT c.id, c.priority, c.run_after FROM unnest(` + a.handlersParam(c) + `::text[]) AS h(name)
	CROSS JOIN LATERAL (
		SELECT id, priority, run_after FROM {s}steps
		WHERE handler = h.name AND ` + readyToClaim + a.filters(anyHandler, "") + `
		ORDER BY priority DESC, run_after, id
		LIMIT ` + a.limit + `
		FOR NO KEY UPDATE SKIP LOCKED
	) c
	ORDER BY c.priority DESC, c.run_after, c.id
	LIMIT ` + a.limit + `
)`
}

// readyToClaim is the condition a step the claim's index walk may take
// meets, whatever the filters.
const readyToClaim = `status = 'pending' AND (promoted OR run_after <= ready_at) AND run_after <= {now}`

// claimArgs are the parameter numbers of a claim in a statement: its
// lease in microseconds, worker ID and limit, and the first of its
// filters' (queues, instance, handlers, capped parents, in that order).
// The statement's $1 is always the transaction's time.
type claimArgs struct {
	lease, worker, limit string
	next                 int
}

// filters returns the conditions of c's filter shape on the columns of
// the steps alias col ("" for none), numbering their parameters from
// a.next.
func (a claimArgs) filters(c claimShape, col string) string {
	if col != "" {
		col += "."
	}
	var b strings.Builder
	next := a.next
	param := func() string {
		next++
		return "$" + strconv.Itoa(next-1)
	}
	switch {
	case c.queues == 1:
		b.WriteString(` AND ` + col + `queue = ` + param())
	case c.queues > 1:
		b.WriteString(` AND ` + col + `queue = ANY(` + param() + `::text[])`)
	}
	if c.byInstance {
		b.WriteString(` AND ` + col + `instance_id = ` + param())
	}
	if c.byHandler {
		b.WriteString(` AND ` + col + `handler = ANY(` + param() + `::text[])`)
	}
	if c.capped {
		// Only items of the forEach steps locked by cappedParentsSQL, as
		// many as each one's cap leaves room for: see claimCapped.
		b.WriteString(` AND ` + col + `item_concurrency > 0 AND ` + col + `id IN (` + itemsUnderCap(param()) + `)`)
	} else {
		b.WriteString(` AND ` + col + `item_concurrency = 0`)
	}
	return b.String()
}

// handlersParam returns the parameter of the handlers in a claim of shape
// c: filters numbers the queues, then the instance, then the handlers.
func (a claimArgs) handlersParam(c claimShape) string {
	n := a.next
	if c.queues > 0 {
		n++
	}
	if c.byInstance {
		n++
	}
	return "$" + strconv.Itoa(n)
}

// claimSet is what a claim writes to each step s it takes.
func (a claimArgs) claimSet() string {
	return `status = 'running', attempts = s.attempts + 1, fence = s.fence + 1,
		started_at = {now}, first_started_at = coalesce(s.first_started_at, {now}),
		lease_until = {clock} + ` + a.lease + `::bigint * interval '1 microsecond', worker_id = ` + a.worker + `, promoted = false`
}

// claimReturning is what a claim's UPDATE of steps s returns of each step
// it took: the claim's columns (claimedColumns) and its order.
var claimReturning = claimColumnsOf("s", false)

// claimColumnsOf is claimReturning's columns of the relation rel, each
// under its own name; with leaseOrNow, a missing lease (a step not
// claimed) reads as now.
func claimColumnsOf(rel string, leaseOrNow bool) string {
	cols := make([]string, 0, 19)
	for _, c := range []string{"id", "instance_id", "name", "workflow", "handler", "queue", "input", "attempts", "fence",
		"max_attempts", "backoff_us", "max_backoff_us", "timeout_us", "first_started_at", "ready_at", "lease_until",
		"priority", "run_after", "item_index"} {
		col := rel + "." + c
		if c == "lease_until" && leaseOrNow {
			col = "coalesce(" + col + ", {now}) AS lease_until"
		}
		cols = append(cols, col)
	}
	return strings.Join(cols, ", ")
}

// claimedColumns are the columns scanClaimed reads, of the relation rel
// with claimReturning's columns.
func claimedColumns(c claimShape, rel string) string {
	cols := `id, instance_id, name, workflow, handler, queue, input, attempts, fence,
	max_attempts, backoff_us, max_backoff_us, timeout_us, first_started_at, ready_at, lease_until, item_index`
	if c.trace {
		cols += `,
	(SELECT traceparent FROM {s}instances i WHERE i.id = ` + rel + `.instance_id)`
	}
	return cols
}

// startClaimedInstances starts the pending instances of the steps in
// claimed, returning their IDs.
func startClaimedInstances(claimed string) string {
	return `
	UPDATE {s}instances i SET status = 'running', started_at = {now},
		deadline = CASE WHEN i.timeout_us > 0 THEN {now} + i.timeout_us * interval '1 microsecond' END
	WHERE i.id IN (
		SELECT l.id FROM {s}instances l
		WHERE l.id IN (SELECT instance_id FROM ` + claimed + `) AND l.status = 'pending'
		FOR NO KEY UPDATE SKIP LOCKED
	)
	RETURNING i.id
`
}

// promoteSQL moves into the claim indexes the delayed steps whose time has
// come ($1 is now), earliest first, a bounded number per claim so that no
// claim runs long when very many fall due at once. A step made pending
// when it was not yet due (run_after later than ready_at: a delayed start,
// a retry backoff, a snooze) sits in steps_delayed, outside the claim
// indexes, until then; so a claim walks only steps it may take, however
// many wait for their time at a higher priority. It reads only
// steps_delayed (one probe when none is due) and skips the rows another
// claim is promoting. A step under limits takes its slots as it is
// promoted (slots_due: migration 18), or is held until one frees, and
// then its slot of its queue's rate (rate_slot_due), staying
// delayed until that slot when the rate is behind; so promote_due
// (migration 21) promotes the steps one at a time in claim order, and of
// the steps that fall due together the one a claim would take first
// takes a free slot first. It takes the limits' locks its batch needs
// before it locks a row, in the order every lock of a limit is taken
// (migration 22), so that claims and finishes never deadlock on them.
//
// The function is called only when its first probe would find a step
// due (dueSQL), or a queue has a rate (whose steps an idle spell may have
// left to start together: migration 24): nearly every claim finds
// neither, and a PL/pgSQL call with its own search_path cost such a claim
// three times the probe alone.
const promoteSQL = `SELECT {s}promote_due({now}) WHERE EXISTS (SELECT FROM {s}steps WHERE ` + dueSQL + `{now})
	OR EXISTS (SELECT FROM {s}queue_limits WHERE interval_us > 0)`

// queuePromotion queues promoteSQL on b at now; promoted receives the
// number of steps it promoted, 0 when none was due.
func (s *Store) queuePromotion(b *pgx.Batch, now any, promoted *int) {
	*promoted = 0
	b.Queue(s.q(promoteSQL), now).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			if err := rows.Scan(promoted); err != nil {
				return err
			}
		}
		return rows.Err()
	})
}

// promotedLeft reports whether a claim of p that took claimed steps may
// have left to others steps its promotion promoted: other processes are
// then told, as of any step made ready. They would not hear of them
// otherwise: each claim promotes the due steps no other claim is
// promoting, so when many fall due together the first claims promote
// them all, and the workers that woke at the same moment, finding none
// left to promote and none yet promoted, wait for news. A claim that took
// at least as many steps as it promoted, and fewer than it asked for,
// took its promoted ones (it took every step it could see) and tells no
// one: a trickle of retries falling due one at a time wakes nobody.
func promotedLeft(p storage.ClaimParams, promoted, claimed int) bool {
	return promoted > claimed || promoted > 0 && claimed >= max(p.Limit, 1)
}

// dueSQL, followed by a time, is the condition of promote_due's first
// probe: a delayed step due by then. TestPromoteGuardIsTheProbe keeps
// promoteSQL's copy of it the function's own.
const dueSQL = `status = 'pending' AND NOT promoted AND run_after > ready_at AND run_after <= `

// claimShape is a claim's filter shape: how many queues (0, 1, several),
// whether it is bound to one instance, whether it names handlers.
type claimShape struct {
	queues     int
	byInstance bool
	byHandler  bool
	capped     bool
	// heads reads the head of each handler instead of walking past the
	// steps of others (candidatesSQL).
	heads bool
	// trace returns each step's instance's traceparent last.
	trace bool
	// snapshots names the claimed steps' instances for the reads of
	// claimsnapshot.go.
	snapshots bool
}

// statementsByShape builds a statement for each claim shape once, the
// first time the process asks for that shape: the statement text stays
// constant, so pgx's statement cache prepares it once per connection. A
// process runs a few of the shapes; building all of the store's 144 at
// init cost every dagrun command, a worker as much as a one-statement
// CLI call, 3.5 ms and 1.1 MB before main (GODEBUG=inittrace=1).
type statementsByShape struct {
	build func(claimShape) string
	built sync.Map // claimShape to string
}

func byShape(build func(claimShape) string) *statementsByShape {
	return &statementsByShape{build: build}
}

// of returns shape's statement.
func (b *statementsByShape) of(shape claimShape) string {
	if sql, ok := b.built.Load(shape); ok {
		return sql.(string)
	}
	sql, _ := b.built.LoadOrStore(shape, b.build(shape))
	return sql.(string)
}

// claimQueries are the claim statements by shape.
var claimQueries = byShape(claimSQL)

// ClaimSteps implements storage.Store.
func (s *Store) ClaimSteps(ctx context.Context, p storage.ClaimParams) ([]storage.ClaimedStep, error) {
	out, _, err := s.claimSteps(ctx, p, false)
	return out, err
}

// ClaimStepsAndWake implements storage.WakeClaimer: NextWake's statement
// goes in the claim's batch, so it costs no round trip of its own.
func (s *Store) ClaimStepsAndWake(ctx context.Context, p storage.ClaimParams) ([]storage.ClaimedStep, time.Time, error) {
	return s.claimSteps(ctx, p, true)
}

func (s *Store) claimSteps(ctx context.Context, p storage.ClaimParams, wake bool) ([]storage.ClaimedStep, time.Time, error) {
	if p.Lease <= 0 {
		return nil, time.Time{}, errors.New("postgres: claim steps: lease must be positive")
	}
	s.lookAhead(ctx, p)
	var (
		out      []storage.ClaimedStep
		capped   bool
		next     *time.Time
		promoted int
	)
	// One batch is its own transaction: one round trip. Whether items
	// under a concurrency cap wait comes with it, from their own partial
	// index, nearly always empty; so does the next wake, when asked for,
	// read after the claim took its steps.
	signals := s.signals.Load() // before the claim reads anything
	var read map[string]*loaded
	err := s.retry(ctx, func() error {
		sql, args := s.claimStatement(p, s.now(), true)
		var b pgx.Batch
		s.queuePromotion(&b, args[0], &promoted)
		b.Queue(sql, args...).Query(func(rows pgx.Rows) error {
			var err error
			out, err = pgx.CollectRows(rows, scanClaimed)
			return err
		})
		read = make(map[string]*loaded)
		s.queueClaimedReads(&b, nil, read)
		b.Queue(s.q(cappedPendingSQL), s.now()).QueryRow(func(row pgx.Row) error { return row.Scan(&capped) })
		if wake {
			queues, handlers := wakeFilters(p)
			b.Queue(s.q(nextWakeSQL), s.now(), queues, handlers).QueryRow(func(row pgx.Row) error { return row.Scan(&next) })
		}
		return s.db.SendBatch(ctx, &b).Close()
	})
	if err != nil {
		return nil, time.Time{}, s.fail("claim steps", err)
	}
	s.snapshots.put(claimedSnapshots(read, out, time.Now()))
	if capped && len(out) < max(p.Limit, 1) {
		// Items the capped claim takes were claimable already: the wake
		// read before it can only be early, which costs an empty claim.
		capped, err := s.claimCapped(ctx, p, max(p.Limit, 1)-len(out))
		if err != nil {
			return nil, time.Time{}, err
		}
		out = append(out, capped...)
	}
	if promotedLeft(p, promoted, len(out)) {
		s.notifier.addUnlisted()
		s.broadcast()
	}
	s.claimers.claimed(p, false, len(out))
	s.claimers.looked(p, signals, wake && !capped && next == nil && len(out) < max(p.Limit, 1))
	if next == nil || len(out) >= max(p.Limit, 1) {
		return out, time.Time{}, nil
	}
	return out, next.UTC(), nil
}

// queueClaim queues a claim on the transaction's tail; into receives the
// claimed steps when the tail runs. A claim that took every ready step
// (the ones this commit readied too) leaves nothing for this store's other
// claimers, so the transaction signals none. With read not nil, the
// instances it takes steps of, but those of known, are read into read
// after it (claimsnapshot.go).
func (s *Store) queueClaim(st *txState, p storage.ClaimParams, now *time.Time, into *[]storage.ClaimedStep, read map[string]*loaded, known []string) {
	sql, args := s.claimStatement(p, now, read != nil)
	s.queuePromotion(&st.tail, now, &st.promoted)
	st.tail.Queue(sql, args...).Query(func(rows pgx.Rows) error {
		claimed, err := pgx.CollectRows(rows, scanClaimed)
		*into, st.claimed = claimed, claimed
		st.promotedLeft = st.promotedLeft || promotedLeft(p, st.promoted, len(claimed))
		// A step the plans made ready and the claim left (its time, or
		// its queue's rate, has it start later; a limit holds it) is news:
		// a claim loop learns when it falls due only from a claim of its
		// own.
		st.quiet = p.TookAll(len(claimed)) && st.claimedPlanReady()
		return err
	})
	if read != nil {
		s.queueClaimedReads(&st.tail, known, read)
		st.claimRead = read
	}
}

// claimStatement returns the claim statement for p's filter shape and its
// arguments; with snapshots, one that names the instances it takes steps
// of for queueClaimedReads.
func (s *Store) claimStatement(p storage.ClaimParams, now *time.Time, snapshots bool) (string, []any) {
	shape, args := claimArguments(p, nil)
	shape.snapshots = snapshots
	shape.heads = s.readsHeads(p)
	return s.q(claimQueries.of(shape)), append([]any{now}, args...)
}

// claimStatementFor is claimStatement, for the items of the locked
// forEach steps parents.
func (s *Store) claimStatementFor(p storage.ClaimParams, now *time.Time, parents []int64) (string, []any) {
	shape, args := claimArguments(p, parents)
	return s.q(claimQueries.of(shape)), append([]any{now}, args...)
}

// claimArguments returns p's filter shape and its claim's arguments in
// claimArgs order (lease, worker, limit, filters), for the items of the
// locked forEach steps parents when parents is not nil.
func claimArguments(p storage.ClaimParams, parents []int64) (claimShape, []any) {
	shape := claimShape{queues: min(len(p.Queues), 2), byInstance: p.InstanceID != "", byHandler: len(p.Handlers) > 0, capped: parents != nil,
		trace: p.TraceParent}
	args := []any{p.Lease.Microseconds(), p.WorkerID, max(p.Limit, 1)}
	switch len(p.Queues) {
	case 0:
	case 1:
		args = append(args, p.Queues[0])
	default:
		args = append(args, p.Queues)
	}
	if shape.byInstance {
		args = append(args, p.InstanceID)
	}
	if shape.byHandler {
		args = append(args, p.Handlers)
	}
	if shape.capped {
		args = append(args, parents)
	}
	return shape, args
}

func scanClaimed(row pgx.CollectableRow) (storage.ClaimedStep, error) {
	return scanClaimedAfter(row)
}

// scanClaimedAfter scans a claimed step's columns after the columns
// scanned into lead.
func scanClaimedAfter(row pgx.CollectableRow, lead ...any) (storage.ClaimedStep, error) {
	var (
		c                        storage.ClaimedStep
		input                    []byte
		backoff, maxBackoff, tmo int64
		first, ready             *time.Time
		lease                    time.Time
		traceParent              pgtype.Text
	)
	dest := [...]any{&c.StepID, &c.InstanceID, &c.Step, &c.Workflow, &c.Handler, &c.Queue, &input, &c.Attempt, &c.Fence,
		&c.Retry.MaxAttempts, &backoff, &maxBackoff, &tmo, &first, &ready, &lease, &c.Item, &traceParent}
	// The traceparent column is there when the claim asked for it.
	n := min(len(dest), len(row.FieldDescriptions())-len(lead))
	err := row.Scan(append(lead, dest[:n]...)...)
	c.TraceParent = traceParent.String
	c.Input = rawJSON(input)
	c.Retry.Backoff = time.Duration(backoff) * time.Microsecond
	c.Retry.MaxBackoff = time.Duration(maxBackoff) * time.Microsecond
	c.Timeout = time.Duration(tmo) * time.Microsecond
	c.FirstStartedAt = utc(first)
	c.ReadyAt = utc(ready)
	c.LeaseUntil = lease.UTC()
	return c, err
}

// extendSQL renews the leases of the claims still held. The rows are
// locked in id order, as every multi-step writer locks them, so two
// heartbeats, or a heartbeat and a finish, cannot deadlock. The new lease
// counts from {clock}, read after those locks were taken: a heartbeat that
// waited for a finishing transaction's locks still gets a full lease.
const extendSQL = `
WITH w AS (
	SELECT * FROM unnest($2::bigint[], $3::bigint[]) AS w(id, fence)
),
l AS MATERIALIZED (
	SELECT s.id, s.status FROM {s}steps s JOIN w ON s.id = w.id AND s.fence = w.fence
	ORDER BY s.id
	FOR NO KEY UPDATE OF s
)
UPDATE {s}steps s SET lease_until = {clock} + $4::bigint * interval '1 microsecond'
FROM l WHERE s.id = l.id AND l.status = 'running'
RETURNING s.id, s.fence, s.xmin::text`

// ExtendLeases implements storage.Store.
func (s *Store) ExtendLeases(ctx context.Context, claims []storage.Claim, lease time.Duration) ([]storage.Claim, error) {
	if len(claims) == 0 {
		return nil, nil
	}
	if lease <= 0 {
		return nil, errors.New("postgres: extend leases: lease must be positive")
	}
	ids, fences := claimArrays(claims)
	var (
		lost     []storage.Claim
		versions map[int64]string // the renewed steps' new xmin
	)
	err := s.retry(ctx, func() error {
		rows, err := s.db.Query(ctx, s.q(extendSQL), s.now(), ids, fences, lease.Microseconds())
		if err != nil {
			return err
		}
		held := make(map[[2]int64]bool, len(claims))
		versions = make(map[int64]string, len(claims))
		var (
			id, fence int64
			xmin      string
		)
		if _, err := pgx.ForEachRow(rows, []any{&id, &fence, &xmin}, func() error {
			held[[2]int64{id, fence}] = true
			versions[id] = xmin
			return nil
		}); err != nil {
			return err
		}
		lost = nil
		for _, c := range claims {
			if !held[[2]int64{c.StepID, c.Fence}] {
				lost = append(lost, c)
			}
		}
		return nil
	})
	if err != nil {
		return nil, s.fail("extend leases", err)
	}
	// A renewal changes nothing a plan reads: the snapshots holding the
	// renewed steps stay good with their new versions.
	s.snapshots.renewed(claims, versions)
	return lost, nil
}

// requeueStatus is the status of a step put back in the queue: pending, or
// cancelled when its instance already finished (it was running when a
// plan failed the instance), so that a pending step always belongs to an
// unfinished instance and claims need no join. The caller holds the
// instance lock, so the instance cannot finish concurrently.
const (
	requeueStatus     = `CASE WHEN i.finished_at IS NULL THEN 'pending' ELSE 'cancelled' END`
	requeueFinishedAt = `CASE WHEN i.finished_at IS NULL THEN NULL ELSE {now} END`
	// failingMainSQL tells a main step (s) of a failing instance (i, not
	// finished: see storage.Plan.Failure): a failed attempt of it with
	// attempts left (a retry, an expired lease) fails it for good, as
	// nothing new starts in an instance that failed.
	failingMainSQL = `(i.failing AND i.finished_at IS NULL AND s.parent_id IS NULL AND NOT s.on_failure)`
	// heldSQL is added to the run_after of a step made pending: a paused
	// instance's steps are held back (see storage.PauseShiftMicros, which
	// a test checks this equals).
	heldSQL = `CASE WHEN i.paused THEN interval '87658200 hours' ELSE interval '0' END`
)

// releaseSQL puts held claims back in the queue without counting the
// attempt, ready at once in the place they had. The caller holds the
// instances' locks.
const releaseSQL = `
WITH w AS (
	SELECT * FROM unnest($2::bigint[], $3::bigint[], $4::text[]) WITH ORDINALITY AS w(id, fence, instance_id, ord)
),
l AS MATERIALIZED (
	SELECT s.id, s.status, w.ord FROM {s}steps s JOIN w ON s.id = w.id AND s.fence = w.fence AND s.instance_id = w.instance_id
	ORDER BY s.id
	FOR NO KEY UPDATE OF s
),
u AS (
	UPDATE {s}steps s SET status = ` + requeueStatus + `, finished_at = ` + requeueFinishedAt + `,
		attempts = s.attempts - 1, run_after = least(s.run_after, {now}) + ` + heldSQL + `, ready_at = {now},
		lease_until = NULL, worker_id = ''
	FROM l, {s}instances i
	WHERE s.id = l.id AND l.status = 'running' AND i.id = s.instance_id
	RETURNING s.instance_id, s.name, s.status, s.attempts, s.queue, l.ord, s.item_index
),
ev AS (
	INSERT INTO {s}events (instance_id, step, type, attempt, message, at)
	SELECT instance_id, name, CASE status WHEN 'cancelled' THEN 'step.cancelled' ELSE 'step.released' END,
		attempts, CASE status WHEN 'cancelled' THEN 'instance already finished' ELSE '' END, {now}
	FROM u WHERE item_index = -1 -- items have no events of their own
	ORDER BY ord
)
SELECT queue FROM u WHERE status = 'pending'`

// ReleaseSteps implements storage.Store.
func (s *Store) ReleaseSteps(ctx context.Context, claims []storage.Claim) error {
	if len(claims) == 0 {
		return nil
	}
	ids, fences := claimArrays(claims)
	instances := make([]string, 0, len(claims))
	for _, c := range claims {
		instances = append(instances, c.InstanceID)
	}
	err := s.inTx(ctx, func(tx pgx.Tx, st *txState) error {
		var b pgx.Batch
		s.queueLock(&b, instances, map[string]*loaded{})
		b.Queue(s.q(releaseSQL), s.now(), ids, fences, instances).Query(func(rows pgx.Rows) error {
			var queue string
			_, err := pgx.ForEachRow(rows, []any{&queue}, func() error {
				st.ready(queue)
				return nil
			})
			return err
		})
		return tx.SendBatch(ctx, &b).Close()
	})
	if err != nil {
		return s.fail("release steps", err)
	}
	return nil
}

func claimArrays(claims []storage.Claim) (ids, fences []int64) {
	ids = make([]int64, len(claims))
	fences = make([]int64, len(claims))
	for i, c := range claims {
		ids[i], fences[i] = c.StepID, c.Fence
	}
	return ids, fences
}

// utc returns a nullable timestamp as a time in UTC, zero for NULL.
func utc(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.UTC()
}

// utcPtr returns a nullable timestamp in UTC.
func utcPtr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}
