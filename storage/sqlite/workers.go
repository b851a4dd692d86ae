package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"slices"
	"time"

	"github.com/dagrun/dagrun/storage"
)

// AnnounceWorker implements storage.Store.
func (s *Store) AnnounceWorker(ctx context.Context, w storage.WorkerInfo) error {
	if w.ID == "" {
		return errors.New("sqlite: announce worker: empty worker ID")
	}
	handlers, err := nameList(w.Handlers)
	if err != nil {
		return err
	}
	queues, err := nameList(w.Queues)
	if err != nil {
		return err
	}
	return s.write(ctx, "announce worker", func(t *txn) error {
		now := us(t.now)
		if _, err := t.exec(`DELETE FROM workers WHERE last_seen < ? AND id <> ?`, us(t.now.Add(-storage.PresenceTTL)), w.ID); err != nil {
			return err
		}
		_, err := t.exec(`INSERT INTO workers (id, handlers, queues, started_at, last_seen) VALUES (?1, ?2, ?3, ?4, ?4)
			ON CONFLICT (id) DO UPDATE SET handlers = excluded.handlers, queues = excluded.queues, last_seen = excluded.last_seen`,
			w.ID, handlers, queues, now)
		return err
	})
}

// RemoveWorker implements storage.Store.
func (s *Store) RemoveWorker(ctx context.Context, id string) error {
	return s.write(ctx, "remove worker", func(t *txn) error {
		_, err := t.exec(`DELETE FROM workers WHERE id = ?`, id)
		return err
	})
}

// ListWorkers implements storage.Store.
func (s *Store) ListWorkers(ctx context.Context) ([]storage.WorkerInfo, error) {
	var out []storage.WorkerInfo
	err := s.read(ctx, "list workers", func(tx *sql.Tx) error {
		out = nil
		rows, err := tx.QueryContext(ctx, `SELECT id, handlers, queues, started_at, last_seen FROM workers
			WHERE last_seen >= ? ORDER BY id`, us(s.now().Add(-storage.PresenceTTL)))
		if err != nil {
			return err
		}
		return eachRow(rows, func(sc scanner) error {
			var (
				w                 storage.WorkerInfo
				handlers, queues  []byte
				started, lastSeen int64
			)
			if err := sc.Scan(&w.ID, &handlers, &queues, &started, &lastSeen); err != nil {
				return err
			}
			if err := json.Unmarshal(handlers, &w.Handlers); err != nil {
				return err
			}
			if err := json.Unmarshal(queues, &w.Queues); err != nil {
				return err
			}
			w.Handlers, w.Queues = nilIfEmpty(w.Handlers), nilIfEmpty(w.Queues)
			w.StartedAt, w.LastSeen = fromUS(started), fromUS(lastSeen)
			out = append(out, w)
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// nameList stores a list of names as a sorted JSON array.
func nameList(names []string) (string, error) {
	sorted := slices.Sorted(slices.Values(names))
	if sorted == nil {
		sorted = []string{}
	}
	b, err := json.Marshal(slices.Compact(sorted))
	return string(b), err
}

func nilIfEmpty(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return s
}

// unservedSQL groups the ready steps by handler and queue and keeps the
// groups no live worker can claim: none has the handler, or none that has
// it serves the queue. ?1 is now, ?2 the oldest last_seen still live.
const unservedSQL = `SELECT r.handler, r.n, r.oldest FROM (
	SELECT handler, queue, sum(n) AS n, min(ready_since) AS oldest FROM ` + readySteps + `
	GROUP BY handler, queue) r
WHERE NOT EXISTS (SELECT 1 FROM workers w WHERE w.last_seen >= ?2
	AND EXISTS (SELECT 1 FROM json_each(w.handlers) WHERE value = r.handler)
	AND (w.queues = '[]' OR EXISTS (SELECT 1 FROM json_each(w.queues) WHERE value = r.queue)))`

// unserved adds the ready steps no live worker can claim to sb.
func unserved(ctx context.Context, tx *sql.Tx, sb *storage.StatsBuilder, now int64) error {
	rows, err := tx.QueryContext(ctx, unservedSQL, now, now-storage.PresenceTTL.Microseconds())
	if err != nil {
		return err
	}
	return eachRow(rows, func(sc scanner) error {
		var (
			handler string
			n       int
			oldest  int64
		)
		if err := sc.Scan(&handler, &n, &oldest); err != nil {
			return err
		}
		sb.Unserved(handler, n, time.Duration(now-oldest)*time.Microsecond)
		return nil
	})
}
