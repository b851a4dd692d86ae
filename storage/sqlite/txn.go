package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"math/bits"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/internal/lookahead"
)

// txn is one write transaction: the store's own or a caller's. It carries
// the transaction's single "now", so every row and event written by one
// transition has the same time, and batches the events to insert them with
// one statement at the end.
type txn struct {
	ctx    context.Context
	tx     querier
	now    time.Time
	events []any // eventColumns values per event, see event
	logged []loggedEvent
	// replan are instances to plan again: see plan.
	replan []string
	// timedOut are instances plan marks as past their workflow timeout
	// (see ExpireInstances), by ID.
	timedOut map[string]bool
	// planFn is the PlanFunc of the transition under way, for the
	// children a plan starts (see startChildren).
	planFn storage.PlanFunc
	// itemSlotFreed is set when an item of a forEach step under a
	// concurrency cap finished and its siblings wait: they were pending
	// all along, but may run only now (see settleItems).
	itemSlotFreed bool
	// madeReady are the steps the transaction's plans made pending, new
	// instances' included: a claim that leaves one of them (not due yet,
	// held by a limit) is no reason to keep its news from the store's
	// claimers.
	madeReady []readyStep

	// Snapshots (see snapshots.go): prior are those the cache held when
	// the transaction began; planFrom the instances a finish plans from
	// them; planned, when not nil, collects the instances whose plan only
	// made steps pending, as planned; spilled tells that the transaction
	// may have written other instances than those it finished, planned
	// or claimed, so that it keeps no snapshot; kept are those to put in
	// the cache once the transaction committed.
	prior    snapshots
	planFrom map[string]*loaded
	planned  map[string]*loaded
	spilled  bool
	kept     snapshots

	// heads are the store's verdicts on its claims' way to claim (see
	// readsHeads), headClaims its count of the claims that read heads; nil
	// in a transaction whose claims always walk.
	heads      *lookahead.Verdicts
	headClaims *atomic.Int64
}

const (
	// insertEventsHead takes the rows of a VALUES list (instance, step,
	// type, attempt, message, time) and stores each under its instance's
	// key (see migration 15). The VALUES list is the only table scanned,
	// so the events take their IDs in the order given.
	insertEventsHead = `INSERT INTO events (instance_key, instance_id, step, type, attempt, message, at)
	SELECT (SELECT k.key FROM instance_keys AS k WHERE k.id = v.column1), v.column1, v.column2, v.column3, v.column4, v.column5, v.column6
	FROM (VALUES `
	insertEventsTail = `) AS v`
	eventColumns     = 6

	// insertLoggedEventsHead is insertEventsHead for events of which some
	// carry logs (see migration 16), with two more values per event: the
	// first log seq and the logs. Only a transaction that has such events
	// binds them, as NULL for the others.
	insertLoggedEventsHead = `INSERT INTO events (instance_key, instance_id, step, type, attempt, message, at, log_seq, logs)
	SELECT (SELECT k.key FROM instance_keys AS k WHERE k.id = v.column1), v.column1, v.column2, v.column3, v.column4, v.column5, v.column6,
		v.column7, v.column8
	FROM (VALUES `
	loggedEventColumns = 8
)

// loggedEvent is what one queued event carries of its attempt's logs.
type loggedEvent struct {
	index    int // of the event, in queue order
	firstSeq int64
	logs     string
}

// event queues one history entry for flushEvents.
func (t *txn) event(instanceID, step string, typ storage.EventType, attempt int, msg string) {
	t.events = append(t.events, instanceID, step, string(typ), attempt, msg, t.now.UnixMicro())
}

// eventWithLogs queues a history entry that carries what its attempt
// logged: logs packed by packLogs, the first of their seqs firstSeq.
func (t *txn) eventWithLogs(instanceID, step string, typ storage.EventType, attempt int, firstSeq int64, logs string) {
	t.logged = append(t.logged, loggedEvent{index: len(t.events) / eventColumns, firstSeq: firstSeq, logs: logs})
	t.event(instanceID, step, typ, attempt, "")
}

// flushEvents inserts the queued events, in order: runs of events that
// carry no logs with insertEventsHead, those that do with
// insertLoggedEventsHead, so that only they bind the two values more
// (binding them as NULL for every event of a transaction cost chain4 2%).
func (t *txn) flushEvents() error {
	defer func() { t.events, t.logged = t.events[:0], t.logged[:0] }()
	next := 0 // the first event not inserted yet
	for logged := t.logged; len(logged) > 0; {
		first, run := logged[0].index, 1
		for run < len(logged) && logged[run].index == first+run {
			run++
		}
		if err := t.insertRowsThen(insertEventsHead, insertEventsTail, eventColumns, t.events[next*eventColumns:first*eventColumns]); err != nil {
			return err
		}
		args := make([]any, 0, run*loggedEventColumns)
		for k, e := range logged[:run] {
			args = append(args, t.events[(first+k)*eventColumns:(first+k+1)*eventColumns]...)
			args = append(args, e.firstSeq, e.logs)
		}
		if err := t.insertRowsThen(insertLoggedEventsHead, insertEventsTail, loggedEventColumns, args); err != nil {
			return err
		}
		next, logged = first+run, logged[run:]
	}
	return t.insertRowsThen(insertEventsHead, insertEventsTail, eventColumns, t.events[next*eventColumns:])
}

// maxRowsPerInsert bounds one multi-row INSERT; 256 rows of the widest
// table stay far below SQLite's 32,766 bound parameters.
const maxRowsPerInsert = 256

// insertRows inserts rows of cols values each, flattened into args, with
// multi-row INSERT ... VALUES statements of power-of-two row counts: a
// handful of statement texts serve every batch size, so they stay in the
// driver's prepared-statement cache, and a batch of n rows takes about
// n/256 + log2(256) executions instead of n.
func (t *txn) insertRows(head string, cols int, args []any) error {
	return t.insertRowsThen(head, "", cols, args)
}

// insertRowsThen is insertRows with tail after the VALUES list.
func (t *txn) insertRowsThen(head, tail string, cols int, args []any) error {
	for len(args) > 0 {
		rows := min(maxRowsPerInsert, 1<<(bits.Len(uint(len(args)/cols))-1))
		n := rows * cols
		if _, err := t.tx.ExecContext(t.ctx, valuesSQL(head, cols, rows)+tail, args[:n]...); err != nil {
			return err
		}
		args = args[n:]
	}
	return nil
}

type valuesKey struct {
	head       string
	cols, rows int
}

var valuesCache sync.Map // valuesKey -> string

// valuesSQL returns head followed by rows placeholder tuples of cols each.
func valuesSQL(head string, cols, rows int) string {
	key := valuesKey{head, cols, rows}
	if q, ok := valuesCache.Load(key); ok {
		return q.(string)
	}
	tuple := "(" + strings.Repeat("?,", cols-1) + "?)"
	var b strings.Builder
	b.Grow(len(head) + rows*(len(tuple)+1))
	b.WriteString(head)
	for i := range rows {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(tuple)
	}
	q := b.String()
	valuesCache.Store(key, q)
	return q
}

// savepoint runs fn inside a savepoint of the transaction, a caller's own:
// when fn fails half-way, its writes are undone and the caller's earlier
// writes stay, with the transaction still usable; the store never commits
// or rolls back a caller's transaction.
func (t *txn) savepoint(fn func() error) error {
	if _, err := t.exec(`SAVEPOINT dagrun_create`); err != nil {
		return err
	}
	if err := fn(); err != nil {
		// Undo even when ctx ended: the caller's transaction must not keep
		// half an instance.
		_, undo := t.tx.ExecContext(context.WithoutCancel(t.ctx), `ROLLBACK TO dagrun_create; RELEASE dagrun_create`)
		t.events, t.logged = t.events[:0], t.logged[:0]
		return errors.Join(err, undo)
	}
	_, err := t.exec(`RELEASE dagrun_create`)
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

// readyStep names a step (not an item) of an instance made pending.
type readyStep struct{ instanceID, name string }
