// Package e2e drives the real dagrun binary the way a user does: it builds
// ./cmd/dagrun once, then runs it in temporary folders against SQLite files
// and, when DAGRUN_TEST_POSTGRES is set, fresh PostgreSQL databases.
//
// It imports the standard library, testify, pgx (to create and drop test
// databases and to inspect rows), the SQLite driver (integrity checks),
// chromedp (the browser test) and the OTLP protobuf types (the trace
// receiver); never dagrun's own packages.
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// binary is the dagrun executable built once by TestMain with the race
// detector, for the processes that stay up while a test drives them
// (workers, servers): where dagrun's goroutines meet, and where a race
// would show. The crash and fault tests' workers are plain (spawnPlain). plainBinary, built without it, runs the one-shot commands
// (list, status, start --detach, ...), hundreds of them per run: a
// race-built one took 260 ms of CPU against 82 ms plain (perf stat -r 5
// dagrun list, on SQLite), and with every command race-built the package
// took 515 s of CI's run of 907 s on a 2-core VM, against 221 s with
// every command plain (go test -race -count=1 ./e2e, with PostgreSQL).
// The CLI's own code runs under the race detector in
// cmd/dagrun/app's tests, and the fleet, load and limits tests measure
// with plainBinary. With DAGRUN_E2E_NORACE set, both are the plain build.
var binary, plainBinary string

// e2eParallel is how many of this package's parallel tests run at once
// unless -parallel says otherwise. They spend most of their time waiting
// for the processes they drive, so the default, GOMAXPROCS (2 on CI's
// machine), left the cores half idle: the package took 214 s at 2 and
// 172 s at 4 there (go test -race -count=1 ./e2e, with PostgreSQL).
const e2eParallel = 4

func TestMain(m *testing.M) {
	flag.Parse()
	parallelSet := false
	flag.Visit(func(f *flag.Flag) { parallelSet = parallelSet || f.Name == "test.parallel" })
	if !parallelSet && runtime.GOMAXPROCS(0) < e2eParallel {
		if err := flag.Set("test.parallel", fmt.Sprint(e2eParallel)); err != nil {
			fmt.Fprintln(os.Stderr, "e2e:", err)
			os.Exit(1)
		}
	}
	dir, err := os.MkdirTemp("", "dagrun-e2e-bin-*")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "dagrun")
	plainBinary = filepath.Join(dir, "dagrun-norace")
	if runtime.GOOS == "windows" {
		binary += ".exe"
		plainBinary += ".exe"
	}
	builds := map[string]bool{binary: true, plainBinary: false} // path: with -race
	if os.Getenv("DAGRUN_E2E_NORACE") != "" {
		plainBinary = binary
		builds = map[string]bool{binary: false}
	}
	// The two builds share little, so they run side by side.
	errs := make(chan error, len(builds))
	for path, race := range builds {
		go func() { errs <- goBuild(path, "../cmd/dagrun", race) }()
	}
	for range builds {
		if err := <-errs; err != nil {
			fmt.Fprintln(os.Stderr, "e2e:", err)
			os.Exit(1)
		}
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// goBuild builds the main package pkg into path, with the race detector
// when race is set.
func goBuild(path, pkg string, race bool) error {
	args := []string{"build", "-o", path, pkg}
	if race {
		args = []string{"build", "-race", "-o", path, pkg}
	}
	build := exec.Command("go", args...)
	build.Env = append(os.Environ(), "CGO_ENABLED=1")
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// backend is one database kind the scenarios run on.
type backend struct {
	name string
	// newDB returns a --db value for a fresh, empty database.
	newDB func(t *testing.T) string
}

// backends returns SQLite, plus PostgreSQL when DAGRUN_TEST_POSTGRES is set
// (required under CI=true).
func backends(t *testing.T) []backend {
	t.Helper()
	list := []backend{{name: "sqlite", newDB: func(t *testing.T) string {
		return filepath.Join(t.TempDir(), "dagrun.db")
	}}}
	if os.Getenv("DAGRUN_TEST_POSTGRES") != "" {
		list = append(list, backend{name: "postgres", newDB: func(t *testing.T) string { return newPostgresDB(t) }})
	} else if os.Getenv("CI") == "true" {
		t.Fatal("DAGRUN_TEST_POSTGRES is not set; Postgres e2e tests are required under CI=true")
	}
	return list
}

var dbSeq atomic.Int64

// newPostgresDB creates a database for one test and drops it afterwards.
func newPostgresDB(t testing.TB) string {
	t.Helper()
	dsn := os.Getenv("DAGRUN_TEST_POSTGRES")
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	name := fmt.Sprintf("dagrun_e2e_%d_%d", time.Now().UnixNano(), dbSeq.Add(1))
	_, err = admin.Exec(ctx, "CREATE DATABASE "+name)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx := context.WithoutCancel(ctx)
		_, _ = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
		_ = admin.Close(ctx)
	})
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	u.Path = "/" + name
	return u.String()
}

// forEachBackend runs a scenario once per backend as parallel subtests.
func forEachBackend(t *testing.T, scenario func(t *testing.T, db string)) {
	t.Helper()
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			scenario(t, b.newDB(t))
		})
	}
}

// env is a user's working folder: a database and a workflows folder.
type env struct {
	dir       string
	db        string
	workflows string
	extraEnv  []string
}

// newEnv makes a working folder with the given workflow files (name →
// YAML) and the repository's shipped workflows.
func newEnv(t *testing.T, db string, files map[string]string) *env {
	t.Helper()
	dir := t.TempDir()
	wf := filepath.Join(dir, "workflows")
	require.NoError(t, os.MkdirAll(wf, 0o755))
	shipped, err := filepath.Glob("../workflows/*.yaml")
	require.NoError(t, err)
	for _, path := range shipped {
		data, err := os.ReadFile(path)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(wf, filepath.Base(path)), data, 0o644))
	}
	for name, src := range files {
		require.NoError(t, os.WriteFile(filepath.Join(wf, name), []byte(src), 0o644))
	}
	return &env{dir: dir, db: db, workflows: wf}
}

// result is what one run of the binary did.
type result struct {
	code   int
	stdout string
	stderr string
}

// command builds a dagrun invocation in the env's folder.
func (e *env) command(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Dir = e.dir
	cmd.Env = append(os.Environ(), "DAGRUN_DB="+e.db, "DAGRUN_WORKFLOWS="+e.workflows)
	// The race runtime sleeps a second at exit by default (atexit_sleep_ms)
	// for reports to flush; over hundreds of runs that dominates the suite.
	cmd.Env = append(cmd.Env, "GORACE=atexit_sleep_ms=0 "+os.Getenv("GORACE"))
	cmd.Env = append(cmd.Env, e.extraEnv...)
	return cmd
}

// binaryCommand is command with another dagrun binary.
func (e *env) binaryCommand(ctx context.Context, bin string, args ...string) *exec.Cmd {
	cmd := e.command(ctx, args...)
	cmd.Path, cmd.Args[0] = bin, bin
	return cmd
}

// runStdin runs one dagrun command (plainBinary) to completion, at most a
// minute, with stdin.
func (e *env) runStdin(t testing.TB, stdin string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := e.binaryCommand(ctx, plainBinary, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Stdin = strings.NewReader(stdin)
	err := cmd.Run()
	res := result{stdout: stdout.String(), stderr: stderr.String()}
	require.NotContains(t, res.stderr, "WARNING: DATA RACE", "dagrun %v", args)
	if err != nil {
		exitErr, ok := err.(*exec.ExitError)
		require.True(t, ok, "run dagrun %v: %v\n%s", args, err, stderr.String())
		res.code = exitErr.ExitCode()
	}
	return res
}

func (e *env) run(t testing.TB, args ...string) result {
	t.Helper()
	return e.runStdin(t, "", args...)
}

// mustRun runs dagrun and requires exit code 0.
func (e *env) mustRun(t testing.TB, args ...string) result {
	t.Helper()
	res := e.run(t, args...)
	require.Equal(t, 0, res.code, "dagrun %v\nstdout:\n%s\nstderr:\n%s", args, res.stdout, res.stderr)
	return res
}

// instance is the part of the instance object the tests read.
type instance struct {
	ID        string          `json:"id"`
	CreatedAt string          `json:"createdAt"`
	Workflow  string          `json:"workflow"`
	Status    string          `json:"status"`
	Input     json.RawMessage `json:"input"`
	Output    json.RawMessage `json:"output"`
	Error     *string         `json:"error"`
	Steps     []struct {
		Name      string          `json:"name"`
		Handler   string          `json:"handler"`
		Status    string          `json:"status"`
		Attempts  int             `json:"attempts"`
		Input     json.RawMessage `json:"input"`
		Output    json.RawMessage `json:"output"`
		Error     *string         `json:"error"`
		StartedAt *string         `json:"startedAt"`
		Workflow  string          `json:"workflow"`
		Children  []string        `json:"children"`
	} `json:"steps"`
	Parent *struct {
		ID   string `json:"id"`
		Step string `json:"step"`
		Item *int   `json:"item"`
	} `json:"parent"`
	Events []struct {
		Type    string `json:"type"`
		Step    string `json:"step"`
		Attempt int    `json:"attempt"`
		Message string `json:"message"`
	} `json:"events"`
}

func (e *env) status(t testing.TB, id string) instance {
	t.Helper()
	res := e.mustRun(t, "status", id, "--json")
	var inst instance
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &inst), res.stdout)
	return inst
}

func (inst instance) step(t *testing.T, name string) int {
	t.Helper()
	for i, s := range inst.Steps {
		if s.Name == name {
			return i
		}
	}
	t.Fatalf("instance %s has no step %q", inst.ID, name)
	return -1
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// golden compares got with testdata/NAME.golden, rewriting it with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		require.NoError(t, os.MkdirAll("testdata", 0o755))
		require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
		return
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "missing golden file; run go test ./e2e -update")
	require.Equal(t, string(want), got)
}
