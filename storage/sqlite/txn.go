package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"time"

	"github.com/dagrun/dagrun/storage"
)

// txn is one write transaction: the store's own or a caller's. It carries
// the transaction's single "now", so every row and event written by one
// transition has the same time, and batches the events to insert them with
// one statement at the end.
type txn struct {
	ctx    context.Context
	tx     *sql.Tx
	now    time.Time
	events []any // flattened rows, see event
}

// event queues one history entry for flushEvents.
func (t *txn) event(instanceID, step string, typ storage.EventType, attempt int, msg string) {
	t.events = append(t.events, []any{instanceID, step, string(typ), attempt, msg, t.now.UnixMicro()})
}

// flushEvents inserts the queued events with one statement: the rows travel
// as one JSON array, which keeps the statement text constant (so it stays
// prepared) whatever the batch size.
func (t *txn) flushEvents() error {
	if len(t.events) == 0 {
		return nil
	}
	b, err := json.Marshal(t.events)
	if err != nil {
		return err
	}
	t.events = t.events[:0]
	_, err = t.tx.ExecContext(t.ctx, `INSERT INTO events (instance_id, step, type, attempt, message, at)
		SELECT value->>0, value->>1, value->>2, value->>3, value->>4, value->>5 FROM json_each(?)`, string(b))
	return err
}

func (t *txn) exec(query string, args ...any) (sql.Result, error) {
	return t.tx.ExecContext(t.ctx, query, args...)
}

func (t *txn) query(query string, args ...any) (*sql.Rows, error) {
	return t.tx.QueryContext(t.ctx, query, args...)
}

func (t *txn) queryRow(query string, args ...any) *sql.Row {
	return t.tx.QueryRowContext(t.ctx, query, args...)
}

// Times are stored as unix microseconds.

func us(t time.Time) int64 { return t.UnixMicro() }

func fromUS(v int64) time.Time { return time.UnixMicro(v).UTC() }

func nullUS(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UnixMicro()
}

func ptrUS(v sql.NullInt64) *time.Time {
	if !v.Valid {
		return nil
	}
	t := fromUS(v.Int64)
	return &t
}

func timeUS(v sql.NullInt64) time.Time {
	if !v.Valid {
		return time.Time{}
	}
	return fromUS(v.Int64)
}

// jsonArg stores JSON as TEXT (readable with the sqlite3 shell), and an
// absent value as NULL.
func jsonArg(b json.RawMessage) any {
	if len(b) == 0 {
		return nil
	}
	return string(b)
}

// rawJSON returns a scanned TEXT column as JSON, nil for NULL.
func rawJSON(b []byte) json.RawMessage {
	if b == nil {
		return nil
	}
	return json.RawMessage(b)
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
