package app_test

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/cmd/dagrun/app"
	"github.com/dagrun/dagrun/handlers"
	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/backendtest"
	"github.com/dagrun/dagrun/storage/sqlite"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// testBundle is one user's working folder: a SQLite file and the test
// workflows, driven through app.Run in process.
type testBundle struct {
	dir      string
	registry *handlers.Registry
	env      map[string]string
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	registry := handlers.NewRegistry()
	handlers.RegisterBuiltins(registry)
	registry.Register("test.decline", func(context.Context, json.RawMessage) (json.RawMessage, error) {
		return nil, errors.New("card declined: insufficient funds")
	})
	dir := t.TempDir()
	workflows, err := filepath.Abs("testdata/workflows")
	require.NoError(t, err)
	return &testBundle{
		dir:      dir,
		registry: registry,
		env: map[string]string{
			"DAGRUN_DB":        filepath.Join(dir, "dagrun.db"),
			"DAGRUN_WORKFLOWS": workflows,
		},
	}
}

type runResult struct {
	code           int
	stdout, stderr string
}

func (b *testBundle) run(t *testing.T, stdin string, args ...string) runResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return b.runStdin(ctx, stdin, args...)
}

// startDetached starts an instance of greet with --detach and returns its
// ID: what a test of a command on one unfinished instance begins with.
func (b *testBundle) startDetached(t *testing.T) string {
	t.Helper()
	res := b.run(t, "", "start", "greet", "--input", `{"name": "Ada"}`, "--detach")
	require.Equal(t, app.ExitOK, res.code, res.stderr)
	return strings.TrimSpace(res.stdout)
}

// runContext runs the CLI under ctx, with no standard input.
func (b *testBundle) runContext(ctx context.Context, args ...string) runResult {
	return b.runStdin(ctx, "", args...)
}

func (b *testBundle) runStdin(ctx context.Context, stdin string, args ...string) runResult {
	var stdout, stderr bytes.Buffer
	code := app.Run(ctx, args, &app.IO{
		Stdin:  strings.NewReader(stdin),
		Stdout: &stdout,
		Stderr: &stderr,
		Getenv: func(name string) string { return b.env[name] },
	}, b.registry)
	return runResult{code: code, stdout: stdout.String(), stderr: stderr.String()}
}

// golden compares got with testdata/NAME.golden, rewriting it with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
		return
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "missing golden file; run go test ./cmd/dagrun/app -update")
	require.Equal(t, string(want), got)
}

var (
	maskUUID     = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)
	maskTime     = regexp.MustCompile(`\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})`)
	maskClock    = regexp.MustCompile(`\b\d{2}:\d{2}:\d{2}\b`)
	maskDuration = regexp.MustCompile(`\b\d+(\.\d+)?(ns|µs|ms|s)\b…?`)
	columnGap    = regexp.MustCompile(`\S  +`)
	// maskWorker matches a worker ID of this machine: host-pid-random.
	maskWorker = func() *regexp.Regexp {
		host, _ := os.Hostname()
		return regexp.MustCompile(regexp.QuoteMeta(cmp.Or(host, "worker")) + `-\d+-[0-9a-f]{8}\b`)
	}()
)

// mask hides what changes from run to run, then re-aligns table columns,
// since a masked duration may be narrower or wider than the real one.
func mask(s string) string {
	s = maskWorker.ReplaceAllString(s, "<WORKER>")
	s = maskUUID.ReplaceAllString(s, "<ID>")
	s = maskTime.ReplaceAllString(s, "<TIME>")
	s = maskClock.ReplaceAllString(s, "<CLOCK>")
	s = maskDuration.ReplaceAllString(s, "<DUR>")
	var out strings.Builder
	tw := tabwriter.NewWriter(&out, 0, 4, 2, ' ', 0)
	for _, line := range strings.SplitAfter(s, "\n") {
		if line == "" {
			continue
		}
		// Two or more spaces after a non-space separate columns.
		line = columnGap.ReplaceAllStringFunc(line, func(m string) string { return m[:1] + "\t" })
		fmt.Fprint(tw, line)
		if line == "\n" {
			_ = tw.Flush()
		}
	}
	_ = tw.Flush()
	return out.String()
}

func TestStatusTable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	res := b.run(t, "", "start", "checkout", "--input", `{"orderId": "A-7"}`)
	require.Equal(t, app.ExitFailed, res.code, res.stderr)
	require.Empty(t, res.stdout)
	// One progress line per transition (from the event history, so none is
	// missed however fast the retries), then the error.
	golden(t, "start-failed", mask(res.stderr))

	id := maskUUID.FindString(res.stderr)
	require.NotEmpty(t, id)
	res = b.run(t, "", "status", id)
	require.Equal(t, app.ExitOK, res.code, res.stderr)
	require.Empty(t, res.stderr)
	golden(t, "status-failed", mask(res.stdout))

	res = b.run(t, "", "start", "greet", "--input", `{"name": "Ada"}`)
	require.Equal(t, app.ExitOK, res.code, res.stderr)
	require.Equal(t, "\"hello, Ada\"\n", res.stdout)
	id = maskUUID.FindString(res.stderr)
	res = b.run(t, "", "status", id)
	require.Equal(t, app.ExitOK, res.code, res.stderr)
	golden(t, "status-completed", mask(res.stdout))

	res = b.run(t, "", "list")
	require.Equal(t, app.ExitOK, res.code, res.stderr)
	golden(t, "list", mask(res.stdout))
}

// TestStatsUnserved: with no worker running, `stats` lists the ready steps
// as waiting for a handler no live worker has, as text and as JSON, and
// has no step durations to show: "-" in the table, null in the JSON.
func TestStatsUnserved(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for range 2 {
		res := b.run(t, "", "start", "greet", "--input", `{"name": "Ada"}`, "--detach")
		require.Equal(t, app.ExitOK, res.code, res.stderr)
	}
	res := b.run(t, "", "stats")
	require.Equal(t, app.ExitOK, res.code, res.stderr)
	golden(t, "stats-unserved", mask(res.stdout))

	res = b.run(t, "", "stats", "--json")
	require.Equal(t, app.ExitOK, res.code, res.stderr)
	var stats struct {
		Workflows []map[string]any `json:"workflows"`
		Unserved  []struct {
			Handler       string  `json:"handler"`
			Ready         int     `json:"ready"`
			OldestReadyMs float64 `json:"oldestReadyMs"`
		} `json:"unserved"`
	}
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &stats), res.stdout)
	require.Len(t, stats.Workflows, 1)
	for _, field := range []string{"stepP50Ms", "stepP95Ms"} {
		v, ok := stats.Workflows[0][field]
		require.True(t, ok, "stats --json has %s", field)
		require.Nil(t, v, "%s with no completed attempt is null, as the table's -", field)
	}
	require.Positive(t, stats.Workflows[0]["oldestReadyMs"])
	require.Len(t, stats.Unserved, 1)
	require.Equal(t, "echo", stats.Unserved[0].Handler)
	require.Equal(t, 2, stats.Unserved[0].Ready)
	require.Positive(t, stats.Unserved[0].OldestReadyMs)
}

// TestHandlersWorkers: `handlers --workers` lists the live workers of the
// database, whatever binary they run, with their queues and handlers.
func TestHandlersWorkers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	res := b.run(t, "", "handlers", "--workers")
	require.Equal(t, app.ExitOK, res.code, res.stderr)
	store, err := sqlite.Open(t.Context(), b.env["DAGRUN_DB"], nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, store.Close()) })
	for _, w := range []storage.WorkerInfo{
		{ID: "custom-1", Handlers: []string{"greet.hello", "echo"}},
		{ID: "stock-1", Handlers: []string{"echo", "orders.charge"}, Queues: []string{"payments", "default"}},
	} {
		require.NoError(t, store.AnnounceWorker(t.Context(), w))
	}
	res = b.run(t, "", "handlers", "--workers")
	require.Equal(t, app.ExitOK, res.code, res.stderr)
	golden(t, "handlers-workers", mask(res.stdout))
}

func TestValidate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	res := b.run(t, "", "validate")
	require.Equal(t, app.ExitOK, res.code, res.stderr)
	require.Equal(t, "ok checkout (4 steps)\nok fanout (2 steps)\nok greet (1 step)\nok refund (2 steps)\n", res.stdout)
	// A folder named stands for its workflow files.
	folder := b.run(t, "", "validate", "testdata/workflows")
	require.Equal(t, res, folder)
	// A file named beside its folder is checked once, not against itself.
	folder = b.run(t, "", "validate", "testdata/workflows", "testdata/workflows/greet.yaml", "./testdata/workflows/greet.yaml")
	require.Equal(t, res, folder)

	res = b.run(t, "", "validate", "testdata/invalid/typos.yaml", "testdata/workflows/greet.yaml", "testdata/invalid/not-yaml.yaml")
	require.Equal(t, app.ExitUsage, res.code)
	require.Equal(t, "ok greet (1 step)\n", res.stdout)
	for _, line := range strings.Split(strings.TrimSpace(res.stderr), "\n") {
		require.Regexp(t, `^testdata/invalid/[a-z-]+\.yaml:\d+:\d+: `, line)
	}
	golden(t, "validate-invalid", res.stderr)
}

// TestValidateListsFilesAsTheEngineLoadsThem: validate skips what the
// engine skips (dot-files an editor left) and refuses what it refuses (two
// files declaring one workflow), so that its "ok" means the workflows load.
func TestValidateListsFilesAsTheEngineLoadsThem(t *testing.T) {
	t.Parallel()
	b := setup(t)
	dir := t.TempDir()
	b.env["DAGRUN_WORKFLOWS"] = dir
	one := "name: dual\nsteps:\n  - {name: a, handler: noop}\n"
	require.NoError(t, os.WriteFile(filepath.Join(dir, "dual.yaml"), []byte(one), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "dual.yml"), []byte(one), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, ".dual.yaml.swp.yml"), []byte("x: ["), 0o644))
	res := b.run(t, "", "validate")
	require.Equal(t, app.ExitUsage, res.code)
	require.Equal(t, "ok dual (1 step)\n", res.stdout)
	require.Equal(t, filepath.Join(dir, "dual.yml")+`:1:7: workflow "dual" is already defined in `+filepath.Join(dir, "dual.yaml")+": keep only one of the two files\n", res.stderr)

	require.NoError(t, os.Remove(filepath.Join(dir, "dual.yml")))
	res = b.run(t, "", "validate")
	require.Equal(t, app.ExitOK, res.code, "a dot-file is not a workflow: %s", res.stderr)
}

// TestValidateCalls: validate checks the workflow steps across the files
// of the folder, and a file given by name against the folder; start
// refuses a workflow in a call cycle with the same error.
func TestValidateCalls(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.env["DAGRUN_WORKFLOWS"] = "testdata/calls"
	res := b.run(t, "", "validate")
	require.Equal(t, app.ExitUsage, res.code)
	require.Equal(t, "ok fine (1 step)\nok shipping (1 step)\n", res.stdout)
	golden(t, "validate-calls", res.stderr)

	res = b.run(t, "", "validate", "testdata/calls/loop-b.yaml", "testdata/calls/fine.yaml")
	require.Equal(t, app.ExitUsage, res.code)
	require.Equal(t, "ok fine (1 step)\n", res.stdout)
	require.Equal(t, `testdata/calls/loop-b.yaml:6:15: step "call-a": workflow call cycle loop-b -> loop-a -> loop-b: each instance would start another without end; remove one of these workflow steps`+"\n", res.stderr)

	// A file with errors of its own has its calls checked too: every
	// error shows at once.
	res = b.run(t, "", "validate", "testdata/calls/sloppy.yaml")
	require.Equal(t, app.ExitUsage, res.code)
	require.Equal(t, `testdata/calls/sloppy.yaml:5:14: step "wait": timeout 10 has no unit: write 10s for seconds (use a Go duration such as 30s, 5m or 1h30m)`+"\n"+
		`testdata/calls/sloppy.yaml:7:15: step "call": unknown workflow "shiping"; did you mean "shipping"? (workflows of this folder: checkout, fine, loop-a, loop-b, partial, shipping, sloppy)`+"\n", res.stderr)

	// A file is checked against its own folder's workflows, whatever
	// --workflows says: that is where its workflow steps find theirs.
	elsewhere := setup(t)
	res = elsewhere.run(t, "", "validate", "testdata/calls/loop-b.yaml")
	require.Equal(t, app.ExitUsage, res.code)
	require.Equal(t, `testdata/calls/loop-b.yaml:6:15: step "call-a": workflow call cycle loop-b -> loop-a -> loop-b: each instance would start another without end; remove one of these workflow steps`+"\n", res.stderr)

	res = b.run(t, "", "start", "loop-a")
	require.Equal(t, app.ExitUsage, res.code)
	require.Contains(t, res.stderr, `dagrun: workflow loop-a is invalid: testdata/calls/loop-a.yaml:4:15: step "call-b": workflow call cycle loop-a -> loop-b -> loop-a`)
	require.Contains(t, res.stderr, "list every error with: dagrun validate testdata/calls/loop-a.yaml")
	require.Equal(t, 1, strings.Count(res.stderr, "\n"), "an error is one line: %s", res.stderr)
	// The other files' errors are for validate; a worker, which runs on,
	// names each workflow left out, with its first error.
	res = b.run(t, "", "list")
	require.Equal(t, app.ExitOK, res.code, res.stderr)
	require.Empty(t, res.stderr)
	ctx, cancel := context.WithCancel(t.Context())
	time.AfterFunc(time.Second, cancel)
	res = b.runContext(ctx, "worker")
	require.Contains(t, res.stderr, `msg="workflow left out: its file has errors" workflow=loop-a error="testdata/calls/loop-a.yaml:4:15: step \"call-b\": workflow call cycle loop-a -> loop-b -> loop-a`)
	require.Contains(t, res.stderr, `fix="dagrun validate testdata/calls/sloppy.yaml"`)
	res = b.run(t, "", "graph", "partial")
	require.Equal(t, app.ExitUsage, res.code)
	require.Contains(t, res.stderr, `step "ship": workflow "shipping" requires the input property "orderId"`)
}

// TestErrorLines records the one-line errors of common mistakes in one
// golden file, so a change to any wording shows up in review.
func TestErrorLines(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cases := []struct {
		args  []string
		stdin string
		code  int
	}{
		{args: []string{"start", "checkout", "--input", `{orderId: "A-7"}`}, code: app.ExitUsage},
		{args: []string{"start", "checkout", "--input", `{"orderId": 7}`}, code: app.ExitUsage},
		{args: []string{"start", "checkout"}, code: app.ExitUsage},
		{args: []string{"start", "checkout", "--input", "-"}, stdin: `"A-7"`, code: app.ExitUsage},
		{args: []string{"start", "checkout", "--input", "@nope.json"}, code: app.ExitUsage},
		{args: []string{"start", "checkout", "--input", ""}, code: app.ExitUsage},
		{args: []string{"start", "checkout", "--input", "-"}, stdin: " \n", code: app.ExitUsage},
		{args: []string{"start", "checkout", "--input", "@testdata/empty.json"}, code: app.ExitUsage},
		{args: []string{"start", "checkout", "--input", "@/dev/zero"}, code: app.ExitUsage},
		{args: []string{"start", "checkout", "--input", `{"orderId": "\ud800"}`}, code: app.ExitUsage},
		{args: []string{"start", "checkout", "--input", `{"orderId": "A-7", "total": 1e400}`}, code: app.ExitUsage},
		{args: []string{"start", "checkout", "--input", "-"}, stdin: strings.Repeat(" ", 5<<20), code: app.ExitUsage},
		{args: []string{"start", "chekout"}, code: app.ExitUsage},
		{args: []string{"start", "checkout", "--delay", "tomorrow"}, code: app.ExitUsage},
		{args: []string{"start", "checkout", "--priority", "1.5"}, code: app.ExitUsage},
		{args: []string{"start"}, code: app.ExitUsage},
		{args: []string{"status"}, code: app.ExitUsage},
		{args: []string{"status", "no-such-id"}, code: app.ExitUsage},
		{args: []string{"status", "no-such-id", "--step", "resize"}, code: app.ExitUsage},
		{args: []string{"status", "no-such-id", "--offset", "100"}, code: app.ExitUsage},
		{args: []string{"status", "no-such-id", "--step", "resize", "--limit", "0"}, code: app.ExitUsage},
		{args: []string{"status", "no-such-id", "--step", "resize", "--offset", "-1"}, code: app.ExitUsage},
		{args: []string{"status", "no-such-id", "--step", "resize", "--status", "done"}, code: app.ExitUsage},
		{args: []string{"cancel", "no-such-id"}, code: app.ExitUsage},
		{args: []string{"retry", "no-such-id"}, code: app.ExitUsage},
		{args: []string{"list", "--status", "done"}, code: app.ExitUsage},
		{args: []string{"list", "--limit", "-1"}, code: app.ExitUsage},
		{args: []string{"worker", "--concurrency", "0"}, code: app.ExitUsage},
		{args: []string{"worker", "--lease", "30"}, code: app.ExitUsage},
		{args: []string{"worker", "--grace", "-1s"}, code: app.ExitUsage},
		{args: []string{"worker", "--max-items", "0"}, code: app.ExitUsage},
		{args: []string{"serve", "--max-items", "-5"}, code: app.ExitUsage},
		{args: []string{"serve", "--lease", "5s"}, code: app.ExitUsage},
		{args: []string{"serve", "--worker", "--lease", "30"}, code: app.ExitUsage},
		{args: []string{"serve", "--worker", "--queues", " , "}, code: app.ExitUsage},
		{args: []string{"start", "fanout", "--max-items", "many"}, code: app.ExitUsage},
		{args: []string{"start", "fanout", "--max-depth", "0"}, code: app.ExitUsage},
		{args: []string{"prune", "--older-than", "1 week"}, code: app.ExitUsage},
		{args: []string{"graph", "nope"}, code: app.ExitUsage},
		{args: []string{"graph", "greet", "--format", "svg"}, code: app.ExitUsage},
		{args: []string{"lsit"}, code: app.ExitUsage},
		{args: []string{"--workflows", "testdata/nowhere", "start", "greet"}, code: app.ExitUsage},
		{args: []string{"help", "strat"}, code: app.ExitUsage},
		{args: []string{"help", "queue", "nope"}, code: app.ExitUsage},
		{args: []string{"help", "queue", "sett"}, code: app.ExitUsage},
		{args: []string{"queue", "bogus"}, code: app.ExitUsage},
		{args: []string{"schedule", "pasue", "nightly"}, code: app.ExitUsage},
		{args: []string{"schedule", "stop", "nightly"}, code: app.ExitUsage},
		{args: []string{"list", "--every"}, code: app.ExitUsage},
		{args: []string{"list", "--all", "--parent", "no-such-id"}, code: app.ExitUsage},
		{args: []string{"--log-level", "loud", "list"}, code: app.ExitUsage},
		{args: []string{"--db", "mysql://localhost/x", "list"}, code: app.ExitUsage},
		{args: []string{"--db", "sqlite:", "list"}, code: app.ExitUsage},
		{args: []string{"--db", "file:/tmp/dagrun-test-never.db", "list"}, code: app.ExitUsage},
		{args: []string{"worker", "--queues", " , "}, code: app.ExitUsage},
		{args: []string{"worker", "--queues", ""}, code: app.ExitUsage},
		{args: []string{"worker", "--queues", "payments,A B"}, code: app.ExitUsage},
		{args: []string{"--db", "postgres://u@127.0.0.1:notaport/x", "list"}, code: app.ExitUsage},
		{args: []string{"--db", "postgres://u@127.0.0.1:5432/x?pool_max_conns=abc", "list"}, code: app.ExitUsage},
		{args: []string{"--db", "postgres://u@127.0.0.1:5432/x?pgbouncer=maybe", "list"}, code: app.ExitUsage},
		{args: []string{"--db", "postgres://u@127.0.0.1:5432/x", "--db-schema", "pg_x", "list"}, code: app.ExitUsage},
		{args: []string{"--db", "postgres://u@127.0.0.1:5432/x", "--db-schema", "information_schema", "list"}, code: app.ExitUsage},
		{args: []string{"--workflows", "app_test.go", "list"}, code: app.ExitUsage},
		{args: []string{"--db", "", "list"}, code: app.ExitUsage},
		{args: []string{"--db-schema", "tenant", "list"}, code: app.ExitUsage},
		{args: []string{"serve", "--tls-cert", "cert.pem"}, code: app.ExitUsage},
		{args: []string{"serve", "--tls-key", "key.pem"}, code: app.ExitUsage},
		{args: []string{"serve", "--tls-cert", "testdata/nope.pem", "--tls-key", "testdata/nope-key.pem"}, code: app.ExitUsage},
		{args: []string{"serve", "--tls-cert", "app_test.go", "--tls-key", "app_test.go"}, code: app.ExitUsage},
	}
	var report strings.Builder
	for _, c := range cases {
		res := b.run(t, c.stdin, c.args...)
		require.Equal(t, c.code, res.code, "dagrun %q\n%s", c.args, res.stderr)
		require.Empty(t, res.stdout, "dagrun %q", c.args)
		require.Equal(t, 1, strings.Count(res.stderr, "\n"), "one line for dagrun %q:\n%s", c.args, res.stderr)
		require.True(t, strings.HasPrefix(res.stderr, "dagrun: "), res.stderr)
		fmt.Fprintf(&report, "$ dagrun %s\n%s(exit %d)\n\n", strings.Join(quoteArgs(c.args), " "), res.stderr, res.code)
	}
	golden(t, "errors", report.String())

	// Nothing was started by any of them.
	res := b.run(t, "", "list", "--json")
	require.Equal(t, app.ExitOK, res.code, res.stderr)
	require.Equal(t, "[]\n", res.stdout)
}

func quoteArgs(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		if a == "" || strings.ContainsAny(a, " \"{}@") {
			a = "'" + a + "'"
		}
		out[i] = a
	}
	return out
}

// TestStdoutIsClean checks that logs never reach stdout, even at debug.
func TestStdoutIsClean(t *testing.T) {
	t.Parallel()
	b := setup(t)
	res := b.run(t, "", "--log-level", "debug", "--log-format", "json", "start", "greet", "--input", `{"name": "Bo"}`)
	require.Equal(t, app.ExitOK, res.code, res.stderr)
	require.Equal(t, "\"hello, Bo\"\n", res.stdout)
	// Durations in a JSON log carry their unit, as in a text log.
	require.Regexp(t, `"duration":"[0-9.]+(ns|µs|ms|s)"`, res.stderr)
	require.NotRegexp(t, `"duration":[0-9]`, res.stderr)
}

// TestJSONFlagsSkipAByteOrderMark: a file or standard input that a
// Windows editor or PowerShell wrote starts with a UTF-8 byte order mark,
// which is no part of the JSON.
func TestJSONFlagsSkipAByteOrderMark(t *testing.T) {
	t.Parallel()
	b := setup(t)
	path := filepath.Join(t.TempDir(), "input.json")
	require.NoError(t, os.WriteFile(path, []byte("\ufeff{\"name\": \"Bo\"}"), 0o644))
	res := b.run(t, "", "start", "greet", "--input", "@"+path)
	require.Equal(t, app.ExitOK, res.code, res.stderr)
	require.Equal(t, "\"hello, Bo\"\n", res.stdout)
	res = b.run(t, "\ufeff{\"name\": \"Al\"}\n", "start", "greet", "--input", "-")
	require.Equal(t, app.ExitOK, res.code, res.stderr)
	require.Equal(t, "\"hello, Al\"\n", res.stdout)
}

// TestReadingANewDatabaseSaysSo: a read of an instance from a SQLite
// path that held no database (a typo, the wrong folder) says that the
// command made an empty one there, not only that the instance is unknown.
func TestReadingANewDatabaseSaysSo(t *testing.T) {
	t.Parallel()
	b := setup(t)
	path := b.env["DAGRUN_DB"]
	const id = "01a252b3-f680-71ad-84fa-1da57b2f715c"
	for _, args := range [][]string{{"status", id}, {"logs", id}} {
		require.NoError(t, os.RemoveAll(path))
		res := b.run(t, "", args...)
		require.Equal(t, app.ExitUsage, res.code, res.stderr)
		require.Equal(t, `dagrun: no instance with ID "`+id+`": there was no database at `+path+", and this command made an empty one (run where yours is, or pass --db or DAGRUN_DB)\n", res.stderr)
		res = b.run(t, "", args...)
		require.Equal(t, app.ExitUsage, res.code, res.stderr)
		require.Equal(t, `dagrun: no instance with ID "`+id+`" (list instances with: dagrun list)`+"\n", res.stderr, "the database is there now")
	}
}

// TestStartJSONOnFailure: --json prints the whole instance object whatever
// the outcome, and the exit code still tells the outcome.
func TestStartJSONOnFailure(t *testing.T) {
	t.Parallel()
	b := setup(t)
	res := b.run(t, "", "start", "checkout", "--input", `{"orderId": "A-8", "email": "a@example.com"}`, "--json")
	require.Equal(t, app.ExitFailed, res.code, res.stderr)
	var inst struct {
		Status string  `json:"status"`
		Error  *string `json:"error"`
		Steps  []struct {
			Name     string `json:"name"`
			Status   string `json:"status"`
			Attempts int    `json:"attempts"`
		} `json:"steps"`
	}
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &inst), res.stdout)
	require.Equal(t, "failed", inst.Status)
	require.Equal(t, "step charge failed: card declined: insufficient funds", *inst.Error)
	got := map[string]string{}
	for _, s := range inst.Steps {
		got[s.Name] = fmt.Sprintf("%s/%d", s.Status, s.Attempts)
	}
	require.Equal(t, map[string]string{"reserve": "completed/1", "charge": "failed/3", "receipt": "completed/1", "ship": "cancelled/0"}, got)
}

// TestInvalidWorkflowFile: starting or drawing a workflow whose file is
// there but invalid names the file's first error, not "unknown workflow".
func TestInvalidWorkflowFile(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.env["DAGRUN_WORKFLOWS"] = "testdata/invalid"
	var report strings.Builder
	for _, args := range [][]string{{"start", "typos"}, {"graph", "typos"}, {"start", "greet"}} {
		res := b.run(t, "", args...)
		require.Equal(t, app.ExitUsage, res.code, res.stderr)
		require.Empty(t, res.stdout)
		lines := strings.Split(strings.TrimSuffix(res.stderr, "\n"), "\n")
		last := lines[len(lines)-1]
		require.True(t, strings.HasPrefix(last, "dagrun: "), res.stderr)
		fmt.Fprintf(&report, "$ dagrun %s\n%s\n\n", strings.Join(args, " "), last)
	}
	golden(t, "invalid-workflow", report.String())
}

// TestDBSchema: --db-schema, or the URL's dagrun_schema, picks the
// PostgreSQL schema of dagrun's tables; without either it is "dagrun".
func TestDBSchema(t *testing.T) {
	t.Parallel()
	if !backendtest.PostgresAvailable(t) {
		t.Skip("set DAGRUN_TEST_POSTGRES to run the PostgreSQL CLI tests")
	}
	b := setup(t)
	db := backendtest.PostgresURL(t)
	res := b.run(t, "", "--db", db, "--db-schema", "tenant_x", "start", "greet", "--input", `{"name": "Bo"}`)
	require.Equal(t, app.ExitOK, res.code, res.stderr)

	count := func(args ...string) int {
		t.Helper()
		res := b.run(t, "", append(args, "list", "--json")...)
		require.Equal(t, app.ExitOK, res.code, res.stderr)
		var list []json.RawMessage
		require.NoError(t, json.Unmarshal([]byte(res.stdout), &list), res.stdout)
		return len(list)
	}
	sep := "?"
	if strings.Contains(db, "?") {
		sep = "&"
	}
	require.Equal(t, 1, count("--db", db, "--db-schema", "tenant_x"))
	require.Equal(t, 1, count("--db", db+sep+"dagrun_schema=tenant_x"))
	require.Equal(t, 0, count("--db", db), "the default schema")

	// A worker's start line names the schema it works in: a mistyped one
	// makes a new, empty schema without another word.
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	stderr := &cancelOnText{text: "dagrun worker started", cancel: cancel}
	code := app.Run(ctx, []string{"--db", db, "--db-schema", "tenant_x", "worker"}, &app.IO{
		Stdout: io.Discard, Stderr: stderr, Getenv: func(name string) string { return b.env[name] },
	}, b.registry)
	require.Equal(t, app.ExitOK, code, stderr.String())
	require.Contains(t, stderr.String(), "schema=tenant_x")
}

// cancelOnText is a stderr that cancels a command once it wrote text.
type cancelOnText struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	text   string
	cancel context.CancelFunc
}

func (w *cancelOnText) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n, err := w.buf.Write(p)
	if strings.Contains(w.buf.String(), w.text) {
		w.cancel()
	}
	return n, err
}

func (w *cancelOnText) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// TestWorkerWarnsOfAShortLease: a lease under a second can run out while
// a busy machine delays a heartbeat; the worker says so as it starts (a
// cancelled worker still reads its flags).
func TestWorkerWarnsOfAShortLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	for lease, warned := range map[string]bool{"100ms": true, "999ms": true, "1s": false, "30s": false} {
		res := b.runContext(ctx, "worker", "--lease", lease)
		require.Equal(t, warned, strings.Contains(res.stderr, "a lease this short can run out"), "--lease %s:\n%s", lease, res.stderr)
	}
}

// TestStatusSaysWhereTheRestOfTheHistoryIs: a history longer than the
// text view shows names where the rest is: all of it through the API,
// the latest events in status --json.
func TestStatusSaysWhereTheRestOfTheHistoryIs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	dir := t.TempDir()
	var src strings.Builder
	src.WriteString("name: long\nsteps:\n")
	for i := range 12 {
		fmt.Fprintf(&src, "  - name: s%d\n    handler: noop\n", i)
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "long.yaml"), []byte(src.String()), 0o644))
	b.env["DAGRUN_WORKFLOWS"] = dir
	res := b.run(t, "", "start", "long", "--json")
	require.Equal(t, app.ExitOK, res.code, res.stderr)
	id := maskUUID.FindString(res.stdout)
	require.NotEmpty(t, id)
	res = b.run(t, "", "status", id)
	require.Equal(t, app.ExitOK, res.code, res.stderr)
	require.Contains(t, res.stdout, "\nHistory (the latest 20 events; GET /api/instances/"+id+"/events has them all, dagrun status "+id+" --json the latest 100):\n")
}
