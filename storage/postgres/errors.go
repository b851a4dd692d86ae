package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dagrun/dagrun/storage"
)

// interpretError translates driver errors into storage sentinels at the
// boundary, so callers only ever check errors.Is(err, storage.ErrXxx).
func interpretError(err error) error {
	if err == nil {
		return nil
	}
	switch {
	case errors.Is(err, storage.ErrNotFound), errors.Is(err, storage.ErrConflict), errors.Is(err, storage.ErrUnavailable):
		return err
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("%w: %v", storage.ErrNotFound, err)
	}
	if msg, ok := unavailable(err); ok {
		return &unavailableError{msg: msg, err: err}
	}
	return err
}

// unavailableError is a one-line "cannot reach the database" error that
// wraps both storage.ErrUnavailable and the driver's error.
type unavailableError struct {
	msg string
	err error
}

func (e *unavailableError) Error() string   { return e.msg }
func (e *unavailableError) Unwrap() []error { return []error{storage.ErrUnavailable, e.err} }

// unavailable reports whether err means the database cannot be used at all
// (server down, DNS, authentication, unknown database, no connection slot
// left), with a one-line message naming the server and what to do. The
// message never includes the password: it is built from the host, port,
// user and database only.
func unavailable(err error) (string, bool) {
	var (
		ce  *pgconn.ConnectError
		pe  *pgconn.PgError
		dns *net.DNSError
		op  *net.OpError
	)
	where := "postgres"
	if errors.As(err, &ce) && ce.Config != nil {
		where = fmt.Sprintf("postgres at %s (user %q, database %q)", net.JoinHostPort(ce.Config.Host, fmt.Sprint(ce.Config.Port)), ce.Config.User, ce.Config.Database)
	}
	if errors.As(err, &pe) {
		if hint, ok := connectHint(pe); ok {
			return fmt.Sprintf("%s: %s: %s (SQLSTATE %s): %s", storage.ErrUnavailable, where, pe.Message, pe.Code, hint), true
		}
	}
	if ce == nil {
		// Errors of an established connection that died mid-way.
		if pe != nil && (pe.Code == "57P01" || pe.Code == "57P02") {
			// 57P01 is both a server shutting down and pg_terminate_backend:
			// say what the two share.
			return fmt.Sprintf("%s: %s ended the connection (%s: a shutdown, or an administrator terminated it): retry later", storage.ErrUnavailable, where, pe.Message), true
		}
		if pe == nil && (errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF)) {
			// The server or a PgBouncer in between closed the connection
			// (a restart): what was in flight may or may not have
			// committed, which fences settle when it is tried again.
			return fmt.Sprintf("%s: %s closed the connection (%s): retry later", storage.ErrUnavailable, where, firstLine(err.Error())), true
		}
		if pe == nil && (errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNABORTED)) {
			// The same, seen as a reset: a PgBouncer or server killed with
			// the connection's data unread resets it instead of closing it.
			return fmt.Sprintf("%s: %s reset the connection (%s): retry later", storage.ErrUnavailable, where, firstLine(err.Error())), true
		}
		return "", false
	}
	switch {
	case pe != nil:
		hint := "check the user, password and database in the database URL"
		switch {
		case missingDatabase(pe):
			hint = "create the database or fix its name in the database URL"
		case pe.Code == "42704": // undefined_object: a URL parameter the server has no setting of
			hint = "the database URL's parameters other than dagrun's and libpq's are sent to the server as settings: " +
				"remove that one, or fix its name (SHOW ALL lists the server's)"
		case pe.Code == "22023": // invalid_parameter_value: a setting the URL gives a value it refuses
			hint = "fix that setting's value in the database URL"
		case pe.Code == "42501": // insufficient_privilege: a setting only a superuser may set
			hint = "remove that setting from the database URL, or have an administrator set it for the role or database (ALTER ROLE ... SET)"
		}
		return fmt.Sprintf("%s: %s: %s: %s", storage.ErrUnavailable, where, pe.Message, hint), true
	case errors.As(err, &dns):
		return fmt.Sprintf("%s: %s: cannot resolve host %q: check the host in the database URL", storage.ErrUnavailable, where, dns.Name), true
	case errors.As(err, &op):
		return fmt.Sprintf("%s: %s: %v: is PostgreSQL running there and reachable from this machine?", storage.ErrUnavailable, where, op.Err), true
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Sprintf("%s: %s: timed out connecting: is PostgreSQL running there and reachable from this machine?", storage.ErrUnavailable, where), true
	default:
		cause := "cannot connect"
		if inner := errors.Unwrap(ce); inner != nil {
			cause += ": " + firstLine(inner.Error())
		}
		return fmt.Sprintf("%s: %s: %s", storage.ErrUnavailable, where, cause), true
	}
}

// connectHint says what to do when the server or PgBouncer turns a
// connection away for want of room, because it accepts none now, or (for
// PgBouncer) because of a startup parameter, and reports whether pe is one
// of those refusals.
func connectHint(pe *pgconn.PgError) (string, bool) {
	switch {
	case pe.Code == "53300": // too_many_connections: max_connections, or a role's or database's CONNECTION LIMIT
		return "every connection the server allows is taken: run fewer workers, give each a smaller pool " +
			"(pool_max_conns=N in the database URL; a worker needs 1, plus 1 for its listener), " +
			"or connect through PgBouncer in transaction-pooling mode with pgbouncer=true in the URL", true
	case pe.Code == "57P03": // cannot_connect_now: starting up, shutting down, in recovery
		return "the server is not accepting connections now (starting up, shutting down or in recovery): retry once it is up", true
	case pe.Code == "08P01" && strings.Contains(pe.Message, "max_client_conn"):
		// PgBouncer's own limit on its clients.
		return "PgBouncer has as many clients as its max_client_conn allows: raise max_client_conn in pgbouncer.ini, " +
			"run fewer workers, or give each a smaller pool (pool_max_conns=N in the database URL)", true
	case pe.Code == "08P01" && pgbouncerNoServer(pe.Message):
		// PgBouncer answers for a server it cannot reach or log in to.
		return "PgBouncer has no connection to PostgreSQL for it (the server is down, full or refusing PgBouncer's login): " +
			"check the server behind PgBouncer and PgBouncer's log (a running worker retries meanwhile)", true
	case pe.Code == "08P01" && strings.HasPrefix(pe.Message, "unsupported startup parameter"):
		return "add pgbouncer=true to the database URL, so that dagrun sends PgBouncer no setting of its own, " +
			"and take any other such setting out of the URL (or list it in PgBouncer's ignore_startup_parameters)", true
	}
	return "", false
}

// pgbouncerNoServer reports whether a PgBouncer error message says it has
// no server connection to give: the server is unreachable or refuses its
// login (server_login_retry), no server connection came free in time
// (query_wait_timeout), or its server connection died mid-way.
func pgbouncerNoServer(msg string) bool {
	for _, s := range []string{"server login has been failing", "query_wait_timeout", "pgbouncer cannot connect to server",
		"server conn crashed", "server_connect_timeout", "server shutting down", "client_login_timeout (server down)"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// missingDatabase reports whether pe refuses a connection because its
// database does not exist: the server's own 3D000, or PgBouncer's, which
// relays the server's message (its [databases] section sends the name on)
// or says it knows no such database, both under 08P01.
func missingDatabase(pe *pgconn.PgError) bool {
	if pe.Code == "3D000" {
		return true
	}
	return pe.Code == "08P01" && (strings.HasPrefix(pe.Message, "no such database") ||
		strings.HasPrefix(pe.Message, "database ") && strings.HasSuffix(pe.Message, " does not exist"))
}

// isRetryable reports whether a transaction aborted by err can simply run
// again: serialization failures and deadlocks.
func isRetryable(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "40001" || pe.Code == "40P01")
}
