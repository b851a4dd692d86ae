package web_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun"
	"github.com/dagrun/dagrun/cmd/dagrun/app/web"
	"github.com/dagrun/dagrun/handlers"
	"github.com/dagrun/dagrun/storage"
)

// TestBadValuesOnEveryRoute sends every route that takes an ID, a filter,
// a key or a number a value no backend can hold. Every backend answers the
// same: 404 for an ID that cannot exist, 400 with a clear message for the
// rest, never a 500, and nothing is written.
func TestBadValuesOnEveryRoute(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		b := setup(t, open, nil)
		badStrings := map[string]string{
			"invalid UTF-8": "a\xffb",
			"NUL byte":      "a\x00b",
			"10 KB":         strings.Repeat("k", 10<<10),
		}
		for name, s := range badStrings {
			id := url.PathEscape(s)
			q := url.QueryEscape(s)
			for _, tc := range []struct {
				method, path string
				status       int
				want         string
			}{
				{http.MethodGet, "/api/instances/" + id, http.StatusNotFound, "no instance with ID"},
				{http.MethodPost, "/api/instances/" + id + "/cancel", http.StatusNotFound, "no instance with ID"},
				{http.MethodPost, "/api/instances/" + id + "/retry", http.StatusNotFound, "no instance with ID"},
				{http.MethodGet, "/api/instances?workflow=" + q, http.StatusBadRequest, "invalid workflow filter"},
				{http.MethodGet, "/api/instances?before=" + q, http.StatusBadRequest, "invalid page cursor"},
				{http.MethodGet, "/api/workflows/" + id, http.StatusNotFound, "unknown workflow"},
			} {
				r := b.do(t, tc.method, tc.path, "")
				requireError(t, r, tc.status, tc.want)
				require.Less(t, len(r.body), 1000, "%s %s: the answer does not repeat a 10 KB value", tc.method, name)
			}
		}
		for _, tc := range []struct {
			name, body, want string
		}{
			{"key with NUL", `{"input": {"name": "x"}, "key": "a\u0000b"}`, "invalid idempotency key: it contains a NUL byte"},
			{"key of 10 KB", `{"input": {"name": "x"}, "key": "` + strings.Repeat("k", 10<<10) + `"}`, "over the limit of 512 bytes"},
			{"priority int32 min", `{"input": {"name": "x"}, "priority": -2147483648}`, "invalid priority"},
			{"priority wrapping to int32 min", `{"input": {"name": "x"}, "priority": 2147483648}`, "invalid priority: 2147483648 is out of range"},
			{"priority past int64", `{"input": {"name": "x"}, "priority": 1e30}`, "invalid request body"},
			{"delay over a year", `{"input": {"name": "x"}, "delay": "100000h"}`, "invalid delay"},
			{"delay past int64", `{"input": {"name": "x"}, "delay": "9999999999h"}`, "invalid delay"},
			{"field name in another case", `{"input": {"name": "x"}, "KEY": "k"}`, `invalid request body: unknown field "KEY"`},
			{"field named twice", `{"input": {"name": "x"}, "key": "a", "key": "b"}`, `invalid request body: field "key" appears twice`},
			{"input nested too deep", `{"input": {"name": "x", "deep": ` + strings.Repeat("[", 1000) + strings.Repeat("]", 1000) + `}}`, "levels deep"},
		} {
			requireError(t, b.do(t, http.MethodPost, "/api/workflows/greet/instances", tc.body), http.StatusBadRequest, tc.want)
		}
		list, err := b.engine.List(context.Background(), storage.ListParams{})
		require.NoError(t, err)
		require.Empty(t, list, "nothing is written")
	})
}

// failingStore answers every listing with a driver error that names the
// database's host, user and name, as pgx does.
type failingStore struct{ storage.Store }

func (failingStore) ListInstances(context.Context, storage.ListParams) ([]storage.Instance, error) {
	return nil, fmt.Errorf("%w: failed to connect to `user=alice database=payroll`: 10.1.2.3:5432: connection refused", storage.ErrUnavailable)
}

// TestHealthzHidesStorageDetailsBehindAToken: /healthz needs no token, so
// with a token set its failure says only that storage is unavailable; the
// detail goes to the server log. Without a token (a local server) it helps
// by naming the cause.
func TestHealthzHidesStorageDetailsBehindAToken(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		token   string
		shows   bool
		message string
	}{
		{token: "s3cret", shows: false, message: "storage unavailable; see the server log"},
		{token: "", shows: true, message: "storage does not answer: storage unavailable: failed to connect"},
	} {
		t.Run(fmt.Sprintf("token=%v", tc.token != ""), func(t *testing.T) {
			t.Parallel()
			registry := handlers.NewRegistry()
			engine, err := dagrun.New(failingStore{openSQLite(t)}, registry, nil)
			require.NoError(t, err)
			var log syncBuffer
			srv, err := web.NewServer(engine, &web.Config{Token: tc.token, Logger: slog.New(slog.NewTextHandler(&log, nil))})
			require.NoError(t, err)
			ts := httptest.NewServer(srv)
			t.Cleanup(ts.Close)
			b := &testBundle{server: ts}
			r := b.do(t, http.MethodGet, "/healthz", "")
			require.Equal(t, http.StatusServiceUnavailable, r.status)
			body := r.json(t)
			require.Contains(t, body["error"], tc.message)
			for _, secret := range []string{"alice", "payroll", "10.1.2.3"} {
				require.Equal(t, tc.shows, strings.Contains(string(r.body), secret), "%s in %s", secret, r.body)
				require.Contains(t, log.String(), secret, "the server log keeps the detail")
			}
		})
	}
}

// syncBuffer is a log the server writes while the test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
