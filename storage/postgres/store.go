// Package postgres is the PostgreSQL backend of dagrun's storage.Store, built
// on pgx/v5 and a pgxpool.Pool, for many workers on many machines.
//
// Claims use FOR UPDATE SKIP LOCKED in one short statement; every transition
// that may promote, fail or cancel steps of an instance first locks that
// instance row (in sorted id order), so two siblings finishing at once in
// separate transactions serialize and a fan-in join is promoted exactly once.
// Commits that make steps ready send one pg_notify on the store's channel,
// which a single listener connection per Store turns into Subscribe signals
// for idle workers; polling stays the fallback. The listener listens only
// while one of the store's claimers waits for work, so a fleet whose
// workers are all busy is not woken by every commit, and it holds its
// connection only while they may wait: a worker that has had work since it
// started holds none.
//
// Every lease, run-after, ready time and event time comes from the
// database server's clock, read inside the statements that write them, so
// that workers on machines whose clocks disagree still agree on when a
// lease ends (Config.Now replaces it in tests). Store.Now reads that clock,
// for a worker to compare with its own.
//
// dagrun's tables live in a schema of their own, "dagrun" unless
// Config.Schema or the URL's dagrun_schema parameter names another, so they
// never meet an application's tables of the same names. Every statement
// names the schema, so no connection needs a search_path (which
// transaction-pooling proxies such as pgbouncer would not keep). The schema
// is versioned (migrations/NNNN_name.sql, embedded) and migrated at
// construction under an advisory lock, so concurrent processes migrate
// once; a database laid out by a dagrun older than schemas of their own,
// with its tables in public, is moved into the schema then.
//
// It may import only storage, storage/internal/migrate, the standard library,
// and pgx.
package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math/rand/v2"
	neturl "net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/internal/lookahead"
)

var (
	_ storage.Store         = (*Store)(nil)
	_ storage.FinishClaimer = (*Store)(nil)
	_ storage.CreateClaimer = (*Store)(nil)
	_ storage.WakeClaimer   = (*Store)(nil)
	_ storage.Clock         = (*Store)(nil)
)

// Defaults of Config fields left zero.
const (
	DefaultMaxConns         = 10
	DefaultApplicationName  = "dagrun"
	DefaultStatementTimeout = 30 * time.Second
	// DefaultSchema holds dagrun's tables when neither Config.Schema nor
	// the URL names a schema.
	DefaultSchema = "dagrun"
	// ChannelPrefix begins the NOTIFY channel of a schema: the channel is
	// ChannelPrefix + "." + schema (or a hash of a long schema name), so
	// stores in different schemas of one database do not wake each other.
	ChannelPrefix = "dagrun_ready"
	// SchemaParam is the URL query parameter (or DSN keyword) that names
	// the schema. Open removes it before connecting: the server never
	// sees it.
	SchemaParam = "dagrun_schema"
	// PgBouncerParam is the URL query parameter (or DSN keyword) that
	// says the URL leads to PgBouncer in transaction-pooling mode
	// (pgbouncer=true): see Config.PgBouncer. Open removes it before
	// connecting.
	PgBouncerParam = "pgbouncer"
)

// Config configures a Store. The zero value (or a nil *Config) is valid.
type Config struct {
	// Schema is the schema holding dagrun's tables, created at migration if
	// missing. Every statement names it explicitly, so the pool given to
	// New and a caller's transaction given to CreateInstances need no
	// search_path. Default "dagrun" (DefaultSchema), or the URL's
	// dagrun_schema parameter; set here, it wins over the URL.
	Schema string

	// MaxConns is the size of the pool Open builds. Default 10, or the
	// URL's pool_max_conns when it has one; set here, it wins over the URL.
	// New uses the pool as configured.
	MaxConns int32

	// ApplicationName is reported in pg_stat_activity for connections Open
	// and the listener make, unless the URL sets application_name.
	// Default "dagrun".
	ApplicationName string

	// StatementTimeout bounds every statement on the connections Open
	// makes (the pool's and the listener's), as their statement_timeout
	// runtime parameter: a statement blocked longer, say on a lock an
	// abandoned session holds, fails with SQLSTATE 57014 ("canceling
	// statement due to statement timeout") instead of hanging its worker.
	// Default 30s (DefaultStatementTimeout); negative disables it
	// (statement_timeout 0). Set explicitly, it overrides a
	// statement_timeout in the URL; left zero, the URL's wins. Migrations
	// at construction run without it. New uses the pool as configured.
	StatementTimeout time.Duration

	// Now, when set, replaces the database server's clock: every
	// timestamp the store writes or compares comes from it. Default nil:
	// the server's clock. Tests set it to drive time.
	Now func() time.Time

	// Logger receives listener reconnects and similar background events.
	// Default slog.Default().
	Logger *slog.Logger

	// ListenerRetryMin and ListenerRetryMax bound the exponential backoff
	// between reconnects of the LISTEN connection; each wait is drawn
	// between half the current backoff and all of it, so that listeners
	// turned away together do not all come back together. Defaults 100ms
	// and 5s.
	ListenerRetryMin time.Duration
	ListenerRetryMax time.Duration

	// PgBouncer says the pool's connections go through PgBouncer (or
	// another pooler) in transaction-pooling mode, where consecutive
	// transactions of one client may run on different server connections
	// and nothing set on a session lasts. The store then keeps no LISTEN
	// connection (a worker finds the steps other processes make ready at
	// its poll instead), and Open sends no runtime parameter of its own
	// at connection startup (PgBouncer refuses them): statement_timeout,
	// enable_seqscan and jit go with each of the store's transactions and
	// single statements instead, in their first batch, for that
	// transaction only (set_config(..., true)); queries use pgx's
	// QueryExecModeCacheDescribe, which prepares no named statement on the
	// server. Default false, or
	// the URL's pgbouncer=true. With New, only the listener is left out:
	// the caller's pool must already use such a query mode.
	PgBouncer bool

	// ShortLived says the store serves one short command and closes, as
	// the CLI's list, inspect or stats do: its connections skip the memory
	// warm-up that makes a long-lived server process keep what its
	// statements free (keepFreedMemorySQL), 12 ms of server time per
	// connection that a few statements never earn back. Default false.
	ShortLived bool
}

func (c *Config) withDefaults() *Config {
	if c == nil {
		c = &Config{}
	}
	return &Config{
		Schema:           cmp.Or(c.Schema, DefaultSchema),
		MaxConns:         cmp.Or(c.MaxConns, DefaultMaxConns),
		ApplicationName:  cmp.Or(c.ApplicationName, DefaultApplicationName),
		StatementTimeout: cmp.Or(c.StatementTimeout, DefaultStatementTimeout),
		Now:              c.Now,
		Logger:           cmp.Or(c.Logger, slog.Default()),
		ListenerRetryMin: cmp.Or(c.ListenerRetryMin, min(100*time.Millisecond, cmp.Or(c.ListenerRetryMax, time.Hour))),
		ListenerRetryMax: cmp.Or(c.ListenerRetryMax, max(5*time.Second, c.ListenerRetryMin)),
		PgBouncer:        c.PgBouncer,
		ShortLived:       c.ShortLived,
	}
}

func (c *Config) validate() error {
	if c.MaxConns < 1 {
		return fmt.Errorf("postgres: MaxConns must be at least 1, got %d", c.MaxConns)
	}
	if c.ListenerRetryMin <= 0 || c.ListenerRetryMin > c.ListenerRetryMax {
		return fmt.Errorf("postgres: ListenerRetryMin %v exceeds ListenerRetryMax %v", c.ListenerRetryMin, c.ListenerRetryMax)
	}
	if c.Schema == "" || strings.ContainsRune(c.Schema, 0) || !utf8.ValidString(c.Schema) || len(c.Schema) > 63 || strings.HasPrefix(c.Schema, "pg_") ||
		c.Schema == "information_schema" {
		return fmt.Errorf("postgres: %w %q: use 1 to 63 bytes of UTF-8, not starting with pg_ nor information_schema (the server's own)", ErrInvalidSchema, c.Schema)
	}
	return nil
}

// Store is a storage.Store on PostgreSQL. It is safe for concurrent use.
type Store struct {
	pool *pgxpool.Pool
	// database is the server's name of the store's database, read at the
	// first caller's transaction (see checkCallerDatabase).
	database atomic.Pointer[string]
	// db runs the statements that are transactions of their own, with
	// dagrun's settings when the sessions cannot hold them.
	db       autocommitter
	ownsPool bool
	cfg      *Config
	// prefix qualifies table names (`"schema".`).
	prefix string
	// markers expands the markers of statements (see q), and expanded
	// keeps what it expanded, by statement, up to maxExpanded of them.
	markers   *strings.Replacer
	expanded  sync.Map // string -> string
	nExpanded atomic.Int64
	channel   string
	// origin marks this store's own notifications: its listener skips
	// them, since the store signals its subscribers itself after each
	// commit (see inTx).
	origin string
	// notifier sends the notifications of the store's own commits.
	notifier *notifier

	subsMu sync.Mutex
	subs   map[*subscriber]struct{}
	// signals counts the signals sent to the subscribers (broadcast), so
	// that a claim can tell whether anything was announced since another
	// (see claimers.settledSince); skippedClaims counts the finishes that
	// left their eager claim out for that, settledHandoffs the hand-offs
	// that walked no index for it, and insertClaims the starts that
	// claimed their steps as they inserted them ("Claims at insert" in
	// create.go).
	signals         atomic.Uint64
	skippedClaims   atomic.Int64
	settledHandoffs atomic.Int64
	insertClaims    atomic.Int64
	// listener is started by the first Subscribe and stopped by Close.
	listener *listener
	// listenerRest is the constant listenerRest; tests shorten it.
	listenerRest time.Duration
	// claimers tells the listener when to connect and listen.
	claimers *claimers
	// heads tells claims whether to read past other handlers' steps
	// (claimheads.go); headClaims counts the claims that did.
	heads      lookahead.Verdicts
	headClaims atomic.Int64
	closed     bool

	// settings sets, for one transaction, the settings a pooler would not
	// keep on a session: empty when the sessions hold them (see
	// autocommitFor).
	settings string

	// snapshots serve finishes that plan before they read; speculated
	// counts those finishes, staleSnapshots the ones that found an
	// instance changed and ran again the usual way (see speculate.go),
	// finishHandoffs those that went with their hand-off in one statement
	// (finishhandoff.go).
	snapshots      snapshots
	speculated     atomic.Int64
	staleSnapshots atomic.Int64
	finishHandoffs atomic.Int64

	// plans turns statements into functions that keep their plans
	// behind PgBouncer (plans.go); nil otherwise.
	plans *planFunctions
}

// New returns a Store on a ready pool, migrating the schema first. Close does
// not close the pool.
func New(ctx context.Context, pool *pgxpool.Pool, cfg *Config) (*Store, error) {
	if pool == nil {
		return nil, errors.New("postgres: New needs a non-nil pool")
	}
	return newStore(ctx, pool, false, cfg, nil)
}

// ErrInvalidURL is wrapped by Open's error for a URL it cannot read: a
// mistake of whoever wrote it, which no retry mends.
var ErrInvalidURL = errors.New("invalid database URL")

// ErrInvalidSchema is wrapped by Open's error for a schema name
// PostgreSQL cannot hold, from Config.Schema or the URL's dagrun_schema.
var ErrInvalidSchema = errors.New("invalid schema name")

// urlProblem says what pgx found wrong with a URL without quoting it: its
// error begins "cannot parse `URL`: ", and the URL may hold a password
// pgx could not tell apart to hide.
func urlProblem(err error) string {
	msg := firstLine(err.Error())
	var pe *pgconn.ParseConfigError
	if errors.As(err, &pe) && strings.HasPrefix(msg, "cannot parse `") {
		if _, rest, ok := strings.Cut(msg, "`: "); ok {
			return rest
		}
	}
	return msg
}

// defaultConnectTimeout bounds a connection attempt when the URL sets no
// connect_timeout. A variable for a test's sake.
var defaultConnectTimeout = 30 * time.Second

// Open builds a pool from a postgres:// URL (or key=value DSN), sized by
// cfg.MaxConns, checks the database can be reached, and migrates the schema.
// An unreachable server, unknown database or failed authentication returns
// an error wrapping storage.ErrUnavailable, a URL it cannot read one
// wrapping ErrInvalidURL. Close closes the pool.
func Open(ctx context.Context, url string, cfg *Config) (*Store, error) {
	explicitTimeout := cfg != nil && cfg.StatementTimeout != 0
	explicitMaxConns := cfg != nil && cfg.MaxConns != 0
	explicitSchema := cfg != nil && cfg.Schema != ""
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w: %v", ErrInvalidURL, urlProblem(err))
	}
	if !HasParam(url, "connect_timeout") {
		// Without one a server that takes the connection and never
		// answers holds every command for the kernel's TCP timeouts
		// (two minutes here); connect_timeout in the URL still wins.
		pcfg.ConnConfig.ConnectTimeout = defaultConnectTimeout
	}
	// pgconn keeps settings it does not know as runtime parameters to send
	// to the server, which would refuse dagrun's own.
	params := pcfg.ConnConfig.RuntimeParams
	urlSchema := params[SchemaParam]
	delete(params, SchemaParam)
	c := Config{}
	if cfg != nil {
		c = *cfg
	}
	if v, ok := params[PgBouncerParam]; ok {
		delete(params, PgBouncerParam)
		on, err := strconv.ParseBool(v)
		if err != nil {
			return nil, fmt.Errorf("postgres: %w: %s=%q: use %s=true or %s=false", ErrInvalidURL, PgBouncerParam, v, PgBouncerParam, PgBouncerParam)
		}
		c.PgBouncer = c.PgBouncer || on
	}
	if !explicitSchema && urlSchema != "" {
		c.Schema = urlSchema
	}
	cfg = c.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	// pgxpool reads pool_max_conns from the URL, which is how the CLI's
	// --db sizes a worker's pool.
	if explicitMaxConns || !HasParam(url, "pool_max_conns") {
		pcfg.MaxConns = cfg.MaxConns
	}
	if _, ok := params["application_name"]; !ok {
		params["application_name"] = cfg.ApplicationName
	}
	if _, ok := params["statement_timeout"]; explicitTimeout || !ok {
		// In milliseconds, PostgreSQL's unit for a bare number; 0 disables.
		ms := max(cfg.StatementTimeout.Milliseconds(), 0)
		if cfg.StatementTimeout > 0 {
			ms = max(ms, 1) // a sub-millisecond timeout must not disable it
		}
		params["statement_timeout"] = strconv.FormatInt(ms, 10)
	}
	if _, ok := params["enable_seqscan"]; !ok {
		// Every statement of the store reaches its rows through an index.
		// A young database has no statistics yet (or statistics from when
		// it was empty), and the planner then believed steps held one row
		// and scanned all of them for every start and every finish, which
		// made a burst of N starts cost O(N²) until autovacuum's first
		// ANALYZE. Discouraging sequential scans keeps the index paths;
		// a query with no index path still runs, as a scan.
		params["enable_seqscan"] = "off"
	}
	if _, ok := params["jit"]; !ok {
		// The store's statements are short, and a JIT compile costs a
		// third of a second or more. A disabled sequential scan costs
		// 10^10 in the planner's sums, so a statement whose table has no
		// index for it (the workers table, scanned for stale rows at every
		// announce) passed jit_above_cost and was compiled each time it
		// ran: measured, a worker's announce took 1 to 2 s of server CPU.
		params["jit"] = "off"
	}
	if _, ok := params["plan_cache_mode"]; !ok {
		// The store runs the same few statements all the time, through
		// pgx's cache of prepared statements: with generic plans each is
		// planned once per connection, not at every execution (planning
		// was about a quarter of the server's time per step, measured in
		// its statement log). TestGenericPlansUseIndexes checks that every
		// one of them keeps its index paths with generic plans.
		params["plan_cache_mode"] = "force_generic_plan"
	}
	var local map[string]string
	if cfg.PgBouncer {
		// Behind PgBouncer statements are not prepared, so there is no
		// plan to keep.
		delete(params, "plan_cache_mode")
		// PgBouncer refuses runtime parameters at startup, and a SET on a
		// session would stay with whichever server connection ran it:
		// these go with each transaction instead.
		local = map[string]string{}
		for _, name := range []string{"statement_timeout", "enable_seqscan", "jit"} {
			local[name] = params[name]
			delete(params, name)
		}
		if !HasParam(url, "default_query_exec_mode") {
			// Named prepared statements live on one server connection,
			// which the next transaction may not get. This mode prepares
			// none: it describes a statement once (on whichever
			// connection) and sends every execution with a Parse of its
			// own, encoded as without PgBouncer, in the types the server
			// described. pgx's exec mode (default_query_exec_mode=exec in
			// the URL) works too, but guesses each parameter's type from
			// its Go type.
			pcfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
		}
	}
	if !cfg.PgBouncer && !cfg.ShortLived {
		pcfg.AfterConnect = keepFreedMemory(pcfg.AfterConnect)
	}
	pcfg.ConnConfig.DialFunc = quietDial(pcfg.ConnConfig.DialFunc)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, interpretError(err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, interpretError(err)
	}
	s, err := newStore(ctx, pool, true, cfg, local)
	if err != nil {
		pool.Close()
		return nil, err
	}
	return s, nil
}

// newStore builds the store; local holds the settings (name to value) its
// transactions and single statements set for themselves (settingsSQL).
func newStore(ctx context.Context, pool *pgxpool.Pool, owns bool, cfg *Config, local map[string]string) (*Store, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := &Store{
		pool:         pool,
		ownsPool:     owns,
		cfg:          cfg,
		prefix:       pgx.Identifier{cfg.Schema}.Sanitize() + ".",
		channel:      ChannelPrefix + "." + cfg.Schema,
		origin:       newOrigin(),
		subs:         make(map[*subscriber]struct{}),
		claimers:     newClaimers(),
		listenerRest: listenerRest,
		settings:     settingsSQL(local),
	}
	s.db = autocommitFor(pool, s.settings)
	if len(s.channel) > 63 { // PostgreSQL's limit on channel names
		h := fnv.New64a()
		_, _ = h.Write([]byte(cfg.Schema))
		s.channel = fmt.Sprintf("%s.%x", ChannelPrefix, h.Sum64())
	}
	s.notifier = &notifier{
		origin: s.origin,
		send: func(ctx context.Context, payload string) error {
			_, err := s.pool.Exec(ctx, "SELECT pg_notify($1, $2)", s.channel, payload)
			return err
		},
		failed: func(err error) {
			s.cfg.Logger.Warn("postgres: could not tell other processes of ready steps; their workers find them at their next poll",
				"channel", s.channel, "error", firstLine(interpretError(err).Error()))
		},
	}
	s.markers = strings.NewReplacer("{s}", s.prefix, "{now}", nowSQL, "{clock}", clockSQL)
	if err := s.migrate(ctx); err != nil {
		return nil, err
	}
	if cfg.PgBouncer {
		s.plans = newPlanFunctions(s)
	}
	return s, nil
}

// Close stops the listener and, for a store made by Open, closes the pool.
// Subscription channels stay open but receive nothing more.
// Schema returns the PostgreSQL schema of the store's tables.
func (s *Store) Schema() string { return s.cfg.Schema }

func (s *Store) Close() error {
	s.subsMu.Lock()
	l := s.listener
	s.listener = nil
	s.closed = true
	s.subsMu.Unlock()
	if l != nil {
		l.stop()
	}
	s.notifier.close()
	if s.plans != nil {
		s.plans.close()
	}
	if s.ownsPool {
		s.pool.Close()
	}
	return nil
}

// Pool returns the pool the store uses.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// q expands the markers of a statement: {s} qualifies a table name
// ("{s}steps") with the store's schema, {now} is the transaction's time and
// {clock} the time a lease starts (see nowSQL).
func (s *Store) q(sql string) string {
	if e, ok := s.expanded.Load(sql); ok {
		return e.(string)
	}
	e := s.markers.Replace(sql)
	if s.nExpanded.Add(1) <= maxExpanded {
		s.expanded.Store(sql, e)
		if s.plans != nil {
			// Later calls get the function's call once it is made; this
			// one already when the schema is known to hold it.
			if call := s.plans.consider(sql, e); call != "" {
				return call
			}
		}
	}
	return e
}

// maxExpanded bounds the statements q keeps expanded. The store's
// statements are a few hundred texts; expanding one of its long
// statements again on every call took a step's transition about 6 µs a
// statement, a sixth of the worker's CPU in latency4.
const maxExpanded = 4096

// nowSQL and clockSQL are the times of a statement: its $1, or the
// server's clock when $1 is NULL. Every row and event a transaction writes
// carries one time, its start (now()), as with SQLite or a test's clock.
// A lease is the exception: it counts from clock_timestamp(), read as the
// statement takes the step, since the transaction may have waited for
// locks since it began (a claim queued after a finish that waited for its
// instances' locks, a heartbeat that waited for a finishing transaction's
// row locks), and a lease counted from before the wait would end early.
const (
	nowSQL   = `coalesce($1::timestamptz, now())`
	clockSQL = `coalesce($1::timestamptz, clock_timestamp())`
)

// now is the $1 of every statement that reads or writes a time: nil, so
// that the server's clock decides, unless Config.Now is set.
func (s *Store) now() *time.Time {
	if s.cfg.Now == nil {
		return nil
	}
	t := s.cfg.Now()
	return &t
}

// Now implements storage.Clock: the time the store stamps its rows with,
// read from the server's clock (or Config.Now).
func (s *Store) Now(ctx context.Context) (time.Time, error) {
	if s.cfg.Now != nil {
		return s.cfg.Now(), nil
	}
	var t time.Time
	if err := s.pool.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&t); err != nil {
		return time.Time{}, s.fail("read the database clock", err)
	}
	return t.UTC(), nil
}

// txState collects, during one transaction attempt, what to do at its end.
type txState struct {
	// tail holds the transaction's last statements (applying plans), sent
	// in one round trip together with the NOTIFY just before the commit.
	tail pgx.Batch
	// readyQueues are the queues of steps made pending.
	readyQueues map[string]struct{}
	// planReady are the steps plans made pending (see readyByPlan), and
	// otherReady is set when steps became ready any other way; claimed is
	// what the transaction's eager claim took.
	planReady  []stepRef
	otherReady bool
	// everyQueue is set when what the transaction made ready is news for
	// the workers of every queue (see waiting).
	everyQueue bool
	claimed    []storage.ClaimedStep
	// quiet is set when the transaction's own eager claim took every step
	// it could see: none is left for this process's other claimers, so
	// its subscribers need no signal.
	quiet bool
	// itemSlotFreed is set when an item under its forEach step's
	// concurrency cap finished: a sibling may run in its slot, which the
	// eager claim never takes (see claimCapped), so a short eager claim
	// proves nothing and the subscribers are signalled all the same.
	itemSlotFreed bool
	// cappedExpanded is set when a forEach step under a concurrency cap
	// expanded into items, which the eager claim never takes either.
	cappedExpanded bool

	// store and plan serve the follow-ups of child instances (see
	// followUp): the workflow steps whose children to create (starts),
	// and the instances the tail finished (finished), whose parents'
	// steps to settle and whose unfinished children to cancel.
	store    *Store
	plan     storage.PlanFunc
	starts   []childStart
	finished []finishedInstance
	// orphans are the unfinished children of the workflow steps (and
	// items) a recorded failure cancelled in a failing instance, to cancel
	// with them.
	orphans []orphan
	// finishing is set while the tail holds a statement that finishes
	// instances: what it finishes may call for follow-ups.
	finishing bool
	// claimRead holds the instances the tail reads after its claim, for
	// snapshots (claimsnapshot.go). Follow-ups may change them at the
	// transaction's own row versions, which no check of versions would
	// tell, so they empty it when they run.
	claimRead map[string]*loaded
	// created are the instances create inserted, as planned.
	created []*storage.NewInstance
	// handoff is the claim a finish's plans may make with their changes
	// (see handoff.go), while they are planned.
	handoff *handoff
	// insertClaim is the claim a start makes as it inserts its steps,
	// when it may ("Claims at insert" in create.go), and insertClaimed
	// the steps create marked for it.
	insertClaim   *storage.ClaimParams
	insertClaimed []stepRef
	// promoted is how many due steps the tail's last promotion promoted,
	// and promotedLeft is set once a claim of the transaction may have left
	// some of those it promoted to others (see promotedLeft).
	promoted     int
	promotedLeft bool
}

func (st *txState) ready(queue string) {
	st.otherReady = true
	st.addQueue(queue)
}

// waiting records a step of queue made waiting. Its deadline, or its
// instance's, is news for every idle worker, whatever its queues: any
// worker times out a wait or an instance (see nextWakeSQL). The
// transaction's NOTIFY then lists no queue.
func (st *txState) waiting(queue string) {
	st.ready(queue)
	st.everyQueue = true
}

// notifyPayload is the payload of the NOTIFY for what the transaction
// made ready, sent with origin.
func (st *txState) notifyPayload(origin string) string {
	if st.everyQueue {
		return payload(origin, nil)
	}
	return payload(origin, st.readyQueues)
}

// freedItemSlot records that an item of queue under a concurrency cap
// finished, leaving its slot to a pending sibling.
func (st *txState) freedItemSlot(queue string) {
	st.ready(queue)
	st.itemSlotFreed = true
}

// readyByPlan records a step a plan made pending.
func (st *txState) readyByPlan(queue, instanceID, step string) {
	st.planReady = append(st.planReady, stepRef{instanceID, step})
	st.addQueue(queue)
}

func (st *txState) addQueue(queue string) {
	if st.readyQueues == nil {
		st.readyQueues = make(map[string]struct{})
	}
	st.readyQueues[queue] = struct{}{}
}

// stepRef names a step (not an item) of an instance.
type stepRef struct{ instanceID, step string }

// claimedAllReady reports whether the transaction's own eager claim took
// every step it made ready: then no other process, nor another claimer of
// this one, has anything to be told of. In a fleet whose workers all have
// work, a NOTIFY for steps their own senders took woke every listener for
// nothing, and each waited on the server-wide lock that serialises
// notifications.
func (st *txState) claimedAllReady() bool {
	return !st.otherReady && len(st.planReady) > 0 && st.claimedPlanReady()
}

// claimedPlanReady reports whether the transaction's eager claim took
// every step its plans made ready.
func (st *txState) claimedPlanReady() bool {
	if len(st.claimed) < len(st.planReady) {
		return false
	}
	took := make(map[stepRef]bool, len(st.claimed))
	for _, c := range st.claimed {
		if c.Item < 0 {
			took[stepRef{c.InstanceID, c.Step}] = true
		}
	}
	for _, r := range st.planReady {
		if !took[r] {
			return false
		}
	}
	return true
}

// finish sends the tail. In a caller's transaction, which the store does
// not see commit, it also sends one NOTIFY on channel, whatever the number
// of steps made pending; the store's own transactions pass no channel and
// notify after their commit (see notifier).
//
// What the tail did may call for more in the same transaction: creating
// the children of the workflow steps it started, settling the parent step
// of a child it finished, cancelling the children of an instance it ended.
// Those follow-ups queue a new tail, sent in turn, until none is left (a
// NOTIFY is delivered at the commit wherever it was sent).
//
// A transaction of the store's own passes own, and its last tail, the one
// no follow-up can come of, goes with its COMMIT (see lazyTx.commitWith).
//
// Each tail ends with releasedSQL, and so does the COMMIT of a transaction
// whose tail is empty: the steps the limits' triggers released count as
// made ready, in the caller's transaction with one more NOTIFY.
func (st *txState) finish(ctx context.Context, tx pgx.Tx, channel string, own *lazyTx) error {
	notified, toldPromoted := 0, false
	for {
		if st.tail.Len() > 0 || own != nil && own.Tx != nil && !st.followUps() {
			st.queueReleased()
		}
		if n := len(st.readyQueues); n > notified && channel != "" {
			notified = n
			st.tail.Queue("SELECT pg_notify($1, $2)", channel, st.notifyPayload(""))
		}
		if st.tail.Len() > 0 {
			if own != nil && !st.finishing && !st.followUps() {
				return own.commitWith(ctx, &st.tail)
			}
			if err := tx.SendBatch(ctx, &st.tail).Close(); err != nil {
				return err
			}
			st.tail, st.finishing = pgx.Batch{}, false
		}
		if channel != "" && len(st.readyQueues) > notified {
			continue // the NOTIFY of the steps the tail released
		}
		if channel != "" && st.promotedLeft && !toldPromoted {
			toldPromoted = true
			st.tail.Queue("SELECT pg_notify($1, $2)", channel, payload("", nil))
			continue // the NOTIFY of the steps the tail promoted
		}
		if !st.followUps() {
			return nil
		}
		// The follow-ups may make steps ready that an eager claim on the
		// tail did not see.
		st.quiet = false
		clear(st.claimRead)
		if err := st.store.followUp(ctx, tx, st); err != nil {
			return err
		}
	}
}

// followUps reports whether what the tails did calls for more (see
// Store.followUp).
func (st *txState) followUps() bool {
	return len(st.starts) > 0 || len(st.finished) > 0 || len(st.orphans) > 0
}

// releasedSQL reads the queues whose held steps the transaction released,
// one line each (limits_release_step, migration 25).
const releasedSQL = `SELECT coalesce(current_setting('dagrun.released', true), '')`

// queueReleased queues releasedSQL on the tail: the queues it names were
// made ready, by statements whose own results do not say so, and an eager
// claim in the same statement as the release could not see their steps.
func (st *txState) queueReleased() {
	st.tail.Queue(releasedSQL).QueryRow(func(row pgx.Row) error {
		var lines string
		if err := row.Scan(&lines); err != nil {
			return err
		}
		for queue := range strings.Lines(lines) {
			st.ready(strings.TrimSuffix(queue, "\n"))
			st.quiet = false
		}
		return nil
	})
}

// newOrigin returns a random tag for a store's notifications.
func newOrigin() string {
	return strconv.FormatUint(rand.Uint64(), 36)
}

// maxTxAttempts bounds how often a transaction is retried on serialization
// failures and deadlocks before the error is returned.
const maxTxAttempts = 5

// inTx runs fn in a transaction of the store's own, retrying it when
// PostgreSQL aborts it with a serialization failure or a deadlock; fn must
// therefore be safe to run again. When it made steps pending, other
// processes get a NOTIFY once it committed (see notifier), and this
// store's subscribers are signalled directly (unless st.quiet), but for
// steps its own eager claim took (see claimedAllReady).
func (s *Store) inTx(ctx context.Context, fn func(tx pgx.Tx, st *txState) error) error {
	return s.retry(ctx, func() error {
		storage.AttemptStarted(ctx)
		st := &txState{store: s}
		err := s.runTx(ctx, writeBegin, func(tx *lazyTx) error {
			if err := fn(tx, st); err != nil {
				return err
			}
			return st.finish(ctx, tx, "", tx)
		})
		if err == nil && len(st.readyQueues) > 0 && !st.claimedAllReady() {
			if st.everyQueue {
				s.notifier.addUnlisted()
			} else {
				s.notifier.add(st.readyQueues)
			}
			if !st.quiet || st.itemSlotFreed || st.cappedExpanded {
				s.broadcast()
			}
		}
		if err == nil && st.promotedLeft {
			s.notifier.addUnlisted()
			s.broadcast()
		}
		return err
	})
}

// replan reports whether err says that a statement function the store
// called vanished (see planFunctions.forget): the store then runs
// statements as they are until their functions are made again.
func (s *Store) replan(err error) bool {
	return s.plans != nil && s.plans.forget(err)
}

// retry runs fn again, a few times, while it fails with a serialization
// failure or a deadlock, or once it called a statement function that
// vanished. fn must expand its statements itself (Store.q), so that the
// next attempt runs their own text.
func (s *Store) retry(ctx context.Context, fn func() error) error {
	for attempt := 1; ; attempt++ {
		err := fn()
		if err == nil {
			return nil
		}
		if s.replan(err) && attempt < maxTxAttempts && ctx.Err() == nil {
			continue // the statement's own text runs now
		}
		if attempt < maxTxAttempts && isRetryable(err) && ctx.Err() == nil {
			// A jittered pause, so that the transactions that collided do
			// not collide again.
			d := time.Duration(attempt) * time.Duration(1+rand.IntN(10)) * time.Millisecond
			select {
			case <-time.After(d):
				continue
			case <-ctx.Done():
			}
		}
		return interpretError(err)
	}
}

// checkCallerDatabase refuses a caller's transaction on another database
// than the store's: the instance would commit where none of the engine's
// workers look (another database of the server that has dagrun's tables
// takes it without an error). Both names come from the server, so a
// proxy's alias names the same database.
func (s *Store) checkCallerDatabase(ctx context.Context, caller pgx.Tx) error {
	own := s.database.Load()
	if own == nil {
		var name string
		if err := s.pool.QueryRow(ctx, "SELECT current_database()").Scan(&name); err != nil {
			return interpretError(err)
		}
		s.database.Store(&name)
		own = &name
	}
	var theirs string
	if err := caller.QueryRow(ctx, "SELECT current_database()").Scan(&theirs); err != nil {
		return interpretError(err)
	}
	if theirs != *own {
		return fmt.Errorf("the caller's transaction is on database %q, not on the store's %q: begin it on a connection to the store's database", theirs, *own)
	}
	return nil
}

// inCallerTx runs fn inside a savepoint of a caller's transaction, so that a
// failure undoes only the store's writes, and never commits the caller's
// transaction. PostgreSQL delivers the NOTIFY when the caller commits.
func (s *Store) inCallerTx(ctx context.Context, caller any, fn func(tx pgx.Tx, st *txState) error) error {
	outer, ok := caller.(pgx.Tx)
	if !ok || outer == nil {
		return fmt.Errorf("the caller's transaction must be a pgx.Tx, got %T", caller)
	}
	if err := s.checkCallerDatabase(ctx, outer); err != nil {
		return err
	}
	storage.AttemptStarted(ctx)
	st := &txState{store: s}
	err := pgx.BeginFunc(ctx, outer, func(tx pgx.Tx) error {
		if err := fn(tx, st); err != nil {
			return err
		}
		return st.finish(ctx, tx, s.channel, nil)
	})
	if err != nil {
		return interpretError(err)
	}
	// Local workers polling before the caller commits find nothing; the
	// NOTIFY at the commit then wakes them again.
	if len(st.readyQueues) > 0 || st.promotedLeft {
		s.broadcast()
	}
	return nil
}

// fail prefixes err with the operation and translates it at the boundary;
// an unavailable database is already one complete line.
func (s *Store) fail(op string, err error) error {
	s.replan(err)
	err = interpretError(err)
	if errors.Is(err, storage.ErrUnavailable) {
		return err
	}
	return fmt.Errorf("postgres: %s: %w", op, err)
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// keepFreedMemorySQL makes a new server process allocate and free one
// chunk of 512 KB. A server process frees the memory of each statement
// when it ends, and glibc's malloc gives the top of its heap back to the
// kernel as soon as more than 128 KB of it is free, so the next
// statement faults its pages in again. But glibc raises that bar for the
// life of the process to twice the largest chunk it has mapped and
// unmapped (its dynamic mmap threshold): after this statement, up to 1 MB
// stay mapped between statements, and a statement that maps a larger
// chunk raises the bar again. Whether a process got there by chance
// depended on the plans it ran: a worker whose hand-offs walked no index
// (settledHandoffSQL) made 98 page faults an instance of latency4
// instead of 22, and its every start took 1.2 ms instead of 0.35.
//
// The chunk is built from 1 KB copies and measured in bytes: repeat('x',
// n) copies one byte at a time, and length() counts the characters of
// the result. Its cost is mostly its page faults, which every worker of a
// fleet pays as it connects: a chunk of 2 MB took 13.4 ms on a new
// connection, this one 5.2 (means of 20 connections), and the bench's
// server processes made as many page faults at their work after either
// (latency4 300 and chain4 4000 on PostgreSQL, /proc/PID/stat of each).
const keepFreedMemorySQL = `SELECT octet_length(repeat(repeat('x', 1024), 512))`

// keepFreedMemory runs keepFreedMemorySQL on each new connection, after
// next (the pool's own AfterConnect) when there is one.
func keepFreedMemory(next func(context.Context, *pgx.Conn) error) func(context.Context, *pgx.Conn) error {
	return func(ctx context.Context, conn *pgx.Conn) error {
		if next != nil {
			if err := next(ctx, conn); err != nil {
				return err
			}
		}
		_, err := conn.Exec(ctx, keepFreedMemorySQL)
		return err
	}
}

// HasParam reports whether a connection string, a URL or a libpq
// keyword/value string, sets the parameter name: the pool settings pgx
// reads from it override dagrun's defaults only when they are there, as a
// parameter, not as text anywhere in it (an application_name that
// contains the name sets nothing).
func HasParam(connString, name string) bool {
	if strings.HasPrefix(connString, "postgres://") || strings.HasPrefix(connString, "postgresql://") {
		u, err := neturl.Parse(connString)
		return err == nil && u.Query().Has(name)
	}
	for _, field := range strings.Fields(connString) {
		if key, _, ok := strings.Cut(field, "="); ok && strings.TrimSpace(key) == name {
			return true
		}
	}
	return false
}
