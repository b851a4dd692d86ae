// Package pgtest drops or reuses the PostgreSQL schemas that tests make in
// one shared database, and keeps that database's system catalogs from
// bloating as they come and go.
//
// Every schema a test migrates and drops leaves a few thousand dead rows in
// pg_attribute, pg_class, pg_depend and the other catalogs. Autovacuum
// clears them on a default server, but a test server may run without it
// (the CI machines do), and then every catalog read slows as a run goes on:
// the storage conformance suite took 92 s of CPU with the dead rows of a
// few hundred schemas in the catalogs against 54 s with none. So every few
// drops one of them vacuums the catalogs, which takes milliseconds when
// done often.
package pgtest

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Execer runs a statement: a *pgx.Conn or a *pgxpool.Pool.
type Execer interface {
	Exec(ctx context.Context, sql string, arguments ...any) (pgconn.CommandTag, error)
}

// vacuumEvery is how many schema drops in a process go between two vacuums
// of the catalogs.
const vacuumEvery = 16

// VacuumCatalogsSQL vacuums the catalogs that creating and dropping
// schemas of tables, indexes, functions and triggers fills with dead rows.
const VacuumCatalogsSQL = `VACUUM pg_catalog.pg_attribute, pg_catalog.pg_class, pg_catalog.pg_depend,
	pg_catalog.pg_attrdef, pg_catalog.pg_index, pg_catalog.pg_proc, pg_catalog.pg_type,
	pg_catalog.pg_trigger, pg_catalog.pg_constraint, pg_catalog.pg_sequence, pg_catalog.pg_namespace`

var drops atomic.Int64

// DropSchema drops schema and everything in it, and every vacuumEvery-th
// call in the process vacuums the catalogs.
func DropSchema(ctx context.Context, db Execer, schema string) error {
	if _, err := db.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
		return fmt.Errorf("dropping schema %s: %w", schema, err)
	}
	if drops.Add(1)%vacuumEvery != 0 {
		return nil
	}
	if _, err := db.Exec(ctx, VacuumCatalogsSQL); err != nil {
		return fmt.Errorf("vacuuming the catalogs after dropping schema %s: %w", schema, err)
	}
	return nil
}
