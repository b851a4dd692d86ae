package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/dagrun/dagrun/storage"
)

const (
	// insertLogsHead takes the rows of a VALUES list (seq, the claimed
	// row's ID or NULL, instance, step, then the record) and stores each
	// under its step's row: the claimed row's, or its forEach step's for an
	// item, found by primary key when the ID matches, else by name. A
	// record whose instance is gone finds no row: its NULL step_id makes OR
	// IGNORE drop it, for a worker may flush the last records of an
	// instance pruned meanwhile, and one such record must not fail the
	// others.
	insertLogsHead = `INSERT OR IGNORE INTO step_logs (seq, step_id, item, attempt, at, level, message, attrs)
	SELECT v.column1, coalesce(
		(SELECT coalesce(s.parent_id, s.id) FROM steps AS s WHERE s.id = v.column2 AND s.instance_id = v.column3 AND s.name = v.column4),
		(SELECT s.id FROM steps AS s WHERE s.instance_id = v.column3 AND s.item_index = -1 AND s.name = v.column4)),
		v.column5, v.column6, v.column7, v.column8, v.column9, v.column10
	FROM (VALUES `
	insertLogsTail = `) AS v`
	logColumns     = 10

	// insertKnownLogsHead stores records whose step's row the transaction
	// already knows.
	insertKnownLogsHead = `INSERT INTO step_logs (seq, step_id, item, attempt, at, level, message, attrs) VALUES `
	knownLogColumns     = 8

	// stepRowID is the row of a step by instance and name; the logs of
	// its items are kept under it too (see migration 14).
	stepRowID = `(SELECT id FROM steps WHERE instance_id = ? AND item_index = -1 AND name = ?)`

	// packedSeq and packedRecord read the record j (json_each) that event
	// e carries (see packLogs): its seq, and its attempt, time, level,
	// message and attributes.
	packedSeq    = `e.log_seq + j.key`
	packedRecord = `e.attempt, j.value->>0, j.value->>1, j.value->>2, j.value->>3`
)

// takeLogSeqs reserves the seqs of n records and returns the first: the
// records of step_logs and those completion events carry share one
// sequence (see migration 16). A database emptied table by table (as
// `dagrun test` empties its own between cases) starts it again.
func (t *txn) takeLogSeqs(n int) (int64, error) {
	var last int64
	if err := t.queryRow(`INSERT INTO log_seqs (id, last) VALUES (1, ?) ON CONFLICT (id) DO UPDATE SET last = last + excluded.last
		RETURNING last`, n).Scan(&last); err != nil {
		return 0, fmt.Errorf("take log seqs: %w", err)
	}
	return last - int64(n) + 1, nil
}

// logsOfCompletion reports whether a completion's event can carry the
// records its result brings: records of that step's attempt (not of an
// item, nor named after another step), which is what a handler logging
// before it returns leaves, with attributes that are JSON (packed records
// must be, for ListLogs to read any of the instance's).
func logsOfCompletion(records []storage.LogRecord, instanceID, step string, attempt int) bool {
	if len(records) == 0 {
		return false
	}
	for i := range records {
		r := &records[i]
		if r.InstanceID != instanceID || r.Step != step || r.Item != -1 || r.Attempt != attempt ||
			(len(r.Attrs) > 0 && !json.Valid(r.Attrs)) {
			return false
		}
	}
	return true
}

// packLogs renders records for events.logs, a JSON array of [at, level,
// message, attrs] (attrs null when none); a record's seq is the event's
// log_seq plus its index.
func packLogs(records []storage.LogRecord) string {
	size := 2
	for i := range records {
		size += len(records[i].Message) + len(records[i].Attrs) + 48
	}
	b := make([]byte, 0, size)
	b = append(b, '[')
	for i := range records {
		r := &records[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '[')
		b = strconv.AppendInt(b, us(r.Time), 10)
		b = append(b, ',')
		b = storage.AppendJSONString(b, r.Level)
		b = append(b, ',')
		b = storage.AppendJSONString(b, r.Message)
		b = append(b, ',')
		if len(r.Attrs) > 0 {
			b = append(b, r.Attrs...)
		} else {
			b = append(b, "null"...)
		}
		b = append(b, ']')
	}
	b = append(b, ']')
	return string(b)
}

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
	if len(records) == 0 {
		return nil
	}
	seq, err := t.takeLogSeqs(len(records))
	if err != nil {
		return err
	}
	args := make([]any, 0, logColumns*len(records))
	for i, r := range records {
		var stepID any
		if r.StepID != 0 {
			stepID = r.StepID
		}
		args = append(args, seq+int64(i), stepID, r.InstanceID, r.Step, r.Item, r.Attempt, us(r.Time), r.Level, r.Message, jsonArg(r.Attrs))
	}
	// Power-of-two batches, as for events: the statements stay prepared
	// whatever the number of records a finish brings.
	if err := t.insertRowsThen(insertLogsHead, insertLogsTail, logColumns, args); err != nil {
		return fmt.Errorf("insert logs: %w", err)
	}
	return nil
}

// appendResultLogs stores what the attempts of results logged (see
// storage.StepResult.Logs), but for the results whose completion event
// carries it (logsKept). logRows holds, for each result the transaction
// accepted, the row its records go under (its step's, or its forEach
// step's for an item), found when its claim was checked; the records of
// the others are looked up as AppendLogs looks them up.
func (t *txn) appendResultLogs(results []storage.StepResult, logRows []int64, logsKept []bool) error {
	var (
		known []storage.LogRecord
		rows  []int64
		other []storage.LogRecord
		trims []storage.LogTrim
	)
	for i := range results {
		r := &results[i]
		if r.LogTrim.Drop > 0 {
			trims = append(trims, r.LogTrim)
		}
		if logsKept[i] {
			continue
		}
		for _, rec := range r.Logs {
			if logRows[i] == 0 || rec.StepID != r.Claim.StepID || rec.InstanceID != r.Claim.InstanceID {
				other = append(other, rec)
				continue
			}
			known = append(known, rec)
			rows = append(rows, logRows[i])
		}
	}
	// Trims first: a trim counts the records stored before this result's.
	if err := t.appendLogs(trims, nil); err != nil {
		return err
	}
	if len(known) > 0 {
		seq, err := t.takeLogSeqs(len(known))
		if err != nil {
			return err
		}
		args := make([]any, 0, knownLogColumns*len(known))
		for i := range known {
			rec := &known[i]
			args = append(args, seq+int64(i), rows[i], int64(rec.Item), int64(rec.Attempt), us(rec.Time), levelArg(rec.Level), rec.Message, jsonArg(rec.Attrs))
		}
		if err := t.insertRows(insertKnownLogsHead, knownLogColumns, args); err != nil {
			return fmt.Errorf("insert logs: %w", err)
		}
	}
	return t.appendLogs(nil, other)
}

// trimLogs drops an attempt's oldest records, turning the newest of them
// into the marker.
func (t *txn) trimLogs(tr storage.LogTrim) error {
	if tr.Drop <= 0 {
		return nil
	}
	if err := t.unpackLogs(tr); err != nil {
		return err
	}
	var stepID, last int64
	err := t.queryRow(`SELECT l.step_id, l.seq FROM step_logs AS l WHERE l.step_id = `+stepRowID+` AND l.attempt = ? AND l.item = ?
		ORDER BY l.seq LIMIT 1 OFFSET CAST(? AS INTEGER)`, tr.InstanceID, tr.Step, tr.Attempt, tr.Item, tr.Drop-1).Scan(&stepID, &last)
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

// unpackLogs moves the records the completion event of tr's attempt
// carries into step_logs, under their seqs, so that the trim counts them:
// a handler's goroutine may go on logging after its attempt completed.
func (t *txn) unpackLogs(tr storage.LogTrim) error {
	if tr.Item != -1 {
		return nil // items' completions have no events
	}
	const completion = `e.instance_key = (SELECT key FROM instance_keys WHERE id = ?1) AND e.step = ?2 AND e.attempt = ?3
		AND e.type = 'step.completed' AND e.logs IS NOT NULL`
	if _, err := t.exec(`INSERT INTO step_logs (seq, step_id, item, attempt, at, level, message, attrs)
		SELECT `+packedSeq+`, s.id, -1, `+packedRecord+`
		FROM events AS e CROSS JOIN json_each(e.logs) AS j
			JOIN steps AS s ON s.instance_id = e.instance_id AND s.item_index = -1 AND s.name = e.step
		WHERE `+completion, tr.InstanceID, tr.Step, tr.Attempt); err != nil {
		return fmt.Errorf("unpack logs: %w", err)
	}
	if _, err := t.exec(`UPDATE events AS e SET log_seq = NULL, logs = NULL WHERE `+completion, tr.InstanceID, tr.Step, tr.Attempt); err != nil {
		return fmt.Errorf("unpack logs: %w", err)
	}
	return nil
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
		// The records of step_logs, and those completion events carry (see
		// migration 16).
		rows, err := tx.QueryContext(ctx, `SELECT l.seq, s.instance_id, s.name, l.item, l.attempt, l.at, l.level, l.message, l.attrs
			FROM steps AS s CROSS JOIN step_logs AS l ON l.step_id = s.id
			WHERE s.instance_id = +?1 AND s.item_index = -1 AND (?2 = '' OR s.name = ?2) AND l.seq > ?3
			UNION ALL
			SELECT `+packedSeq+`, e.instance_id, e.step, -1, `+packedRecord+`
			FROM events AS e CROSS JOIN json_each(e.logs) AS j
			WHERE e.instance_key = (SELECT key FROM instance_keys WHERE id = ?1) AND e.logs IS NOT NULL
				AND (?2 = '' OR e.step = ?2) AND `+packedSeq+` > ?3
			ORDER BY 1 LIMIT CAST(?4 AS INTEGER)`, p.InstanceID, p.Step, p.AfterSeq, limit)
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
