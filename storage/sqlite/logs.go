package sqlite

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/dagrun/dagrun/storage"
)

const (
	// insertLogsHead takes the rows of a VALUES list (the claimed row's ID
	// or NULL, instance, step, then the record) and stores each under its
	// step's row: the claimed row's, or its forEach step's for an item,
	// found by primary key when the ID matches, else by name. A record
	// whose instance is gone finds no row: its NULL step_id makes OR
	// IGNORE drop it, for a worker may flush the last records of an
	// instance pruned meanwhile, and one such record must not fail the
	// others. The VALUES list is the only table scanned, so the records
	// take their seqs in the order given.
	insertLogsHead = `INSERT OR IGNORE INTO step_logs (step_id, item, attempt, at, level, message, attrs)
	SELECT coalesce(
		(SELECT coalesce(s.parent_id, s.id) FROM steps AS s WHERE s.id = v.column1 AND s.instance_id = v.column2 AND s.name = v.column3),
		(SELECT s.id FROM steps AS s WHERE s.instance_id = v.column2 AND s.item_index = -1 AND s.name = v.column3)),
		v.column4, v.column5, v.column6, v.column7, v.column8, v.column9
	FROM (VALUES `
	insertLogsTail = `) AS v`
	logColumns     = 9

	// insertKnownLogsHead stores records whose step's row the transaction
	// already knows.
	insertKnownLogsHead = `INSERT INTO step_logs (step_id, item, attempt, at, level, message, attrs) VALUES `
	knownLogColumns     = 7

	// stepRowID is the row of a step by instance and name; the logs of
	// its items are kept under it too (see migration 14).
	stepRowID = `(SELECT id FROM steps WHERE instance_id = ? AND item_index = -1 AND name = ?)`
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
		var stepID any
		if r.StepID != 0 {
			stepID = r.StepID
		}
		args = append(args, stepID, r.InstanceID, r.Step, r.Item, r.Attempt, us(r.Time), r.Level, r.Message, jsonArg(r.Attrs))
	}
	// Power-of-two batches, as for events: the statements stay prepared
	// whatever the number of records a finish brings.
	if err := t.insertRowsThen(insertLogsHead, insertLogsTail, logColumns, args); err != nil {
		return fmt.Errorf("insert logs: %w", err)
	}
	return nil
}

// appendResultLogs stores what the attempts of results logged (see
// storage.StepResult.Logs). logRows holds, for each result the transaction
// accepted, the row its records go under (its step's, or its forEach
// step's for an item), found when its claim was checked; the records of
// the others are looked up as AppendLogs looks them up.
func (t *txn) appendResultLogs(results []storage.StepResult, logRows []int64) error {
	var (
		known []any
		other []storage.LogRecord
		trims []storage.LogTrim
	)
	for i := range results {
		r := &results[i]
		if r.LogTrim.Drop > 0 {
			trims = append(trims, r.LogTrim)
		}
		for _, rec := range r.Logs {
			if logRows[i] == 0 || rec.StepID != r.Claim.StepID || rec.InstanceID != r.Claim.InstanceID {
				other = append(other, rec)
				continue
			}
			known = append(known, logRows[i], int64(rec.Item), int64(rec.Attempt), us(rec.Time), levelArg(rec.Level), rec.Message, jsonArg(rec.Attrs))
		}
	}
	// Trims first: a trim counts the records stored before this result's.
	if err := t.appendLogs(trims, nil); err != nil {
		return err
	}
	if err := t.insertRows(insertKnownLogsHead, knownLogColumns, known); err != nil {
		return fmt.Errorf("insert logs: %w", err)
	}
	return t.appendLogs(nil, other)
}

// trimLogs drops an attempt's oldest records, turning the newest of them
// into the marker.
func (t *txn) trimLogs(tr storage.LogTrim) error {
	if tr.Drop <= 0 {
		return nil
	}
	var stepID, last int64
	err := t.queryRow(`SELECT l.step_id, l.seq FROM step_logs AS l WHERE l.step_id = `+stepRowID+` AND l.attempt = ? AND l.item = ?
		ORDER BY l.seq LIMIT 1 OFFSET ?`, tr.InstanceID, tr.Step, tr.Attempt, tr.Item, tr.Drop-1).Scan(&stepID, &last)
	if err == sql.ErrNoRows {
		return nil // pruned, or nothing stored yet
	}
	if err != nil {
		return err
	}
	if _, err := t.exec(`DELETE FROM step_logs WHERE step_id = ? AND attempt = ? AND item = ? AND seq < ?`,
		stepID, tr.Attempt, tr.Item, last); err != nil {
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
		rows, err := tx.QueryContext(ctx, `SELECT l.seq, s.instance_id, s.name, l.item, l.attempt, l.at, l.level, l.message, l.attrs
			FROM steps AS s CROSS JOIN step_logs AS l ON l.step_id = s.id
			WHERE s.instance_id = ?1 AND s.item_index = -1 AND (?2 = '' OR s.name = ?2) AND l.seq > ?3
			ORDER BY l.seq LIMIT ?4`, p.InstanceID, p.Step, p.AfterSeq, limit)
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

// levelArgs are the usual levels' names, boxed once: a record's arguments
// cost the writer an allocation each.
var levelArgs = map[string]any{"DEBUG": "DEBUG", "INFO": "INFO", "WARN": "WARN", "ERROR": "ERROR"}

// levelArg is level as a statement argument.
func levelArg(level string) any {
	if a, ok := levelArgs[level]; ok {
		return a
	}
	return level
}
