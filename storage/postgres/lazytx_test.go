package postgres

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// countingTracer counts the batches and the single queries a pool sends:
// each is one round trip. The NOTIFYs a store sends after its commits and
// its listener's statements go their own way and are not counted.
type countingTracer struct{ trips atomic.Int64 }

func (c *countingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if q := strings.TrimSpace(d.SQL); !strings.HasPrefix(q, "SELECT pg_notify") && !strings.HasPrefix(q, "LISTEN") && !strings.HasPrefix(q, "UNLISTEN") {
		c.trips.Add(1)
	}
	return ctx
}
func (c *countingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *countingTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.trips.Add(1)
	return ctx
}
func (c *countingTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (c *countingTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// TestRunTx: a store transaction sends its BEGIN with its first
// statements, commits what fn wrote when fn succeeds, rolls it back when
// fn or a statement fails, and leaves its connection fit for the next
// transaction in every case.
func TestRunTx(t *testing.T) {
	t.Parallel()
	s := openTestStore(t, &Config{MaxConns: 1})
	ctx := t.Context()
	_, err := s.pool.Exec(ctx, s.q(`CREATE TABLE {s}runtx (v int PRIMARY KEY)`))
	require.NoError(t, err)
	count := func() (n int) {
		t.Helper()
		require.NoError(t, s.pool.QueryRow(ctx, s.q(`SELECT count(*) FROM {s}runtx`)).Scan(&n))
		return n
	}
	insert := func(tx pgx.Tx, v int) error {
		_, err := tx.Exec(ctx, s.q(`INSERT INTO {s}runtx VALUES ($1)`), v)
		return err
	}
	refused := errors.New("refused")

	require.NoError(t, s.runTx(ctx, writeBegin, func(tx *lazyTx) error {
		var isolation string
		if err := tx.QueryRow(ctx, "SELECT current_setting('transaction_isolation')").Scan(&isolation); err != nil {
			return err
		}
		require.Equal(t, "read committed", isolation, "the first statement ran inside the BEGIN's transaction")
		return insert(tx, 1)
	}))
	require.Equal(t, 1, count(), "committed")

	require.ErrorIs(t, s.runTx(ctx, writeBegin, func(tx *lazyTx) error {
		if err := insert(tx, 2); err != nil {
			return err
		}
		return refused
	}), refused)
	require.Equal(t, 1, count(), "rolled back after fn failed")

	err = s.runTx(ctx, writeBegin, func(tx *lazyTx) error {
		var b pgx.Batch
		b.Queue(s.q(`INSERT INTO {s}runtx VALUES (3)`))
		b.Queue(s.q(`INSERT INTO {s}runtx VALUES (1)`)) // a duplicate key
		return tx.SendBatch(ctx, &b).Close()
	})
	require.ErrorContains(t, err, "duplicate key")
	require.Equal(t, 1, count(), "rolled back after the first batch failed")

	require.NoError(t, s.runTx(ctx, writeBegin, func(*lazyTx) error { return nil }), "a transaction that sent nothing")

	// The last batch with the COMMIT: committed, and nothing left for
	// runTx to commit; a statement of that batch that fails undoes the
	// whole transaction.
	require.NoError(t, s.runTx(ctx, writeBegin, func(tx *lazyTx) error {
		if err := insert(tx, 5); err != nil {
			return err
		}
		var b pgx.Batch
		b.Queue(s.q(`INSERT INTO {s}runtx VALUES (6)`))
		return tx.commitWith(ctx, &b)
	}))
	require.Equal(t, 3, count(), "committed with the last batch")
	err = s.runTx(ctx, writeBegin, func(tx *lazyTx) error {
		if err := insert(tx, 7); err != nil {
			return err
		}
		var b pgx.Batch
		b.Queue(s.q(`INSERT INTO {s}runtx VALUES (8)`))
		b.Queue(s.q(`INSERT INTO {s}runtx VALUES (1)`)) // a duplicate key
		return tx.commitWith(ctx, &b)
	})
	require.ErrorContains(t, err, "duplicate key")
	require.Equal(t, 3, count(), "rolled back: the COMMIT after the failed statement never ran")
	require.NoError(t, s.runTx(ctx, writeBegin, func(tx *lazyTx) error {
		var b pgx.Batch
		b.Queue(s.q(`INSERT INTO {s}runtx VALUES (9)`))
		return tx.commitWith(ctx, &b)
	}), "BEGIN, statements and COMMIT in one batch")
	require.Equal(t, 4, count())

	require.Error(t, s.runTx(ctx, readBegin, func(tx *lazyTx) error { return insert(tx, 4) }), "a read-only transaction wrote")
	require.Equal(t, 4, count())

	t.Run("round trips", func(t *testing.T) {
		tracer := &countingTracer{}
		cfg := s.pool.Config().Copy()
		cfg.ConnConfig.Tracer = tracer
		traced, err := pgxpool.NewWithConfig(ctx, cfg)
		require.NoError(t, err)
		t.Cleanup(traced.Close)
		s := &Store{pool: traced}
		require.NoError(t, s.runTx(ctx, writeBegin, func(tx *lazyTx) error {
			var b pgx.Batch
			b.Queue("SELECT 1")
			b.Queue("SELECT 2")
			if err := tx.SendBatch(ctx, &b).Close(); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "SELECT 3")
			return err
		}))
		require.EqualValues(t, 3, tracer.trips.Load(), "BEGIN with the first batch, the second statement, COMMIT")

		tracer.trips.Store(0)
		require.NoError(t, s.runTx(ctx, writeBegin, func(tx *lazyTx) error {
			if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
				return err
			}
			var b pgx.Batch
			b.Queue("SELECT 2")
			return tx.commitWith(ctx, &b)
		}))
		require.EqualValues(t, 2, tracer.trips.Load(), "BEGIN with the first statement, the last batch with COMMIT")
		var status byte
		c, err := traced.Acquire(ctx)
		require.NoError(t, err)
		status = c.Conn().PgConn().TxStatus()
		c.Release()
		require.Equal(t, byte('I'), status, "the connection goes back to the pool out of any transaction")
	})
}
