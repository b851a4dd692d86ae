package postgres

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dagrun/dagrun/storage"
)

// announceSQL records a worker as live and deletes the rows of workers not
// seen for storage.PresenceTTL, which stopped without removing themselves.
const announceSQL = `
WITH stale AS (
	DELETE FROM {s}workers WHERE last_seen < {now} - $4 * interval '1 microsecond' AND id <> $2
)
INSERT INTO {s}workers (id, handlers, queues, started_at, last_seen) VALUES ($2, $3, $5, {now}, {now})
ON CONFLICT (id) DO UPDATE SET handlers = excluded.handlers, queues = excluded.queues, last_seen = excluded.last_seen`

// AnnounceWorker implements storage.Store.
func (s *Store) AnnounceWorker(ctx context.Context, w storage.WorkerInfo) error {
	if w.ID == "" {
		return errors.New("postgres: announce worker: empty worker ID")
	}
	err := s.retry(ctx, func() error {
		_, err := s.db.Exec(ctx, s.q(announceSQL), s.now(), w.ID, names(w.Handlers), storage.PresenceTTL.Microseconds(), names(w.Queues))
		return err
	})
	if err != nil {
		return s.fail("announce worker", err)
	}
	return nil
}

// RemoveWorker implements storage.Store.
func (s *Store) RemoveWorker(ctx context.Context, id string) error {
	err := s.retry(ctx, func() error {
		_, err := s.db.Exec(ctx, s.q(`DELETE FROM {s}workers WHERE id = $1`), id)
		return err
	})
	if err != nil {
		return s.fail("remove worker", err)
	}
	return nil
}

// ListWorkers implements storage.Store.
func (s *Store) ListWorkers(ctx context.Context) ([]storage.WorkerInfo, error) {
	var out []storage.WorkerInfo
	err := s.retry(ctx, func() error {
		rows, err := s.db.Query(ctx, s.q(`SELECT id, handlers, queues, started_at, last_seen FROM {s}workers
			WHERE last_seen >= {now} - $2 * interval '1 microsecond' ORDER BY id`), s.now(), storage.PresenceTTL.Microseconds())
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (storage.WorkerInfo, error) {
			var (
				w                 storage.WorkerInfo
				started, lastSeen time.Time
			)
			err := row.Scan(&w.ID, &w.Handlers, &w.Queues, &started, &lastSeen)
			if len(w.Handlers) == 0 {
				w.Handlers = nil
			}
			if len(w.Queues) == 0 {
				w.Queues = nil
			}
			w.StartedAt, w.LastSeen = started.UTC(), lastSeen.UTC()
			return w, err
		})
		return err
	})
	if err != nil {
		return nil, s.fail("list workers", err)
	}
	return out, nil
}

// names returns a list of names sorted and without duplicates, never nil
// (the columns are NOT NULL arrays).
func names(list []string) []string {
	return slices.Compact(append([]string{}, slices.Sorted(slices.Values(list))...))
}

// unservedSQL groups the ready steps by handler and queue and keeps the
// groups no live worker can claim: none has the handler, or none that has
// it serves the queue. $1 is now, $2 the oldest last_seen still live.
const unservedSQL = `
SELECT r.handler, r.n, (extract(epoch FROM {now} - r.oldest) * 1000000)::bigint FROM (
	SELECT handler, queue, sum(n)::bigint AS n, min(ready_since) AS oldest FROM ` + readySteps + `
	GROUP BY handler, queue) r
WHERE NOT EXISTS (SELECT 1 FROM {s}workers w WHERE w.last_seen >= {now} - $2 * interval '1 microsecond'
	AND r.handler = ANY(w.handlers) AND (cardinality(w.queues) = 0 OR r.queue = ANY(w.queues)))`
