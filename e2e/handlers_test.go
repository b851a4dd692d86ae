package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// built holds the binaries besides the e2e one, each built on first use
// next to it: name -> *builtBinary.
var built sync.Map

type builtBinary struct {
	once sync.Once
	path string
	err  error
}

// buildOnce builds the main package pkg into name, next to the e2e binary,
// once per test process; with race, under the race detector unless
// DAGRUN_E2E_NORACE is set.
func buildOnce(t *testing.T, name, pkg string, race bool) string {
	t.Helper()
	v, _ := built.LoadOrStore(name, &builtBinary{})
	b := v.(*builtBinary)
	b.once.Do(func() {
		b.path = filepath.Join(filepath.Dir(binary), name)
		b.err = goBuild(b.path, pkg, race && os.Getenv("DAGRUN_E2E_NORACE") == "")
	})
	require.NoError(t, b.err)
	return b.path
}

// customBinary returns examples/custom built like the e2e binary: a dagrun
// binary of one's own, with the greet.hello handler the stock one lacks.
func customBinary(t *testing.T) string {
	t.Helper()
	return buildOnce(t, "dagrun-custom", "../examples/custom", true)
}

// unserved returns `stats --json`'s ready steps per handler that no live
// worker can run.
func (e *env) unserved(t *testing.T) map[string]int {
	t.Helper()
	var stats struct {
		Unserved []struct {
			Handler string `json:"handler"`
			Ready   int    `json:"ready"`
		} `json:"unserved"`
	}
	res := e.mustRun(t, "stats", "--json")
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &stats), res.stdout)
	out := map[string]int{}
	for _, h := range stats.Unserved {
		out[h.Handler] = h.Ready
	}
	return out
}

// TestMixedBinaries: a stock `dagrun worker` shares the database with a
// binary of one's own (examples/custom). The stock worker never claims a
// step whose handler only the custom binary has (its attempts stay 0, the
// instance waits instead of failing), and stats name that handler as
// waiting with no live worker; a worker of the custom binary then runs it
// to completion.
func TestMixedBinaries(t *testing.T) {
	t.Parallel()
	custom := customBinary(t)
	forEachBackend(t, func(t *testing.T, db string) {
		e := newEnv(t, db, map[string]string{
			"quick.yaml": "name: quick\nsteps:\n  - {name: a, handler: echo, input: {n: 1}}\n",
		})
		customWorkflows, err := filepath.Abs("../examples/custom/workflows")
		require.NoError(t, err)
		stock := e.spawn(t, "worker", "--poll", "100ms")

		startCustom := e.command(t.Context(), "--workflows", customWorkflows, "start", "greet", "--input", `{"name": "Ada"}`, "--detach")
		startCustom.Path, startCustom.Args[0] = custom, custom
		out, err := startCustom.Output()
		require.NoError(t, err, "custom start: %s", out)
		id := strings.TrimSpace(string(out))

		// A later instance of a stock handler completes: the stock worker
		// claims in claim order and has passed over the older greet step.
		quick := strings.TrimSpace(e.mustRun(t, "start", "quick", "--detach").stdout)
		waitFor(t, 30*time.Second, "the stock worker to run a stock step", func() bool {
			return e.status(t, quick).Status == "completed"
		})
		inst := e.status(t, id)
		require.Equal(t, "pending", inst.Status)
		hello := inst.Steps[inst.step(t, "hello")]
		require.Equal(t, "pending", hello.Status)
		require.Zero(t, hello.Attempts, "the stock worker spent no attempt of greet.hello")
		require.Equal(t, map[string]int{"greet.hello": 1}, e.unserved(t))
		text := e.mustRun(t, "stats").stdout
		require.Contains(t, text, "READY STEPS NO LIVE WORKER CAN RUN")
		require.Regexp(t, `(?m)^greet\.hello\s+1\s`, text)

		customWorker := e.spawnBinary(t, custom, "--workflows", customWorkflows, "worker", "--poll", "100ms")
		waitFor(t, 30*time.Second, "the custom worker to finish the instance", func() bool {
			return e.status(t, id).Status == "completed"
		})
		inst = e.status(t, id)
		require.Equal(t, 1, inst.Steps[inst.step(t, "hello")].Attempts)
		require.JSONEq(t, `{"greeting": "Hello, Ada!", "loud": "HELLO, ADA!"}`, string(inst.Output))
		require.Empty(t, e.unserved(t))
		customWorker.stop(t)
		stock.stop(t)
	})
}
