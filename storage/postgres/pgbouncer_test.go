package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/storagetest"
)

// sessionSettings reads the settings dagrun sets for its statements
// (statement_timeout, enable_seqscan, jit), as q sees them.
func sessionSettings(t *testing.T, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) []string {
	t.Helper()
	var timeout, seqscan, jit string
	require.NoError(t, q.QueryRow(t.Context(), "SELECT current_setting('statement_timeout'), current_setting('enable_seqscan'), current_setting('jit')").Scan(&timeout, &seqscan, &jit))
	return []string{timeout, seqscan, jit}
}

// TestPgBouncerURL: pgbouncer=true leaves dagrun's settings out of the
// connection startup (PgBouncer refuses any it does not know) and sets them
// with SET LOCAL in each transaction of the store instead, the URL's
// statement_timeout included; queries prepare no named statement; and no
// listener connection is opened. The server is reached directly here: what
// the sessions hold is what PgBouncer would pass on.
func TestPgBouncerURL(t *testing.T) {
	t.Parallel()
	schema := newSchema(t)
	open := func(t *testing.T, keyValues ...string) *Store {
		return openURL(t, withQuery(t, testURL(t), append([]string{SchemaParam, schema}, keyValues...)...), &Config{MaxConns: 1})
	}
	plain, err := pgx.Connect(t.Context(), testURL(t))
	require.NoError(t, err)
	defer plain.Close(context.WithoutCancel(t.Context()))
	server := sessionSettings(t, plain)

	s := open(t, PgBouncerParam, "true", "statement_timeout", "5000")
	require.True(t, s.cfg.PgBouncer)
	require.Equal(t, server, sessionSettings(t, s.Pool()), "the session holds the server's defaults: nothing was sent at startup")
	require.Equal(t, pgx.QueryExecModeCacheDescribe, s.Pool().Config().ConnConfig.DefaultQueryExecMode)
	transactions := map[string]func(context.Context, func(pgx.Tx) error) error{
		"write": func(ctx context.Context, fn func(pgx.Tx) error) error {
			return s.inTx(ctx, func(tx pgx.Tx, _ *txState) error { return fn(tx) })
		},
		"read": s.read,
	}
	for name, inTx := range transactions {
		require.NoError(t, inTx(t.Context(), func(tx pgx.Tx) error {
			require.Equal(t, []string{"5s", "off", "off"}, sessionSettings(t, tx), "in a %s transaction", name)
			return nil
		}))
	}
	// Claims, heartbeats and single reads are transactions of their own:
	// their batch sets the settings first.
	require.Equal(t, []string{"5s", "off", "off"}, sessionSettings(t, s.db), "a statement of its own")
	rows, err := s.db.Query(t.Context(), "SELECT current_setting('jit') FROM generate_series(1, 3)")
	require.NoError(t, err)
	jits, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"off", "off", "off"}, jits)
	var b pgx.Batch
	var batched string
	b.Queue("SELECT current_setting('enable_seqscan')").QueryRow(func(row pgx.Row) error { return row.Scan(&batched) })
	require.NoError(t, s.db.SendBatch(t.Context(), &b).Close())
	require.Equal(t, "off", batched, "in a batch")
	_, err = s.db.Exec(t.Context(), "SELECT pg_sleep(0.01)")
	require.NoError(t, err)
	require.Equal(t, server, sessionSettings(t, s.Pool()), "the settings stayed with their statements")
	require.ErrorIs(t, s.db.QueryRow(t.Context(), "SELECT 1 WHERE false").Scan(new(int)), pgx.ErrNoRows)
	claimed, err := s.ClaimSteps(t.Context(), storage.ClaimParams{WorkerID: "w", Limit: 1, Lease: time.Minute})
	require.NoError(t, err)
	require.Empty(t, claimed)

	_, unsubscribe := s.Subscribe(nil)
	defer unsubscribe()
	time.Sleep(100 * time.Millisecond) // a listener would have connected by now
	require.Zero(t, s.listenerPID(), "a store behind PgBouncer started a listener")

	t.Run("query mode from the URL", func(t *testing.T) {
		s := open(t, PgBouncerParam, "1", "default_query_exec_mode", "exec")
		require.Equal(t, pgx.QueryExecModeExec, s.Pool().Config().ConnConfig.DefaultQueryExecMode)
	})
	t.Run("false", func(t *testing.T) {
		s := open(t, PgBouncerParam, "false")
		require.False(t, s.cfg.PgBouncer)
		require.Equal(t, []string{"30s", "off", "off"}, sessionSettings(t, s.Pool()))
	})
	t.Run("invalid", func(t *testing.T) {
		_, err := Open(t.Context(), withQuery(t, testURL(t), SchemaParam, schema, PgBouncerParam, "maybe"), &Config{MaxConns: 1})
		require.EqualError(t, err, `postgres: invalid database URL: pgbouncer="maybe": use pgbouncer=true or pgbouncer=false`)
		require.ErrorIs(t, err, ErrInvalidURL)
	})
}

// TestPgBouncerConformance runs the conformance suite through a PgBouncer
// in transaction-pooling mode with three server connections for all the
// suite's parallel stores, so that consecutive transactions of one store
// land on connections other stores used in between: anything the store
// left on a session (a prepared statement, a setting, a LISTEN, an
// advisory lock) would be missing or in another's way. Skipped without
// the pgbouncer program (failed under CI=true).
func TestPgBouncerConformance(t *testing.T) {
	t.Parallel()
	bouncer := startPgBouncer(t, testURL(t), 3)
	storagetest.Run(t, storagetest.Harness{
		NewStore: func(t *testing.T, now func() time.Time) storage.Store {
			return openURL(t, withQuery(t, bouncer, SchemaParam, newSchema(t)), &Config{Now: now, MaxConns: 4})
		},
		BeginTx: beginCallerTx,
	})
}

// startPgBouncer runs PgBouncer in transaction-pooling mode in front of the
// server of serverURL, with poolSize server connections per database, on a
// free port until the test ends, and returns serverURL through it with
// pgbouncer=true. settings are more lines of pgbouncer.ini's [pgbouncer].
func startPgBouncer(t *testing.T, serverURL string, poolSize int, settings ...string) string {
	t.Helper()
	path, err := exec.LookPath("pgbouncer")
	if err != nil {
		path, err = exec.LookPath("/usr/sbin/pgbouncer")
	}
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("pgbouncer is not installed; CI needs it (apt-get install pgbouncer)")
		}
		t.Skip("pgbouncer is not installed (apt-get install pgbouncer)")
	}
	server, err := url.Parse(serverURL)
	require.NoError(t, err)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	_, port, _ := net.SplitHostPort(addr)
	require.NoError(t, l.Close())

	dir := t.TempDir()
	require.NoError(t, os.Chmod(dir, 0o755)) // PgBouncer may run as another user
	password, _ := server.User.Password()
	users := filepath.Join(dir, "userlist.txt")
	require.NoError(t, os.WriteFile(users, fmt.Appendf(nil, "%q %q\n", server.User.Username(), password), 0o644))
	config := filepath.Join(dir, "pgbouncer.ini")
	require.NoError(t, os.WriteFile(config, fmt.Appendf(nil, `[databases]
* = host=%s port=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %s
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = transaction
default_pool_size = %d
max_client_conn = 1000
%s
`, server.Hostname(), cmp.Or(server.Port(), "5432"), port, users, poolSize, strings.Join(settings, "\n")), 0o644))
	args := []string{config}
	if os.Geteuid() == 0 { // PgBouncer refuses to run as root
		account := "postgres"
		if _, err := user.Lookup(account); err != nil {
			account = "nobody"
		}
		args = append([]string{"-u", account}, args...)
	}
	logs, err := os.Create(filepath.Join(dir, "pgbouncer.log"))
	require.NoError(t, err)
	defer logs.Close() // the process has its own descriptor
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = logs, logs
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	require.Eventually(t, func() bool {
		conn, err := net.Dial("tcp", addr)
		if err == nil {
			_ = conn.Close()
		}
		return err == nil
	}, 10*time.Second, 20*time.Millisecond, "pgbouncer did not listen")
	through := *server
	through.Host = net.JoinHostPort("127.0.0.1", port)
	return withQuery(t, through.String(), PgBouncerParam, "true")
}

// TestPgBouncerWithoutItsServerIsUnavailable: when the server behind
// PgBouncer goes away, PgBouncer keeps the store's connections and answers
// each query with an error of its own (SQLSTATE 08P01), which must read as
// the database being unavailable, as the server's own refusal does: the
// CLI exits 3, the API answers 503 and a worker retries its results with
// backoff instead of giving them up after a few quick tries. The server
// "goes away" behind a TCP relay the test cuts.
func TestPgBouncerWithoutItsServerIsUnavailable(t *testing.T) {
	t.Parallel()
	server, err := url.Parse(testURL(t))
	require.NoError(t, err)
	relay := newTCPRelay(t, server.Host)
	server.Host = relay.addr
	// A query waits at most 2 s for a server connection, not 120.
	bouncer := startPgBouncer(t, server.String(), 1, "query_wait_timeout = 2", "server_login_retry = 1")
	store := openURL(t, withQuery(t, bouncer, SchemaParam, newSchema(t)), &Config{MaxConns: 1})
	_, err = store.Stats(t.Context())
	require.NoError(t, err, "through the relay while it relays")

	relay.cut()
	for range 2 {
		_, err := store.Stats(t.Context())
		require.ErrorIs(t, err, storage.ErrUnavailable)
		require.Contains(t, err.Error(), "PgBouncer has no connection to PostgreSQL")
		require.NotContains(t, err.Error(), "\n")
	}
}

// tcpRelay forwards connections to a server until cut, which closes them
// all and refuses new ones: the server seems to have gone away.
type tcpRelay struct {
	addr string
	l    net.Listener
	mu   sync.Mutex
	open []net.Conn
}

func newTCPRelay(t *testing.T, target string) *tcpRelay {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	r := &tcpRelay{addr: l.Addr().String(), l: l}
	t.Cleanup(r.cut)
	go func() {
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				_ = in.Close()
				continue
			}
			r.mu.Lock()
			r.open = append(r.open, in, out)
			r.mu.Unlock()
			go func() { _, _ = io.Copy(out, in); _ = out.Close() }()
			go func() { _, _ = io.Copy(in, out); _ = in.Close() }()
		}
	}()
	return r
}

func (r *tcpRelay) cut() {
	_ = r.l.Close()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.open {
		_ = c.Close()
	}
	r.open = nil
}

func TestUnavailableErrors(t *testing.T) {
	t.Parallel()
	cases := map[string]struct {
		err  error
		want bool
		says string // in the message, when not empty
	}{
		"PgBouncer cannot log in":     {&pgconn.PgError{Code: "08P01", Message: "server login has been failing, try again later (server_login_retry)"}, true, ""},
		"PgBouncer found no server":   {&pgconn.PgError{Code: "08P01", Message: "query_wait_timeout"}, true, ""},
		"PgBouncer lost its server":   {&pgconn.PgError{Code: "08P01", Message: "server conn crashed?"}, true, ""},
		"connection closed mid-query": {fmt.Errorf("receive message: %w", io.ErrUnexpectedEOF), true, ""},
		// A PgBouncer or server killed under load resets some connections
		// rather than closing them.
		"connection reset mid-query": {&net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}, true, "reset the connection"},
		"broken pipe on a send":      {&net.OpError{Op: "write", Net: "tcp", Err: os.NewSyscallError("write", syscall.EPIPE)}, true, "reset the connection"},
		// 57P01 is a shutdown and pg_terminate_backend alike.
		"connection terminated":      {&pgconn.PgError{Code: "57P01", Message: "terminating connection due to administrator command"}, true, "a shutdown, or an administrator terminated it"},
		"another protocol violation": {&pgconn.PgError{Code: "08P01", Message: "invalid message format"}, false, ""},
		"a constraint":               {&pgconn.PgError{Code: "23505", Message: "duplicate key"}, false, ""},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			err := interpretError(c.err)
			require.Equal(t, c.want, errors.Is(err, storage.ErrUnavailable), "%v", err)
			if c.want {
				require.NotContains(t, err.Error(), "\n")
				require.Contains(t, err.Error(), c.says)
			}
		})
	}
}

// TestPgBouncerUnknownDatabase: a database URL naming a database that does
// not exist gets the same advice through PgBouncer as from the server,
// although PgBouncer relays the server's refusal under its own SQLSTATE.
func TestPgBouncerUnknownDatabase(t *testing.T) {
	t.Parallel()
	bouncer, err := url.Parse(startPgBouncer(t, testURL(t), 1))
	require.NoError(t, err)
	bouncer.Path = "/dagrun_no_such_database"
	_, err = Open(t.Context(), bouncer.String(), &Config{MaxConns: 1})
	require.ErrorIs(t, err, storage.ErrUnavailable)
	require.Contains(t, err.Error(), `database "dagrun_no_such_database" does not exist: create the database or fix its name in the database URL`)
	require.NotContains(t, err.Error(), "\n")
}

// TestURLSettingsTheServerRefuses: a parameter of the database URL that
// the server refuses as a setting is named with what to do about it, not
// with advice about the user, password and database.
func TestURLSettingsTheServerRefuses(t *testing.T) {
	t.Parallel()
	base := testURL(t)
	for _, c := range []struct{ param, says, hint string }{
		{"bogus_param=1", `unrecognized configuration parameter "bogus_param"`, "remove that one, or fix its name"},
		{"statement_timeout=soon", `invalid value for parameter "statement_timeout": "soon"`, "fix that setting's value in the database URL"},
	} {
		u, err := url.Parse(base)
		require.NoError(t, err)
		q := u.Query()
		name, value, _ := strings.Cut(c.param, "=")
		q.Set(name, value)
		u.RawQuery = q.Encode()
		_, err = Open(t.Context(), u.String(), &Config{MaxConns: 1})
		require.ErrorIs(t, err, storage.ErrUnavailable, c.param)
		require.NotContains(t, err.Error(), "\n")
		require.NotContains(t, err.Error(), "check the user, password and database", c.param)
		require.Contains(t, err.Error(), c.says+": ", c.param)
		require.Contains(t, err.Error(), c.hint, c.param)
	}
}

func TestMissingDatabase(t *testing.T) {
	t.Parallel()
	cases := map[string]struct {
		err  *pgconn.PgError
		want bool
	}{
		"the server":                     {&pgconn.PgError{Code: "3D000", Message: `database "orders" does not exist`}, true},
		"PgBouncer relaying the server":  {&pgconn.PgError{Code: "08P01", Message: `database "orders" does not exist`}, true},
		"PgBouncer without the database": {&pgconn.PgError{Code: "08P01", Message: "no such database: orders"}, true},
		"PgBouncer without a server":     {&pgconn.PgError{Code: "08P01", Message: "server login has been failing, try again later (server_login_retry)"}, false},
		"a wrong password":               {&pgconn.PgError{Code: "28P01", Message: `password authentication failed for user "dagrun"`}, false},
		"a missing role":                 {&pgconn.PgError{Code: "28000", Message: `role "dagrun" does not exist`}, false},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, c.want, missingDatabase(c.err))
		})
	}
}
