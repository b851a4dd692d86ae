package postgres

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/storagetest"
)

// showStatementTimeout returns statement_timeout as a connection of s's pool
// sees it.
func showStatementTimeout(t *testing.T, s *Store) string {
	t.Helper()
	var v string
	require.NoError(t, s.Pool().QueryRow(t.Context(), "SHOW statement_timeout").Scan(&v))
	return v
}

// TestFaultStatementTimeoutConfig: Open sets statement_timeout on its
// connections: 30s by default, the URL's when Config leaves it zero,
// Config's when set, none when negative.
func TestFaultStatementTimeoutConfig(t *testing.T) {
	t.Parallel()
	schema := newSchema(t)
	withParam := func(v string) string {
		u, err := url.Parse(testURL(t))
		require.NoError(t, err)
		q := u.Query()
		q.Set("statement_timeout", v)
		u.RawQuery = q.Encode()
		return u.String()
	}
	cases := []struct {
		name    string
		url     string
		timeout time.Duration
		want    string
	}{
		{"default", testURL(t), 0, "30s"},
		{"config", testURL(t), 1500 * time.Millisecond, "1500ms"},
		{"url", withParam("5000"), 0, "5s"},
		{"config over url", withParam("5000"), 2 * time.Second, "2s"},
		{"disabled", withParam("5000"), -1, "0"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, err := Open(t.Context(), c.url, &Config{Schema: schema, MaxConns: 1, StatementTimeout: c.timeout})
			require.NoError(t, err)
			defer s.Close()
			require.Equal(t, c.want, showStatementTimeout(t, s))
		})
	}
}

// TestFaultStatementTimeout: a store write blocked on a lock another session
// holds fails promptly with a statement-timeout error instead of hanging,
// and once the lock is gone the same write succeeds.
func TestFaultStatementTimeout(t *testing.T) {
	t.Parallel()
	// Long enough for the statements after the lock is gone, whose first
	// planning in a new backend took over 200ms on a loaded machine.
	const timeout = time.Second
	s := openInSchema(t, newSchema(t), &Config{StatementTimeout: timeout, MaxConns: 2})
	ctx := t.Context()
	p := params(spec("a"), spec("b", "a"))
	_, err := s.CreateInstances(ctx, nil, []storage.CreateParams{p}, storagetest.Plan)
	require.NoError(t, err)
	claimed, err := s.ClaimSteps(ctx, storage.ClaimParams{WorkerID: "w", Limit: 1, Lease: time.Minute})
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	done := []storage.StepResult{{Claim: claimed[0].Claim, Outcome: storage.OutcomeCompleted, Output: []byte(`{}`)}}

	// Another session (not bound by the store's timeout) locks the
	// instance row, as a stuck administrator's transaction might.
	blocker, err := sharedPool(t).Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = blocker.Rollback(context.WithoutCancel(ctx)) }()
	_, err = blocker.Exec(ctx, "SELECT 1 FROM "+pgx.Identifier{s.cfg.Schema, "instances"}.Sanitize()+" WHERE id = $1 FOR UPDATE", p.ID)
	require.NoError(t, err)

	began := time.Now()
	_, err = s.FinishSteps(ctx, done, storagetest.Plan)
	took := time.Since(began)
	t.Logf("blocked finish failed after %s: %v", took.Round(time.Millisecond), err)
	require.Error(t, err)
	var pe *pgconn.PgError
	require.True(t, errors.As(err, &pe), "%v", err)
	require.Equal(t, "57014", pe.Code)
	require.ErrorContains(t, err, "statement timeout")
	require.NotErrorIs(t, err, storage.ErrUnavailable)
	require.Less(t, took, 5*time.Second, "the statement timeout did not end the wait")
	require.GreaterOrEqual(t, took, timeout)

	// Nothing of the failed transaction stuck, and the store works again
	// once the lock is released.
	require.NoError(t, blocker.Rollback(ctx))
	out, claimedNext, err := s.FinishAndClaim(ctx, done, storagetest.Plan, storage.ClaimParams{WorkerID: "w", Limit: 1, Lease: time.Minute})
	require.NoError(t, err)
	require.True(t, out[0].Accepted)
	require.Len(t, claimedNext, 1)
	require.Equal(t, "b", claimedNext[0].Step)
}

// TestFaultListenerBackoffResets: the reconnect backoff grows only across
// failed attempts. A listener killed again and again, each time after it
// got back to LISTENing, reconnects within about ListenerRetryMin every
// time, not after a delay doubled at every kill.
func TestFaultListenerBackoffResets(t *testing.T) {
	t.Parallel()
	s := openTestStore(t, &Config{ListenerRetryMin: 10 * time.Millisecond, ListenerRetryMax: 10 * time.Second})
	ch, pid := subscribeIdle(t, s)
	for kill := range 9 {
		drain(ch)
		var killed bool
		require.NoError(t, sharedPool(t).QueryRow(t.Context(), "SELECT pg_terminate_backend($1)", int32(pid)).Scan(&killed))
		require.True(t, killed)
		// Doubling from 10ms, the ninth reconnect would wait 2.56s.
		took := awaitSignal(t, ch, time.Second, "the listener was killed")
		t.Logf("kill %d: reconnected in %s", kill+1, took.Round(time.Millisecond))
		pid = awaitListener(t, s, pid)
	}
}

// TestPoolSizeFromURL: the URL's pool_max_conns sizes the pool Open builds
// (that is how --db sizes a worker's pool), Config.MaxConns wins over it,
// and without either the pool has DefaultMaxConns connections.
// TestHasParam: a parameter is set by its key, in a URL or a keyword/value
// string, not by its name appearing in a value.
func TestHasParam(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		conn string
		want bool
	}{
		{"postgres://u@h/db?pool_max_conns=4", true},
		{"postgresql://u@h/db?sslmode=disable&pool_max_conns=4", true},
		{"postgres://u@h/db?application_name=pool_max_conns", false},
		{"postgres://u@h/pool_max_conns", false},
		{"host=h dbname=db pool_max_conns=4", true},
		{"host=h application_name=pool_max_conns", false},
	} {
		require.Equal(t, c.want, HasParam(c.conn, "pool_max_conns"), c.conn)
	}
}

func TestPoolSizeFromURL(t *testing.T) {
	t.Parallel()
	schema := newSchema(t)
	withSize := func(v string) string {
		u, err := url.Parse(testURL(t))
		require.NoError(t, err)
		q := u.Query()
		q.Set("pool_max_conns", v)
		u.RawQuery = q.Encode()
		return u.String()
	}
	cases := []struct {
		name   string
		url    string
		config int32
		want   int32
	}{
		{"default", testURL(t), 0, DefaultMaxConns},
		{"a name that only contains the parameter's", withQuery(t, testURL(t), "application_name", "pool_max_conns_x"), 0, DefaultMaxConns},
		{"url", withSize("3"), 0, 3},
		{"config over url", withSize("3"), 5, 5},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, err := Open(t.Context(), c.url, &Config{Schema: schema, MaxConns: c.config})
			require.NoError(t, err)
			defer s.Close()
			require.Equal(t, c.want, s.Pool().Config().MaxConns)
		})
	}
}

// TestConnectRefused: a server with no connection slot left for the store
// (here the role's CONNECTION LIMIT; max_connections gives the same
// SQLSTATE 53300) makes Open fail with storage.ErrUnavailable and one line
// that names the problem and the ways out.
func TestConnectRefused(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	role := fmt.Sprintf("dagrun_refused_%d", time.Now().UnixNano())
	_, err := sharedPool(t).Exec(ctx, "CREATE ROLE "+role+" LOGIN CONNECTION LIMIT 0")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = sharedPool(t).Exec(context.WithoutCancel(ctx), "DROP ROLE IF EXISTS "+role) })
	u, err := url.Parse(testURL(t))
	require.NoError(t, err)
	u.User = url.User(role)

	_, err = Open(ctx, u.String(), &Config{MaxConns: 1})
	require.ErrorIs(t, err, storage.ErrUnavailable)
	msg := err.Error()
	t.Log(msg)
	require.NotContains(t, msg, "\n")
	for _, want := range []string{`too many connections for role "` + role + `"`, "SQLSTATE 53300", "run fewer workers", "pool_max_conns=N", "pgbouncer=true"} {
		require.Contains(t, msg, want)
	}
}

// TestFaultLookAheadFails: a look ahead that fails (here with the claim's
// context) leaves the verdict as it was and is made again at the next
// claim, not a second later: a failed look that counted as made would
// have the claims walk past another handler's backlog for that second, or
// read heads for nothing.
func TestFaultLookAheadFails(t *testing.T) {
	t.Parallel()
	s := openTestStore(t, nil)
	p := storage.ClaimParams{WorkerID: "w", Limit: 10, Lease: time.Minute, Handlers: []string{"mine"}}
	insert := func(handler string, n int) {
		t.Helper()
		_, err := s.pool.Exec(t.Context(), s.q(`
			INSERT INTO {s}steps (instance_id, position, name, handler, queue, workflow, status, run_after, ready_at)
			SELECT $1 || g, 0, 's', $1, 'default', 'wf', 'pending', now() - interval '1 hour', now() - interval '1 hour'
			FROM generate_series(1, $2::int) g`), handler, n)
		require.NoError(t, err)
	}
	insert("mine", 5)

	cancelled, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := s.ClaimSteps(cancelled, p)
	require.ErrorIs(t, err, context.Canceled)
	require.False(t, s.heads.Heads(p), "a failed look changes no verdict")

	// Another handler's steps, ahead of the claimer's own by priority.
	insert("theirs", 50)
	_, err = s.pool.Exec(t.Context(), s.q(`UPDATE {s}steps SET priority = 1 WHERE handler = 'theirs'`))
	require.NoError(t, err)
	claimed, err := s.ClaimSteps(t.Context(), p)
	require.NoError(t, err)
	require.Len(t, claimed, 5)
	require.True(t, s.heads.Heads(p), "the next claim looked again and found the other handler's steps ahead")
	require.EqualValues(t, 1, s.headClaims.Load())
}

// TestRoleThatMayNotCreateTheSchema: a role without the right to create
// dagrun's schema is told what to grant, as storage unavailable (exit 3),
// not as a failure of its command.
func TestRoleThatMayNotCreateTheSchema(t *testing.T) {
	t.Parallel()
	dbURL := newDatabase(t)
	role := fmt.Sprintf("dagrun_test_nocreate_%d", idSeq.Add(1)+time.Now().UnixNano()%1_000_000)
	admin := sharedPool(t)
	_, err := admin.Exec(t.Context(), "CREATE ROLE "+role+" LOGIN")
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), 30*time.Second)
		defer cancel()
		_, err := admin.Exec(ctx, "DROP ROLE "+role)
		require.NoError(t, err)
	})
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	u.User = url.User(role)
	_, err = Open(t.Context(), u.String(), &Config{MaxConns: 2})
	require.ErrorIs(t, err, storage.ErrUnavailable)
	require.ErrorContains(t, err, `creating dagrun's tables in schema dagrun: permission denied for database`)
	require.ErrorContains(t, err, "GRANT CREATE ON DATABASE")
	require.NotContains(t, err.Error(), "\n")
}
