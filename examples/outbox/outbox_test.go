package outbox_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun"
	"github.com/dagrun/dagrun/dag"
	"github.com/dagrun/dagrun/examples/orders"
	"github.com/dagrun/dagrun/examples/outbox"
	"github.com/dagrun/dagrun/handlers"
	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/backendtest"
	"github.com/dagrun/dagrun/storage/postgres"
	"github.com/dagrun/dagrun/storage/sqlite"
)

func newEngine(t *testing.T, store storage.Store) *dagrun.Engine {
	t.Helper()
	registry := handlers.NewRegistry()
	handlers.RegisterBuiltins(registry)
	orders.Register(registry)
	w, err := dag.ParseFile("../../workflows/order-processing.yaml", &dag.ParseOptions{HandlerExists: registry.Has})
	require.NoError(t, err)
	engine, err := dagrun.New(store, registry, &dagrun.Config{Workflows: []*dag.Workflow{w}})
	require.NoError(t, err)
	return engine
}

var order = outbox.Order{ID: "A-1", TotalAmount: 12, Items: []outbox.Item{{SKU: "book", Qty: 1}}}

func countInstances(t *testing.T, engine *dagrun.Engine) int {
	t.Helper()
	list, err := engine.List(context.Background(), storage.ListParams{})
	require.NoError(t, err)
	return len(list)
}

func TestOutboxSQLite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, err := sql.Open("sqlite3", sqlite.DSN(filepath.Join(t.TempDir(), "app.db")))
	require.NoError(t, err)
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { _ = db.Close() })
	_, err = db.Exec(outbox.SchemaSQL)
	require.NoError(t, err)
	store, err := sqlite.New(db, nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, store.Close()) })
	engine := newEngine(t, store)

	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = outbox.PlaceOrderSQL(ctx, engine, tx, order)
	require.NoError(t, err)
	require.NoError(t, tx.Rollback())
	require.Equal(t, 0, countInstances(t, engine), "rolled back: no instance")
	var orders int
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM orders`).Scan(&orders))
	require.Equal(t, 0, orders)

	tx, err = db.BeginTx(ctx, nil)
	require.NoError(t, err)
	id, err := outbox.PlaceOrderSQL(ctx, engine, tx, order)
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	inst, err := engine.Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, "order-processing", inst.Workflow)
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM orders`).Scan(&orders))
	require.Equal(t, 1, orders)
}

func TestOutboxPostgres(t *testing.T) {
	t.Parallel()
	if !backendtest.PostgresAvailable(t) {
		t.Skip("DAGRUN_TEST_POSTGRES is not set")
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, backendtest.PostgresURL(t))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = pool.Exec(ctx, outbox.SchemaSQL)
	require.NoError(t, err)
	store, err := postgres.New(ctx, pool, nil)
	require.NoError(t, err)
	engine := newEngine(t, store)

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = outbox.PlaceOrderPgx(ctx, engine, tx, order)
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))
	require.Equal(t, 0, countInstances(t, engine), "rolled back: no instance")

	tx, err = pool.Begin(ctx)
	require.NoError(t, err)
	id, err := outbox.PlaceOrderPgx(ctx, engine, tx, order)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	inst, err := engine.Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, "order-processing", inst.Workflow)
	var orders int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&orders))
	require.Equal(t, 1, orders)
}
