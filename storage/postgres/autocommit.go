package postgres

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// autocommitter runs the store's statements that are transactions of their
// own (claims, heartbeats, announcements, single reads): the pool itself
// when the sessions hold dagrun's settings, or settingPool when they
// cannot (PgBouncer).
type autocommitter interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// settingPool sends each statement, or batch, after a SELECT of
// set_config(name, value, true) for each of dagrun's settings, in one
// batch: one round trip and one implicit transaction, so that the settings
// hold for exactly the statements they precede, on whichever server
// connection a transaction-pooling proxy lends for them.
type settingPool struct {
	pool     *pgxpool.Pool
	settings string
}

// writeBegin and readBegin begin the store's own transactions: READ
// COMMITTED for writes, whatever the server's default (the locking
// protocol, lock the instance and then read what sibling transactions
// committed meanwhile, relies on it), and REPEATABLE READ read-only for
// reads, so that the several queries of one answer see one snapshot.
const (
	writeBegin = "BEGIN ISOLATION LEVEL READ COMMITTED"
	readBegin  = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
)

// settingsSQL returns the statement that sets local's settings (name to
// value) for the transaction it runs in, or "" when there are none.
// set_config(..., true) is SET LOCAL in a statement that can go in a
// batch, whose statements share one transaction.
func settingsSQL(local map[string]string) string {
	if len(local) == 0 {
		return ""
	}
	var sb strings.Builder
	sb.WriteString("SELECT ")
	for i, name := range slices.Sorted(maps.Keys(local)) {
		if i > 0 {
			sb.WriteString(", ")
		}
		fmt.Fprintf(&sb, "set_config('%s', '%s', true)", quoteLiteral(name), quoteLiteral(local[name]))
	}
	return sb.String()
}

// autocommitFor returns what runs pool's autocommitted statements, given
// the statement that sets dagrun's settings ("" when the sessions hold
// them).
func autocommitFor(pool *pgxpool.Pool, settings string) autocommitter {
	if settings == "" {
		return pool
	}
	return &settingPool{pool: pool, settings: settings}
}

// quoteLiteral escapes s for a single-quoted SQL string literal
// (standard_conforming_strings, on since PostgreSQL 9.1).
func quoteLiteral(s string) string {
	return strings.ReplaceAll(s, "'", "''")
}

// send sends b with the settings first and reads their result, so that
// the caller reads b's own results in order.
func (p *settingPool) send(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	// A batch of its own: the caller's stays as it was, should it send
	// it again (a retry).
	withSettings := &pgx.Batch{QueuedQueries: append([]*pgx.QueuedQuery{{SQL: p.settings}}, b.QueuedQueries...)}
	br := p.pool.SendBatch(ctx, withSettings)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return failedBatch{err}
	}
	return br
}

func (p *settingPool) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return p.send(ctx, b)
}

func (p *settingPool) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return execOnly(p.send(ctx, batchOf(sql, args)))
}

func (p *settingPool) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return queryOnly(p.send(ctx, batchOf(sql, args)))
}

func (p *settingPool) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	rows, err := p.Query(ctx, sql, args...)
	return batchRow{rows: rows, err: err}
}

// batchOf returns a batch of one statement.
func batchOf(sql string, args []any) *pgx.Batch {
	var b pgx.Batch
	b.Queue(sql, args...)
	return &b
}

// execOnly reads the result of br's one statement left to read, and
// ends br.
func execOnly(br pgx.BatchResults) (pgconn.CommandTag, error) {
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag, err
}

// queryOnly returns the rows of br's one statement left to read; closing
// them ends br.
func queryOnly(br pgx.BatchResults) (pgx.Rows, error) {
	rows, err := br.Query()
	if err != nil {
		_ = br.Close()
		return rows, err
	}
	return &batchRows{Rows: rows, batch: br}, nil
}

// batchRows are the rows of a batch's one query; closing them ends the
// batch, which gives its connection back to the pool.
type batchRows struct {
	pgx.Rows
	batch  pgx.BatchResults
	closed bool
	err    error
}

func (r *batchRows) Close() {
	if r.closed {
		return
	}
	r.closed = true
	r.Rows.Close()
	r.err = r.batch.Close()
}

func (r *batchRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.err
}

func (r *batchRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.Close()
	return false
}

// batchRow is pgx.Row on batchRows: the first row, or pgx.ErrNoRows.
type batchRow struct {
	rows pgx.Rows
	err  error
}

func (r batchRow) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	defer r.rows.Close()
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	r.rows.Close()
	return r.rows.Err()
}

// failedBatch is the result of a batch whose settings failed.
type failedBatch struct{ err error }

func (f failedBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, f.err }
func (f failedBatch) Query() (pgx.Rows, error)         { return nil, f.err }
func (f failedBatch) QueryRow() pgx.Row                { return batchRow{err: f.err} }
func (f failedBatch) Close() error                     { return f.err }
func (f failedBatch) Tx() pgx.Tx                       { return nil }
