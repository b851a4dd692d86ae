// Package sqlite is the embedded dagrun storage backend: one SQLite file,
// zero setup, safe for several processes on the same file.
//
// Every write is one BEGIN IMMEDIATE transaction on a single writer
// connection: the write lock is taken up front, so a transaction never
// starts as a reader and then fails to upgrade (SQLITE_BUSY_SNAPSHOT, which
// busy_timeout cannot help), and other processes wait on busy_timeout instead
// of surfacing "database is locked". Reads that need no lock (GetInstance,
// ListInstances, Stats) use a separate read-only pool, which WAL lets run
// alongside the writer.
//
// Use Open for a file path. New takes a pool the caller opened; that pool must
// use the DSN built by DSN (it sets _txlock=immediate, WAL, busy_timeout,
// synchronous=NORMAL, foreign keys, and connections without a mutex of
// their own, which database/sql never shares between goroutines at once),
// and so must the pool behind a caller's own transaction passed to
// CreateInstances.
//
// Readiness is broadcast in-process by Subscribe after commits; other
// processes on the same file see new work through the worker's polling.
//
// A write waits for another process's lock up to the busy timeout, in short
// slices so that its context can end the wait; past the timeout it fails
// as storage.ErrUnavailable, saying the file is locked. Before each
// transaction the store checks that its path still names the file it
// opened, at least a database header long: a file deleted, replaced,
// truncated or corrupted under it is storage.ErrDatabaseLost from then on,
// since SQLite itself would write on into a file no other process sees.
//
// Leases, run-after, ready and event times come from this machine's clock,
// read in Go (Config.Now, time.Now by default). Every process sharing the
// file runs on this one machine (SQLite's locking does not hold across a
// network file system), so they all share that clock and agree on when a
// lease ends; there is no other clock to prefer, unlike PostgreSQL's
// server's.
//
// It may import only storage, storage/internal, the standard library and
// the mattn/go-sqlite3 driver.
package sqlite
