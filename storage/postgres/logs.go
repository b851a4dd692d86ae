package postgres

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dagrun/dagrun/storage"
)

// trimLogsSQL drops an attempt's $5 oldest records, turning the newest of
// them into the marker $6.
const trimLogsSQL = `
WITH last AS (
	SELECT seq FROM {s}step_logs WHERE instance_id = $1 AND step = $2 AND attempt = $3 AND item = $4
	ORDER BY seq OFFSET $5 - 1 LIMIT 1
),
d AS (
	DELETE FROM {s}step_logs WHERE instance_id = $1 AND step = $2 AND attempt = $3 AND item = $4
		AND seq < (SELECT seq FROM last)
)
UPDATE {s}step_logs SET level = 'INFO', message = $6, attrs = NULL WHERE seq = (SELECT seq FROM last)`

// appendLogsSQL inserts the records in their order, keeping those whose
// instance still exists: a worker may flush the last records of an
// instance pruned meanwhile. Each record looks its instance up by key: the
// LIMIT keeps the planner from turning the lookup into a join, which a
// generic plan made while instances held a few rows (a young database
// not yet analyzed) did as a hash join reading every instance, at every
// flush, for the connection's life: 1.9 ms a flush at 16,000 instances.
const appendLogsSQL = `
INSERT INTO {s}step_logs (instance_id, step, item, attempt, at, level, message, attrs)
SELECT r.instance_id, r.step, r.item, r.attempt, r.at, r.level, r.message, r.attrs
FROM unnest($1::text[], $2::text[], $3::int[], $4::int[], $5::timestamptz[], $6::text[], $7::text[], $8::json[])
	WITH ORDINALITY AS r(instance_id, step, item, attempt, at, level, message, attrs, ord)
	CROSS JOIN LATERAL (SELECT FROM {s}instances i WHERE i.id = r.instance_id LIMIT 1) alive
ORDER BY r.ord`

// AppendLogs implements storage.Store.
func (s *Store) AppendLogs(ctx context.Context, trims []storage.LogTrim, records []storage.LogRecord) error {
	if len(trims) == 0 && len(records) == 0 {
		return nil
	}
	err := s.inTx(ctx, func(tx pgx.Tx, _ *txState) error {
		var b pgx.Batch
		s.queueAppendLogs(&b, trims, records)
		return tx.SendBatch(ctx, &b).Close()
	})
	if err != nil {
		return s.fail("append logs", err)
	}
	return nil
}

// queueAppendLogs queues on b what AppendLogs writes.
func (s *Store) queueAppendLogs(b *pgx.Batch, trims []storage.LogTrim, records []storage.LogRecord) {
	for _, tr := range trims {
		if tr.Drop > 0 {
			b.Queue(s.q(trimLogsSQL), tr.InstanceID, tr.Step, tr.Attempt, tr.Item, tr.Drop, tr.Marker)
		}
	}
	if len(records) == 0 {
		return
	}
	var (
		instances, steps, levels, messages []string
		items, attempts                    []int32
		ats                                []time.Time
		attrs                              []json.RawMessage
	)
	for _, r := range records {
		instances, steps = append(instances, r.InstanceID), append(steps, r.Step)
		items, attempts = append(items, int32(r.Item)), append(attempts, int32(r.Attempt))
		ats, levels, messages = append(ats, r.Time), append(levels, r.Level), append(messages, r.Message)
		attrs = append(attrs, jsonOrNil(r.Attrs))
	}
	b.Queue(s.q(appendLogsSQL), instances, steps, items, attempts, ats, levels, messages, attrs)
}

// queueResultLogs queues on b what the attempts of results logged (see
// storage.StepResult.Logs).
func (s *Store) queueResultLogs(b *pgx.Batch, results []storage.StepResult) {
	trims, records := storage.ResultLogs(results)
	s.queueAppendLogs(b, trims, records)
}

// ListLogs implements storage.Store.
func (s *Store) ListLogs(ctx context.Context, p storage.LogsParams) ([]storage.LogRecord, error) {
	limit := p.Limit
	if limit <= 0 {
		limit = 1000
	}
	var out []storage.LogRecord
	err := s.read(ctx, func(tx pgx.Tx) error {
		out = nil
		var exists bool
		if err := tx.QueryRow(ctx, s.q(`SELECT EXISTS (SELECT 1 FROM {s}instances WHERE id = $1)`), p.InstanceID).Scan(&exists); err != nil {
			return err
		}
		if !exists {
			return fmt.Errorf("instance %s: %w", p.InstanceID, storage.ErrNotFound)
		}
		rows, err := tx.Query(ctx, s.q(`SELECT seq, instance_id, step, item, attempt, at, level, message, attrs FROM {s}step_logs
			WHERE instance_id = $1 AND ($2 = '' OR step = $2) AND seq > $3 ORDER BY seq LIMIT $4`), p.InstanceID, p.Step, p.AfterSeq, limit)
		if err != nil {
			return err
		}
		var (
			r       storage.LogRecord
			recAttr []byte
		)
		_, err = pgx.ForEachRow(rows, []any{&r.Seq, &r.InstanceID, &r.Step, &r.Item, &r.Attempt, &r.Time, &r.Level, &r.Message, &recAttr}, func() error {
			r.Time = r.Time.UTC()
			r.Attrs = rawJSON(bytes.Clone(recAttr))
			out = append(out, r)
			return nil
		})
		return err
	})
	if err != nil {
		return nil, s.fail("list logs", err)
	}
	return out, nil
}
