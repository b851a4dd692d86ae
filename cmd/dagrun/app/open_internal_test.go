package app

import (
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage/backendtest"
	"github.com/dagrun/dagrun/storage/postgres"
)

// TestOneOffCommandStoresAreShortLived: the store of a one-off command
// (conns zero) skips the memory warm-up of its connections, which only a
// long-lived connection earns back; a worker's and a server's keep it.
func TestOneOffCommandStoresAreShortLived(t *testing.T) {
	if !backendtest.PostgresAvailable(t) {
		t.Skip("set DAGRUN_TEST_POSTGRES to run the PostgreSQL CLI tests")
	}
	db := backendtest.PostgresURL(t)
	cases := []struct {
		name   string
		conns  int32
		warmUp bool
	}{
		{"a command", 0, false},
		{"a worker", workerConns, true},
		{"a server", serveConns, true},
		{"a start that runs its instance", followConns, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			store, err := openStore(t.Context(), db, "", slog.New(slog.DiscardHandler), c.conns)
			require.NoError(t, err)
			t.Cleanup(func() { _ = store.Close() })
			pg, ok := store.(*postgres.Store)
			require.True(t, ok, "a postgres:// URL opens a PostgreSQL store")
			require.Equal(t, c.warmUp, pg.Pool().Config().AfterConnect != nil, "a hook after connecting")
		})
	}
}

// TestRedactDSN: a password never reaches a log, in the URL's user
// information or as a parameter.
func TestRedactDSN(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ in, want string }{
		{"postgres://u:S3cret@h:5432/db?sslmode=disable", "postgres://u:***@h:5432/db?sslmode=disable"},
		{"postgres://u:S3cret@h/db?sslmode=disable&password=Other", "postgres://u:***@h/db?sslmode=disable&password=***"},
		{"postgres://u@h/db?password=Other&sslmode=disable", "postgres://u@h/db?password=***&sslmode=disable"},
		{"host=h password=Other dbname=db", "host=h password=*** dbname=db"},
		{"postgres://u@h/db?application_name=mypassword=x", "postgres://u@h/db?application_name=mypassword=x"},
		{"/var/lib/dagrun.db", "/var/lib/dagrun.db"},
	} {
		require.Equal(t, c.want, redactDSN(c.in), c.in)
	}
}
