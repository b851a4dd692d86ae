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
func openStore(ctx context.Context, db string, logger *slog.Logger) (storage.Store, error) {
	switch {
	case db == "":
		return nil, usageError(fmt.Errorf("--db is empty: give a SQLite path or a postgres:// URL"))
	case strings.HasPrefix(db, "postgres://"), strings.HasPrefix(db, "postgresql://"):
		return postgres.Open(ctx, db, &postgres.Config{Logger: logger})
	case strings.HasPrefix(db, "sqlite:"):
		path := strings.TrimPrefix(strings.TrimPrefix(db, "sqlite:"), "//")
		if path == "" {
			return nil, usageError(fmt.Errorf("--db %q names no file: use sqlite:PATH", db))
		}
		return sqlite.Open(ctx, path, nil)
	case strings.Contains(db, "://"):
		scheme := db[:strings.Index(db, "://")]
		return nil, usageError(fmt.Errorf("--db scheme %q is not supported: use a SQLite path, sqlite:PATH, or postgres://", scheme))
	default:
		return sqlite.Open(ctx, db, nil)
	}
}
