package e2e

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// badCase is one mistake a user makes on the command line. Each must fail
// with one clear line on stderr (compared with testdata/badinput-NAME.golden
// after masking), the documented exit code, nothing on stdout, and nothing
// written to the database.
type badCase struct {
	name  string
	args  []string
	stdin string
	code  int
}

// validOrder satisfies order-processing's input schema.
const validOrder = `{"orderId": "A-1", "items": [{"sku": "pen"}], "totalAmount": 1}`

func badInputCases() []badCase {
	unknownID := "01234567-89ab-cdef-0123-456789abcdef"
	return []badCase{
		// The input.
		{name: "input-not-json", args: []string{"start", "order-processing", "--input", "{orderId: A-1}"}, code: 2},
		{name: "input-not-object", args: []string{"start", "order-processing", "--input", `["A-1"]`}, code: 2},
		{name: "input-missing-required", args: []string{"start", "order-processing", "--input", `{"orderId": "A-1"}`}, code: 2},
		{name: "input-min-items", args: []string{"start", "order-processing", "--input", `{"orderId": "A-1", "items": [], "totalAmount": 1}`}, code: 2},
		{name: "input-wrong-type", args: []string{"start", "order-processing", "--input", `{"orderId": 7, "items": [1], "totalAmount": -1}`}, code: 2},
		{name: "input-two-values", args: []string{"start", "order-processing", "--input", validOrder + " {}"}, code: 2},
		{name: "input-too-large", args: []string{"start", "order-processing", "--input", "@big.json"}, code: 2},
		{name: "input-missing-file", args: []string{"start", "order-processing", "--input", "@missing.json"}, code: 2},
		{name: "input-stdin-not-json", args: []string{"start", "order-processing", "--input", "-", "--detach"}, stdin: "orderId=A-1\n", code: 2},
		{name: "input-stdin-empty", args: []string{"start", "order-processing", "--input", "-", "--detach"}, code: 2},
		// Names and IDs.
		{name: "unknown-workflow", args: []string{"start", "order-procesing", "--input", validOrder}, code: 2},
		{name: "status-unknown-id", args: []string{"status", unknownID}, code: 2},
		{name: "cancel-unknown-id", args: []string{"cancel", unknownID}, code: 2},
		{name: "retry-unknown-id", args: []string{"retry", unknownID}, code: 2},
		// Flags.
		{name: "delay-malformed", args: []string{"start", "order-processing", "--input", validOrder, "--delay", "5x"}, code: 2},
		{name: "priority-not-number", args: []string{"start", "order-processing", "--input", validOrder, "--priority", "high"}, code: 2},
		{name: "worker-lease-malformed", args: []string{"worker", "--lease", "abc"}, code: 2},
		{name: "worker-poll-zero", args: []string{"worker", "--poll", "0s"}, code: 2},
		{name: "worker-concurrency-zero", args: []string{"worker", "--concurrency", "0"}, code: 2},
		{name: "prune-older-than-malformed", args: []string{"prune", "--older-than", "yesterday"}, code: 2},
		{name: "prune-without-bound", args: []string{"prune"}, code: 2},
		{name: "list-bad-status", args: []string{"list", "--status", "done"}, code: 2},
		{name: "list-bad-limit", args: []string{"list", "--limit", "0"}, code: 2},
		{name: "unknown-flag", args: []string{"start", "order-processing", "--inptu", validOrder}, code: 2},
		{name: "flag-missing-value", args: []string{"start", "order-processing", "--input"}, code: 2},
		{name: "missing-argument", args: []string{"start", "--input", validOrder}, code: 2},
		{name: "extra-argument", args: []string{"status", unknownID, "extra"}, code: 2},
		{name: "unknown-command", args: []string{"stat", unknownID}, code: 2},
		{name: "bad-log-format", args: []string{"list", "--log-format", "xml"}, code: 2},
		// Numbers out of what every backend stores.
		{name: "priority-int32-min", args: []string{"start", "order-processing", "--input", validOrder, "--priority", "-2147483648"}, code: 2},
		{name: "priority-wraps-to-int32-min", args: []string{"start", "order-processing", "--input", validOrder, "--priority", "2147483648"}, code: 2},
		{name: "priority-past-int64", args: []string{"start", "order-processing", "--input", validOrder, "--priority", "99999999999999999999"}, code: 2},
		{name: "delay-negative", args: []string{"start", "order-processing", "--input", validOrder, "--delay", "-5m"}, code: 2},
		{name: "delay-too-long", args: []string{"start", "order-processing", "--input", validOrder, "--delay", "100000h"}, code: 2},
		{name: "list-limit-too-large", args: []string{"list", "--limit", "100000"}, code: 2},
		{name: "worker-concurrency-huge", args: []string{"worker", "--concurrency", "1000000000"}, code: 2},
		{name: "worker-lease-too-long", args: []string{"worker", "--lease", "1000h"}, code: 2},
		// Strings no backend can hold.
		{name: "key-too-long", args: []string{"start", "order-processing", "--input", validOrder, "--key", strings.Repeat("k", 10<<10)}, code: 2},
		{name: "key-not-utf8", args: []string{"start", "order-processing", "--input", validOrder, "--key", "a\xffb"}, code: 2},
		{name: "status-id-not-utf8", args: []string{"status", "a\xffb"}, code: 2},
		{name: "cancel-id-too-long", args: []string{"cancel", strings.Repeat("i", 10<<10)}, code: 2},
		{name: "retry-id-not-utf8", args: []string{"retry", "a\xffb"}, code: 2},
		{name: "list-workflow-not-utf8", args: []string{"list", "--workflow", "a\xffb"}, code: 2},
		{name: "worker-queue-not-utf8", args: []string{"worker", "--queues", "a\xffb"}, code: 2},
		// Input nested past the documented depth.
		{name: "input-nested-too-deep", args: []string{"start", "order-processing", "--input", `{"orderId": "A-1", "items": [` + strings.Repeat("[", 5000) + strings.Repeat("]", 5000) + `], "totalAmount": 1}`}, code: 2},
		// A workflow name is a name, never a path (outside.yaml lies next to
		// the workflows folder).
		{name: "graph-name-is-not-a-path", args: []string{"graph", "../outside"}, code: 2},
		{name: "start-name-is-not-a-path", args: []string{"start", "../outside", "--input", "{}"}, code: 2},
	}
}

var (
	maskTempDir = regexp.MustCompile(`/[^\s"']*/(dagrun-e2e|Test)[^\s"']*`)
	maskID      = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)
)

// mask replaces what changes between runs in an error line.
func mask(s string) string {
	s = maskTempDir.ReplaceAllString(s, "TMPDIR")
	return maskID.ReplaceAllString(s, "ID")
}

// requireEmpty checks that nothing was written: no instance exists.
func (e *env) requireEmpty(t *testing.T, after string) {
	t.Helper()
	require.Equal(t, "[]\n", e.mustRun(t, "list", "--json").stdout, "nothing is written after %s", after)
}

func TestBadInput(t *testing.T) {
	forEachBackend(t, func(t *testing.T, db string) {
		e := newEnv(t, db, nil)
		// 1.1 MiB of otherwise valid input.
		pad := strings.Repeat("x", 11<<20/10)
		big := `{"orderId": "A-1", "items": [1], "totalAmount": 1, "pad": "` + pad + `"}`
		require.NoError(t, os.WriteFile(filepath.Join(e.dir, "big.json"), []byte(big), 0o644))
		require.NoError(t, os.WriteFile(filepath.Join(e.dir, "outside.yaml"), []byte("name: outside\nsteps:\n  - name: a\n    handler: echo\n"), 0o644))
		e.mustRun(t, "list") // the database exists and is empty

		for _, c := range badInputCases() {
			res := e.runStdin(t, c.stdin, c.args...)
			require.Equal(t, c.code, res.code, "%s: dagrun %v\nstderr: %s", c.name, c.args, res.stderr)
			require.Empty(t, res.stdout, c.name)
			line := requireOneLine(t, res.stderr)
			golden(t, "badinput-"+c.name, mask(line)+"\n")
			e.requireEmpty(t, c.name)
		}

		// The same input through standard input works.
		res := e.runStdin(t, validOrder, "start", "order-processing", "--input", "-", "--detach")
		require.Equal(t, 0, res.code, res.stderr)
		require.Regexp(t, idPattern, strings.TrimSpace(res.stdout))
		require.Len(t, e.listJSON(t), 1)
		res = e.runStdin(t, validOrder, "start", "order-processing", "--input", "-")
		require.Equal(t, 0, res.code, res.stderr)
		require.Contains(t, res.stdout, "paymentId")
	})
}

// TestBadDatabase covers --db values that name no usable database. They
// fail before any backend is reached, so they run once.
func TestBadDatabase(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "unused.db", nil)
	garbage := []byte("this is not a SQLite database\x00\x01\x02\xff and never was; it only looks like a file\n")
	require.NoError(t, os.WriteFile(filepath.Join(e.dir, "garbage.db"), garbage, 0o644))

	cases := []struct {
		name string
		db   string
		code int
	}{
		{"db-unknown-scheme", "mysql://x", 2},
		{"db-not-sqlite", "garbage.db", 3},
		{"db-not-sqlite-prefixed", "sqlite:garbage.db", 3},
		{"db-missing-folder", "no/such/folder/dagrun.db", 3},
		{"db-postgres-unreachable", "postgres://postgres@127.0.0.1:1/x?connect_timeout=2", 3},
	}
	for _, c := range cases {
		for _, args := range [][]string{
			{"list"},
			{"start", "order-processing", "--input", validOrder},
		} {
			res := e.run(t, append([]string{"--db", c.db}, args...)...)
			require.Equal(t, c.code, res.code, "%s: %v\n%s", c.name, args, res.stderr)
			require.Empty(t, res.stdout)
			line := requireOneLine(t, res.stderr)
			golden(t, "badinput-"+c.name, mask(line)+"\n")
		}
	}
	data, err := os.ReadFile(filepath.Join(e.dir, "garbage.db"))
	require.NoError(t, err)
	require.Equal(t, garbage, data, "a file that is not a database is left untouched")
	_, err = os.Stat(filepath.Join(e.dir, "no"))
	require.ErrorIs(t, err, os.ErrNotExist, "no folder is created for a mistyped path")

	// DAGRUN_DB works like --db.
	e.extraEnv = []string{"DAGRUN_DB=mysql://x"}
	res := e.run(t, "list")
	require.Equal(t, 2, res.code)
	golden(t, "badinput-db-unknown-scheme", mask(requireOneLine(t, res.stderr))+"\n")
}

// TestStartOfAnInvalidWorkflow: a workflow whose file has errors is refused
// naming its first error, by the CLI and by the API (422), rather than
// reported as unknown; the folder's other workflows still start.
func TestStartOfAnInvalidWorkflow(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "invalid.db", map[string]string{"broken.yaml": "name: broken\ntimeout: 10\nsteps:\n  - {name: a, handler: echo}\n"})
	res := e.run(t, "start", "broken")
	require.Equal(t, 2, res.code, res.stderr)
	require.Contains(t, requireOneLine(t, res.stderr), "workflow broken is invalid: ")

	server, base := e.serveAPI(t, plainBinary)
	t.Cleanup(func() { server.stop(t) })
	resp, err := http.Post(base+"/api/workflows/broken/instances", "application/json", strings.NewReader(`{}`))
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusUnprocessableEntity, resp.StatusCode, string(body))
	require.Contains(t, string(body), `workflow \"broken\" is invalid: `)
	require.Contains(t, string(body), `timeout 10 has no unit`)

	resp, err = http.Post(base+"/api/workflows/order-processing/instances", "application/json", strings.NewReader(`{"input": `+validOrder+`}`))
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusCreated, resp.StatusCode)
}
