package postgres

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// lazyTx is a transaction whose BEGIN goes with its first statements, in
// the same batch (pgx.Batch.BeginTx), instead of a round trip of its own:
// every store transaction starts with a statement, so each saves one round
// trip. Behind PgBouncer the settings dagrun cannot keep on a session go in
// that batch too, right after the BEGIN. Until the first statement is sent
// nothing has reached the server; once it is, lazyTx is the pgx.Tx it
// embeds.
type lazyTx struct {
	pgx.Tx
	conn *pgx.Conn
	// begin is the BEGIN statement; settings, when not empty, the
	// statement that sets dagrun's settings for the transaction.
	begin, settings string
	// actor, when not empty, is set for the transaction with its BEGIN
	// (see actAs).
	actor string
}

// runTx runs fn in a transaction begun by begin on a connection of the
// store's pool, committed when fn succeeds and rolled back otherwise, as
// pgx.BeginTxFunc does.
func (s *Store) runTx(ctx context.Context, begin string, fn func(*lazyTx) error) (err error) {
	c, err := s.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	// A connection left in a transaction (a failed rollback) is closed by
	// the pool on release, not reused.
	defer c.Release()
	tx := &lazyTx{conn: c.Conn(), begin: begin, settings: s.settings}
	defer func() {
		if tx.Tx != nil {
			rollbackErr := tx.Tx.Rollback(context.WithoutCancel(ctx))
			if rollbackErr != nil && !errors.Is(rollbackErr, pgx.ErrTxClosed) && err == nil {
				err = rollbackErr
			}
		}
	}()
	if err := fn(tx); err != nil {
		return err
	}
	if tx.Tx == nil {
		return nil // nothing was sent: nothing to commit
	}
	return tx.Tx.Commit(ctx)
}

// commitWith sends b, the transaction's last statements, with the COMMIT
// after them, in one round trip instead of two: a step's transition then
// takes two round trips, not three. Once it returns nil the transaction is
// over and runTx has nothing left to commit; when it fails, runTx rolls
// back (a COMMIT after a failed statement of the same batch never runs:
// the server skips the rest of the batch).
func (t *lazyTx) commitWith(ctx context.Context, b *pgx.Batch) error {
	b.Queue("commit")
	if err := t.SendBatch(ctx, b).Close(); err != nil {
		return err
	}
	t.Tx = nil
	return nil
}

// start sends b with the BEGIN (and the settings) first, and reads their
// results, so that the caller reads b's own in order.
func (t *lazyTx) start(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	var first pgx.Batch
	first.BeginTx(pgx.TxOptions{BeginQuery: t.begin})
	if t.settings != "" {
		first.Queue(t.settings)
	}
	if t.actor != "" {
		first.Queue(actorSQL, t.actor)
	}
	first.QueuedQueries = append(first.QueuedQueries, b.QueuedQueries...)
	br := t.conn.SendBatch(ctx, &first)
	t.Tx = br.Tx()
	for range len(first.QueuedQueries) - len(b.QueuedQueries) {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return failedBatch{err}
		}
	}
	return br
}

// begun makes sure the transaction has begun, for the methods that need
// it before they send anything.
func (t *lazyTx) begun(ctx context.Context) error {
	if t.Tx != nil {
		return nil
	}
	return t.start(ctx, &pgx.Batch{}).Close()
}

func (t *lazyTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if t.Tx != nil {
		return t.Tx.SendBatch(ctx, b)
	}
	return t.start(ctx, b)
}

func (t *lazyTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if t.Tx != nil {
		return t.Tx.Exec(ctx, sql, args...)
	}
	return execOnly(t.start(ctx, batchOf(sql, args)))
}

func (t *lazyTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if t.Tx != nil {
		return t.Tx.Query(ctx, sql, args...)
	}
	return queryOnly(t.start(ctx, batchOf(sql, args)))
}

func (t *lazyTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if t.Tx != nil {
		return t.Tx.QueryRow(ctx, sql, args...)
	}
	rows, err := t.Query(ctx, sql, args...)
	return batchRow{rows: rows, err: err}
}

func (t *lazyTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := t.begun(ctx); err != nil {
		return nil, err
	}
	return t.Tx.Begin(ctx)
}

func (t *lazyTx) Commit(ctx context.Context) error {
	if t.Tx == nil {
		return nil
	}
	return t.Tx.Commit(ctx)
}

func (t *lazyTx) Rollback(ctx context.Context) error {
	if t.Tx == nil {
		return nil
	}
	return t.Tx.Rollback(ctx)
}

func (t *lazyTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if err := t.begun(ctx); err != nil {
		return 0, err
	}
	return t.Tx.CopyFrom(ctx, table, columns, src)
}

func (t *lazyTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := t.begun(ctx); err != nil {
		return nil, err
	}
	return t.Tx.Prepare(ctx, name, sql)
}

func (t *lazyTx) LargeObjects() pgx.LargeObjects {
	if err := t.begun(context.Background()); err != nil {
		panic("postgres: begin a transaction for large objects: " + err.Error())
	}
	return t.Tx.LargeObjects()
}

func (t *lazyTx) Conn() *pgx.Conn { return t.conn }
