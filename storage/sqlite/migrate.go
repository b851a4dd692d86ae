package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"strings"
	"time"

	"github.com/dagrun/dagrun/storage"
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
		return checkMigrationsTable(ctx, s.w, s.name)
	}
	return s.write(ctx, "migrate", func(t *txn) error {
		if _, err := t.tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
			version    INTEGER PRIMARY KEY,
			name       TEXT NOT NULL,
			applied_at INTEGER NOT NULL
		)`); err != nil {
			return err
		}
		if err := checkMigrationsTable(ctx, t.tx, s.name); err != nil {
			return err
		}
		var current int
		if err := t.tx.QueryRowContext(ctx, `SELECT coalesce(max(version), 0) FROM schema_migrations`).Scan(&current); err != nil {
			return err
		}
		if latest := ms[len(ms)-1].Version; current > latest {
			return fmt.Errorf("%w: SQLite database %q has dagrun's schema version %d, newer than this build of dagrun supports (%d): upgrade dagrun",
				storage.ErrUnavailable, s.name, current, latest)
		}
		for _, m := range ms[current:] {
			if _, err := t.tx.ExecContext(ctx, m.SQL); err != nil {
				if current == 0 && strings.Contains(err.Error(), "already exists") {
					// A file of another program with a table of one of
					// dagrun's names (steps, instances, events ...).
					return fmt.Errorf("%w: SQLite database %q holds another program's tables under dagrun's names (%v): give dagrun a database file of its own",
						storage.ErrUnavailable, s.name, err)
				}
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

// checkMigrationsTable refuses a file whose schema_migrations is another
// program's (golang-migrate's, Rails'): its versions are not dagrun's.
func checkMigrationsTable(ctx context.Context, q interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}, name string) error {
	rows, err := q.QueryContext(ctx, `SELECT name FROM pragma_table_info('schema_migrations') ORDER BY cid`)
	if err != nil {
		return err
	}
	columns, err := column[string](rows)
	if err != nil {
		return err
	}
	if strings.Join(columns, ",") != "version,name,applied_at" {
		return fmt.Errorf("%w: SQLite database %q holds a schema_migrations table that is not dagrun's (columns %s): "+
			"another program keeps its migrations in this file; give dagrun a database file of its own",
			storage.ErrUnavailable, name, strings.Join(columns, ", "))
	}
	return nil
}
