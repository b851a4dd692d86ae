package postgres

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dagrun/dagrun/storage"
)

// read runs fn in a read-only REPEATABLE READ transaction, so that the
// several queries of one answer (an instance, its steps, its events) see
// one snapshot.
//
// fn runs again when a statement function it called had vanished (see
// Store.retry), so it must start its answer afresh.
func (s *Store) read(ctx context.Context, fn func(tx pgx.Tx) error) error {
	return s.retry(ctx, func() error {
		return s.runTx(ctx, readBegin, func(tx *lazyTx) error { return fn(tx) })
	})
}

const instanceColumns = `id, workflow, definition_hash, status, input, output, error, coalesce(idempotency_key, ''),
	priority, run_after, created_at, started_at, finished_at, paused AND finished_at IS NULL,
	timeout_us, CASE WHEN status = 'running' THEN deadline END,
	status = 'running' AND failing, failed_step,
	coalesce(traceparent, ''), coalesce(trace_caller, ''),
	parent_id, parent_step, parent_item, depth, coalesce(concurrency_key, ''), held AND finished_at IS NULL`

func scanInstance(row pgx.Row, extra ...any) (storage.Instance, error) {
	var (
		in                storage.Instance
		input, output     []byte
		started, finished *time.Time
		timeout           int64
		deadline          *time.Time
	)
	var (
		parent *string
		ref    storage.ParentRef
	)
	dest := append([]any{&in.ID, &in.Workflow, &in.DefinitionHash, &in.Status, &input, &output, &in.Error, &in.Key,
		&in.Priority, &in.RunAfter, &in.CreatedAt, &started, &finished, &in.Paused, &timeout, &deadline, &in.Failing, &in.FailedStep, &in.TraceParent, &in.TraceCaller, &parent, &ref.Step, &ref.Item, &in.Depth, &in.ConcurrencyKey, &in.Held}, extra...)
	if err := row.Scan(dest...); err != nil {
		return in, err
	}
	if parent != nil {
		ref.InstanceID = *parent
		in.Parent = &ref
	}
	in.Input, in.Output = rawJSON(input), rawJSON(output)
	in.RunAfter, in.CreatedAt = in.RunAfter.UTC(), in.CreatedAt.UTC()
	in.StartedAt, in.FinishedAt = utcPtr(started), utcPtr(finished)
	in.Timeout, in.Deadline = time.Duration(timeout)*time.Microsecond, utcPtr(deadline)
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

const stepColumns = `instance_id, id, name, handler, queue, depends_on, status, attempts, max_attempts,
	backoff_us, max_backoff_us, timeout_us, input, output, error, run_after, ready_at, ` + attemptStartedAt + ` AS started_at, finished_at,
	lease_until, worker_id, for_each, wait_signal, deadline, on_failure, child_workflow, child_id`

// collectSteps scans step rows and hands each to add with its instance.
func collectSteps(rows pgx.Rows, add func(instanceID string, st storage.Step)) error {
	var (
		instanceID                                     string
		st                                             storage.Step
		input, output                                  []byte
		backoff, maxBackoff, tmo                       int64
		runAfter, ready, started, finished, leaseUntil *time.Time
		deadline                                       *time.Time
		forEach                                        bool
		child                                          string
	)
	_, err := pgx.ForEachRow(rows, []any{&instanceID, &st.ID, &st.Name, &st.Handler, &st.Queue, &st.DependsOn, &st.Status,
		&st.Attempts, &st.Retry.MaxAttempts, &backoff, &maxBackoff, &tmo, &input, &output, &st.Error, &runAfter, &ready,
		&started, &finished, &leaseUntil, &st.WorkerID, &forEach, &st.Signal, &deadline, &st.OnFailure, &st.Workflow, &child}, func() error {
		if len(st.DependsOn) == 0 {
			st.DependsOn = nil
		}
		st.Retry.Backoff = time.Duration(backoff) * time.Microsecond
		st.Retry.MaxBackoff = time.Duration(maxBackoff) * time.Microsecond
		st.Timeout = time.Duration(tmo) * time.Microsecond
		st.Input, st.Output = rawJSON(input), rawJSON(output)
		st.RunAfter = storage.Unpaused(utc(runAfter))
		st.ReadyAt, st.StartedAt, st.FinishedAt, st.LeaseUntil = utcPtr(ready), utcPtr(started), utcPtr(finished), utcPtr(leaseUntil)
		st.Deadline = utcPtr(deadline)
		if forEach {
			st.Items = &storage.ItemCounts{}
		}
		if child != "" {
			st.Children = []string{child}
		}
		add(instanceID, st)
		st = storage.Step{}
		return nil
	})
	return err
}

// GetInstance implements storage.Store.
func (s *Store) GetInstance(ctx context.Context, id string) (*storage.Instance, error) {
	var in storage.Instance
	err := s.read(ctx, func(tx pgx.Tx) error {
		var (
			def []byte
			err error
		)
		in, err = scanInstance(tx.QueryRow(ctx, s.q(`SELECT `+instanceColumns+`,
			(SELECT source FROM {s}definitions WHERE hash = definition_hash) FROM {s}instances WHERE id = $1`), id), &def)
		if err != nil {
			return fmt.Errorf("instance %s: %w", id, interpretError(err))
		}
		in.Definition = def
		var b pgx.Batch
		b.Queue(s.q(`SELECT `+stepColumns+` FROM {s}steps WHERE instance_id = $1 AND item_index = -1 ORDER BY position`), id).Query(func(rows pgx.Rows) error {
			return collectSteps(rows, func(_ string, st storage.Step) { in.Steps = append(in.Steps, st) })
		})
		// One more than shown tells whether older events exist.
		b.Queue(s.q(`SELECT * FROM (`+latestEventsSQL+`) e ORDER BY id`), id, storage.InstanceEvents+1).Query(func(rows pgx.Rows) error {
			var e storage.Event
			_, err := pgx.ForEachRow(rows, []any{&e.ID, &e.InstanceID, &e.Step, &e.Type, &e.Attempt, &e.Message, &e.At, &e.Actor}, func() error {
				e.At = e.At.UTC()
				in.Events = append(in.Events, e)
				return nil
			})
			if len(in.Events) > storage.InstanceEvents {
				in.Events, in.EventsTruncated = in.Events[1:], true
			}
			return err
		})
		if err := tx.SendBatch(ctx, &b).Close(); err != nil {
			return err
		}
		if err := s.itemCounts(ctx, tx, []storage.Instance{in}); err != nil {
			return err
		}
		return s.itemChildren(ctx, tx, []storage.Instance{in})
	})
	if err != nil {
		return nil, s.fail("get instance", err)
	}
	return &in, nil
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
	add := func(cond string, arg any) {
		args = append(args, arg)
		where = append(where, strings.ReplaceAll(cond, "$?", "$"+strconv.Itoa(len(args))))
	}
	if p.Workflow != "" {
		add("workflow = $?", p.Workflow)
	}
	if p.Key != "" {
		add("idempotency_key = $?", p.Key)
	}
	if p.Status != "" {
		add("status = $?", string(p.Status))
	}
	if p.BeforeID != "" {
		add("id < $?", p.BeforeID)
	}
	if p.Parent != "" {
		add("parent_id = $?", p.Parent)
	}
	if p.TopLevel {
		where = append(where, "parent_id IS NULL")
	}
	q := `SELECT ` + instanceColumns + ` FROM {s}instances`
	if len(where) > 0 {
		q += ` WHERE ` + strings.Join(where, " AND ")
	}
	args = append(args, limit)
	q += ` ORDER BY id DESC LIMIT $` + strconv.Itoa(len(args))
	var out []storage.Instance
	err := s.read(ctx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, s.q(q), args...)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (storage.Instance, error) { return scanInstance(row) })
		if err != nil || len(out) == 0 {
			return err
		}
		idx := make(map[string]int, len(out))
		ids := make([]string, len(out))
		for i := range out {
			idx[out[i].ID], ids[i] = i, out[i].ID
		}
		rows, err = tx.Query(ctx, s.q(`SELECT `+stepColumns+` FROM {s}steps WHERE instance_id = ANY($1) AND item_index = -1 ORDER BY instance_id, position`), ids)
		if err != nil {
			return err
		}
		if err := collectSteps(rows, func(id string, st storage.Step) {
			i := idx[id]
			out[i].Steps = append(out[i].Steps, st)
		}); err != nil {
			return err
		}
		if err := s.itemCounts(ctx, tx, out); err != nil {
			return err
		}
		return s.itemChildren(ctx, tx, out)
	})
	if err != nil {
		return nil, s.fail("list instances", err)
	}
	return out, nil
}

// Stats implements storage.Store: five aggregate queries in one round trip
// (instance counts from instance_counts, not from the instances)
// over one snapshot. Running, stuck and ready counts read only the partial
// indexes of running and pending steps, grouped by workflow and queue at
// once; the percentiles read only the steps of the storage.StatsWindow most
// recently finished instances, however much history is kept.
func (s *Store) Stats(ctx context.Context) (*storage.Stats, error) {
	now := s.now()
	var (
		sb   storage.StatsBuilder
		gone int // rows of instance_counts left by processes that are gone
	)
	err := s.read(ctx, func(tx pgx.Tx) error {
		sb.Reset()
		var (
			b  pgx.Batch
			wf string
			q  string
			n  int
		)
		b.Queue(s.q(countsSQL)).Query(func(rows pgx.Rows) error {
			var (
				status storage.InstanceStatus
				shards int
			)
			gone = 0
			_, err := pgx.ForEachRow(rows, []any{&wf, &status, &n, &shards}, func() error {
				if n != 0 {
					sb.Instances(wf, status, n)
				}
				gone += shards
				return nil
			})
			return err
		})
		b.Queue(s.q(`SELECT workflow, queue, count(*), count(*) FILTER (WHERE lease_until < {now})
			FROM {s}steps WHERE status = 'running' AND lease_until IS NOT NULL GROUP BY workflow, queue`), now).Query(func(rows pgx.Rows) error {
			var stuck int
			_, err := pgx.ForEachRow(rows, []any{&wf, &q, &n, &stuck}, func() error {
				sb.Running(wf, q, n, stuck)
				return nil
			})
			return err
		})
		b.Queue(s.q(`SELECT workflow, queue, sum(n)::bigint, (extract(epoch FROM {now} - min(ready_since)) * 1000000)::bigint
			FROM `+readySteps+` GROUP BY workflow, queue`), now).Query(func(rows pgx.Rows) error {
			var waitedUS int64
			_, err := pgx.ForEachRow(rows, []any{&wf, &q, &n, &waitedUS}, func() error {
				sb.Ready(wf, q, n, time.Duration(waitedUS)*time.Microsecond)
				return nil
			})
			return err
		})
		b.Queue(s.q(`SELECT workflow, count(*) FROM {s}steps WHERE status = 'waiting' GROUP BY workflow`)).Query(func(rows pgx.Rows) error {
			_, err := pgx.ForEachRow(rows, []any{&wf, &n}, func() error {
				sb.Waiting(wf, n)
				return nil
			})
			return err
		})
		b.Queue(s.q(unservedSQL), now, storage.PresenceTTL.Microseconds()).Query(func(rows pgx.Rows) error {
			var waitedUS int64
			_, err := pgx.ForEachRow(rows, []any{&wf, &n, &waitedUS}, func() error {
				sb.Unserved(wf, n, time.Duration(waitedUS)*time.Microsecond)
				return nil
			})
			return err
		})
		b.Queue(s.q(`SELECT workflow,
				percentile_disc(0.5) WITHIN GROUP (ORDER BY d),
				percentile_disc(0.95) WITHIN GROUP (ORDER BY d)
			FROM (SELECT workflow, (extract(epoch FROM finished_at - `+attemptStartedAt+`) * 1000000)::bigint AS d
				FROM {s}steps WHERE instance_id IN (SELECT id FROM {s}instances
					WHERE finished_at IS NOT NULL ORDER BY finished_at DESC LIMIT $1)
				AND status = 'completed' AND started_at IS NOT NULL) c
			GROUP BY workflow`), storage.StatsWindow).Query(func(rows pgx.Rows) error {
			var p50, p95 int64
			_, err := pgx.ForEachRow(rows, []any{&wf, &p50, &p95}, func() error {
				sb.Durations(wf, time.Duration(p50)*time.Microsecond, time.Duration(p95)*time.Microsecond)
				return nil
			})
			return err
		})
		return tx.SendBatch(ctx, &b).Close()
	})
	if err != nil {
		return nil, s.fail("stats", err)
	}
	if gone > compactCountsAbove {
		err := s.retry(ctx, func() error {
			_, err := s.db.Exec(ctx, s.q(compactCountsSQL))
			return err
		})
		if err != nil {
			return nil, s.fail("stats: fold instance counts", err)
		}
	}
	return sb.Stats(), nil
}

// countsSQL sums each workflow's instances per status from
// instance_counts (see migration 9), with how many of the rows summed
// belong to server processes that are gone.
const countsSQL = `
SELECT workflow, status, sum(n)::bigint, count(*) FILTER (WHERE shard <> 0 AND shard NOT IN (SELECT pid FROM pg_stat_activity))
FROM {s}instance_counts GROUP BY workflow, status`

// compactCountsAbove is how many rows of gone processes Stats lets
// instance_counts hold before it folds them into shard 0: a pool replaces
// its connections (each a new process) every hour or so, and each leaves a
// row per (workflow, status) it changed.
const compactCountsAbove = 256

// compactCountsSQL folds the rows of processes that are gone into shard 0.
// A process's rows change only in its own transactions, so a gone one's
// are final; the advisory lock lets one folder at a time write shard 0,
// and SKIP LOCKED passes over a row a new process with a reused pid is
// writing, so folding never waits for a writer nor deadlocks with one.
const compactCountsSQL = `
WITH gone AS (
	DELETE FROM {s}instance_counts WHERE ctid IN (
		SELECT ctid FROM {s}instance_counts
		WHERE shard <> 0 AND shard NOT IN (SELECT pid FROM pg_stat_activity)
			AND pg_try_advisory_xact_lock(hashtext('dagrun:instance_counts'))
		FOR UPDATE SKIP LOCKED)
	RETURNING workflow, status, n
)
INSERT INTO {s}instance_counts AS c (workflow, status, shard, n)
SELECT workflow, status, 0, sum(n)::bigint FROM gone GROUP BY workflow, status
ON CONFLICT (workflow, status, shard) DO UPDATE SET n = c.n + excluded.n`

// pruneBatch bounds how many instances one prune transaction deletes, so
// that a large prune never holds many locks or a long transaction.
const pruneBatch = 500

// Prune implements storage.Store. It deletes in batches, each its own
// transaction that takes the instances with their steps and events, then
// the definition snapshots those instances used that no remaining instance
// uses (under lockDefinitionsSQL's exclusive locks, so that a concurrent
// start keeps the snapshot it uses).
func (s *Store) Prune(ctx context.Context, olderThan time.Time, dryRun bool) (int, error) {
	if dryRun {
		var n int
		err := s.retry(ctx, func() error {
			return s.db.QueryRow(ctx, s.q(`SELECT count(*) FROM {s}instances
				WHERE finished_at IS NOT NULL AND finished_at < $1 AND parent_id IS NULL`), olderThan).Scan(&n)
		})
		if err != nil {
			return 0, s.fail("prune", err)
		}
		return n, nil
	}
	total := 0
	for {
		var n int
		err := s.inTx(ctx, func(tx pgx.Tx, _ *txState) error {
			// No foreign keys cascade (migration 2): the statement deletes
			// the steps and events itself.
			// Children go with their top-level ancestor, and only with it.
			rows, err := tx.Query(ctx, s.q(`
				WITH RECURSIVE top AS (
					SELECT id FROM {s}instances WHERE finished_at IS NOT NULL AND finished_at < $1 AND parent_id IS NULL
					ORDER BY finished_at LIMIT $2 FOR UPDATE SKIP LOCKED
				),
				doomed (id, top) AS (
					SELECT id, true FROM top
					UNION ALL SELECT c.id, false FROM {s}instances c JOIN doomed ON c.parent_id = doomed.id
				),
				s AS (DELETE FROM {s}steps WHERE instance_id IN (SELECT id FROM doomed)),
				e AS (DELETE FROM {s}events WHERE instance_id IN (SELECT id FROM doomed)),
				sg AS (DELETE FROM {s}signals WHERE instance_id IN (SELECT id FROM doomed)),
				sl AS (DELETE FROM {s}step_logs WHERE instance_id IN (SELECT id FROM doomed)),
				i AS (DELETE FROM {s}instances WHERE id IN (SELECT id FROM doomed) RETURNING workflow, definition_hash, parent_id IS NULL AS top)
				SELECT workflow, definition_hash, count(*) FILTER (WHERE top) FROM i GROUP BY workflow, definition_hash`), olderThan, pruneBatch)
			if err != nil {
				return err
			}
			var (
				workflows, hashes []string
				workflow, hash    string
				count             int
			)
			n = 0
			if _, err := pgx.ForEachRow(rows, []any{&workflow, &hash, &count}, func() error {
				workflows, hashes, n = append(workflows, workflow), append(hashes, hash), n+count
				return nil
			}); err != nil {
				return err
			}
			if n == 0 {
				return nil
			}
			// The locks come first, in a statement of their own, so that the
			// delete's snapshot sees every start that held one. A hash is one
			// workflow's snapshot, so the workflow's index finds the
			// instances that may still use it.
			var b pgx.Batch
			b.Queue(lockDefinitionsExclusive, hashes)
			b.Queue(s.q(`DELETE FROM {s}definitions d USING unnest($1::text[], $2::text[]) AS x(workflow, hash)
				WHERE d.hash = x.hash AND NOT EXISTS (
					SELECT 1 FROM {s}instances i WHERE i.workflow = x.workflow AND i.definition_hash = x.hash)`), workflows, hashes)
			return tx.SendBatch(ctx, &b).Close()
		})
		if err != nil {
			return total, s.fail("prune", err)
		}
		total += n
		if n < pruneBatch {
			return total, nil
		}
	}
}
