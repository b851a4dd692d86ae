package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dagrun/dagrun/storage"
)

// startableDeferredSQL finds the instances StartDeferred may plan: marked
// deferred, unfinished, not paused, their time come; a held one is
// admitted first if its key has room. Those not held come first, so that
// held ones whose keys are full never crowd them out of the limit; locked
// without waiting, skipping those another sweep has, so that this lock in
// another order than the instances' ids cannot deadlock.
const startableDeferredSQL = `
SELECT id FROM {s}instances
WHERE deferred AND finished_at IS NULL AND NOT paused AND run_after <= {now}
ORDER BY held, id LIMIT $2 FOR NO KEY UPDATE SKIP LOCKED`

// admitDeferredSQL admits the held instances of $2 whose time has come if
// their keys have room, one after the other, as the promotion of a first
// step would (a deferred instance may have none).
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
ORDER BY c.id`

// markStartedSQL clears the mark of the instances of $1 that may start
// now, and returns them.
const markStartedSQL = `
UPDATE {s}instances SET deferred = false
WHERE id = ANY($1) AND deferred AND NOT held AND NOT paused AND finished_at IS NULL
RETURNING id`

// StartDeferred implements storage.Store.
func (s *Store) StartDeferred(ctx context.Context, limit int, plan storage.PlanFunc) (int, error) {
	return s.sweep(ctx, "start deferred", startableDeferredSQL, limit, plan, func(tx pgx.Tx, st *txState, now *time.Time, ids []string) (int, error) {
		if _, err := tx.Exec(ctx, s.q(admitDeferredSQL), now, ids); err != nil {
			return 0, err
		}
		if _, err := tx.Exec(ctx, s.q(releaseAdmittedSQL), ids); err != nil {
			return 0, err
		}
		if _, err := tx.Exec(ctx, s.q(releaseAdmittedStepsSQL), now, ids); err != nil {
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
		ls, err := s.lock(ctx, tx, start)
		if err != nil {
			return 0, err
		}
		loaded := make([]*loaded, 0, len(ls))
		for _, l := range ls {
			loaded = append(loaded, l)
		}
		return len(start), s.planAndApply(st, now, loaded, plan)
	})
}
