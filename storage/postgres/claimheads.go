package postgres

import (
	"context"
	"time"

	"github.com/dagrun/dagrun/storage"
)

// lookAhead looks at the steps ahead of a claim with p's filters, when its
// verdict is due (see package storage/internal/lookahead), in a statement of its own, so
// that the claims themselves stay the plain walk a fleet of one binary's
// workers always takes. A look that fails leaves the last verdict: the
// claim that follows meets the same database.
func (s *Store) lookAhead(ctx context.Context, p storage.ClaimParams) {
	now := time.Now()
	if !s.heads.Begin(p, now) {
		return
	}
	shape, args := claimArguments(p, nil)
	var served bool
	err := s.pool.QueryRow(ctx, s.q(headProbeQueries.of(shape)), append([]any{s.now(), max(p.Limit, 1)}, args[3:]...)...).Scan(&served)
	s.heads.Done(p, !served, err == nil, now)
}

// readsHeads reports whether a claim with p's filters reads its handlers'
// heads (candidatesSQL), as the last look saw, and counts those that do.
func (s *Store) readsHeads(p storage.ClaimParams) bool {
	heads := s.heads.Heads(p)
	if heads {
		s.headClaims.Add(1)
	}
	return heads
}

// headProbeSQL returns the look of lookAhead for a claim of shape c: true
// when the first $2 ready steps the claim would walk, whatever their
// handler, are all of its handlers, or there are none. $1 is the time;
// the filters follow as claimArgs numbers them from $3.
func headProbeSQL(c claimShape) string {
	a := claimArgs{limit: "$2", next: 3}
	anyHandler := c
	anyHandler.byHandler = false
	return `SELECT coalesce(bool_and(handler = ANY(` + a.handlersParam(c) + `::text[])), true) FROM (
	SELECT handler FROM {s}steps
	WHERE ` + readyToClaim + a.filters(anyHandler, "") + `
	ORDER BY priority DESC, run_after, id
	LIMIT ` + a.limit + `
) h`
}

var headProbeQueries = byShape(headProbeSQL)
