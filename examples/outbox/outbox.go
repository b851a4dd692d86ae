// Package outbox shows the transactional outbox with dagrun: an order row
// and the workflow instance that processes it are written in one
// transaction of the application's own, so either both exist or neither
// does. There is no window in which an order is saved but its workflow
// never starts, or a workflow runs for an order that was rolled back.
//
// PlaceOrderSQL does it with a *sql.Tx on SQLite, PlaceOrderPgx with a
// pgx.Tx on PostgreSQL; outbox_test.go runs both, committed and rolled
// back.
package outbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/dagrun/dagrun"
)

// Order is the business record.
type Order struct {
	ID          string  `json:"orderId"`
	TotalAmount float64 `json:"totalAmount"`
	Items       []Item  `json:"items"`
}

// Item is one line of an order.
type Item struct {
	SKU string `json:"sku"`
	Qty int    `json:"qty"`
}

// SchemaSQL creates the application's own table (SQLite and PostgreSQL).
const SchemaSQL = `CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, total NUMERIC NOT NULL, instance_id TEXT NOT NULL)`

// PlaceOrderSQL inserts the order and starts order-processing for it in
// tx. The caller commits or rolls back; dagrun never commits a caller's
// transaction.
func PlaceOrderSQL(ctx context.Context, engine *dagrun.Engine, tx *sql.Tx, order Order) (string, error) {
	id, err := start(ctx, engine, tx, order)
	if err != nil {
		return "", err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id, total, instance_id) VALUES (?, ?, ?)`, order.ID, order.TotalAmount, id); err != nil {
		return "", fmt.Errorf("insert order %s: %w", order.ID, err)
	}
	return id, nil
}

// PlaceOrderPgx is PlaceOrderSQL for a pgx transaction on PostgreSQL.
func PlaceOrderPgx(ctx context.Context, engine *dagrun.Engine, tx pgx.Tx, order Order) (string, error) {
	id, err := start(ctx, engine, tx, order)
	if err != nil {
		return "", err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO orders (id, total, instance_id) VALUES ($1, $2, $3)`, order.ID, order.TotalAmount, id); err != nil {
		return "", fmt.Errorf("insert order %s: %w", order.ID, err)
	}
	return id, nil
}

func start(ctx context.Context, engine *dagrun.Engine, tx any, order Order) (string, error) {
	input, err := json.Marshal(order)
	if err != nil {
		return "", err
	}
	// The order ID as idempotency key: placing the same order twice starts
	// one workflow.
	res, err := engine.StartTx(ctx, tx, "order-processing", input, &dagrun.StartOptions{Key: order.ID})
	if err != nil {
		return "", err
	}
	return res.ID, nil
}
