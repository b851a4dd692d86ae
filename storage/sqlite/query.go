package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/dagrun/dagrun/storage"
)

const instanceColumns = `id, workflow, definition_hash, status, input, output, error, coalesce(idem_key, ''), priority,
	run_after, created_at, started_at, finished_at, paused AND finished_at IS NULL,
	timeout_us, CASE WHEN status = 'running' THEN deadline END,
	status = 'running' AND failing, failed_step,
	coalesce(traceparent, ''), coalesce(trace_caller, ''),
	parent_id, parent_step, parent_item, depth, coalesce(concurrency_key, ''), held AND finished_at IS NULL`

type scanner interface{ Scan(...any) error }

func scanInstance(sc scanner, extra ...any) (storage.Instance, error) {
	var (
		in                storage.Instance
		input, output     []byte
		runAfter, created int64
		started, finished sql.NullInt64
		timeout           int64
		deadline          sql.NullInt64
		parent            sql.NullString
		ref               storage.ParentRef
	)
	dest := append([]any{&in.ID, &in.Workflow, &in.DefinitionHash, &in.Status, &input, &output, &in.Error, &in.Key, &in.Priority,
		&runAfter, &created, &started, &finished, &in.Paused, &timeout, &deadline, &in.Failing, &in.FailedStep, &in.TraceParent, &in.TraceCaller,
		&parent, &ref.Step, &ref.Item, &in.Depth, &in.ConcurrencyKey, &in.Held}, extra...)
	if err := sc.Scan(dest...); err != nil {
		return in, err
	}
	if parent.Valid {
		ref.InstanceID = parent.String
		in.Parent = &ref
	}
	in.Input, in.Output = rawJSON(input), rawJSON(output)
	in.RunAfter, in.CreatedAt = fromUS(runAfter), fromUS(created)
	in.StartedAt, in.FinishedAt = ptrUS(started), ptrUS(finished)
	in.Timeout, in.Deadline = time.Duration(timeout)*time.Microsecond, ptrUS(deadline)
	return in, nil
}

// attemptStartedAt is a step's start as the views show it: when its
// current attempt began. A snooze (the sleep built-in's wait) belongs to
// its attempt, yet each wake is a claim that sets started_at; the first
// attempt's start is first_started_at, which snoozes keep, so a step on
// its first attempt shows that (a 4 s sleep lasts 4 s, not the
// milliseconds of its last wake). A later attempt that snoozed shows its
// last wake.
const attemptStartedAt = `CASE WHEN attempts <= 1 AND first_started_at IS NOT NULL THEN first_started_at ELSE started_at END`

const stepColumns = `instance_id, id, name, handler, queue, depends_on, status, attempts, max_attempts, backoff_us, max_backoff_us,
	timeout_us, input, output, error, run_after, ready_at, ` + attemptStartedAt + ` AS started_at, finished_at, lease_until, worker_id, for_each,
	wait_signal, deadline, on_failure, child_workflow, child_id`

func scanStep(sc scanner) (string, storage.Step, error) {
	var (
		instanceID                           string
		st                                   storage.Step
		deps, input, output                  []byte
		backoff, maxBackoff, tmo, runAfter   int64
		ready, started, finished, leaseUntil sql.NullInt64
		deadline                             sql.NullInt64
		forEach                              bool
		child                                string
	)
	if err := sc.Scan(&instanceID, &st.ID, &st.Name, &st.Handler, &st.Queue, &deps, &st.Status, &st.Attempts, &st.Retry.MaxAttempts,
		&backoff, &maxBackoff, &tmo, &input, &output, &st.Error, &runAfter, &ready, &started, &finished, &leaseUntil, &st.WorkerID, &forEach,
		&st.Signal, &deadline, &st.OnFailure, &st.Workflow, &child); err != nil {
		return "", st, err
	}
	if err := json.Unmarshal(deps, &st.DependsOn); err != nil {
		return "", st, fmt.Errorf("step %s: depends_on: %w", st.Name, err)
	}
	if len(st.DependsOn) == 0 {
		st.DependsOn = nil
	}
	st.Retry.Backoff = time.Duration(backoff) * time.Microsecond
	st.Retry.MaxBackoff = time.Duration(maxBackoff) * time.Microsecond
	st.Timeout = time.Duration(tmo) * time.Microsecond
	st.Input, st.Output = rawJSON(input), rawJSON(output)
	st.RunAfter = storage.Unpaused(fromUS(runAfter))
	if runAfter == 0 {
		st.RunAfter = time.Time{}
	}
	st.ReadyAt, st.StartedAt, st.FinishedAt, st.LeaseUntil = ptrUS(ready), ptrUS(started), ptrUS(finished), ptrUS(leaseUntil)
	st.Deadline = ptrUS(deadline)
	if forEach {
		st.Items = &storage.ItemCounts{}
	}
	if child != "" {
		st.Children = []string{child}
	}
	return instanceID, st, nil
}

// GetInstance implements storage.Store.
func (s *Store) GetInstance(ctx context.Context, id string) (*storage.Instance, error) {
	var in storage.Instance
	err := s.read(ctx, "get instance", func(tx *sql.Tx) error {
		var (
			def []byte
			err error
		)
		in, err = scanInstance(tx.QueryRowContext(ctx, `SELECT `+instanceColumns+`,
			(SELECT source FROM definitions WHERE hash = definition_hash) FROM instances WHERE id = ?`, id), &def)
		if err != nil {
			return fmt.Errorf("instance %s: %w", id, interpretError(s.name, err))
		}
		in.Definition = def
		rows, err := tx.QueryContext(ctx, `SELECT `+stepColumns+` FROM steps WHERE instance_id = +? AND item_index = -1 ORDER BY position`, id)
		if err != nil {
			return err
		}
		if err := scanSteps(rows, func(_ string, st storage.Step) { in.Steps = append(in.Steps, st) }); err != nil {
			return err
		}
		if err := itemCounts(ctx, tx, []storage.Instance{in}); err != nil {
			return err
		}
		if err := itemChildren(ctx, tx, []storage.Instance{in}); err != nil {
			return err
		}
		// One more than shown tells whether older events exist.
		in.Events, err = latestEvents(ctx, tx, id, storage.InstanceEvents+1)
		if len(in.Events) > storage.InstanceEvents {
			in.Events, in.EventsTruncated = in.Events[1:], true
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return &in, nil
}

func scanSteps(rows *sql.Rows, add func(string, storage.Step)) error {
	defer rows.Close()
	for rows.Next() {
		id, st, err := scanStep(rows)
		if err != nil {
			return err
		}
		add(id, st)
	}
	return rows.Err()
}

// ListInstances implements storage.Store.
func (s *Store) ListInstances(ctx context.Context, p storage.ListParams) ([]storage.Instance, error) {
	limit := p.Limit
	if limit <= 0 {
		limit = 50
	}
	var (
		where []string
		args  []any
	)
	if p.Workflow != "" {
		where, args = append(where, "workflow = +?"), append(args, p.Workflow)
	}
	if p.Key != "" {
		where, args = append(where, "idem_key = +?"), append(args, p.Key)
	}
	if p.Status != "" {
		where, args = append(where, "status = +?"), append(args, string(p.Status))
	}
	if p.BeforeID != "" {
		where, args = append(where, "id < ?"), append(args, p.BeforeID)
	}
	if p.Parent != "" {
		where, args = append(where, "parent_id = +?"), append(args, p.Parent)
	}
	if p.TopLevel {
		where = append(where, "parent_id IS NULL")
	}
	q := `SELECT ` + instanceColumns + ` FROM instances`
	if len(where) > 0 {
		q += ` WHERE ` + strings.Join(where, " AND ")
	}
	q += ` ORDER BY id DESC LIMIT CAST(? AS INTEGER)`
	args = append(args, limit)
	var out []storage.Instance
	err := s.read(ctx, "list instances", func(tx *sql.Tx) error {
		out = nil
		rows, err := tx.QueryContext(ctx, q, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		ids := []string{}
		for rows.Next() {
			in, err := scanInstance(rows)
			if err != nil {
				return err
			}
			out = append(out, in)
			ids = append(ids, in.ID)
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if len(out) == 0 {
			return nil
		}
		idx := make(map[string]int, len(out))
		for i := range out {
			idx[out[i].ID] = i
		}
		b, _ := json.Marshal(ids) // strings always marshal
		rows, err = tx.QueryContext(ctx, `SELECT `+stepColumns+` FROM steps
			WHERE instance_id IN (SELECT value FROM json_each(?)) AND item_index = -1 ORDER BY instance_id, position`, string(b))
		if err != nil {
			return err
		}
		if err := scanSteps(rows, func(id string, st storage.Step) {
			i := idx[id]
			out[i].Steps = append(out[i].Steps, st)
		}); err != nil {
			return err
		}
		if err := itemCounts(ctx, tx, out); err != nil {
			return err
		}
		return itemChildren(ctx, tx, out)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Stats implements storage.Store. Instance counts come from
// instance_counts, which triggers keep exact (migration 7), so a scrape
// costs the same at a million instances as at ten. Running, stuck and
// ready counts read only
// the partial indexes of running and pending steps, grouped by workflow and
// queue at once; the percentiles read only the steps of the
// storage.StatsWindow most recently finished instances, however much
// history is kept.
func (s *Store) Stats(ctx context.Context) (*storage.Stats, error) {
	now := us(s.now())
	var sb storage.StatsBuilder
	err := s.read(ctx, "stats", func(tx *sql.Tx) error {
		sb.Reset()
		rows, err := tx.QueryContext(ctx, `SELECT workflow, status, n FROM instance_counts WHERE n > 0`)
		if err != nil {
			return err
		}
		if err := eachRow(rows, func(sc scanner) error {
			var (
				wf     string
				status storage.InstanceStatus
				n      int
			)
			if err := sc.Scan(&wf, &status, &n); err != nil {
				return err
			}
			sb.Instances(wf, status, n)
			return nil
		}); err != nil {
			return err
		}
		rows, err = tx.QueryContext(ctx, `SELECT workflow, queue, count(*), count(*) FILTER (WHERE lease_until < ?)
			FROM steps WHERE status = 'running' AND lease_until IS NOT NULL GROUP BY workflow, queue`, now)
		if err != nil {
			return err
		}
		if err := eachRow(rows, func(sc scanner) error {
			var wf, q string
			var n, stuck int
			if err := sc.Scan(&wf, &q, &n, &stuck); err != nil {
				return err
			}
			sb.Running(wf, q, n, stuck)
			return nil
		}); err != nil {
			return err
		}
		rows, err = tx.QueryContext(ctx, `SELECT workflow, queue, sum(n), min(ready_since) FROM `+readySteps+`
			GROUP BY workflow, queue`, now)
		if err != nil {
			return err
		}
		if err := eachRow(rows, func(sc scanner) error {
			var wf, q string
			var n int
			var oldest int64
			if err := sc.Scan(&wf, &q, &n, &oldest); err != nil {
				return err
			}
			sb.Ready(wf, q, n, time.Duration(now-oldest)*time.Microsecond)
			return nil
		}); err != nil {
			return err
		}
		rows, err = tx.QueryContext(ctx, `SELECT workflow, count(*) FROM steps WHERE status = 'waiting' GROUP BY workflow`)
		if err != nil {
			return err
		}
		if err := eachRow(rows, func(sc scanner) error {
			var wf string
			var n int
			if err := sc.Scan(&wf, &n); err != nil {
				return err
			}
			sb.Waiting(wf, n)
			return nil
		}); err != nil {
			return err
		}
		if err := unserved(ctx, tx, &sb, now); err != nil {
			return err
		}
		rows, err = tx.QueryContext(ctx, `SELECT workflow, finished_at - `+attemptStartedAt+` AS d FROM steps
			WHERE instance_id IN (SELECT id FROM instances WHERE finished_at IS NOT NULL ORDER BY finished_at DESC LIMIT CAST(? AS INTEGER))
				AND status = 'completed' AND started_at IS NOT NULL
			ORDER BY workflow, d`, storage.StatsWindow)
		if err != nil {
			return err
		}
		var (
			cur string
			ds  []int64
		)
		flush := func() {
			if len(ds) > 0 {
				sb.Durations(cur, percentile(ds, 50), percentile(ds, 95))
			}
			ds = ds[:0]
		}
		if err := eachRow(rows, func(sc scanner) error {
			var wf string
			var d int64
			if err := sc.Scan(&wf, &d); err != nil {
				return err
			}
			if wf != cur {
				flush()
				cur = wf
			}
			ds = append(ds, d)
			return nil
		}); err != nil {
			return err
		}
		flush()
		return nil
	})
	if err != nil {
		return nil, err
	}
	return sb.Stats(), nil
}

// percentile is the nearest-rank percentile p of sorted microseconds.
func percentile(sorted []int64, p int) time.Duration {
	rank := (len(sorted)*p + 99) / 100 // ceil(n·p/100), at least 1 for n ≥ 1
	return time.Duration(sorted[max(rank, 1)-1]) * time.Microsecond
}

func eachRow(rows *sql.Rows, fn func(scanner) error) error {
	defer rows.Close()
	for rows.Next() {
		if err := fn(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

// column reads the one column of every row of rows, closing them.
func column[T any](rows *sql.Rows) ([]T, error) {
	var out []T
	err := eachRow(rows, func(sc scanner) error {
		var v T
		err := sc.Scan(&v)
		out = append(out, v)
		return err
	})
	return out, err
}

// pruneBatch bounds how long one prune transaction holds the write lock.
const pruneBatch = 500

// Prune implements storage.Store. It deletes in batches, each its own
// transaction, so that workers are not stalled behind one huge delete;
// foreign keys cascade to steps and events (New refuses a pool without
// them). Each batch also deletes the definition snapshots its instances
// used that no remaining instance uses; SQLite's single writer means no
// start can take one of them meanwhile.
func (s *Store) Prune(ctx context.Context, olderThan time.Time, dryRun bool) (int, error) {
	bound := us(olderThan)
	if dryRun {
		var n int
		err := s.read(ctx, "prune", func(tx *sql.Tx) error {
			return tx.QueryRowContext(ctx, `SELECT count(*) FROM instances
				WHERE finished_at IS NOT NULL AND finished_at < ? AND parent_id IS NULL`, bound).Scan(&n)
		})
		return n, err
	}
	total := 0
	for {
		n := 0
		err := s.write(ctx, "prune", func(t *txn) error {
			n = 0
			// Children go with their top-level ancestor, and only with it.
			rows, err := t.query(`WITH RECURSIVE tree (id) AS (
					SELECT id FROM (SELECT id FROM instances
						WHERE finished_at IS NOT NULL AND finished_at < ? AND parent_id IS NULL LIMIT CAST(? AS INTEGER))
					UNION ALL SELECT i.id FROM instances i JOIN tree ON i.parent_id = tree.id)
				DELETE FROM instances WHERE id IN tree RETURNING workflow, definition_hash, parent_id IS NULL`, bound, pruneBatch)
			if err != nil {
				return err
			}
			definitions := map[[2]string]bool{}
			if err := eachRow(rows, func(sc scanner) error {
				var (
					workflow, hash string
					top            bool
				)
				if err := sc.Scan(&workflow, &hash, &top); err != nil {
					return err
				}
				if top {
					n++
				}
				definitions[[2]string{workflow, hash}] = true
				return nil
			}); err != nil {
				return err
			}
			for d := range definitions {
				// A hash is one workflow's snapshot, so the workflow's index
				// finds the instances that may still use it.
				if _, err := t.exec(`DELETE FROM definitions WHERE hash = ?2 AND NOT EXISTS (
					SELECT 1 FROM instances WHERE workflow = ?1 AND definition_hash = ?2)`, d[0], d[1]); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return total, err
		}
		total += n
		if n < pruneBatch {
			return total, nil
		}
	}
}
