package app

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/postgres"
	"github.com/dagrun/dagrun/storage/sqlite"
)

// openStore picks the backend from the --db value: postgres:// and
// postgresql:// select PostgreSQL; sqlite:PATH or a plain path selects
// SQLite. Any other scheme is a usage error rather than a file name.
// schema (--db-schema) names PostgreSQL's schema for dagrun's tables;
// empty leaves it to the URL's dagrun_schema parameter, else "dagrun".
func openStore(ctx context.Context, db, schema string, logger *slog.Logger) (storage.Store, error) {
	switch {
	case db == "":
		return nil, usageError(fmt.Errorf("--db is empty: give a SQLite path or a postgres:// URL"))
	case strings.HasPrefix(db, "postgres://"), strings.HasPrefix(db, "postgresql://"):
		return postgres.Open(ctx, db, &postgres.Config{Schema: schema, Logger: logger})
	case strings.HasPrefix(db, "sqlite:"):
		path := strings.TrimPrefix(strings.TrimPrefix(db, "sqlite:"), "//")
		if path == "" {
			return nil, usageError(fmt.Errorf("--db %q names no file: use sqlite:PATH", db))
		}
		return sqliteStore(ctx, path, schema)
	case strings.Contains(db, "://"):
		scheme := db[:strings.Index(db, "://")]
		return nil, usageError(fmt.Errorf("--db scheme %q is not supported: use a SQLite path, sqlite:PATH, or postgres://", scheme))
	default:
		return sqliteStore(ctx, db, schema)
	}
}

// sqliteStore opens a SQLite file; a schema is PostgreSQL's alone, and a
// flag that would do nothing is a usage error rather than silently ignored.
func sqliteStore(ctx context.Context, path, schema string) (storage.Store, error) {
	if schema != "" {
		return nil, usageError(fmt.Errorf("--db-schema %q applies only to PostgreSQL, and --db names a SQLite file", schema))
	}
	return sqlite.Open(ctx, path, nil)
}
