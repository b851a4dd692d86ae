package e2e

// Sub-workflows through the real binary: the shipped order-fulfilment
// example calling shipping, the listing of children, the cancel cascade,
// and workers SIGKILLed while parents and children run.

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// listAll lists instances as JSON (top-level ones unless args say otherwise).
func (e *env) listAll(t *testing.T, args ...string) []instance {
	t.Helper()
	res := e.mustRun(t, append([]string{"list", "--json", "--limit", "1000"}, args...)...)
	var list []instance
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &list), res.stdout)
	return list
}

func ids(list []instance) []string {
	out := make([]string, len(list))
	for i, inst := range list {
		out[i] = inst.ID
	}
	return out
}

// TestSubflowExample runs the shipped order-fulfilment example, whose ship
// step runs the shipping workflow as a child instance, the way the README
// shows it, on each backend: the parent completes with the child's
// tracking number, the child names its parent, list shows the parent
// unless --all, and order-processing still runs as before.
func TestSubflowExample(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, db string) {
		e := newEnv(t, db, nil)
		e.mustRun(t, "validate")
		input := `{"orderId": "A-1001", "items": [{"sku": "book", "qty": 2}], "totalAmount": 42.5, "customerEmail": "ada@example.com"}`
		res := e.mustRun(t, "start", "order-fulfilment", "--input", input)
		var out struct {
			PaymentID  string `json:"paymentId"`
			TrackingNo string `json:"trackingNo"`
		}
		require.NoError(t, json.Unmarshal([]byte(res.stdout), &out), res.stdout)
		require.Regexp(t, `^TRK-[0-9A-F]{10}$`, out.TrackingNo)
		require.NotEmpty(t, out.PaymentID)

		parents := e.listAll(t)
		require.Len(t, parents, 1, "list shows top-level instances only")
		parent := e.status(t, parents[0].ID)
		require.Equal(t, "completed", parent.Status)
		require.Nil(t, parent.Parent)
		ship := parent.Steps[parent.step(t, "ship")]
		require.Equal(t, "shipping", ship.Workflow)
		require.Len(t, ship.Children, 1)
		childID := ship.Children[0]

		child := e.status(t, childID)
		require.Equal(t, "shipping", child.Workflow)
		require.Equal(t, "completed", child.Status)
		require.NotNil(t, child.Parent)
		require.Equal(t, parent.ID, child.Parent.ID)
		require.Equal(t, "ship", child.Parent.Step)
		require.Nil(t, child.Parent.Item)
		require.JSONEq(t, string(child.Output), string(ship.Output), "the step's output is the child's")
		require.JSONEq(t, fmt.Sprintf(`{"trackingNo": %q}`, out.TrackingNo), string(child.Output))
		notify := child.Steps[child.step(t, "notify")]
		require.Equal(t, "completed", notify.Status, "the customer was told")

		require.ElementsMatch(t, []string{parent.ID, childID}, ids(e.listAll(t, "--all")))
		require.Equal(t, []string{childID}, ids(e.listAll(t, "--parent", parent.ID)))
		require.Empty(t, e.listAll(t, "--parent", childID))

		text := e.mustRun(t, "status", parent.ID).stdout
		require.Contains(t, text, "ship runs workflow shipping as child instance "+childID+": dagrun status "+childID)
		require.Regexp(t, `(?m)^ship +workflow:shipping +completed `, text)
		text = e.mustRun(t, "status", childID).stdout
		require.Regexp(t, `(?m)^Parent: +`+parent.ID+` \(step ship\): dagrun status `+parent.ID+`$`, text)
		all := e.mustRun(t, "list", "--all").stdout
		require.Regexp(t, `(?m)^`+childID+` +shipping +completed +2/2 .* `+parent.ID+` ship$`, all)

		// Without an email, as the README starts it, nobody is notified.
		res = e.mustRun(t, "start", "order-fulfilment", "--input", `{"orderId": "A-1002", "items": [{"sku": "book", "qty": 2}], "totalAmount": 42.5}`, "--json")
		var second instance
		require.NoError(t, json.Unmarshal([]byte(res.stdout), &second), res.stdout)
		require.Equal(t, "completed", second.Status)
		quiet := e.status(t, second.Steps[second.step(t, "ship")].Children[0])
		require.Equal(t, "skipped", quiet.Steps[quiet.step(t, "notify")].Status)

		// The one-file original still runs, to the same shape of output.
		res = e.mustRun(t, "start", "order-processing", "--input", input)
		require.Regexp(t, `"trackingNo": "TRK-[0-9A-F]{10}"`, res.stdout)
	})
}

// subflowWaiting is a parent whose child waits for a signal that never
// comes, so that both stay unfinished until cancelled.
var subflowWaiting = map[string]string{
	"holder.yaml": `name: holder
steps:
  - name: before
    handler: noop
  - name: hold
    workflow: held
    dependsOn: [before]
    input: {note: held}
`,
	"held.yaml": `name: held
input: {type: object, required: [note]}
steps:
  - name: nested
    workflow: innermost
  - name: after
    handler: noop
    dependsOn: [nested]
`,
	"innermost.yaml": `name: innermost
steps:
  - name: wait
    wait: {signal: go}
`,
}

// TestSubflowCancelCascade cancels a parent through the CLI while its
// child, and the child's own child, wait: all three end cancelled, and the
// parent's workflow step with them. A retry of the parent brings all three
// back, and a retry of the child alone is refused.
func TestSubflowCancelCascade(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, db string) {
		e := newEnv(t, db, subflowWaiting)
		e.mustRun(t, "validate")
		worker := e.spawn(t, "worker", "--poll", "50ms")
		id := strings.TrimSpace(e.mustRun(t, "start", "holder", "--detach").stdout)

		var child, grandchild string
		waitFor(t, 30*time.Second, "the grandchild to wait for its signal", func() bool {
			kids := e.listAll(t, "--parent", id)
			if len(kids) != 1 {
				return false
			}
			child = kids[0].ID
			grand := e.listAll(t, "--parent", child)
			if len(grand) != 1 {
				return false
			}
			grandchild = grand[0].ID
			g := e.status(t, grandchild)
			return g.Steps[0].Status == "waiting"
		})
		require.Equal(t, "running", e.status(t, child).Status)

		res := e.run(t, "cancel", child+"x")
		require.Equal(t, 2, res.code, "an unknown ID is a usage error")
		e.mustRun(t, "cancel", id)
		for _, x := range []string{id, child, grandchild} {
			require.Equal(t, "cancelled", e.status(t, x).Status, "instance %s", x)
		}
		parent := e.status(t, id)
		hold := parent.Steps[parent.step(t, "hold")]
		require.NotEqual(t, "running", hold.Status, "the workflow step of a cancelled parent")
		require.Equal(t, "completed", parent.Steps[parent.step(t, "before")].Status)
		res = e.run(t, "cancel", child)
		require.Equal(t, 2, res.code, "a child already cancelled with its parent:\n%s", res.stderr)

		// A child is retried through its parent, which retries it, and its
		// own child: the signal then finishes all three.
		res = e.run(t, "retry", child)
		require.Equal(t, 2, res.code)
		require.Contains(t, res.stderr, "dagrun retry "+id+" retries this child")
		e.mustRun(t, "retry", id, "--detach")
		waitFor(t, 30*time.Second, "the grandchild to wait again", func() bool {
			return e.status(t, grandchild).Steps[0].Status == "waiting"
		})
		require.Len(t, e.listAll(t, "--parent", id), 1, "the retry re-used the child")
		e.mustRun(t, "signal", grandchild, "go")
		waitFor(t, 30*time.Second, "the parent to complete", func() bool {
			return e.status(t, id).Status == "completed"
		})
		for _, x := range []string{child, grandchild} {
			require.Equal(t, "completed", e.status(t, x).Status, "instance %s", x)
		}
		worker.stop(t)
	})
}

// subflowProbe is a crash-test parent: a probe step, a workflow step
// whose child runs two probe steps, and a probe step after it that
// carries the child's output on.
func subflowProbe() map[string]string {
	child := probeWorkflow("crashchild", probeStep{name: "a"}, probeStep{"b", []string{"a"}})
	// The probe step pre, without its workflow's output, then the rest.
	pre, _, _ := strings.Cut(probeWorkflow("crashparent", probeStep{name: "pre"}), "output:")
	return map[string]string{
		"crashchild.yaml": child,
		"crashparent.yaml": pre + `  - name: call
    workflow: crashchild
    dependsOn: [pre]
    input: {url: "${{ input.url }}"}
  - name: post
    handler: echo
    dependsOn: [call]
    input: {child: "${{ steps.call.output }}"}
output: ${{ steps.post.output.child }}
`,
	}
}

// parentChildMismatches counts, in one query (one snapshot of the
// database), the workflow steps whose state disagrees with their child's:
// a step still running though its child finished, or a step finished
// though its child still runs.
const parentChildMismatches = `SELECT count(*) FROM instances c JOIN steps s
	ON s.instance_id = c.parent_id AND s.name = c.parent_step
	WHERE ((c.status IN ('completed', 'failed', 'cancelled') AND s.status = 'running')
	   OR (c.status IN ('pending', 'running') AND s.status IN ('completed', 'failed', 'cancelled'))) AND c.parent_item = -1`

// TestCrashSubflowWorkersKilled runs many parents whose children run on
// three worker processes, SIGKILLs a worker again and again while steps of
// parents and children are in flight, sampling the database for a parent
// step whose state disagrees with its child's, then lets a fresh worker
// finish everything: every parent completes with its one child's output.
func TestCrashSubflowWorkersKilled(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, db string) {
		const (
			parents = 20
			kills   = 4
		)
		probe := newRelProbe(t, 150*time.Millisecond)
		e := newEnv(t, db, subflowProbe())
		e.mustRun(t, "validate")
		// Every parent is there before the workers start, so that many
		// steps of parents and children are in flight at each kill.
		started := e.startDetachedMany(t, "crashparent", probe.input(), parents)
		workerArgs := []string{"worker", "--concurrency", "4", "--lease", "1s", "--poll", "100ms"}
		var workers []*process
		for range 3 {
			workers = append(workers, e.spawn(t, workerArgs...))
		}

		// Meanwhile the database is sampled for a disagreement, each
		// sample one query, so one snapshot.
		var samples, mismatches atomic.Int64
		stopSampling := make(chan struct{})
		sampled := make(chan struct{})
		go func() {
			defer close(sampled)
			for {
				select {
				case <-stopSampling:
					return
				case <-time.After(20 * time.Millisecond):
				}
				if n, err := dbIntErr(db, parentChildMismatches); err == nil {
					samples.Add(1)
					mismatches.Add(int64(n))
				}
			}
		}()

		// Three probe requests per parent: pre, and the child's a and b.
		requests := parents * 3
		for k := range kills {
			waitFor(t, 60*time.Second, "steps in flight", func() bool {
				_, total := probe.snapshot()
				return total >= (k+1)*requests/(kills+1) && probe.inFlight() > 0
			})
			require.Zero(t, dbInt(t, db, parentChildMismatches), "a workflow step disagrees with its child")
			victim := workers[k%len(workers)]
			t.Logf("kill %d: SIGKILL worker pid %d with %d requests in flight", k+1, victim.pid(), probe.inFlight())
			victim.kill(t)
			workers[k%len(workers)] = e.spawn(t, workerArgs...)
			require.Zero(t, dbInt(t, db, parentChildMismatches), "a workflow step disagrees with its child")
		}
		// Every worker goes; a fresh one finishes what is left.
		for _, w := range workers {
			w.kill(t)
		}
		require.Zero(t, dbInt(t, db, parentChildMismatches), "a workflow step disagrees with its child")
		close(stopSampling)
		<-sampled
		t.Logf("%d samples of the database while workers were killed", samples.Load())
		require.Positive(t, samples.Load())
		require.Zero(t, mismatches.Load(), "a sample found a workflow step that disagrees with its child")
		fresh := e.spawn(t, workerArgs...)
		waitFor(t, 120*time.Second, "every parent and child to finish", func() bool {
			for _, inst := range e.listAll(t, "--all") {
				if inst.Status == "pending" || inst.Status == "running" {
					return false
				}
			}
			return true
		})
		fresh.stop(t)
		require.Zero(t, dbInt(t, db, parentChildMismatches))
		require.Equal(t, parents, dbInt(t, db, `SELECT count(*) FROM instances c JOIN steps s
			ON s.instance_id = c.parent_id AND s.name = c.parent_step
			WHERE s.status = 'completed' AND c.status = 'completed'`), "the agreement query's join pairs each child with its parent's step")

		require.Len(t, e.listAll(t), parents)
		require.Len(t, e.listAll(t, "--all"), 2*parents, "one child per parent, never a second")
		for _, id := range started {
			parent := e.status(t, id)
			require.Equal(t, "completed", parent.Status, "parent %s: %v", id, parent.Error)
			call := parent.Steps[parent.step(t, "call")]
			require.Len(t, call.Children, 1, "parent %s", id)
			child := e.status(t, call.Children[0])
			require.Equal(t, "completed", child.Status)
			require.Equal(t, id, child.Parent.ID)
			require.JSONEq(t, string(child.Output), string(call.Output), "parent %s: the step's output is the child's", id)
			require.JSONEq(t, string(child.Output), string(parent.Output), "parent %s carries its child's output", id)
			var seq struct {
				Seq int `json:"seq"`
			}
			require.NoError(t, json.Unmarshal(child.Output, &seq))
			require.Positive(t, seq.Seq)
		}
		require.Zero(t, duplicateCompletions(t, db), "a step completed twice")
	})
}
