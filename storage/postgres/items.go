package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dagrun/dagrun/storage"
)

// expandSQL makes a blocked forEach step ($2 instance, $3 name) running,
// with no lease (it is never claimed, only its items are), and inserts one
// pending item per input of $4, copying what a claim needs from the step;
// with $5 it records the step's step.ready event (a creation has its own).
// It returns how many items it inserted and whether the step caps how many
// run at once.
const expandSQL = `
WITH p AS (
	UPDATE {s}steps s SET status = 'running', started_at = {now}, first_started_at = {now}, ready_at = {now},
		run_after = (SELECT i.run_after + ` + heldSQL + ` FROM {s}instances i WHERE i.id = s.instance_id), lease_until = NULL
	WHERE s.instance_id = $2 AND s.item_index = -1 AND s.name = $3 AND s.status = 'blocked' AND s.for_each
	RETURNING s.*
),
ev AS (
	INSERT INTO {s}events (instance_id, step, type, attempt, message, at)
	SELECT p.instance_id, p.name, 'step.ready', 0, cardinality($4::json[]) || ' items', {now} FROM p WHERE $5
),
ins AS (
	INSERT INTO {s}steps (instance_id, position, name, handler, queue, workflow, depends_on, status,
		max_attempts, backoff_us, max_backoff_us, timeout_us, priority, input, run_after, ready_at,
		parent_id, item_index, item_concurrency, continue_on_error, held_by_instance, queue_limited)
	SELECT p.instance_id, p.position, p.name, p.handler, p.queue, p.workflow, '{}', 'pending',
		p.max_attempts, p.backoff_us, p.max_backoff_us, p.timeout_us, p.priority, x.input, p.run_after, {now},
		p.id, x.ord - 1, p.item_concurrency, p.continue_on_error, p.held_by_instance,
		p.child_workflow = '' AND EXISTS (SELECT 1 FROM {s}queue_limits q WHERE q.queue = p.queue)
	FROM p, unnest($4::json[]) WITH ORDINALITY AS x(input, ord)
	RETURNING 1
)
SELECT (SELECT count(*) FROM ins), coalesce((SELECT p.item_concurrency > 0 FROM p), false)`

// queueExpand queues the expansion of one forEach step on the
// transaction's tail; the step must be a blocked forEach step.
func (s *Store) queueExpand(st *txState, now *time.Time, instanceID, name string, items []json.RawMessage) {
	s.queueExpansion(st, now, instanceID, name, items, true)
}

// queueExpandAtCreation is queueExpand for a step expanded by the plan of
// its instance's creation, whose events the creation writes.
func (s *Store) queueExpandAtCreation(st *txState, now *time.Time, instanceID, name string, items []json.RawMessage) {
	s.queueExpansion(st, now, instanceID, name, items, false)
}

func (s *Store) queueExpansion(st *txState, now *time.Time, instanceID, name string, items []json.RawMessage, event bool) {
	st.tail.Queue(s.q(expandSQL), now, instanceID, name, items, event).QueryRow(func(row pgx.Row) error {
		var (
			inserted int
			capped   bool
		)
		if err := row.Scan(&inserted, &capped); err != nil {
			return err
		}
		if inserted != len(items) {
			return fmt.Errorf("plan for instance %s expands step %q, which is not a blocked forEach step", instanceID, name)
		}
		// The eager claim never takes capped items (see claimCapped): a
		// short one proves nothing about them.
		st.cappedExpanded = st.cappedExpanded || capped && inserted > 0
		return nil
	})
}

// settleSQL brings the running forEach steps of $2 up to date after some
// of their items finished, in the transaction of that change (whose
// instance locks keep two transactions from settling one step twice): a
// failed or cancelled item without continueOnError fails its step at once
// and cancels the step's unfinished items; a step whose items are all
// finished completes with their outputs in index order, or fails when
// one failed (null for it in the output).
const settleSQL = `
WITH f AS MATERIALIZED (
	-- min() reads the few failed and cancelled entries of the status
	-- index; ORDER BY item_index LIMIT 1 could walk every item in index
	-- order instead, at every commit.
	SELECT s.id, s.status, s.continue_on_error,
		(SELECT min(f.item_index) FROM {s}steps f WHERE f.parent_id = s.id AND f.status IN ('failed', 'cancelled')) AS failed_index,
		EXISTS (SELECT 1 FROM {s}steps u WHERE u.parent_id = s.id AND u.status IN ('pending', 'running')) AS unfinished
	FROM {s}steps s
	WHERE s.id = ANY($2::bigint[])
),
p AS (
	SELECT f.*, (SELECT e.error FROM {s}steps e WHERE e.parent_id = f.id AND e.item_index = f.failed_index) AS failed_error
	FROM f
),
d AS (
	SELECT p.*, p.failed_index IS NOT NULL AS failed FROM p
	WHERE p.status = 'running' AND ((p.failed_index IS NOT NULL AND NOT p.continue_on_error) OR NOT p.unfinished)
),
c AS (
	UPDATE {s}steps i SET status = 'cancelled', finished_at = {now}, lease_until = NULL
	FROM d WHERE i.parent_id = d.id AND d.failed AND NOT d.continue_on_error AND i.status IN ('pending', 'running')
),
u AS (
	UPDATE {s}steps s SET
		status = CASE WHEN d.failed THEN 'failed' ELSE 'completed' END,
		error = CASE WHEN d.failed THEN 'item ' || d.failed_index || ' failed: ' || d.failed_error ELSE '' END,
		finished_at = {now},
		output = CASE WHEN d.failed AND NOT d.continue_on_error THEN NULL ELSE
			(SELECT json_agg(coalesce(o.output, 'null'::json) ORDER BY o.item_index) FROM {s}steps o WHERE o.parent_id = d.id) END
	FROM d WHERE s.id = d.id
	RETURNING s.instance_id, s.name, s.status, s.error, s.output, s.position
),
ev AS (
	INSERT INTO {s}events (instance_id, step, type, attempt, message, at)
	SELECT u.instance_id, u.name, 'step.' || u.status, 0, u.error, {now} FROM u ORDER BY u.instance_id, u.position
)
SELECT instance_id, name, status, error, output FROM u`

// settle runs settleSQL for parents and brings the loaded states of their
// instances (locked, loaded before) up to date; it returns the instances
// whose steps it finished, to plan.
func (s *Store) settle(ctx context.Context, tx pgx.Tx, now *time.Time, parents []int64, locked map[string]*loaded) ([]*loaded, error) {
	if len(parents) == 0 {
		return nil, nil
	}
	rows, err := tx.Query(ctx, s.q(settleSQL), now, parents)
	if err != nil {
		return nil, err
	}
	var (
		touched                   []*loaded
		instanceID, name, message string
		status                    storage.StepStatus
		output                    []byte
	)
	_, err = pgx.ForEachRow(rows, []any{&instanceID, &name, &status, &message, &output}, func() error {
		l := locked[instanceID]
		if l == nil {
			return fmt.Errorf("forEach step %s settled in instance %s, which is not locked", name, instanceID)
		}
		i := stepIndex(&l.state, name)
		if i < 0 {
			return fmt.Errorf("forEach step %s of instance %s not loaded", name, instanceID)
		}
		ss := &l.state.Steps[i]
		ss.Status, ss.Error, ss.Output = status, message, rawJSON(append([]byte(nil), output...))
		for _, t := range touched {
			if t == l {
				return nil
			}
		}
		touched = append(touched, l)
		return nil
	})
	return touched, err
}

// ListItems implements storage.Store.
func (s *Store) ListItems(ctx context.Context, p storage.ItemsParams) ([]storage.Item, error) {
	limit := p.Limit
	if limit <= 0 {
		limit = 100
	}
	var out []storage.Item
	err := s.retry(ctx, func() error {
		out = nil
		var (
			parentID  int64
			callsFlow bool
		)
		err := s.db.QueryRow(ctx, s.q(`SELECT id, child_workflow <> '' FROM {s}steps WHERE instance_id = $1 AND item_index = -1 AND name = $2`),
			p.InstanceID, p.Step).Scan(&parentID, &callsFlow)
		if errors.Is(err, pgx.ErrNoRows) {
			var exists bool
			if err := s.db.QueryRow(ctx, s.q(`SELECT EXISTS (SELECT 1 FROM {s}instances WHERE id = $1)`), p.InstanceID).Scan(&exists); err != nil {
				return err
			}
			if !exists {
				return fmt.Errorf("instance %s: %w", p.InstanceID, storage.ErrNotFound)
			}
			return fmt.Errorf("step %s of instance %s: %w", p.Step, p.InstanceID, storage.ErrNotFound)
		}
		if err != nil {
			return err
		}
		status, startedAt := "status", attemptStartedAt
		if callsFlow {
			status, startedAt = itemStatusSQL, itemChildStartedSQL
		}
		rows, err := s.db.Query(ctx, s.q(`SELECT item_index, `+status+`, attempts, input, output, error, `+startedAt+` AS started_at, finished_at, worker_id, child_id
			FROM {s}steps WHERE parent_id = $1 AND ($4 = '' OR `+status+` = $4) ORDER BY item_index LIMIT $2 OFFSET $3`),
			parentID, limit, max(p.Offset, 0), string(p.Status))
		if err != nil {
			return err
		}
		var (
			it                storage.Item
			input, output     []byte
			started, finished *time.Time
		)
		_, err = pgx.ForEachRow(rows, []any{&it.Index, &it.Status, &it.Attempts, &input, &output, &it.Error, &started, &finished, &it.WorkerID, &it.Child}, func() error {
			it.Input, it.Output = rawJSON(append([]byte(nil), input...)), rawJSON(append([]byte(nil), output...))
			if input == nil {
				it.Input = nil
			}
			if output == nil {
				it.Output = nil
			}
			it.StartedAt, it.FinishedAt = utcPtr(started), utcPtr(finished)
			out = append(out, it)
			it = storage.Item{}
			return nil
		})
		return err
	})
	if err != nil {
		if errors.Is(err, storage.ErrNotFound) {
			return nil, err
		}
		return nil, s.fail("list items", err)
	}
	return out, nil
}

// itemCountsSQL counts the items of forEach steps ($1) by status, reading
// only the items' status index.
const itemCountsSQL = `SELECT parent_id, status, count(*) FROM {s}steps WHERE parent_id = ANY($1) GROUP BY parent_id, status`

// heldItemsSQL counts the running items of forEach workflow steps ($1)
// whose child is held (itemStatusSQL).
const heldItemsSQL = `SELECT s.parent_id, count(*) FROM {s}steps s JOIN {s}instances i ON i.id = s.child_id
	WHERE s.parent_id = ANY($1) AND s.status = 'running' AND i.held GROUP BY s.parent_id`

// itemChildStartedSQL is when an item of a forEach workflow step started:
// when its child did, none while the child waits to be admitted, as an
// item of a handler starts when it is claimed.
const itemChildStartedSQL = `(SELECT i.started_at FROM {s}instances i WHERE i.id = {s}steps.child_id)`

// itemStatusSQL is the status shown of an item of a forEach workflow
// step: running from the start, it is pending while its child waits to be
// admitted under its concurrency limit, since nothing of it runs yet.
const itemStatusSQL = `CASE WHEN status = 'running' AND EXISTS (SELECT 1 FROM {s}instances i
	WHERE i.id = {s}steps.child_id AND i.held) THEN 'pending' ELSE status END`

// itemCounts fills in the item counts of the forEach steps of instances,
// then moves the items whose child is held (itemStatusSQL) from running to
// pending, reading only the items of forEach workflow steps.
func (s *Store) itemCounts(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, instances []storage.Instance) error {
	byID, ids := storage.ForEachSteps(instances, func(*storage.Step) bool { return true })
	if len(ids) == 0 {
		return nil
	}
	rows, err := q.Query(ctx, s.q(itemCountsSQL), ids)
	if err != nil {
		return err
	}
	var (
		id     int64
		status storage.StepStatus
		n      int
	)
	if _, err = pgx.ForEachRow(rows, []any{&id, &status, &n}, func() error {
		storage.CountItem(byID[id].Items, status, n)
		return nil
	}); err != nil {
		return err
	}
	calling, ids := storage.ForEachSteps(instances, func(st *storage.Step) bool { return st.Workflow != "" })
	if len(ids) == 0 {
		return nil
	}
	if rows, err = q.Query(ctx, s.q(heldItemsSQL), ids); err != nil {
		return err
	}
	_, err = pgx.ForEachRow(rows, []any{&id, &n}, func() error {
		storage.HoldItems(calling[id].Items, n)
		return nil
	})
	return err
}

// itemChildren fills in the child IDs of the forEach workflow steps of
// instances, in item order.
func (s *Store) itemChildren(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, instances []storage.Instance) error {
	byID, ids := storage.ForEachSteps(instances, func(st *storage.Step) bool { return st.Workflow != "" })
	if len(ids) == 0 {
		return nil
	}
	rows, err := q.Query(ctx, s.q(`SELECT parent_id, child_id FROM {s}steps
		WHERE parent_id = ANY($1) AND child_id <> '' ORDER BY parent_id, item_index`), ids)
	if err != nil {
		return err
	}
	var (
		id    int64
		child string
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &child}, func() error {
		byID[id].Children = append(byID[id].Children, child)
		return nil
	})
	return err
}

// itemsUnderCap is the items a claim may take of the forEach steps whose
// IDs are the array parameter parents: of each, as many of its first due
// pending items (by index) as its cap less its running items leaves room
// for. Each step's items are reached through the index of its items by
// status and index, a few entries per claim: counting, for every pending
// item, the pending ones before it made a claim read every pending item's
// predecessors, and a step of 2,000 capped items took minutes to run.
func itemsUnderCap(parents string) string {
	return `SELECT x.id FROM unnest(` + parents + `::bigint[]) AS p(id)
	CROSS JOIN LATERAL (
		SELECT f.item_concurrency - (SELECT count(*) FROM {s}steps r WHERE r.parent_id = p.id AND r.status = 'running') AS room
		FROM {s}steps f WHERE f.parent_id = p.id AND f.status = 'pending' AND f.item_concurrency > 0 LIMIT 1
	) cap
	CROSS JOIN LATERAL (
		SELECT q.id FROM {s}steps q
		WHERE q.parent_id = p.id AND q.status = 'pending' AND q.run_after <= {now}
		ORDER BY q.item_index LIMIT greatest(cap.room, 0)
	) x`
}

// readySteps is the ready (pending and due) steps and items, as a FROM
// item: read from the partial indexes of pending rows, the claims' (steps
// and uncapped items), the delayed ones' (due, not promoted yet by a
// claim) and the capped items', never from the whole table. ready_since
// is when each became ready: its run_after orders it (a step made ready
// by its dependencies has its instance's), so the later of that and the
// time it was made pending. n is how many ready steps a row stands for:
// the figures sum it.
//
// The items of a forEach step with a concurrency cap count as far as the
// cap leaves room, as itemsUnderCap has a claim take them: as many of the due
// ones as the cap less the step's running items, in one row per step. The
// others wait for those to finish, held as a limit holds steps, and no
// worker can take them sooner.
const readySteps = `(
	SELECT workflow, queue, handler, ` + readySince + ` AS ready_since, 1::bigint AS n FROM {s}steps
	WHERE status = 'pending' AND item_concurrency = 0 AND (promoted OR run_after <= ready_at) AND run_after <= {now}
	UNION ALL
	SELECT workflow, queue, handler, ` + readySince + ` AS ready_since, 1::bigint AS n FROM {s}steps
	WHERE status = 'pending' AND NOT promoted AND run_after > ready_at AND run_after <= {now} AND item_concurrency = 0
	UNION ALL
	SELECT workflow, queue, handler, ready_since, least(due, room) AS n FROM (` + cappedSteps + cappedStepsGroup + `) capped
	WHERE room > 0
) ready`

// cappedSteps, ended by cappedStepsGroup, gives one row per forEach step
// with a concurrency cap and due pending items: its workflow, queue and
// handler, when its oldest due item became ready, how many are due, and
// the room its cap leaves (the cap less its running items). The ready
// figures count least(due, room) of them, Queues the rest as held. A
// caller may add conditions on c between the two.
const cappedSteps = `SELECT workflow, queue, handler, min(` + readySince + `) AS ready_since, count(*) AS due,
		greatest(item_concurrency - (SELECT count(*) FROM {s}steps r WHERE r.parent_id = c.parent_id AND r.status = 'running'), 0) AS room
	FROM {s}steps c WHERE c.status = 'pending' AND c.item_concurrency > 0 AND c.run_after <= {now}`

const cappedStepsGroup = ` GROUP BY c.parent_id, c.workflow, c.queue, c.handler, c.item_concurrency`

// readySince is when a step of readySteps became ready.
const readySince = `greatest(run_after, ready_at)`

// cappedPendingSQL tells whether any item under a concurrency cap is
// claimable.
const cappedPendingSQL = `
SELECT EXISTS (SELECT 1 FROM {s}steps WHERE status = 'pending' AND item_concurrency > 0 AND run_after <= {now})`

// cappedParentsSQL locks the forEach steps with items under a concurrency
// cap that the claimer ($2 instance, $3 queues, $4 handlers: empty for
// any) can take, skipping those another claimer holds.
//
// The steps are found by skipping from one to the next through the index
// of pending capped items (one probe each) rather than by reading every
// pending item: a step of 10,000 items capped at 3 made each claim read
// all of them.
const cappedParentsSQL = `
WITH RECURSIVE p (id) AS (
	SELECT min(parent_id) FROM {s}steps WHERE ` + cappedParentTerms + `
	UNION ALL
	SELECT (SELECT min(parent_id) FROM {s}steps WHERE ` + cappedParentTerms + ` AND parent_id > p.id)
	FROM p WHERE p.id IS NOT NULL
)
SELECT id FROM {s}steps WHERE id = ANY(ARRAY(SELECT id FROM p WHERE id IS NOT NULL)) ORDER BY id FOR NO KEY UPDATE SKIP LOCKED`

// cappedParentTerms are cappedParentsSQL's conditions on a pending item.
const cappedParentTerms = `status = 'pending' AND item_concurrency > 0 AND run_after <= {now}
		AND ($2 = '' OR instance_id = $2)
		AND (cardinality($3::text[]) = 0 OR queue = ANY($3::text[]))
		AND (cardinality($4::text[]) = 0 OR handler = ANY($4::text[]))`

// claimCapped claims items of forEach steps with a concurrency cap, which
// the main claim statement leaves alone. Counting a step's running items
// and claiming under the cap must not race with another claimer doing the
// same, whose claims a statement's snapshot would not see: the claimer
// first locks the steps (skipping those another holds), then claims their
// items in a second statement, whose snapshot sees every claim committed
// before it got the locks. Pending capped items have a partial index of
// their own, so when there are none this costs one quick statement.
func (s *Store) claimCapped(ctx context.Context, p storage.ClaimParams, limit int) ([]storage.ClaimedStep, error) {
	p.Limit = limit
	var out []storage.ClaimedStep
	err := s.inTx(ctx, func(tx pgx.Tx, st *txState) error {
		out = nil
		queues, handlers := p.Queues, p.Handlers
		if queues == nil {
			queues = []string{}
		}
		if handlers == nil {
			handlers = []string{}
		}
		rows, err := tx.Query(ctx, s.q(cappedParentsSQL), s.now(), p.InstanceID, queues, handlers)
		if err != nil {
			return err
		}
		parents, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil || len(parents) == 0 {
			return err
		}
		sql, args := s.claimStatementFor(p, s.now(), parents)
		rows, err = tx.Query(ctx, sql, args...)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, scanClaimed)
		return err
	})
	if err != nil {
		return nil, s.fail("claim steps", err)
	}
	return out, nil
}
