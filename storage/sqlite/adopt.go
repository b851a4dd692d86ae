package sqlite

import (
	"context"
	"encoding/json"
	"errors"
	"slices"

	"github.com/dagrun/dagrun/storage"
)

// adoptSQL renews the leases of the running steps leased to ?3 (since ?1,
// now, and claimed at ?4 or later) but those ?5 lists as [id, fence]
// pairs, returning them as a claim does. It reads the running steps
// through steps_running_lease, from now on: the unexpired ones.
const adoptSQL = `UPDATE steps SET lease_until = ?2
	WHERE status = 'running' AND lease_until >= ?1 AND worker_id = ?3 AND started_at >= ?4
		AND NOT EXISTS (SELECT 1 FROM json_each(?5) h WHERE h.value->>0 = steps.id AND h.value->>1 = steps.fence)` + claimReturning

// AdoptSteps implements storage.Store.
func (s *Store) AdoptSteps(ctx context.Context, p storage.AdoptParams) ([]storage.ClaimedStep, error) {
	if p.Lease <= 0 {
		return nil, errors.New("sqlite: adopt steps: lease must be positive")
	}
	held := make([][2]int64, len(p.Held))
	for i, c := range p.Held {
		held[i] = [2]int64{c.StepID, c.Fence}
	}
	b, err := json.Marshal(held)
	if err != nil {
		return nil, err
	}
	q := adoptSQL
	if p.TraceParent {
		q += claimTraceParent
	}
	var out []storage.ClaimedStep
	err = s.write(ctx, "adopt steps", func(t *txn) error {
		out = nil
		since := int64(0)
		if p.Within > 0 {
			since = us(t.now.Add(-p.Within))
		}
		rows, err := t.query(q, us(t.now), us(t.now.Add(p.Lease)), p.WorkerID, since, string(b))
		if err != nil {
			return err
		}
		adopted, err := scanClaimed(rows, p.TraceParent)
		if err != nil {
			return err
		}
		slices.SortFunc(adopted, byClaimOrder)
		for _, c := range adopted {
			out = append(out, c.ClaimedStep)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
