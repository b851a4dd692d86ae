package postgres

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dagrun/dagrun/storage"
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
	done, current := s.migrated(ctx, ms)
	if err := s.checkNotNewer(current, ms); err != nil {
		return err
	}
	if done {
		return nil
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
		ident := pgx.Identifier{s.cfg.Schema}.Sanitize()
		if _, err := tx.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+ident); err != nil {
			return err
		}
		// Before search_path changes: it finds the tables older versions
		// made.
		if err := s.adoptLegacy(ctx, tx); err != nil {
			return err
		}
		// The migration files use unqualified names: search_path names
		// the schema for this transaction only (SET LOCAL, which a
		// transaction-pooling proxy keeps), and the store's own statements
		// never rely on it.
		if _, err := tx.Exec(ctx, "SET LOCAL search_path TO "+ident); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, s.q(`CREATE TABLE IF NOT EXISTS {s}schema_migrations (
			version    integer PRIMARY KEY,
			name       text NOT NULL,
			applied_at timestamptz NOT NULL DEFAULT now()
		)`)); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, s.q("SELECT version FROM {s}schema_migrations"))
		if err != nil {
			return err
		}
		applied, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		if err != nil {
			return err
		}
		done := make(map[int]bool, len(applied))
		newest := 0
		for _, v := range applied {
			done[int(v)] = true
			newest = max(newest, int(v))
		}
		if err := s.checkNotNewer(newest, ms); err != nil {
			return err
		}
		changed := false
		for _, m := range ms {
			if done[m.Version] {
				continue
			}
			if _, err := tx.Exec(ctx, m.SQL); err != nil {
				return fmt.Errorf("migration %s: %w", m.Name, err)
			}
			if _, err := tx.Exec(ctx, s.q("INSERT INTO {s}schema_migrations (version, name) VALUES ($1, $2)"), m.Version, m.Name); err != nil {
				return err
			}
			changed = true
		}
		if changed {
			if _, err := tx.Exec(ctx, dropPlanFunctionsSQL); err != nil {
				return fmt.Errorf("dropping the statement functions of the schema's previous version: %w", err)
			}
		}
		return nil
	})
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "42501" { // insufficient_privilege
		// The role may not create the schema or its tables: a setup to
		// fix, not a fault of this run.
		ident := pgx.Identifier{s.cfg.Schema}.Sanitize()
		return &unavailableError{err: err, msg: fmt.Sprintf("%s: postgres: creating dagrun's tables in schema %s: %s: "+
			"let the role create them (GRANT CREATE ON DATABASE ... TO it), or have an administrator create the schema for it "+
			"(CREATE SCHEMA %s AUTHORIZATION the role)", storage.ErrUnavailable, s.cfg.Schema, pe.Message, ident)}
	}
	if err != nil {
		return fmt.Errorf("postgres: migrating schema: %w", interpretError(err))
	}
	return nil
}

// dropPlanFunctionsSQL drops the statement functions (plans.go) of the
// schema search_path names. Their names hash the schema's version, so a
// migration leaves every one of them unused by the processes of the new
// version; a process of the old one still running makes its own again
// when it finds them gone.
const dropPlanFunctionsSQL = `DO $$
DECLARE
	f regprocedure;
BEGIN
	FOR f IN SELECT p.oid::regprocedure FROM pg_proc p
		WHERE p.pronamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema()) AND p.proname LIKE 'dagrun\_plan\_%'
	LOOP
		EXECUTE 'DROP FUNCTION ' || f;
	END LOOP;
END $$`

// migrated reports whether the schema already has every migration in ms,
// as it has when a process starts beside others of the same version: a
// fleet of workers started at once then does not queue, one at a time,
// for the migration lock (20 workers waited 16 s for it in all), and the
// newest version the schema records. Any doubt, an error included (no
// schema yet), says no: the locked path decides.
func (s *Store) migrated(ctx context.Context, ms []migrate.Migration) (done bool, newest int) {
	versions := make([]int32, len(ms))
	for i, m := range ms {
		versions[i] = int32(m.Version)
	}
	var n int
	err := s.pool.QueryRow(ctx, s.q("SELECT count(*) FILTER (WHERE version = ANY($1)), coalesce(max(version), 0) FROM {s}schema_migrations"),
		versions).Scan(&n, &newest)
	if err != nil {
		return false, 0
	}
	return n == len(ms), newest
}

// checkNotNewer refuses a schema a newer dagrun migrated past this build's
// last migration, as the SQLite store refuses such a file: this build
// would misread its tables (a rolled-back deploy beside newer workers).
func (s *Store) checkNotNewer(newest int, ms []migrate.Migration) error {
	if latest := ms[len(ms)-1].Version; newest > latest {
		return fmt.Errorf("%w: PostgreSQL schema %q has dagrun's schema version %d, newer than this build of dagrun supports (%d): upgrade dagrun",
			storage.ErrUnavailable, s.cfg.Schema, newest, latest)
	}
	return nil
}

// legacyTables are the tables dagrun made before it had a schema of its
// own, each with a column that tells dagrun's apart from an application's
// table of the same name.
var legacyTables = []struct{ name, column string }{
	{"schema_migrations", "applied_at"},
	{"definitions", "workflow"},
	{"instances", "definition_hash"},
	{"steps", "lease_until"},
	{"events", "instance_id"},
}

// lastLegacyVersion is the last migration of the versions that laid their
// tables out where search_path put them. A schema whose schema_migrations
// records a later one was laid out by a version that had a schema of its
// own, run with that schema explicitly (--db-schema public): its tables
// are that store's, not an older dagrun's, and are never moved.
const lastLegacyVersion = 3

// legacyLockKey is the advisory lock older versions took to migrate their
// tables where search_path put them: taking it too keeps an older process
// from migrating them while they move, and two stores of different schemas
// from both taking them.
const legacyLockKey = "dagrun:"

// adoptLegacy moves the tables of a database laid out by an older dagrun
// (in the schema an unqualified schema_migrations resolves to, normally
// public, by a version up to lastLegacyVersion) into the store's schema,
// once: when the store's schema has no schema_migrations yet and those
// tables are dagrun's. The caller holds
// the schema's migration lock; the move is part of its transaction, so a
// concurrent store waits for it and then finds the tables in place.
// Indexes, constraints and identity sequences move with their tables.
func (s *Store) adoptLegacy(ctx context.Context, tx pgx.Tx) error {
	from, err := s.legacySchema(ctx, tx)
	if from == "" || err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1, hashtext($2))", migrateLockClass, legacyLockKey); err != nil {
		return err
	}
	// Another store may have moved them while this one waited.
	if from, err = s.legacySchema(ctx, tx); from == "" || err != nil {
		return err
	}
	for _, t := range legacyTables {
		if _, err := tx.Exec(ctx, "ALTER TABLE "+pgx.Identifier{from, t.name}.Sanitize()+" SET SCHEMA "+pgx.Identifier{s.cfg.Schema}.Sanitize()); err != nil {
			return fmt.Errorf("moving dagrun's table %s from schema %s to %s: %w", t.name, from, s.cfg.Schema, err)
		}
	}
	s.cfg.Logger.Info("postgres: moved the tables of an older dagrun into their own schema",
		"from", from, "to", s.cfg.Schema)
	return nil
}

// legacySchemaSQL finds, when the store's schema ($1) has no
// schema_migrations yet, the schema of the schema_migrations older
// versions would use (through search_path), and which of legacyTables
// ($2 names, $3 telling columns) it holds with their telling column, and
// whether that schema_migrations has all of dagrun's columns. Only
// catalogs are read, so an application's tables of the same names cannot
// make it fail.
const legacySchemaSQL = `
WITH old AS (
	SELECT n.nspname AS schema FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
	WHERE c.oid = to_regclass('schema_migrations') AND n.nspname <> $1
		AND to_regclass(quote_ident($1) || '.schema_migrations') IS NULL
)
SELECT old.schema, array_agg(t.name ORDER BY t.name) FILTER (WHERE a.attname IS NOT NULL),
	(SELECT count(*) = 3 FROM pg_attribute m
	WHERE m.attrelid = to_regclass(quote_ident(old.schema) || '.schema_migrations')
		AND m.attname IN ('version', 'name', 'applied_at') AND NOT m.attisdropped)
FROM old
CROSS JOIN unnest($2::text[], $3::text[]) AS t(name, col)
LEFT JOIN pg_attribute a ON a.attrelid = to_regclass(quote_ident(old.schema) || '.' || quote_ident(t.name))
	AND a.attname = t.col AND NOT a.attisdropped
GROUP BY old.schema`

// legacySchema returns the schema holding an older dagrun's tables, or ""
// when there is none to adopt: no schema_migrations outside the store's
// schema, or one that is not dagrun's (its columns, and migration 1 under
// dagrun's name, tell).
func (s *Store) legacySchema(ctx context.Context, tx pgx.Tx) (string, error) {
	names := make([]string, len(legacyTables))
	columns := make([]string, len(legacyTables))
	for i, t := range legacyTables {
		names[i], columns[i] = t.name, t.column
	}
	var (
		schema       string
		found        []string
		migrationsOK bool
	)
	err := tx.QueryRow(ctx, legacySchemaSQL, s.cfg.Schema, names, columns).Scan(&schema, &found, &migrationsOK)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	if err != nil || !migrationsOK {
		return "", err
	}
	ms, err := migrate.Read(migrationFS, "migrations")
	if err != nil {
		return "", err
	}
	// Compared as text, whatever the columns' types, so that an error
	// cannot abort the transaction.
	var ours bool
	var latest int64
	if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM "+pgx.Identifier{schema, "schema_migrations"}.Sanitize()+
		" WHERE version::text = '1' AND name::text = $1), (SELECT coalesce(max(version::text::bigint), 0) FROM "+
		pgx.Identifier{schema, "schema_migrations"}.Sanitize()+")", ms[0].Name).Scan(&ours, &latest); err != nil || !ours {
		return "", err
	}
	if latest > lastLegacyVersion {
		s.cfg.Logger.Warn("postgres: another schema holds the tables of a dagrun run with that schema; this store leaves them, and has its own",
			"their_schema", schema, "this_schema", s.cfg.Schema, "to_use_them", "--db-schema "+schema)
		return "", nil
	}
	if len(found) < len(legacyTables) {
		return "", fmt.Errorf("schema %s holds dagrun's schema_migrations but only %d of its %d tables (%s): "+
			"restore the others, or drop %s.schema_migrations if this database no longer serves dagrun",
			schema, len(found), len(legacyTables), strings.Join(found, ", "), schema)
	}
	return schema, nil
}
