package postgres

import (
	"context"
	"errors"
	"fmt"
	"net"

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
// (server down, DNS, authentication, unknown database), with a one-line
// message naming the server and what to do. The message never includes the
// password: it is built from the host, port, user and database only.
func unavailable(err error) (string, bool) {
	var ce *pgconn.ConnectError
	if !errors.As(err, &ce) {
		// Errors of an established connection that died mid-way.
		var pe *pgconn.PgError
		if errors.As(err, &pe) && (pe.Code == "57P01" || pe.Code == "57P02" || pe.Code == "57P03") {
			return fmt.Sprintf("%s: postgres is shutting down or not accepting connections (%s): retry later", storage.ErrUnavailable, pe.Message), true
		}
		return "", false
	}
	where := "postgres"
	if ce.Config != nil {
		where = fmt.Sprintf("postgres at %s (user %q, database %q)", net.JoinHostPort(ce.Config.Host, fmt.Sprint(ce.Config.Port)), ce.Config.User, ce.Config.Database)
	}
	var (
		pe  *pgconn.PgError
		dns *net.DNSError
		op  *net.OpError
	)
	switch {
	case errors.As(err, &pe):
		hint := "check the user, password and database in the database URL"
		switch pe.Code {
		case "3D000":
			hint = "create the database or fix its name in the database URL"
		case "53300":
			hint = "the server has too many connections; lower MaxConns or raise max_connections"
		case "57P03":
			hint = "the server is starting up or shutting down; retry shortly"
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

// isRetryable reports whether a transaction aborted by err can simply run
// again: serialization failures and deadlocks.
func isRetryable(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "40001" || pe.Code == "40P01")
}
