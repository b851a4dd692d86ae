package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// statsOf returns the `stats --json` figures of one workflow.
func (e *env) statsOf(t *testing.T, workflow string) (stats struct {
	Workflow    string         `json:"workflow"`
	Instances   map[string]int `json:"instances"`
	ReadySteps  int            `json:"readySteps"`
	StuckSteps  int            `json:"stuckSteps"`
	OldestReady float64        `json:"oldestReadyMs"`
	StepP50Ms   *float64       `json:"stepP50Ms"`
	StepP95Ms   *float64       `json:"stepP95Ms"`
}) {
	t.Helper()
	var all struct {
		Workflows []json.RawMessage `json:"workflows"`
	}
	res := e.mustRun(t, "stats", "--json")
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &all), res.stdout)
	for _, raw := range all.Workflows {
		require.NoError(t, json.Unmarshal(raw, &stats))
		if stats.Workflow == workflow {
			return stats
		}
	}
	t.Fatalf("stats --json has no workflow %s:\n%s", workflow, res.stdout)
	return stats
}

// TestStatsStuckSteps SIGKILLs the only worker in the middle of a step:
// once its lease has passed, `stats` counts the step as stuck (running, but
// nobody heartbeats it), until a new worker recovers and finishes it.
func TestStatsStuckSteps(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, db string) {
		probe := newRelProbe(t, 0)
		release := make(chan struct{})
		defer close(release)
		probe.setHold(func(r relRequest) <-chan struct{} {
			if r.N == 1 && strings.HasSuffix(r.Key, "/a") {
				return release // the first execution of a never ends
			}
			return nil
		})
		e := newEnv(t, db, map[string]string{"stuck.yaml": probeWorkflow("stuck", probeStep{name: "a"}, probeStep{"b", []string{"a"}})})
		worker := e.spawn(t, "worker", "--lease", "1s", "--poll", "100ms")
		id := strings.TrimSpace(e.mustRun(t, "start", "stuck", "--input", probe.input(), "--detach").stdout)
		probe.next(t, 30*time.Second, "the worker to run step a")

		st := e.statsOf(t, "stuck")
		require.Equal(t, 1, st.Instances["running"])
		require.Zero(t, st.StuckSteps, "a step whose worker heartbeats is not stuck")
		worker.kill(t)
		waitFor(t, 10*time.Second, "stats to count the step as stuck", func() bool {
			return e.statsOf(t, "stuck").StuckSteps == 1
		})
		st = e.statsOf(t, "stuck")
		require.Equal(t, 1, st.Instances["running"])
		require.Zero(t, st.ReadySteps)
		require.Equal(t, "running", e.status(t, id).Steps[0].Status, "nothing recovers a step without a live worker")
		require.Nil(t, st.StepP50Ms, "no attempt completed: no duration, not 0")
		require.Nil(t, st.StepP95Ms, "no attempt completed: no duration, not 0")

		worker = e.spawn(t, "worker", "--lease", "1s", "--poll", "100ms")
		waitFor(t, 30*time.Second, "the new worker to finish the instance", func() bool {
			return e.status(t, id).Status == "completed"
		})
		st = e.statsOf(t, "stuck")
		require.Zero(t, st.StuckSteps)
		require.Equal(t, 1, st.Instances["completed"])
		require.Zero(t, st.Instances["running"])
		require.NotNil(t, st.StepP50Ms)
		require.NotNil(t, st.StepP95Ms)
		require.Positive(t, *st.StepP50Ms)
		require.GreaterOrEqual(t, *st.StepP95Ms, *st.StepP50Ms)
		worker.stop(t)
	})
}

// TestPrune checks that `prune --older-than D` deletes exactly the finished
// instances (completed or failed) that finished more than D ago, with their
// steps and events, that --dry-run only counts them, and that unfinished
// instances are never pruned, however old.
func TestPrune(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, db string) {
		e := newEnv(t, db, map[string]string{
			"quick.yaml":  "name: quick\nsteps:\n  - {name: a, handler: echo, input: {n: 1}}\n  - {name: b, handler: noop, dependsOn: [a]}\n",
			"broken.yaml": "name: broken\nsteps:\n  - name: a\n    handler: http\n    input: {url: \"nope://x\"}\n",
		})
		old := strings.TrimSpace(e.mustRun(t, "start", "quick", "--json").stdout)
		var oldInst instance
		require.NoError(t, json.Unmarshal([]byte(old), &oldInst))
		require.Equal(t, "completed", oldInst.Status)
		oldDone := time.Now()
		time.Sleep(3 * time.Second)
		var recent []string
		for _, wf := range []string{"quick", "quick", "broken"} {
			res := e.run(t, "start", wf, "--json")
			var inst instance
			require.NoError(t, json.Unmarshal([]byte(res.stdout), &inst), res.stdout)
			require.Contains(t, []string{"completed", "failed"}, inst.Status)
			recent = append(recent, inst.ID)
		}
		pending := strings.TrimSpace(e.mustRun(t, "start", "quick", "--delay", "1h", "--detach").stdout)
		countRows := func(ids ...string) (steps, events int) {
			in := "'" + strings.Join(ids, "','") + "'"
			return dbInt(t, db, `SELECT count(*) FROM steps WHERE instance_id IN (`+in+`)`),
				dbInt(t, db, `SELECT count(*) FROM events WHERE instance_id IN (`+in+`)`)
		}
		steps, events := countRows(oldInst.ID)
		require.Equal(t, 2, steps)
		require.Positive(t, events)

		// A bound just younger than the old instance, taken right before
		// each command: the old one is older, and the recent ones stay
		// younger as long as the command starts within the gap between
		// them (slow under -race on a loaded machine, hence a wide gap).
		bound := func() time.Duration { return time.Since(oldDone).Truncate(time.Millisecond) }
		prune := func(args ...string) string {
			return strings.TrimSpace(e.mustRun(t, append([]string{"prune"}, args...)...).stdout)
		}
		require.Equal(t, "would prune 0 finished instances older than 1h", prune("--older-than", "1h", "--dry-run"))
		require.Equal(t, "pruned 0 finished instances older than 1h", prune("--older-than", "1h"))
		require.Equal(t, "pruned 0 finished instances older than 7d", prune("--older-than", "7d"))
		require.Equal(t, "pruned 0 finished instances older than 2w", prune("--older-than", "2w"))
		b := bound()
		require.Equal(t, fmt.Sprintf("would prune 1 finished instance older than %s", b), prune("--older-than", b.String(), "--dry-run"))
		require.Equal(t, "completed", e.status(t, oldInst.ID).Status, "--dry-run deletes nothing")
		b = bound()
		require.Equal(t, fmt.Sprintf("pruned 1 finished instance older than %s", b), prune("--older-than", b.String()))

		res := e.run(t, "status", oldInst.ID)
		require.Equal(t, 2, res.code, "a pruned instance is gone: %s", res.stderr)
		steps, events = countRows(oldInst.ID)
		require.Zero(t, steps, "pruned instances' steps are deleted")
		require.Zero(t, events, "pruned instances' events are deleted")
		for _, id := range append(recent, pending) {
			e.status(t, id)
		}

		require.Equal(t, "would prune 3 finished instances older than 0s", prune("--older-than", "0s", "--dry-run"))
		require.Equal(t, "pruned 3 finished instances older than 0s", prune("--older-than", "0s"))
		steps, events = countRows(recent...)
		require.Zero(t, steps)
		require.Zero(t, events)
		list := e.mustRun(t, "list", "--json").stdout
		var left []instance
		require.NoError(t, json.Unmarshal([]byte(list), &left))
		require.Len(t, left, 1, "only the unfinished instance is left")
		require.Equal(t, pending, left[0].ID)
		require.Equal(t, "pending", left[0].Status)
		steps, events = countRows(pending)
		require.Equal(t, 2, steps)
		require.Positive(t, events)
		require.Equal(t, "pruned 0 finished instances older than 0s", prune("--older-than", "0s"))
	})
}
