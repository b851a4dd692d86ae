package app

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"strings"

	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/postgres"
	"github.com/dagrun/dagrun/storage/sqlite"
)

// PostgreSQL pool sizes, the connections a command's store may hold at
// once, unless the URL's pool_max_conns says otherwise (it wins: it is the
// operator's). A worker's loops (claims, group commits, heartbeats, step
// logs, the scheduler) each run one statement or transaction at a time; a
// claim takes up to --concurrency steps and a commit records up to 256
// results in one transaction. So what a worker needs does not grow with
// --concurrency: one connection drained a backlog as fast as two or ten
// at --concurrency 10, 100, 1,000 and 5,000 (README, Performance). The
// store's listener, when it has one, is a connection of its own on top.
const (
	workerConns  = 1
	followConns  = 2                        // start, retry and bench: a worker, and a starter or follower beside it
	serveConns   = postgres.DefaultMaxConns // concurrent HTTP requests
	commandConns = 1                        // every other command: one statement at a time
)

// openStore picks the backend from the --db value: postgres:// and
// postgresql:// select PostgreSQL; sqlite:PATH or a plain path selects
// SQLite. Any other scheme is a usage error rather than a file name.
// schema (--db-schema) names PostgreSQL's schema for dagrun's tables;
// empty leaves it to the URL's dagrun_schema parameter, else "dagrun".
// conns sizes a PostgreSQL pool when the URL has no pool_max_conns; zero
// is a one-off command's store: commandConns connections, without the
// warm-up that only a long-lived connection earns back
// (postgres.Config.ShortLived).
func openStore(ctx context.Context, db, schema string, logger *slog.Logger, conns int32) (storage.Store, error) {
	switch {
	case db == "":
		return nil, usageError(fmt.Errorf("--db is empty: give a SQLite path or a postgres:// URL"))
	case strings.HasPrefix(db, "postgres://"), strings.HasPrefix(db, "postgresql://"):
		cfg := &postgres.Config{Schema: schema, Logger: logger, ShortLived: conns == 0}
		if !postgres.HasParam(db, "pool_max_conns") {
			cfg.MaxConns = cmp.Or(conns, commandConns)
		}
		store, err := postgres.Open(ctx, db, cfg)
		if errors.Is(err, postgres.ErrInvalidURL) || errors.Is(err, postgres.ErrInvalidSchema) {
			return nil, usageError(err)
		}
		return store, err
	case strings.HasPrefix(db, "sqlite:"):
		path := sqlitePath(db)
		if path == "" {
			return nil, usageError(fmt.Errorf("--db %q names no file: use sqlite:PATH", db))
		}
		return sqliteStore(ctx, path, schema)
	case strings.HasPrefix(db, "file:"):
		// SQLite's URI form: the store sets the connection's options
		// itself, and would take the URI for a file's name.
		return nil, usageError(fmt.Errorf("--db %q is a SQLite URI, which dagrun does not read: give the file's path (sqlite:PATH, or the path alone)", db))
	case strings.Contains(db, "://"):
		scheme := db[:strings.Index(db, "://")]
		return nil, usageError(fmt.Errorf("--db scheme %q is not supported: use a SQLite path, sqlite:PATH, or postgres://", scheme))
	default:
		return sqliteStore(ctx, db, schema)
	}
}

// openCommandStore opens the store of --db for this command (see
// openStore), noting in c.newDatabase a SQLite file it makes: a read of
// an instance from a mistyped path, or in the wrong folder, makes an
// empty database there, and its "not found" says so. (Reads make the
// file, and its schema, on purpose: a "dagrun list" before many
// processes start migrates it once.)
func (c *cli) openCommandStore(ctx context.Context, conns int32) (storage.Store, error) {
	if path := sqlitePath(c.db); path != "" {
		if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
			c.newDatabase = path
		}
	}
	return openStore(ctx, c.db, c.dbSchema, c.logger, conns)
}

// sqlitePath is the file path of a --db value that names a SQLite file,
// or "" for any other.
func sqlitePath(db string) string {
	switch {
	case db == "", db == ":memory:", strings.HasPrefix(db, "file:"), strings.Contains(db, "://") && !strings.HasPrefix(db, "sqlite://"):
		return ""
	case strings.HasPrefix(db, "sqlite:"):
		return strings.TrimPrefix(strings.TrimPrefix(db, "sqlite:"), "//")
	}
	return db
}

// sqliteStore opens a SQLite file; a schema is PostgreSQL's alone, and a
// flag that would do nothing is a usage error rather than silently ignored.
func sqliteStore(ctx context.Context, path, schema string) (storage.Store, error) {
	if schema != "" {
		return nil, usageError(fmt.Errorf("--db-schema (or DAGRUN_DB_SCHEMA) %q applies only to PostgreSQL, and --db names a SQLite file", schema))
	}
	return sqlite.Open(ctx, path, nil)
}
