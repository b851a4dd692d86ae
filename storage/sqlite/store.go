package sqlite

import (
	"cmp"
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mattn/go-sqlite3"

	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/internal/lookahead"
)

var (
	_ storage.Store         = (*Store)(nil)
	_ storage.FinishClaimer = (*Store)(nil)
	_ storage.CreateClaimer = (*Store)(nil)
	_ storage.WakeClaimer   = (*Store)(nil)
)

// Defaults of Config.
const (
	BusyTimeoutDefault = 10 * time.Second
	ReadConnsDefault   = 4
)

// busySlice is how long one attempt to take the write lock waits in
// SQLite's own busy handler, which nothing interrupts; between slices a
// write checks its context, so a signal ends a wait for the lock at once.
const busySlice = 200 * time.Millisecond

// Config tunes a Store. The zero value, and a nil *Config, mean defaults.
type Config struct {
	// Now returns the current time; every time the store writes comes from
	// it. Default: time.Now. Tests inject a fake clock.
	Now func() time.Time
	// BusyTimeout is how long a connection opened by Open waits for another
	// process's write lock before failing. Default: 10s.
	BusyTimeout time.Duration
	// ReadConns caps the read-only pool opened by Open. Default: 4.
	ReadConns int
}

// WithDefaults returns a copy of c with every unset field defaulted.
func (c *Config) WithDefaults() *Config {
	if c == nil {
		c = &Config{}
	}
	out := *c
	if out.Now == nil {
		out.Now = time.Now
	}
	out.BusyTimeout = cmp.Or(out.BusyTimeout, BusyTimeoutDefault)
	out.ReadConns = cmp.Or(out.ReadConns, ReadConnsDefault)
	return &out
}

func (c *Config) validate() error {
	if c.BusyTimeout < 0 {
		return errors.New("sqlite: Config.BusyTimeout must not be negative")
	}
	if c.ReadConns < 0 {
		return errors.New("sqlite: Config.ReadConns must not be negative")
	}
	return nil
}

// Store is the SQLite implementation of storage.Store.
type Store struct {
	w   *sql.DB // writes: one connection, BEGIN IMMEDIATE
	r   *sql.DB // reads; the same pool as w when built by New in memory
	own bool    // Close closes w and r
	// ownReads is set when the store opened r itself on the file of a
	// caller's pool (New): Close closes r alone.
	ownReads bool
	name     string // the file, for error messages
	now      func() time.Time
	// busy is how long a write waits for the lock in busySlice attempts;
	// zero for a pool from New, whose own busy timeout applies.
	busy time.Duration

	mu   sync.Mutex
	subs map[chan struct{}]struct{}
	// checkpoints copies the write-ahead log into the database off the
	// writer (see checkpoint.go); nil for a pool from New or in memory.
	checkpoints *checkpointer

	// watch turns other processes' commits into signals while anyone
	// subscribes; nil otherwise.
	watch *watcher
	// watchers counts the watchers still running, stopped ones included:
	// one stopped when its last subscriber left may still be looking.
	watchers sync.WaitGroup

	// file is the database file as first opened, to notice when the path
	// names another file (deleted, or replaced by a copy) while this
	// process still writes to the old one; nil for an in-memory database.
	file os.FileInfo
	path string
	// sidecars are the file's -wal and -shm files as first opened (nil
	// when one did not exist then): once the file is replaced, they are
	// the lost database's, and Close removes them if the path still
	// names them (see removeLostSidecars).
	sidecars map[string]os.FileInfo
	// hadHeader is set once the file was seen holding a database header;
	// a file that shrinks below one afterwards was truncated under us.
	hadHeader atomic.Bool
	// lost, once set, is returned by every later call: a database lost
	// stays lost.
	lost atomic.Pointer[error]

	// snaps are the snapshots finishes plan from (see snapshots.go); nil
	// for a pool from New.
	snaps *snapshotCache
	// heads tells claims whether to read past other handlers' steps (see
	// readsHeads); headClaims counts the claims that did.
	heads      lookahead.Verdicts
	headClaims atomic.Int64
}

// DSN returns the data source name for the SQLite file at path with the
// settings dagrun needs: every transaction BEGIN IMMEDIATE, WAL, a busy
// timeout, synchronous=NORMAL, foreign keys on, and no mutex per
// connection (database/sql never uses one from two goroutines at once).
// Open a pool with sql.Open("sqlite3", DSN(path)) to pass it to New, or to
// begin transactions of your own for CreateInstances.
func DSN(path string) string {
	return dsn(path, BusyTimeoutDefault, openMode{})
}

// openMode is how a pool of the store opens its connections.
type openMode struct {
	// readOnly connections take no write lock and write nothing.
	readOnly bool
	// existing connections open a file that exists already, read-write,
	// and never create it (the file: URI's mode=rw). The pools a store
	// opens once its file exists use it, so that a connection they open
	// after the file was deleted fails instead of making a new, empty
	// database at the path: the first connection to that one rebuilds the
	// shared-memory index (-shm) that the connections to the deleted file
	// still have mapped, and they die of SIGBUS at their next read instead
	// of reporting the database lost.
	existing bool
}

func dsn(path string, busy time.Duration, mode openMode) string {
	q := url.Values{}
	q.Set("_busy_timeout", strconv.FormatInt(busy.Milliseconds(), 10))
	q.Set("_journal_mode", "WAL")
	q.Set("_synchronous", "NORMAL")
	q.Set("_foreign_keys", "on")
	// The driver keeps prepared statements per connection, so the hot
	// statements are parsed once per connection instead of once per call.
	q.Set("_stmt_cache_size", "64")
	// database/sql uses a connection from one goroutine at a time, so
	// SQLite need not lock it at each call (SQLITE_OPEN_NOMUTEX; its
	// interrupt, which the driver sends from another goroutine when a
	// context ends, takes no lock in any mode). See library.go.
	q.Set("_mutex", "no")
	if mode.readOnly {
		q.Set("_query_only", "on")
		q.Set("_txlock", "deferred")
	} else {
		q.Set("_txlock", "immediate")
	}
	if mode.existing {
		q.Set("mode", "rw") // SQLite's own, read from file: URIs only
	}
	if mode.existing || strings.ContainsAny(path, "?#%") {
		// The driver cuts a plain path at its first "?"; as a file: URI
		// the path is escaped and SQLite reads it whole.
		path = "file:" + (&url.URL{Path: path}).EscapedPath()
	}
	return path + "?" + q.Encode()
}

// Open opens (creating if needed) the SQLite file at path, migrates it, and
// returns a Store that owns its pools: Close closes them.
func Open(ctx context.Context, path string, cfg *Config) (*Store, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if path == "" {
		return nil, errors.New("sqlite: empty database path")
	}
	if err := checkPath(path); err != nil {
		return nil, err
	}
	w, err := sql.Open("sqlite3", dsn(path, min(cfg.BusyTimeout, busySlice), openMode{}))
	if err != nil {
		return nil, interpretError(path, err)
	}
	// One writer: SQLite serialises writers anyway, and queuing them in the
	// pool is cheaper than queuing them on the file lock.
	w.SetMaxOpenConns(1)
	w.SetMaxIdleConns(1)
	w.SetConnMaxLifetime(0)
	w.SetConnMaxIdleTime(0)
	if err := connectWhenFree(ctx, w, cfg.BusyTimeout); err != nil {
		_ = w.Close()
		return nil, interpretError(path, err)
	}
	s := &Store{w: w, r: w, own: true, name: path, now: cfg.Now, busy: cfg.BusyTimeout, snaps: &snapshotCache{}}
	if err := s.migrate(ctx); err != nil {
		_ = w.Close()
		return nil, err
	}
	if err := s.rememberFile(ctx); err != nil {
		_ = w.Close()
		return nil, err
	}
	if s.file == nil {
		// In memory (":memory:"): each connection has a database of its
		// own, so the reads share the writer's one connection.
		return s, nil
	}
	r, err := sql.Open("sqlite3", dsn(path, cfg.BusyTimeout, openMode{readOnly: true, existing: true}))
	if err != nil {
		_ = w.Close()
		return nil, interpretError(path, err)
	}
	r.SetMaxOpenConns(cfg.ReadConns)
	r.SetMaxIdleConns(cfg.ReadConns)
	s.r = r
	// Marked now rather than at its first finish (writerMark): setting
	// the mark expires every statement the connection has prepared.
	if _, err := w.ExecContext(ctx, "PRAGMA temp.user_version = "+strconv.FormatInt(newWriterMark(), 10)); err != nil {
		_ = errors.Join(r.Close(), w.Close())
		return nil, interpretError(path, err)
	}
	if s.file != nil {
		// See checkpoint.go. Should the writer's connection be replaced,
		// the new one checkpoints at SQLite's default, as before.
		if _, err := w.ExecContext(ctx, fmt.Sprintf("PRAGMA wal_autocheckpoint = %d", writerCheckpointPages)); err != nil {
			_ = errors.Join(r.Close(), w.Close())
			return nil, interpretError(path, err)
		}
		if s.checkpoints, err = openCheckpointer(path, cfg.BusyTimeout, s.checkFile); err != nil {
			_ = errors.Join(r.Close(), w.Close())
			return nil, interpretError(path, err)
		}
	}
	return s, nil
}

// New returns a Store on db, a pool the caller opened with DSN and keeps
// owning (Close does not close it, but closes the read-only pool the
// store opens on the same file for its reads), and migrates the schema. It refuses a
// pool with foreign keys off, which would let prune leave steps and events
// behind, and a pool on a file without WAL, without a busy timeout, or
// whose transactions begin DEFERRED: its readers would wait for its
// writers, and its writes would fail at once when another process writes.
// For speed, set db.SetMaxOpenConns(1): writers are serialised by SQLite
// anyway.
func New(db *sql.DB, cfg *Config) (*Store, error) {
	if db == nil {
		return nil, errors.New("sqlite: New: nil *sql.DB")
	}
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if err := connectWhenFree(context.Background(), db, cfg.BusyTimeout); err != nil {
		return nil, interpretError("database", err)
	}
	s := &Store{w: db, r: db, name: "database", now: cfg.Now}
	if err := s.rememberFile(context.Background()); err != nil {
		return nil, err
	}
	if s.file == nil && db.Stats().MaxOpenConnections != 1 {
		return nil, errors.New("sqlite: New: the pool is in memory, where each connection has a database of its own: call db.SetMaxOpenConns(1) first")
	}
	if err := checkPool(db, s.file != nil); err != nil {
		return nil, err
	}
	if s.file != nil {
		if err := checkImmediate(db, s.path); err != nil {
			return nil, err
		}
		s.name = s.path
	}
	if err := s.migrate(context.Background()); err != nil {
		return nil, err
	}
	if s.file != nil {
		// Reads on a pool of their own: on the caller's, whose
		// transactions all begin IMMEDIATE, each would wait for the write
		// lock, held meanwhile by any transaction the caller has open
		// (one it passes to StartTx, say).
		r, err := sql.Open("sqlite3", dsn(s.path, cfg.BusyTimeout, openMode{readOnly: true, existing: true}))
		if err != nil {
			return nil, interpretError(s.path, err)
		}
		r.SetMaxOpenConns(cfg.ReadConns)
		r.SetMaxIdleConns(cfg.ReadConns)
		s.r, s.ownReads = r, true
	}
	return s, nil
}

// checkPool refuses a pool without the settings of DSN that the store
// relies on (see New): foreign keys, through which prune deletes an
// instance's steps and events, and, for a file (an in-memory database has
// neither), WAL and a busy timeout.
func checkPool(db *sql.DB, onFile bool) error {
	var (
		foreignKeys bool
		journal     string
		busyMS      int
	)
	if err := db.QueryRow(`SELECT (SELECT foreign_keys FROM pragma_foreign_keys), (SELECT journal_mode FROM pragma_journal_mode),
		(SELECT timeout FROM pragma_busy_timeout)`).Scan(&foreignKeys, &journal, &busyMS); err != nil {
		return interpretError("database", err)
	}
	switch {
	case !foreignKeys:
		return errors.New(`sqlite: New: the pool has foreign keys off: open it with sql.Open("sqlite3", sqlite.DSN(path)), or add _foreign_keys=on to its DSN`)
	case !onFile:
		return nil
	case !strings.EqualFold(journal, "wal"):
		return fmt.Errorf(`sqlite: New: the pool's journal mode is %s, not WAL: open it with sql.Open("sqlite3", sqlite.DSN(path)), or add _journal_mode=WAL to its DSN`, journal)
	case busyMS <= 0:
		return errors.New(`sqlite: New: the pool has no busy timeout, so a write fails at once while another process writes: open it with sql.Open("sqlite3", sqlite.DSN(path)), or add _busy_timeout=5000 to its DSN`)
	}
	return nil
}

// checkImmediate refuses a pool whose transactions begin DEFERRED (the
// driver's default without DSN's _txlock=immediate). Such a transaction
// reads before it takes the write lock, and when another process commits
// in between, its first write fails with SQLITE_BUSY at once: the busy
// timeout cannot help a transaction whose snapshot is already stale. The
// pool's own settings do not show the mode, so a transaction of the pool
// is begun and a connection of its own tries to take the write lock: it
// cannot while an IMMEDIATE transaction holds it. Another process writing
// at that moment makes the pool pass: it is never refused wrongly.
func checkImmediate(db *sql.DB, path string) error {
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return interpretError("database", err)
	}
	defer func() { _ = tx.Rollback() }()
	probe, err := sql.Open("sqlite3", dsn(path, 0, openMode{existing: true}))
	if err != nil {
		return err
	}
	defer probe.Close()
	writer, err := probe.BeginTx(ctx, nil) // BEGIN IMMEDIATE, not waiting
	if err != nil {
		return nil // the pool's transaction holds the write lock, or another process does
	}
	_ = writer.Rollback()
	return errors.New(`sqlite: New: the pool's transactions begin DEFERRED, so a write fails at once when another process wrote since it read: open it with sql.Open("sqlite3", sqlite.DSN(path)), or add _txlock=immediate to its DSN`)
}

// Close closes the pools Open opened; it does nothing for a Store from New.
func (s *Store) Close() error {
	if !s.own {
		if s.ownReads {
			return s.r.Close()
		}
		return nil
	}
	s.mu.Lock()
	s.stopWatchLocked()
	s.mu.Unlock()
	s.watchers.Wait()
	if s.isLost() {
		keepWALOnClose(s.r)
		keepWALOnClose(s.w)
		if s.checkpoints != nil {
			keepWALOnClose(s.checkpoints.conn)
		}
	}
	var checkpoints error
	if s.checkpoints != nil {
		checkpoints = s.checkpoints.close()
	}
	err := errors.Join(checkpoints, s.r.Close(), s.w.Close())
	s.removeLostSidecars()
	return err
}

// isLost reports whether the store found its file deleted or replaced.
func (s *Store) isLost() bool {
	lost := s.lost.Load()
	return lost != nil && errors.Is(*lost, storage.ErrDatabaseLost)
}

// keepWALOnClose tells each of pool's connections to leave the -wal file
// where it is when it closes. The last connection to close deletes the
// -wal its path names, and once the database file was replaced that may
// be another process's WAL for the new file: removeLostSidecars removes
// only this store's own.
func keepWALOnClose(pool *sql.DB) {
	ctx := context.Background()
	var held []*sql.Conn
	for range pool.Stats().OpenConnections {
		conn, err := pool.Conn(ctx)
		if err != nil {
			break
		}
		held = append(held, conn)
		_ = conn.Raw(func(driverConn any) error {
			if c, ok := driverConn.(*sqlite3.SQLiteConn); ok {
				return c.SetFileControlInt("main", sqlite3.SQLITE_FCNTL_PERSIST_WAL, 1)
			}
			return nil
		})
	}
	for _, conn := range held {
		_ = conn.Close()
	}
}

// removeLostSidecars removes, once the database file was deleted or
// replaced under the store, the -wal and -shm files its path still names
// if they are the ones the store opened with the lost file: left there,
// the next process to open a file restored at the path would replay the
// lost database's WAL into it, and corrupt it. A -wal or -shm that
// another process made for the new file is another file, and stays.
func (s *Store) removeLostSidecars() {
	if !s.isLost() || s.file == nil {
		return
	}
	if fi, err := os.Stat(s.path); err == nil && os.SameFile(fi, s.file) {
		return // the file is still there (truncated or corrupted): its WAL is its own
	}
	for suffix, opened := range s.sidecars {
		if fi, err := os.Stat(s.path + suffix); err == nil && os.SameFile(fi, opened) {
			_ = os.Remove(s.path + suffix)
		}
	}
}

// Subscribe returns a channel that receives a value after this process
// commits a change that may have made steps ready, and, for a store from
// Open, within milliseconds of another process committing anything (see
// watchDataVersion; a store from New cannot pin a connection of the
// caller's pool to watch, and relies on polling for other processes).
// Signals coalesce: the channel holds at most one. cancel stops the
// signals; the channel is not closed, so a receiver never mistakes
// cancellation for a signal. Every subscriber hears of every change,
// whatever its queues: a change of the file does not say which queues it
// made ready.
func (s *Store) Subscribe([]string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	s.mu.Lock()
	if s.subs == nil {
		s.subs = make(map[chan struct{}]struct{})
	}
	s.subs[ch] = struct{}{}
	w := s.startWatchLocked()
	s.mu.Unlock()
	if w != nil {
		// A commit made after Subscribe returns must differ from the
		// version the watcher compares with.
		<-w.ready
	}
	var once sync.Once
	return ch, func() {
		once.Do(func() {
			s.mu.Lock()
			delete(s.subs, ch)
			if len(s.subs) == 0 {
				s.stopWatchLocked()
			}
			s.mu.Unlock()
		})
	}
}

func (s *Store) notify() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for ch := range s.subs {
		select {
		case ch <- struct{}{}:
		default: // a signal is already pending; coalesce
		}
	}
}

// checkPath refuses a path SQLite could open but not use as a database,
// a folder or a device, whose errors ("unable to open database file",
// "disk I/O error") say nothing of what is wrong.
func checkPath(path string) error {
	if path == ":memory:" || strings.HasPrefix(path, "file:") {
		return nil
	}
	fi, err := os.Stat(path)
	switch {
	case err != nil:
		return nil // a new file, or a problem SQLite reports in its terms
	case fi.IsDir():
		return fmt.Errorf("%w: SQLite database %q is a folder: name a file, such as %s", storage.ErrUnavailable, path, filepath.Join(path, "dagrun.db"))
	case !fi.Mode().IsRegular():
		return fmt.Errorf("%w: SQLite database %q is not a regular file (%s): name a file", storage.ErrUnavailable, path, fileKind(fi.Mode()))
	case hardLinks(fi) > 1:
		// SQLite finds a database's -wal and -shm files by its name: a
		// process that opens it by another name has a log of its own,
		// and the two write over each other's pages.
		return fmt.Errorf("%w: SQLite database %q has %d hard links, and processes that open it by different names corrupt it: keep one name (a symbolic link is safe)", storage.ErrUnavailable, path, hardLinks(fi))
	}
	return nil
}

// fileKind names the kind of a file that is neither regular nor a folder.
func fileKind(mode os.FileMode) string {
	switch {
	case mode&os.ModeCharDevice != 0:
		return "a character device"
	case mode&os.ModeDevice != 0:
		return "a device"
	case mode&os.ModeNamedPipe != 0:
		return "a named pipe"
	case mode&os.ModeSocket != 0:
		return "a socket"
	}
	return "of type " + mode.Type().String()
}

// rememberFile records which file the store opened, as SQLite names it.
func (s *Store) rememberFile(ctx context.Context) error {
	var path string
	if err := s.w.QueryRowContext(ctx, `SELECT file FROM pragma_database_list WHERE name = 'main'`).Scan(&path); err != nil {
		return s.fail("open", err)
	}
	if path == "" {
		return nil // in memory: there is no file to lose
	}
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("%w: cannot read SQLite database %q: %v", storage.ErrUnavailable, s.name, err)
	}
	s.path, s.file = path, fi
	s.sidecars = map[string]os.FileInfo{}
	for _, suffix := range []string{"-wal", "-shm"} {
		if fi, err := os.Stat(path + suffix); err == nil {
			s.sidecars[suffix] = fi
		}
	}
	s.hadHeader.Store(fi.Size() >= sqliteHeaderBytes)
	return nil
}

// sqliteHeaderBytes is the size of the header every SQLite database file
// starts with once anything was written to it (in WAL mode a new file may
// be empty until the first checkpoint). No checkpoint or vacuum makes a
// database file shorter than its header again.
const sqliteHeaderBytes = 100

// checkFile reports the database lost when its path no longer names the
// file this store opened, or when that file shrank below a database
// header. SQLite does not notice either at once: it writes on into a
// deleted file, which no other process sees, while a new process creates a
// fresh file at the path; and its page cache can answer without reading a
// truncated file.
func (s *Store) checkFile() error {
	if lost := s.lost.Load(); lost != nil {
		return *lost
	}
	if s.file == nil {
		return nil
	}
	fi, err := os.Stat(s.path)
	switch {
	case errors.Is(err, os.ErrNotExist), err == nil && !os.SameFile(fi, s.file):
		return s.markLost(fmt.Errorf("%w: SQLite database %q was deleted or replaced while this process had it open: "+
			"stop every dagrun process using it, then restore the file from a backup or start afresh, "+
			"with no %s-wal or %s-shm of the lost database left beside it", storage.ErrDatabaseLost, s.name, s.name, s.name))
	case err != nil:
		return nil // a passing stat failure proves nothing; SQLite reports its own
	case fi.Size() >= sqliteHeaderBytes:
		s.hadHeader.Store(true)
	case s.hadHeader.Load():
		return s.markLost(s.damaged())
	}
	return nil
}

// damaged is the error of a file damaged under the store.
func (s *Store) damaged() error {
	return fmt.Errorf("%w: SQLite database %q was truncated, overwritten or corrupted while this process had it open: "+
		"stop every dagrun process using it, then restore the file from a backup", storage.ErrDatabaseLost, s.name)
}

// markLost makes err the answer to every later call and returns it.
func (s *Store) markLost(err error) error {
	s.lost.CompareAndSwap(nil, &err)
	return *s.lost.Load()
}

// write runs fn in one BEGIN IMMEDIATE transaction on the writer and commits.
func (s *Store) write(ctx context.Context, op string, fn func(t *txn) error) error {
	if err := s.checkFile(); err != nil {
		return err
	}
	tx, err := s.beginWrite(ctx)
	if err != nil {
		return s.fail(op, err)
	}
	storage.AttemptStarted(ctx)
	// Every write empties the snapshot cache; only a finish that commits
	// fills it again (see snapshots.go).
	t := &txn{ctx: ctx, tx: tx.conn, now: s.now(), prior: s.snaps.take(), heads: &s.heads, headClaims: &s.headClaims}
	if err := fn(t); err != nil {
		tx.rollback()
		return s.fail(op, err)
	}
	if err := t.flushEvents(); err != nil {
		tx.rollback()
		return s.fail(op, err)
	}
	if err := tx.commit(ctx); err != nil {
		return s.fail(op, err)
	}
	s.snaps.put(t.kept)
	if s.checkpoints != nil {
		s.checkpoints.kick()
	}
	return nil
}

// beginWrite begins a BEGIN IMMEDIATE transaction, waiting for another
// process's write lock for up to the busy timeout, one busySlice at a time
// so that the wait ends as soon as ctx does.
func (s *Store) beginWrite(ctx context.Context) (*writeTx, error) {
	conn, err := s.w.Conn(ctx)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(s.busy)
	for {
		_, err := conn.ExecContext(context.WithoutCancel(ctx), "BEGIN IMMEDIATE")
		var se sqlite3.Error
		if err == nil || !errors.As(err, &se) || se.Code != sqlite3.ErrBusy || ctx.Err() != nil || !time.Now().Before(deadline) {
			if err != nil {
				_ = conn.Close()
				if ctx.Err() != nil {
					return nil, ctx.Err()
				}
				return nil, err
			}
			return &writeTx{conn: conn}, nil
		}
	}
}

// connectWhenFree opens db's first connection, trying again while the file
// is busy, for up to busy. A connection switches a new file to WAL
// (dsn's journal mode) as it opens, reading it first: when another
// process holds the file's write lock meanwhile (it is switching the file
// too, or migrating it), SQLite refuses at once rather than wait in its
// busy handler, which could deadlock the two, so two processes started
// together on a new file failed with "database is locked".
func connectWhenFree(ctx context.Context, db *sql.DB, busy time.Duration) error {
	deadline := time.Now().Add(busy)
	for {
		err := db.PingContext(ctx)
		var se sqlite3.Error
		if err == nil || !errors.As(err, &se) || se.Code != sqlite3.ErrBusy || !time.Now().Before(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// querier runs a transaction's statements: the writer's connection inside
// its BEGIN IMMEDIATE (writeTx), or a caller's *sql.Tx.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// writeTx is a write transaction begun and ended by statements on the
// writer's connection rather than a *sql.Tx: database/sql starts a
// goroutine for every Tx, and one more for every query of it, to watch the
// Tx's context; a writer's transaction ends only when the call ends it,
// always before the call returns, so nothing needs watching. Statements
// still stop when their own context ends.
type writeTx struct {
	conn *sql.Conn
}

// commit commits unless ctx ended meanwhile, and returns the connection
// to its pool.
func (t *writeTx) commit(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		t.rollback()
		return err
	}
	if _, err := t.conn.ExecContext(context.WithoutCancel(ctx), "COMMIT"); err != nil {
		t.rollback()
		return err
	}
	return t.conn.Close()
}

// rollback rolls back and returns the connection to its pool. When the
// ROLLBACK fails, the connection goes back only if SQLite left no
// transaction open (it rolls back by itself on some errors, a full disk or
// an interrupted statement); otherwise it is closed, so that no later
// write finds a transaction open.
func (t *writeTx) rollback() {
	if _, err := t.conn.ExecContext(context.Background(), "ROLLBACK"); err != nil {
		_ = t.conn.Raw(func(dc any) error {
			if c, ok := dc.(*sqlite3.SQLiteConn); ok && c.AutoCommit() {
				return nil
			}
			return driver.ErrBadConn
		})
	}
	_ = t.conn.Close()
}

// read runs fn in one read transaction on the read pool, so its queries see
// one snapshot.
func (s *Store) read(ctx context.Context, op string, fn func(tx *sql.Tx) error) error {
	if err := s.checkFile(); err != nil {
		return err
	}
	tx, err := begin(ctx, s.r, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return s.fail(op, err)
	}
	defer tx.rollback()
	if err := fn(tx.Tx); err != nil {
		return s.fail(op, err)
	}
	return nil
}

// connTx is a read transaction on a connection taken from a pool for it
// alone (writes are writeTx). database/sql rolls a transaction back when the context it was begun with
// ends, but on a goroutine of its own, which returns the connection after
// the call that began it has returned: Close, which does not wait for
// connections in use, then returned while SQLite still had the file open
// (a test's folder could not be removed after it). A connTx is begun
// without ctx's end, so it ends only when the call ends it, and always
// before the call returns; its statements still stop when ctx ends.
type connTx struct {
	*sql.Tx
	conn *sql.Conn
}

// begin takes a connection of db, waiting for it no longer than ctx
// allows, and begins a transaction on it.
func begin(ctx context.Context, db *sql.DB, opts *sql.TxOptions) (*connTx, error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	tx, err := conn.BeginTx(context.WithoutCancel(ctx), opts)
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	return &connTx{Tx: tx, conn: conn}, nil
}

// rollback rolls back, if the transaction is still open, and returns the
// connection to its pool.
func (t *connTx) rollback() {
	_ = t.Tx.Rollback()
	_ = t.conn.Close()
}

// fail prefixes err with the operation and translates it at the boundary.
// Once the store is open, a file that reads as corrupt or as no database at
// all was damaged under it: the database is lost.
func (s *Store) fail(op string, err error) error {
	var se sqlite3.Error
	if s.file != nil && errors.As(err, &se) && (se.Code == sqlite3.ErrCorrupt || se.Code == sqlite3.ErrNotADB) {
		// A file truncated, deleted or replaced under the store reads as
		// corrupt too when a query reaches it before the file check
		// does: that check names what happened.
		if lost := s.checkFile(); lost != nil {
			return lost
		}
		// Damage in pages the open did not read may be older than this
		// process: the message does not say when it came.
		return s.markLost(fmt.Errorf("%w: SQLite database %q is corrupt, or was overwritten while this process had it open: "+
			"stop every dagrun process using it, then restore the file from a backup", storage.ErrDatabaseLost, s.name))
	}
	err = interpretError(s.name, err)
	if errors.Is(err, storage.ErrUnavailable) {
		return err // already one complete line
	}
	return fmt.Errorf("sqlite: %s: %w", op, err)
}

// interpretError turns driver errors into storage sentinels.
func interpretError(name string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, sql.ErrNoRows) {
		return storage.ErrNotFound
	}
	var se sqlite3.Error
	if errors.As(err, &se) {
		switch se.Code {
		case sqlite3.ErrCantOpen:
			return fmt.Errorf("%w: cannot open SQLite database %q: check that its folder exists and is writable", storage.ErrUnavailable, name)
		case sqlite3.ErrNotADB:
			return fmt.Errorf("%w: %q is not a SQLite database: point the database path at a dagrun database or a new file", storage.ErrUnavailable, name)
		case sqlite3.ErrPerm, sqlite3.ErrReadonly:
			return fmt.Errorf("%w: SQLite database %q is not writable: fix its permissions (and those of its -wal and -shm files)", storage.ErrUnavailable, name)
		case sqlite3.ErrCorrupt:
			return fmt.Errorf("%w: SQLite database %q is corrupt: restore it from a backup", storage.ErrUnavailable, name)
		case sqlite3.ErrFull:
			return fmt.Errorf("%w: disk full writing SQLite database %q", storage.ErrUnavailable, name)
		case sqlite3.ErrBusy, sqlite3.ErrLocked:
			return fmt.Errorf("%w: SQLite database %q is locked: a transaction held its write lock for longer than the busy timeout; "+
				"try again, and if it persists find the process holding the file (fuser %s), or a transaction of this one left open", storage.ErrUnavailable, name, name)
		}
	}
	return err
}
