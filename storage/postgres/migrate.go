package postgres

import (
	"context"
	"embed"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/dagrun/dagrun/storage/internal/migrate"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// migrateLockClass is the first key of the advisory lock taken while
// migrating; the second is a hash of the schema, so stores in different
// schemas migrate in parallel while processes sharing one migrate once.
const migrateLockClass = 0x64616772 // "dagr"

// migrate applies the migrations not yet recorded in schema_migrations, all
// in one transaction under a transaction-scoped advisory lock: a concurrent
// migrator waits for the lock, then finds everything applied. A failure
// rolls the whole transaction back, so no version is ever half-applied.
func (s *Store) migrate(ctx context.Context) error {
	ms, err := migrate.Read(migrationFS, "migrations")
	if err != nil {
		return err
	}
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		// A migration may legitimately run long (an index on a big
		// table): Config.StatementTimeout is for the store's own
		// statements, not for this one transaction.
		if _, err := tx.Exec(ctx, "SET LOCAL statement_timeout = 0"); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1, hashtext($2))", migrateLockClass, "dagrun:"+s.cfg.Schema); err != nil {
			return err
		}
		if s.cfg.Schema != "" {
			ident := pgx.Identifier{s.cfg.Schema}.Sanitize()
			// search_path is local to this transaction: the migration files
			// use unqualified names.
			if _, err := tx.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+ident+"; SET LOCAL search_path TO "+ident); err != nil {
				return err
			}
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
			version    integer PRIMARY KEY,
			name       text NOT NULL,
			applied_at timestamptz NOT NULL DEFAULT now()
		)`); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, "SELECT version FROM schema_migrations")
		if err != nil {
			return err
		}
		applied, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		if err != nil {
			return err
		}
		done := make(map[int]bool, len(applied))
		for _, v := range applied {
			done[int(v)] = true
		}
		for _, m := range ms {
			if done[m.Version] {
				continue
			}
			if _, err := tx.Exec(ctx, m.SQL); err != nil {
				return fmt.Errorf("migration %s: %w", m.Name, err)
			}
			if _, err := tx.Exec(ctx, "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", m.Version, m.Name); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("postgres: migrating schema: %w", interpretError(err))
	}
	return nil
}
