package postgres

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/internal/migrate"
)

// Plans kept in functions, behind PgBouncer. A server connection keeps the
// plan of a named prepared statement, but in transaction pooling the next
// transaction may run on another connection, so the store prepares none
// (Config.PgBouncer) and every execution is parsed and planned again. The
// store's statements are large, on a table with many partial indexes:
// planning a claim took 0.76 ms and a finish 0.87 ms, about as long as
// running them, and a PgBouncer worker drained half as many instances a
// second as one connected directly.
//
// PgBouncer 1.21 keeps prepared statements itself; Debian's 1.18 does not.
// What every version keeps is the server connection under a client's
// transaction, and a PL/pgSQL function caches the plans of its statements
// on the server connection that runs it, whichever client called. So in
// PgBouncer mode each row-returning statement the store runs becomes, in
// the background after its first use, a function of the store's schema
// whose body is the statement (RETURN QUERY), and the store calls that
// instead: SELECT * FROM "schema".dagrun_plan_<hash>($1, ...). The
// function's parameters and columns are the types the server described
// for the statement, so the rows, their types and the row count are the
// statement's own; errors keep their SQLSTATE.
//
// A data-modifying statement that returns no rows becomes a function that
// returns how many rows it changed, called as SELECT FROM
// generate_series(1, f(...)): n empty rows, so the caller reads the same
// count from the command tag. A statement the server cannot describe, one
// that is neither a single query nor a single change, a query of no
// columns, one with a parameter or column of a pseudo-type (void) and one
// with more parameters than a function takes stay as they are, and so do
// all of them when the role may not create functions in the schema: every
// execution is then planned as before.
//
// A function's name is a hash of its statement and of the schema's
// version, so a changed statement or a migrated schema makes a new one
// (the migration drops the old ones: migrate.go), and a
// process that finds the function made by another needs one read of
// pg_proc to call it.
//
// A function can vanish under running processes: a DBA drops it, or the
// schema is restored without it. The first statement that calls it fails
// with "function does not exist"; the store then routes every statement
// back to its own text, makes the functions again in the background, and
// runs the statement again where it retries transactions (Store.retry).
// A function that could not be made for a passing reason (a connection
// lost while making it) is tried again, a few times, later.

// planFuncPrefix begins the name of every statement function.
const planFuncPrefix = "dagrun_plan_"

// maxFuncArgs is PostgreSQL's limit on a function's arguments
// (FUNC_MAX_ARGS).
const maxFuncArgs = 100

// planAttempts bounds how often the store tries to make one statement's
// function when making it fails for another reason than the role's
// privileges; planRetryPause times the next try, once per attempt made.
const (
	planAttempts    = 3
	planRetryPause  = time.Second
	planOutagePause = 30 * time.Second
)

// planBusyPause is how long a store first waits before it looks again for
// a function another session is making; each look doubles it, up to
// planBusyMaxPause. planMakeWithin bounds one attempt to make a function,
// waits included.
const (
	planBusyPause    = 20 * time.Millisecond
	planBusyMaxPause = 500 * time.Millisecond
	planMakeWithin   = 30 * time.Second
)

// planCloseGrace bounds how long close waits for an attempt under way.
const planCloseGrace = 5 * time.Second

// planFunctions turns the statements of a store in PgBouncer mode into
// functions in the background, the statements queued together in one
// transaction.
type planFunctions struct {
	s       *Store
	pending chan planRequest
	ctx     context.Context
	stop    context.CancelFunc
	// attempts is the context of the attempts to make functions: close
	// lets the one under way end, commit or roll back, before it cancels
	// it (see close).
	attempts context.Context
	abort    context.CancelFunc
	done     chan struct{}

	mu       sync.Mutex
	working  int  // requests queued or being made
	disabled bool // the role may not create functions
	idle     *sync.Cond
	// routed holds the statements routed through a function: their
	// template (the key of Store.expanded) and their own text.
	routed map[string]string
	// known maps the name of every function the schema held at the last
	// look (lookAll) to its call. One read lists what the whole fleet has
	// made so far, so a statement whose function another process made is
	// routed at its first use, without a read of its own: 60 workers
	// behind PgBouncer, each looking its statements up one by one, ran
	// most of a 4,000-instance backlog before they routed them all, and
	// planned nearly every statement at each execution meanwhile.
	known map[string]string
	// failures counts, per template, the attempts to make its function
	// that failed, and outages those that found the database unavailable
	// (which do not count as attempts).
	failures map[string]int
	outages  map[string]int

	// retryPause is planRetryPause; beforeMake, when not nil, fails an
	// attempt to make a function, and onBusy hears of each attempt that
	// found another session making it: tests set them.
	retryPause time.Duration
	beforeMake func() error
	onBusy     func()
	// makeWithin is planMakeWithin; tests shorten it.
	makeWithin time.Duration
}

// planRequest is a statement to wrap: its template (the key of
// Store.expanded) and its text with the markers expanded.
type planRequest struct {
	template, sql string
	// looks counts the looks that found another session making the
	// function, since busySince.
	looks     int
	busySince time.Time
}

func newPlanFunctions(s *Store) *planFunctions {
	ctx, stop := context.WithCancel(context.Background())
	attempts, abort := context.WithCancel(context.Background())
	p := &planFunctions{s: s, pending: make(chan planRequest, maxExpanded), ctx: ctx, stop: stop, attempts: attempts, abort: abort, done: make(chan struct{}),
		routed: map[string]string{}, failures: map[string]int{}, outages: map[string]int{}, retryPause: planRetryPause, makeWithin: planMakeWithin,
		working: 1} // the first look
	p.idle = sync.NewCond(&p.mu)
	go p.run()
	return p
}

// consider routes a statement the store expanded for the first time
// through its function when the schema is known to hold it, and returns
// the call; otherwise it queues the statement and returns "".
func (p *planFunctions) consider(template, sql string) string {
	if !wrappable(sql) {
		return ""
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.disabled || p.ctx.Err() != nil {
		return ""
	}
	if call := p.known[planFunctionName(p.s.prefix, sql)]; call != "" {
		p.route(template, sql, call)
		return call
	}
	select {
	case p.pending <- planRequest{template: template, sql: sql}:
		p.working++
	default: // more statements than q keeps: this one stays as it is
	}
	return ""
}

// route sends the statement template through the function call; p.mu is
// held.
func (p *planFunctions) route(template, sql, call string) {
	p.routed[template] = sql
	delete(p.failures, template)
	p.s.expanded.Store(template, call)
}

// wrappable reports whether a statement may become a function's body: a
// query, or a change with or without RETURNING.
func wrappable(sql string) bool {
	return mainVerb(sql) != ""
}

// mainVerb returns the verb of a statement's main part, SELECT, INSERT,
// UPDATE or DELETE, after its WITH clause if it has one; "" for anything
// else. It reads words outside parentheses, string literals, quoted
// names and comments, so a CTE's own verbs do not count.
func mainVerb(sql string) string {
	depth, sawWith, verb := 0, false, ""
	for i := 0; i < len(sql); {
		c := sql[i]
		switch {
		case c == '(':
			depth++
			i++
		case c == ')':
			depth--
			i++
		case c == ';':
			return "" // several statements: no function body
		case c == '\'' || c == '"':
			end := strings.IndexByte(sql[i+1:], c)
			if end < 0 {
				return ""
			}
			i += end + 2 // a doubled quote reads as two literals: same depth
		case strings.HasPrefix(sql[i:], "--"):
			end := strings.IndexByte(sql[i:], '\n')
			if end < 0 {
				return ""
			}
			i += end
		case c == '$' && i+1 < len(sql) && sql[i+1] >= '0' && sql[i+1] <= '9':
			i++ // a parameter
		case strings.HasPrefix(sql[i:], "/*") || c == '$':
			return "" // comments of this kind and dollar quotes: not ours
		case c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z':
			j := i
			for j < len(sql) && (sql[j] == '_' || sql[j] >= 'a' && sql[j] <= 'z' || sql[j] >= 'A' && sql[j] <= 'Z' || sql[j] >= '0' && sql[j] <= '9') {
				j++
			}
			word := strings.ToUpper(sql[i:j])
			i = j
			if depth != 0 || verb != "" {
				continue // read on only for a second statement
			}
			switch word {
			case "WITH":
				if sawWith {
					return ""
				}
				sawWith = true
			case "SELECT", "INSERT", "UPDATE", "DELETE":
				verb = word
			case "RECURSIVE", "AS", "MATERIALIZED", "NOT":
			default:
				if !sawWith {
					return "" // a statement of another kind
				}
			}
		default:
			i++
		}
	}
	return verb
}

// run makes the queued statements' functions until close: a process that
// starts makes few, and those once. It looks up the functions the schema
// holds first, so that the statements a process starts with go through
// their functions from their first use; each batch of statements queued
// later is settled in one transaction (makeAll), whose one read routes
// every statement of the batch whose function another process made. A
// read per statement, on a worker's one pool connection that its claims
// and finishes keep busy, took 60 workers behind PgBouncer 2 to 6 s to
// route their statements.
func (p *planFunctions) run() {
	defer close(p.done)
	p.look()
	p.finished()
	for {
		select {
		case <-p.ctx.Done():
			return
		case r := <-p.pending:
			batch := p.queued(r)
			if p.ctx.Err() != nil {
				return // closed: make no more
			}
			p.handleAll(batch)
		}
	}
}

// queued returns r and the requests queued after it.
func (p *planFunctions) queued(r planRequest) []planRequest {
	batch := []planRequest{r}
	for {
		select {
		case r := <-p.pending:
			batch = append(batch, r)
		default:
			return batch
		}
	}
}

// handleAll routes each request of batch through its function, known,
// made or found made, or sets it aside, tries it again later or leaves it
// as it is. The functions the schema lacks are made together, in one
// transaction: behind a busy PgBouncer each transaction waits its turn
// for a server connection (a fifth of a second for 60 workers), and one
// per statement kept the first worker of a fresh schema making functions
// for most of a 4,000-instance backlog, which the whole fleet planned at
// every execution meanwhile.
func (p *planFunctions) handleAll(batch []planRequest) {
	p.mu.Lock()
	disabled := p.disabled
	calls := make([]string, len(batch))
	var rest []planRequest
	for i, r := range batch {
		if calls[i] = p.known[planFunctionName(p.s.prefix, r.sql)]; calls[i] == "" && !disabled {
			rest = append(rest, r)
		}
	}
	p.mu.Unlock()
	for i, r := range batch {
		if calls[i] != "" || disabled {
			p.settle(r, calls[i], nil)
		}
	}
	if len(rest) == 0 {
		return
	}
	results, err := p.attemptAll(rest)
	for i, r := range rest {
		call, rerr := "", err
		if err == nil {
			call, rerr = results[i].call, results[i].err
		}
		if rerr != nil && r.looks > 0 && errors.Is(rerr, context.DeadlineExceeded) {
			// Whether the time ran out in a pause or in the statements of
			// the next look (on a loaded machine) is chance, not a
			// different cause.
			rerr = p.heldTooLong(r, rerr)
		}
		p.settle(r, call, rerr)
	}
}

// settle acts on what making r's function came to: it routes r through
// call, sets r aside while another session makes it (errPlanBusy), or
// tries it again later, or leaves it as it is.
func (p *planFunctions) settle(r planRequest, call string, err error) {
	if errors.Is(err, errPlanBusy) {
		if p.setAside(r) {
			return // still working on it
		}
		err = p.heldTooLong(r, context.DeadlineExceeded)
	}
	switch {
	case err == nil && call != "":
		p.mu.Lock()
		p.route(r.template, r.sql, call)
		p.mu.Unlock()
	case isInsufficientPrivilege(err):
		p.mu.Lock()
		already := p.disabled
		p.disabled = true
		p.mu.Unlock()
		if !already {
			p.s.cfg.Logger.Info("postgres: this role may not create functions in dagrun's schema, so behind PgBouncer every statement is planned at each execution; grant CREATE on the schema to keep their plans",
				"schema", p.s.cfg.Schema, "error", firstLine(err.Error()))
		}
	case err != nil && p.ctx.Err() == nil:
		p.failed(r, err)
	}
	p.finished()
}

// finished counts off a piece of work: a request handled, or the first
// look.
func (p *planFunctions) finished() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.working--
	if p.working == 0 {
		p.idle.Broadcast()
	}
}

// failed tries r again later, unless its function failed to be made
// planAttempts times: then r stays as it is for the life of the store. A
// database that cannot be reached (an outage, which PgBouncer reports for
// as long as its server_login_retry) is no attempt: r is tried again, at
// growing intervals up to planOutagePause, until it is made or the store
// closes.
func (p *planFunctions) failed(r planRequest, err error) {
	if errors.Is(interpretError(err), storage.ErrUnavailable) {
		p.mu.Lock()
		p.outages[r.template]++
		k := p.outages[r.template]
		p.mu.Unlock()
		pause := min(p.retryPause<<min(k-1, 5), planOutagePause)
		p.s.cfg.Logger.Debug("postgres: a statement's function could not be made while the database is unavailable; trying again",
			"in", pause, "error", firstLine(err.Error()))
		time.AfterFunc(pause, func() { p.consider(r.template, r.sql) })
		return
	}
	p.mu.Lock()
	p.failures[r.template]++
	n := p.failures[r.template]
	p.mu.Unlock()
	if n >= planAttempts {
		p.s.cfg.Logger.Warn("postgres: behind PgBouncer, a statement is planned at every execution: its function could not be made",
			"attempts", n, "error", firstLine(err.Error()))
		return
	}
	p.s.cfg.Logger.Debug("postgres: a statement's function could not be made; trying again", "error", firstLine(err.Error()))
	time.AfterFunc(time.Duration(n)*p.retryPause, func() { p.consider(r.template, r.sql) })
}

// forget answers an error of a statement the store ran: when it says that
// a statement function does not exist, every statement goes back to its
// own text and its function is made again, and forget reports true: the
// statement may run again at once.
func (p *planFunctions) forget(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42883" || !strings.Contains(pgErr.Message, planFuncPrefix) {
		return false
	}
	p.mu.Lock()
	routed := p.routed
	p.routed = map[string]string{}
	p.known = nil
	for template, sql := range routed {
		p.s.expanded.Store(template, sql)
	}
	p.mu.Unlock()
	if len(routed) > 0 { // once, though every connection may fail at once
		p.s.cfg.Logger.Warn("postgres: a statement function of dagrun's schema vanished; making them again, and planning statements at each execution meanwhile",
			"error", firstLine(pgErr.Message))
	}
	for template, sql := range routed {
		p.consider(template, sql)
	}
	return true
}

// close stops making functions and waits for the attempt under way, for
// up to planCloseGrace before it cancels it. Cancelled, an attempt leaves
// its transaction to the server until the server notices: behind
// PgBouncer the client's side of it closes at once, but the server's
// goes on, with the locks it took, and a DROP SCHEMA right after the
// store closed (a test's cleanup) deadlocked with it.
func (p *planFunctions) close() {
	p.mu.Lock()
	p.stop()
	p.idle.Broadcast() // a wait returns: nothing more will be made
	p.mu.Unlock()
	select {
	case <-p.done:
	case <-time.After(planCloseGrace):
		p.abort()
		<-p.done
	}
	p.abort()
}

// setAside puts r aside while another session makes its function, and
// queues it again after a pause that doubles with each look, so that run
// goes on with the other statements meanwhile: processes that start
// together then make different functions at once, instead of all waiting
// on each function in turn (60 workers behind PgBouncer each took 3 to 8
// s to route their statements). It reports false once the lock was held
// for p.makeWithin: the attempt has failed.
func (p *planFunctions) setAside(r planRequest) bool {
	if p.onBusy != nil {
		p.onBusy()
	}
	if r.busySince.IsZero() {
		r.busySince = time.Now()
	}
	if time.Since(r.busySince) >= p.makeWithin {
		return false
	}
	pause := min(planBusyPause<<min(r.looks, 5), planBusyMaxPause)
	r.looks++
	time.AfterFunc(jitter(pause), func() {
		if p.ctx.Err() == nil {
			select {
			case p.pending <- r:
				return // working still counts it
			default:
			}
		}
		p.finished()
	})
	return true
}

// heldTooLong names the lock on r's function as the cause of err.
func (p *planFunctions) heldTooLong(r planRequest, err error) error {
	return fmt.Errorf("another session held the lock on function %s for %s without making it "+
		"(a session left in a transaction holds it: see pg_stat_activity): %w",
		planFunctionName(p.s.prefix, r.sql), p.makeWithin, err)
}

// look reads the functions the schema holds into known; a failure only
// leaves the statements to be found by the transactions that would make
// them (makeAll).
func (p *planFunctions) look() {
	ctx, cancel := context.WithTimeout(p.ctx, planMakeWithin)
	defer cancel()
	conn, err := p.s.pool.Acquire(ctx)
	if err != nil {
		return
	}
	defer conn.Release()
	if err := p.lookAll(ctx, conn); err != nil {
		p.s.cfg.Logger.Debug("postgres: could not list dagrun's statement functions", "error", firstLine(err.Error()))
	}
}

// lookAll reads every statement function of the schema into known.
func (p *planFunctions) lookAll(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}) error {
	rows, err := q.Query(ctx, `SELECT proname::text, pronargs, proretset FROM pg_proc
		WHERE pronamespace = $1::regnamespace AND proname LIKE $2`,
		pgx.Identifier{p.s.cfg.Schema}.Sanitize(), planFuncPrefix+"%")
	if err != nil {
		return err
	}
	known := map[string]string{}
	var (
		fn   string
		args int16
		set  bool
	)
	_, err = pgx.ForEachRow(rows, []any{&fn, &args, &set}, func() error {
		known[fn] = planCall(p.s.prefix, fn, int(args), !set)
		return nil
	})
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.known = known
	p.mu.Unlock()
	return nil
}

// planResult is what an attempt to make one statement's function came
// to: the call of the function, "" when the statement stays as it is, or
// why it failed.
type planResult struct {
	call string
	err  error
}

// attemptAll is makeAll, within p.makeWithin, unless a test's beforeMake
// fails it.
func (p *planFunctions) attemptAll(batch []planRequest) ([]planResult, error) {
	if p.beforeMake != nil {
		if err := p.beforeMake(); err != nil {
			return nil, err
		}
	}
	ctx, cancel := context.WithTimeout(p.attempts, p.makeWithin)
	defer cancel()
	return p.makeAll(ctx, batch)
}

// errPlanBusy says that another session holds the lock on a function's
// name: it is making the function.
var errPlanBusy = errors.New("postgres: another session is making the function")

// makeAll creates, unless they exist, the functions of the batch's
// statements, in one transaction, and returns each one's result: errPlanBusy
// for a function another session holds the lock on: it is making it.
// Processes that start together may make the same function: one does,
// under that lock, and the others look again later without holding a
// connection, which behind PgBouncer is one of the few its pool lends to
// the whole fleet. Waiting on the lock instead held 60 workers' server
// connections for 13 s in all, about a tenth of a fleet's start. An error
// of makeAll's own is every statement's.
func (p *planFunctions) makeAll(ctx context.Context, batch []planRequest) ([]planResult, error) {
	conn, err := p.s.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Release()
	results := make([]planResult, len(batch))
	names := make([]string, len(batch))
	keys := make([]string, len(batch))
	for i, r := range batch {
		names[i] = planFunctionName(p.s.prefix, r.sql)
		keys[i] = p.s.prefix + names[i]
	}
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT pg_try_advisory_xact_lock(hashtext(k))
			FROM unnest($1::text[]) WITH ORDINALITY AS u(k, i) ORDER BY i`, keys)
		if err != nil {
			return err
		}
		locked, err := pgx.CollectRows(rows, pgx.RowTo[bool])
		if err != nil {
			return err
		}
		if len(locked) != len(keys) {
			return fmt.Errorf("postgres: took %d locks on statement functions' names, asked for %d", len(locked), len(keys))
		}
		// Made by another process already, nearly always. A statement of
		// its own, so that it reads after the locks: a session that held
		// one may have made its function meanwhile. The read lists every
		// other function made so far as well.
		if err := p.lookAll(ctx, tx); err != nil {
			return err
		}
		p.mu.Lock()
		for i, name := range names {
			results[i].call = p.known[name]
		}
		p.mu.Unlock()
		for i := range batch {
			switch {
			case results[i].call != "":
			case !locked[i]:
				results[i].err = errPlanBusy
			default:
				results[i].call, results[i].err = p.makeIn(ctx, tx, names[i], batch[i].sql)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return results, nil
}

// makeIn creates the function name of sql in a savepoint of tx, so that a
// statement whose function cannot be made leaves the others made, and
// returns its call, or "" when sql stays as it is. Only the session that
// holds the lock on name describes the statement: processes that start
// together find the function missing together, and each described the
// statement, about 2 ms of the server's time, only to learn that another
// was making it.
func (p *planFunctions) makeIn(ctx context.Context, tx pgx.Tx, name, sql string) (string, error) {
	var call string
	err := pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error {
		create, made, err := p.describe(ctx, sp, name, sql)
		if err != nil || create == "" {
			return err
		}
		if _, err := sp.Exec(ctx, create); err != nil {
			return err
		}
		call = made
		return nil
	})
	return call, err
}

// describe returns the statement that creates sql's function name and
// the call of that function, or "" when sql stays as it is.
func (p *planFunctions) describe(ctx context.Context, tx pgx.Tx, name, sql string) (create, call string, err error) {
	// An unnamed statement: described on this connection, kept by none.
	desc, err := tx.Conn().PgConn().Prepare(ctx, "", sql, nil)
	if err != nil {
		return "", "", err
	}
	changes := len(desc.Fields) == 0
	if len(desc.ParamOIDs) > maxFuncArgs || changes && mainVerb(sql) == "SELECT" {
		return "", "", nil
	}
	oids := make([]uint32, 0, len(desc.ParamOIDs)+len(desc.Fields))
	oids = append(oids, desc.ParamOIDs...)
	for _, f := range desc.Fields {
		oids = append(oids, f.DataTypeOID)
	}
	// A pseudo-type (void, record, anyelement, ...) cannot be a
	// function's parameter or column: such a statement stays as it is.
	var (
		types  []string
		pseudo bool
	)
	if err := tx.QueryRow(ctx, `SELECT array_agg(format_type(u.t, NULL) ORDER BY u.i), coalesce(bool_or(y.typtype = 'p'), false)
		FROM unnest($1::oid[]) WITH ORDINALITY AS u(t, i) JOIN pg_type y ON y.oid = u.t`, oids).Scan(&types, &pseudo); err != nil {
		return "", "", err
	}
	if pseudo || len(types) != len(oids) {
		return "", "", nil
	}
	params, columns := types[:len(desc.ParamOIDs)], types[len(desc.ParamOIDs):]
	create, ok := planFunction(p.s.prefix+name, sql, params, columns, changes)
	if !ok {
		return "", "", nil
	}
	return create, planCall(p.s.prefix, name, len(params), changes), nil
}

// planFunctionName names the function of a statement of the schema prefix
// qualifies: a hash of the statement and of the schema's version, which
// together settle its parameters' and columns' types.
func planFunctionName(prefix, sql string) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%d\x00%s", prefix, schemaVersion(), sql)
	return planFuncPrefix + hex.EncodeToString(h.Sum(nil)[:8])
}

// schemaVersion is the version of the last migration this build knows.
var schemaVersion = sync.OnceValue(func() int {
	ms, err := migrate.Read(migrationFS, "migrations")
	if err != nil || len(ms) == 0 {
		return 0 // the store could not have opened
	}
	return ms[len(ms)-1].Version
})

// planCall returns the statement that calls function name of the schema
// prefix qualifies with args parameters: its rows, or, for a change, as
// many rows of no columns as it changed, so that the command tag counts
// them.
func planCall(prefix, name string, args int, changes bool) string {
	list := make([]string, args)
	for i := range list {
		list[i] = fmt.Sprintf("$%d", i+1)
	}
	call := prefix + name + "(" + strings.Join(list, ", ") + ")"
	if changes {
		return "SELECT FROM generate_series(1, " + call + ")"
	}
	return "SELECT * FROM " + call
}

// planFunction returns the statement that creates function fn (qualified)
// whose body is sql, with the given parameter and column types: a
// function that returns sql's rows, or, for changes (sql returns none),
// the count of rows it changed. ok is false when sql cannot be quoted as
// a body.
func planFunction(fn, sql string, params, columns []string, changes bool) (create string, ok bool) {
	const quote = "$dagrun_plan$"
	if strings.Contains(sql, quote) {
		return "", false
	}
	// The columns are named apart from any column the statement reads:
	// in PL/pgSQL an output column is a variable its statements could
	// otherwise resolve to (use_column settles a clash the other way all
	// the same).
	out := make([]string, len(columns))
	for i, t := range columns {
		out[i] = fmt.Sprintf("dagrun_out_%d %s", i+1, t)
	}
	// The statement ends on a line of its own: its last line may be a
	// comment.
	body := "\n#variable_conflict use_column\nBEGIN\nRETURN QUERY " + sql + "\n;\nEND\n"
	signature := "(" + strings.Join(params, ", ") + ") RETURNS TABLE (" + strings.Join(out, ", ") + ")"
	if changes {
		body = "\n#variable_conflict use_column\nDECLARE dagrun_changed bigint;\nBEGIN\n" + sql +
			"\n;\nGET DIAGNOSTICS dagrun_changed = ROW_COUNT;\nRETURN dagrun_changed;\nEND\n"
		signature = "(" + strings.Join(params, ", ") + ") RETURNS bigint"
	}
	// Generic plans, as the named prepared statements of a direct
	// connection settle on: PL/pgSQL otherwise kept planning the lock of
	// several instances afresh at every call.
	return "CREATE FUNCTION " + fn + signature +
		" LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan AS " + quote + body + quote, true
}

// isInsufficientPrivilege reports whether err is PostgreSQL's refusal of
// an action to the role.
func isInsufficientPrivilege(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42501"
}
