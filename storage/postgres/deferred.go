package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dagrun/dagrun/storage"
)

// StartDeferred works in two transactions. The first admits the held
// instances whose time has come and whose keys have room, taking each
// key's advisory lock before the held instance's row (limits_admit_due)
// and the keys in order, so that two sweeps never wait on each other, and
// parks those of full keys; the other rows of a key it parks it locks SKIP
// LOCKED, waiting for none. The second locks the instances that may start
// in id order, as every transaction that changes an instance's steps does,
// and plans them. A transaction that locks an admitted instance and a held
// one of its key together and finishes the first (a finish takes the rows,
// then the key) can still deadlock with the first; as with a step's
// promotion (limits_due), one of them is retried.

// admissibleDeferredSQL finds the held instances the first transaction
// admits, each key's highest priority first: their time come, not parked.
// The admission, under the key's lock, admits each if its key has room
// and parks it if not (limits_admit_due): then only a finish of its key
// admits it, and no sweep reads it again. However many instances wait
// behind a full key, the sweep reads each once, and a backlog never
// crowds out an instance whose key is empty.
//
// The due instances are read in the order of instances_deferred, at most
// admitWindow of them, then sorted: ordered by key from the start, the
// statement was planned on young tables as a walk of every unfinished
// instance (instances_unfinished).
const admissibleDeferredSQL = `
WITH due AS MATERIALIZED (
	SELECT id, workflow, concurrency_key, priority FROM {s}instances
	WHERE deferred AND finished_at IS NULL AND NOT parked AND held AND NOT paused AND run_after <= {now}
	ORDER BY run_after LIMIT ` + admitWindow + `)
SELECT id FROM due ORDER BY workflow, concurrency_key, priority DESC, id LIMIT $2`

// admitWindow is how many held instances that fell due the sweep sorts by
// key and priority at most. Only those that fell due since the last sweep
// are not parked, so a larger burst is the only one a sweep may admit out
// of priority order.
const admitWindow = "10000"

// admitDeferredSQL admits the instances of $2, one after the other, as
// the promotion of a first step would (a deferred instance may have
// none), if their keys have room, and parks the others.
const admitDeferredSQL = `SELECT {s}limits_admit_due(x.id, {now}) FROM unnest($2::text[]) WITH ORDINALITY AS x(id, ord) ORDER BY x.ord`

// releaseAdmittedSQL releases the steps of the instances of $1 that are
// admitted now: they count for their limits and hold no slot they are
// not due (see limits_release_step).
const releaseAdmittedSQL = `
UPDATE {s}steps s SET held_by_instance = false
WHERE s.instance_id = ANY($1) AND s.held_by_instance
	AND NOT (SELECT i.held FROM {s}instances i WHERE i.id = s.instance_id)`

const releaseAdmittedStepsSQL = `
SELECT {s}limits_release_step(c, {now}) FROM {s}steps c
WHERE c.instance_id = ANY($2) AND c.status = 'pending' AND c.run_after = '9999-01-01 00:00:00+00' AND NOT c.held_by_instance
ORDER BY c.priority DESC, c.id`

// startableDeferredSQL finds the instances the second transaction plans:
// marked deferred, admitted, unfinished, not paused, their time come, the
// earliest first. Read by id, the statement was planned on young tables
// as a walk of every unfinished instance (instances_unfinished), at every
// sweep.
const startableDeferredSQL = `
SELECT id FROM {s}instances
WHERE deferred AND finished_at IS NULL AND NOT parked AND NOT held AND NOT paused AND run_after <= {now}
ORDER BY run_after LIMIT $2`

// markStartedSQL clears the mark of the instances of $1 that still may
// start (another sweep may have started them since they were found), and
// returns them.
const markStartedSQL = `
UPDATE {s}instances SET deferred = false
WHERE id = ANY($1) AND deferred AND NOT held AND NOT paused AND finished_at IS NULL
RETURNING id`

// StartDeferred implements storage.Store.
func (s *Store) StartDeferred(ctx context.Context, limit int, plan storage.PlanFunc) (int, error) {
	_, err := s.sweep(ctx, "start deferred", admissibleDeferredSQL, limit, plan, func(tx pgx.Tx, st *txState, now *time.Time, ids []string) (int, error) {
		if _, err := tx.Exec(ctx, s.q(admitDeferredSQL), now, ids); err != nil {
			return 0, err
		}
		if _, err := tx.Exec(ctx, s.q(releaseAdmittedSQL), ids); err != nil {
			return 0, err
		}
		_, err := tx.Exec(ctx, s.q(releaseAdmittedStepsSQL), now, ids)
		return len(ids), err
	})
	if err != nil {
		return 0, err
	}
	return s.sweep(ctx, "start deferred", startableDeferredSQL, limit, plan, func(tx pgx.Tx, st *txState, now *time.Time, ids []string) (int, error) {
		ls, err := s.lock(ctx, tx, ids)
		if err != nil {
			return 0, err
		}
		rows, err := tx.Query(ctx, s.q(markStartedSQL), ids)
		if err != nil {
			return 0, err
		}
		start, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil || len(start) == 0 {
			return 0, err
		}
		loaded := make([]*loaded, 0, len(start))
		for _, id := range start {
			l := ls[id]
			l.state.Deferred = false // as the mark now says
			loaded = append(loaded, l)
		}
		return len(start), s.planAndApply(st, now, loaded, plan)
	})
}
