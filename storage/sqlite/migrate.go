package sqlite

import (
	"context"
	"embed"
	"fmt"
	"time"

	"github.com/dagrun/dagrun/storage/internal/migrate"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// migrate applies the migrations this binary knows and the file lacks, all
// in one BEGIN IMMEDIATE transaction: two processes opening a new file at
// once serialise on the write lock, and the second finds the work done.
func (s *Store) migrate(ctx context.Context) error {
	ms, err := migrate.Read(migrationFS, "migrations")
	if err != nil {
		return err
	}
	// A file that is up to date needs no write lock: a reader then opens
	// it even while another process holds the lock.
	var current int
	if err := s.w.QueryRowContext(ctx, `SELECT coalesce(max(version), 0) FROM schema_migrations`).Scan(&current); err == nil && current == ms[len(ms)-1].Version {
		return nil
	}
	return s.write(ctx, "migrate", func(t *txn) error {
		if _, err := t.tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
			version    INTEGER PRIMARY KEY,
			name       TEXT NOT NULL,
			applied_at INTEGER NOT NULL
		)`); err != nil {
			return err
		}
		var current int
		if err := t.tx.QueryRowContext(ctx, `SELECT coalesce(max(version), 0) FROM schema_migrations`).Scan(&current); err != nil {
			return err
		}
		if latest := ms[len(ms)-1].Version; current > latest {
			return fmt.Errorf("database schema version %d is newer than this build of dagrun supports (%d): upgrade dagrun", current, latest)
		}
		for _, m := range ms[current:] {
			if _, err := t.tx.ExecContext(ctx, m.SQL); err != nil {
				return fmt.Errorf("%s: %w", m.Name, err)
			}
			if _, err := t.tx.ExecContext(ctx, `INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)`,
				m.Version, m.Name, time.Now().UnixMicro()); err != nil {
				return err
			}
		}
		return nil
	})
}
