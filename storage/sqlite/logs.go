package sqlite

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/dagrun/dagrun/storage"
)

const (
	// insertLogsHead takes the rows of a VALUES list and keeps those whose
	// instance still exists: a worker may flush the last records of an
	// instance pruned meanwhile, and one such record must not fail the
	// others (the foreign key would).
	insertLogsHead = `INSERT INTO step_logs (instance_id, step, item, attempt, at, level, message, attrs)
	SELECT column1, column2, column3, column4, column5, column6, column7, column8 FROM (VALUES `
	insertLogsTail = `) WHERE column1 IN (SELECT id FROM instances)`
	logColumns     = 8
)

// AppendLogs implements storage.Store.
func (s *Store) AppendLogs(ctx context.Context, trims []storage.LogTrim, records []storage.LogRecord) error {
	if len(trims) == 0 && len(records) == 0 {
		return nil
	}
	return s.write(ctx, "append logs", func(t *txn) error { return t.appendLogs(trims, records) })
}

// appendLogs is AppendLogs inside the transaction.
func (t *txn) appendLogs(trims []storage.LogTrim, records []storage.LogRecord) error {
	for _, tr := range trims {
		if err := t.trimLogs(tr); err != nil {
			return err
		}
	}
	args := make([]any, 0, logColumns*len(records))
	for _, r := range records {
		args = append(args, r.InstanceID, r.Step, r.Item, r.Attempt, us(r.Time), r.Level, r.Message, jsonArg(r.Attrs))
	}
	// Power-of-two batches, as for events: the statements stay prepared
	// whatever the number of records a finish brings.
	if err := t.insertRowsThen(insertLogsHead, insertLogsTail, logColumns, args); err != nil {
		return fmt.Errorf("insert logs: %w", err)
	}
	return nil
}

// appendResultLogs stores what the attempts of results logged (see
// storage.StepResult.Logs).
func (t *txn) appendResultLogs(results []storage.StepResult) error {
	trims, records := storage.ResultLogs(results)
	if len(trims) == 0 && len(records) == 0 {
		return nil
	}
	return t.appendLogs(trims, records)
}

// trimLogs drops an attempt's oldest records, turning the newest of them
// into the marker.
func (t *txn) trimLogs(tr storage.LogTrim) error {
	if tr.Drop <= 0 {
		return nil
	}
	var last int64
	err := t.queryRow(`SELECT seq FROM step_logs WHERE instance_id = ? AND step = ? AND attempt = ? AND item = ?
		ORDER BY seq LIMIT 1 OFFSET ?`, tr.InstanceID, tr.Step, tr.Attempt, tr.Item, tr.Drop-1).Scan(&last)
	if err == sql.ErrNoRows {
		return nil // pruned, or nothing stored yet
	}
	if err != nil {
		return err
	}
	if _, err := t.exec(`DELETE FROM step_logs WHERE instance_id = ? AND step = ? AND attempt = ? AND item = ? AND seq < ?`,
		tr.InstanceID, tr.Step, tr.Attempt, tr.Item, last); err != nil {
		return err
	}
	_, err = t.exec(`UPDATE step_logs SET level = 'INFO', message = ?, attrs = NULL WHERE seq = ?`, tr.Marker, last)
	return err
}

// ListLogs implements storage.Store.
func (s *Store) ListLogs(ctx context.Context, p storage.LogsParams) ([]storage.LogRecord, error) {
	limit := p.Limit
	if limit <= 0 {
		limit = 1000
	}
	var out []storage.LogRecord
	err := s.read(ctx, "list logs", func(tx *sql.Tx) error {
		out = nil
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM instances WHERE id = ?`, p.InstanceID).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return fmt.Errorf("instance %s: %w", p.InstanceID, storage.ErrNotFound)
		}
		rows, err := tx.QueryContext(ctx, `SELECT seq, instance_id, step, item, attempt, at, level, message, attrs FROM step_logs
			WHERE instance_id = ?1 AND (?2 = '' OR step = ?2) AND seq > ?3 ORDER BY seq LIMIT ?4`, p.InstanceID, p.Step, p.AfterSeq, limit)
		if err != nil {
			return err
		}
		return eachRow(rows, func(sc scanner) error {
			var (
				r     storage.LogRecord
				at    int64
				attrs []byte
			)
			if err := sc.Scan(&r.Seq, &r.InstanceID, &r.Step, &r.Item, &r.Attempt, &at, &r.Level, &r.Message, &attrs); err != nil {
				return err
			}
			r.Time, r.Attrs = fromUS(at), rawJSON(attrs)
			out = append(out, r)
			return nil
		})
	})
	return out, err
}
