package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// yearlyYAML has a schedule that fires once a year, so that the next fire
// times the CLI and the API compute a moment apart are the same.
const yearlyYAML = `name: yearly
schedule:
  - cron: "@yearly"
steps:
  - name: one
    handler: echo
`

// serveAPI runs `dagrun serve` (no worker, no scheduler: what it answers
// changes only when the test changes it) on a free loopback port of the
// env's database and returns its URL without the trailing slash.
func serveAPI(t *testing.T, e *env) string {
	t.Helper()
	_, base := serveProcess(t, e)
	return base
}

// serveProcess is serveAPI that also returns the server's process.
func serveProcess(t *testing.T, e *env) (*process, string) {
	t.Helper()
	p := e.spawn(t, "serve", "--addr", "127.0.0.1:0", "--no-schedules")
	listening := regexp.MustCompile(`url=(http://127\.0\.0\.1:\d+)/`)
	var base string
	require.Eventually(t, func() bool {
		m := listening.FindStringSubmatch(p.stderr.String())
		if m != nil {
			base = m[1]
		}
		return m != nil || !p.running()
	}, 30*time.Second, 10*time.Millisecond)
	require.NotEmpty(t, base, "dagrun serve did not start:\n%s", p.stderr.String())
	return p, base
}

// apiCall sends a request to a dagrun server, with the header given as
// name, value pairs, and returns the response, whose body is read, and the
// body.
func apiCall(t *testing.T, method, url, body string, header ...string) (*http.Response, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	require.NoError(t, err)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(data)
}

// TestAPIListsWhatTheCLIPrints: each list of the API answers the JSON the
// CLI's --json prints for the same thing, and the instance list carries
// its next page in a Link header, not in its body.
func TestAPIListsWhatTheCLIPrints(t *testing.T) {
	t.Parallel()
	e := newEnv(t, filepath.Join(t.TempDir(), "dagrun.db"), map[string]string{"yearly.yaml": yearlyYAML})
	// Delayed, the instances' steps are not due: the queue list holds no
	// wait that grows between the two reads.
	for range 5 {
		e.mustRun(t, "start", "yearly", "--detach", "--delay", "1h")
	}
	e.mustRun(t, "queue", "set", "slow", "--concurrency", "2", "--rate", "10/s")
	base := serveAPI(t, e)

	for _, tc := range []struct {
		name string
		cli  []string
		path string
	}{
		{"instances", []string{"list", "--json"}, "/api/instances"},
		{"instances filtered", []string{"list", "--json", "--workflow", "yearly", "--status", "pending", "--limit", "2"}, "/api/instances?workflow=yearly&status=pending&limit=2"},
		{"no instances", []string{"list", "--json", "--workflow", "order-processing"}, "/api/instances?workflow=order-processing"},
		{"queues", []string{"queues", "--json"}, "/api/queues"},
		{"schedules", []string{"schedules", "--json"}, "/api/schedules"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := e.mustRun(t, tc.cli...).stdout
			resp, got := apiCall(t, http.MethodGet, base+tc.path, "")
			require.Equal(t, http.StatusOK, resp.StatusCode, got)
			require.JSONEq(t, want, got, "GET %s against dagrun %s", tc.path, strings.Join(tc.cli, " "))
		})
	}

	// Following the Link headers reads every instance once, newest first,
	// with the filter of the first request.
	all := e.mustRun(t, "list", "--json").stdout
	var pages int
	var read []json.RawMessage
	next := base + "/api/instances?workflow=yearly&limit=2"
	link := regexp.MustCompile(`^<(/api/instances\?[^>]*)>; rel="next"$`)
	for next != "" {
		require.Less(t, pages, 3, "the list of 5 instances has more than 3 pages of 2")
		pages++
		resp, body := apiCall(t, http.MethodGet, next, "")
		require.Equal(t, http.StatusOK, resp.StatusCode, body)
		var page []json.RawMessage
		require.NoError(t, json.Unmarshal([]byte(body), &page), body)
		read = append(read, page...)
		next = ""
		if h := resp.Header.Get("Link"); h != "" {
			m := link.FindStringSubmatch(h)
			require.NotNil(t, m, "Link header %q", h)
			require.Contains(t, m[1], "workflow=yearly")
			require.Contains(t, m[1], "limit=2")
			next = base + m[1]
		}
	}
	require.Equal(t, 3, pages)
	joined, err := json.Marshal(read)
	require.NoError(t, err)
	require.JSONEq(t, all, string(joined))
}

// TestAPIStartReplaysAKey: a second start with the same workflow and key
// answers as the first did, 201 with the first instance, marked as a
// replay, and starts nothing.
func TestAPIStartReplaysAKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t, filepath.Join(t.TempDir(), "dagrun.db"), map[string]string{"yearly.yaml": yearlyYAML})
	base := serveAPI(t, e)
	url := base + "/api/workflows/yearly/instances"

	first, created := apiCall(t, http.MethodPost, url, `{"input": {"n": 1}, "key": "k-1", "delay": "1h"}`)
	require.Equal(t, http.StatusCreated, first.StatusCode, created)
	require.Empty(t, first.Header.Values("Idempotent-Replayed"))
	again, replayed := apiCall(t, http.MethodPost, url, `{"input": {"n": 2}, "key": "k-1"}`)
	require.Equal(t, http.StatusCreated, again.StatusCode, replayed)
	require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
	require.Equal(t, first.Header.Get("Location"), again.Header.Get("Location"))
	require.JSONEq(t, created, replayed)

	var list []instance
	require.NoError(t, json.Unmarshal([]byte(e.mustRun(t, "list", "--json").stdout), &list))
	require.Len(t, list, 1, "the repeat started nothing")
}
