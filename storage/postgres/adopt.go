package postgres

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/dagrun/dagrun/storage"
)

// adoptSQL renews the leases of the running steps leased to $4, claimed
// $5 microseconds ago or less (any when $5 is 0), but those of the claims
// $2, $3 (step IDs and fences), returning them as a claim does. It reads
// the running steps through steps_running_lease, from now on: the
// unexpired ones. The rows are locked in id order, as every multi-step
// writer locks them, and checked again once locked.
func adoptSQL(trace bool) string {
	return `
WITH h AS (
	SELECT * FROM unnest($2::bigint[], $3::bigint[]) AS h(id, fence)
),
l AS MATERIALIZED (
	SELECT s.id FROM {s}steps s
	WHERE s.status = 'running' AND s.lease_until >= {now} AND s.worker_id = $4
		AND ($5::bigint = 0 OR s.started_at >= {now} - $5::bigint * interval '1 microsecond')
		AND NOT EXISTS (SELECT FROM h WHERE h.id = s.id AND h.fence = s.fence)
	ORDER BY s.id
	FOR NO KEY UPDATE OF s
),
u AS (
	UPDATE {s}steps s SET lease_until = {clock} + $6::bigint * interval '1 microsecond'
	FROM l WHERE s.id = l.id AND s.status = 'running' AND s.lease_until >= {now} AND s.worker_id = $4
	RETURNING ` + claimReturning + `
)
SELECT ` + claimedColumns(claimShape{trace: trace}, "u") + `
FROM u ORDER BY priority DESC, run_after, id`
}

var adoptStatements = [2]string{adoptSQL(false), adoptSQL(true)}

// AdoptSteps implements storage.Store.
func (s *Store) AdoptSteps(ctx context.Context, p storage.AdoptParams) ([]storage.ClaimedStep, error) {
	if p.Lease <= 0 {
		return nil, errors.New("postgres: adopt steps: lease must be positive")
	}
	ids, fences := claimArrays(p.Held)
	sql := adoptStatements[0]
	if p.TraceParent {
		sql = adoptStatements[1]
	}
	var out []storage.ClaimedStep
	err := s.retry(ctx, func() error {
		rows, err := s.db.Query(ctx, s.q(sql), s.now(), ids, fences, p.WorkerID, max(p.Within.Microseconds(), 0), p.Lease.Microseconds())
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, scanClaimed)
		return err
	})
	if err != nil {
		return nil, s.fail("adopt steps", err)
	}
	return out, nil
}
