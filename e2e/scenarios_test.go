package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// quickstartInput is the order of the README's quickstart.
const quickstartInput = `{"orderId": "A-1001", "items": [{"sku": "book", "qty": 2}], "totalAmount": 42.5}`

var idPattern = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// startDetached starts an instance with --detach and returns its ID.
func (e *env) startDetached(t *testing.T, workflow, input string, extra ...string) string {
	t.Helper()
	args := append([]string{"start", workflow, "--input", input, "--detach"}, extra...)
	res := e.mustRun(t, args...)
	id := strings.TrimSpace(res.stdout)
	require.Regexp(t, idPattern, id, "start --detach prints only the instance ID")
	require.Equal(t, id+"\n", res.stdout)
	return id
}

// listJSON returns `dagrun list --json` with the given filters.
func (e *env) listJSON(t *testing.T, args ...string) []instance {
	t.Helper()
	res := e.mustRun(t, append([]string{"list", "--json"}, args...)...)
	var out []instance
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &out), res.stdout)
	return out
}

// countEvents counts the instance's events of a type, for one step or ("")
// for all.
func (inst instance) countEvents(typ, step string) int {
	n := 0
	for _, ev := range inst.Events {
		if ev.Type == typ && (step == "" || ev.Step == step) {
			n++
		}
	}
	return n
}

// compact returns raw JSON without insignificant space, so tests can compare
// exact encodings (42 and not 42.0).
func compact(t *testing.T, raw json.RawMessage) string {
	t.Helper()
	var b bytes.Buffer
	require.NoError(t, json.Compact(&b, raw))
	return b.String()
}

// requireOneLine checks that stderr is one "dagrun: ..." line and returns it.
func requireOneLine(t *testing.T, stderr string) string {
	t.Helper()
	require.True(t, strings.HasSuffix(stderr, "\n"), "stderr ends with a newline: %q", stderr)
	line := strings.TrimSuffix(stderr, "\n")
	require.NotContains(t, line, "\n", "the error is one line")
	require.True(t, strings.HasPrefix(line, "dagrun: "), "the error starts with dagrun: %q", line)
	return line
}

// pathServer is a loopback HTTP server that counts requests per path and
// answers with whatever the test's function returns.
type pathServer struct {
	*httptest.Server
	mu     sync.Mutex
	counts map[string]int
}

func newPathServer(t *testing.T, answer func(path string, n int) int) *pathServer {
	t.Helper()
	s := &pathServer{counts: map[string]int{}}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.counts[r.URL.Path]++
		n := s.counts[r.URL.Path]
		s.mu.Unlock()
		code := answer(r.URL.Path, n)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		fmt.Fprintf(w, `{"path": %q, "request": %d}`, r.URL.Path, n)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *pathServer) count(path string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counts[path]
}

// requireTime checks that a JSON value is an RFC 3339 time string.
func requireTime(t *testing.T, v any, what string) {
	t.Helper()
	s, ok := v.(string)
	require.True(t, ok, "%s is a string, got %#v", what, v)
	_, err := time.Parse(time.RFC3339, s)
	require.NoError(t, err, "%s is RFC 3339", what)
}

// Scenario 1: the quickstart, its output modes, a detached start run by a
// separate worker process, status and list.
func TestQuickstart(t *testing.T) {
	forEachBackend(t, func(t *testing.T, db string) {
		e := newEnv(t, db, nil)

		// Following start: stdout is exactly the output JSON, progress on stderr.
		res := e.mustRun(t, "start", "order-processing", "--input", quickstartInput)
		var out map[string]any
		require.NoError(t, json.Unmarshal([]byte(res.stdout), &out), "stdout is only the output JSON: %q", res.stdout)
		require.Len(t, out, 2, res.stdout)
		require.Regexp(t, `^pay_\d+$`, out["paymentId"])
		require.Regexp(t, `^TRK-[0-9A-F]+$`, out["trackingNo"])
		require.NotContains(t, res.stdout, "level=")
		require.NotContains(t, res.stdout, "completed")
		for _, step := range []string{"validate", "charge", "ship"} {
			require.Regexp(t, `(?m)^`+step+` +completed`, res.stderr)
		}
		require.Regexp(t, `(?m)^notify +skipped$`, res.stderr)
		require.Regexp(t, `(?m)^instance [0-9a-f-]{36} completed in `, res.stderr)

		// --json: the whole instance object with every documented field.
		res = e.mustRun(t, "start", "order-processing", "--input", quickstartInput, "--json")
		var obj map[string]any
		require.NoError(t, json.Unmarshal([]byte(res.stdout), &obj), res.stdout)
		for _, key := range []string{"id", "workflow", "status", "input", "output", "error", "createdAt", "finishedAt", "steps"} {
			require.Contains(t, obj, key)
		}
		require.Regexp(t, idPattern, obj["id"])
		require.Equal(t, "order-processing", obj["workflow"])
		require.Equal(t, "completed", obj["status"])
		require.Nil(t, obj["error"])
		require.Equal(t, "A-1001", obj["input"].(map[string]any)["orderId"])
		require.Contains(t, obj["output"], "paymentId")
		requireTime(t, obj["createdAt"], "createdAt")
		requireTime(t, obj["finishedAt"], "finishedAt")
		steps := obj["steps"].([]any)
		require.Len(t, steps, 4)
		wantSteps := []struct{ name, handler, status string }{
			{"validate", "orders.validate", "completed"},
			{"charge", "orders.charge", "completed"},
			{"ship", "orders.ship", "completed"},
			{"notify", "orders.notify", "skipped"},
		}
		for i, want := range wantSteps {
			s := steps[i].(map[string]any)
			for _, key := range []string{"name", "handler", "status", "attempts", "input", "output", "error", "startedAt", "finishedAt"} {
				require.Contains(t, s, key, "step %s", want.name)
			}
			require.Equal(t, want.name, s["name"])
			require.Equal(t, want.handler, s["handler"])
			require.Equal(t, want.status, s["status"])
			if want.status == "completed" {
				require.Equal(t, 1.0, s["attempts"])
				requireTime(t, s["startedAt"], want.name+".startedAt")
				requireTime(t, s["finishedAt"], want.name+".finishedAt")
				require.NotNil(t, s["output"])
			} else {
				require.Equal(t, 0.0, s["attempts"])
				require.Nil(t, s["startedAt"])
			}
		}
		charge := steps[1].(map[string]any)["input"].(map[string]any)
		require.Equal(t, map[string]any{"amount": 42.5, "idempotencyKey": "charge-A-1001"}, charge)

		// --detach prints only the ID; a separate worker process runs it.
		id := e.startDetached(t, "order-processing", quickstartInput)
		require.Equal(t, "pending", e.status(t, id).Status)
		worker := e.spawn(t, "worker", "--poll", "50ms")
		waitFor(t, 30*time.Second, "the worker to complete the detached instance", func() bool {
			return e.status(t, id).Status == "completed"
		})
		worker.stop(t)
		require.Contains(t, worker.stderr.String(), "dagrun worker stopped")
		require.Empty(t, worker.stdout.String(), "the worker logs on stderr only")

		// status: a header and a step table.
		res = e.mustRun(t, "status", id)
		require.Regexp(t, `(?m)^Instance: +`+id+`$`, res.stdout)
		require.Regexp(t, `(?m)^Workflow: +order-processing$`, res.stdout)
		require.Regexp(t, `(?m)^Status: +completed$`, res.stdout)
		require.Regexp(t, `(?m)^STEP +HANDLER +STATUS +ATTEMPTS +DURATION +ERROR$`, res.stdout)
		require.Regexp(t, `(?m)^validate +orders\.validate +completed +1 +\S+`, res.stdout)
		require.Regexp(t, `(?m)^notify +orders\.notify +skipped +0 +-`, res.stdout)
		inst := e.status(t, id)
		require.Equal(t, id, inst.ID)
		require.Equal(t, 1, inst.countEvents("instance.completed", ""))

		// list: newest first, filters.
		all := e.listJSON(t)
		require.Len(t, all, 3)
		require.Equal(t, id, all[0].ID, "newest first")
		res = e.mustRun(t, "list")
		require.Len(t, strings.Split(strings.TrimSpace(res.stdout), "\n"), 4, res.stdout)
		require.Regexp(t, `(?m)^ID +WORKFLOW +STATUS +STEPS +CREATED +DURATION$`, res.stdout)
		require.Regexp(t, `(?m)^`+id+` +order-processing +completed +4/4 `, res.stdout)
		require.Len(t, e.listJSON(t, "--workflow", "order-processing"), 3)
		require.Empty(t, e.listJSON(t, "--workflow", "other"))
		require.Len(t, e.listJSON(t, "--status", "completed"), 3)
		require.Empty(t, e.listJSON(t, "--status", "failed"))
		limited := e.listJSON(t, "--limit", "1")
		require.Len(t, limited, 1)
		require.Equal(t, id, limited[0].ID)
		require.Equal(t, "[]\n", e.mustRun(t, "list", "--json", "--status", "cancelled").stdout, "an empty list is [] not null")
	})
}

const fanoutWorkflow = `name: fanout
description: Fan out from split to three branches, one skipped, and join them.
input:
  type: object
  required: [n, tags, meta]
  properties:
    n: {type: integer}
    tags: {type: array, items: {type: string}}
    meta: {type: object}
    optional: {type: boolean}
steps:
  - name: split
    handler: echo
    input:
      n: ${{ input.n }}
      tags: ${{ input.tags }}
      meta: ${{ input.meta }}
  - name: double
    handler: echo
    dependsOn: [split]
    input:
      value: ${{ steps.split.output.n * 2 }}
      ratio: ${{ steps.split.output.n / 4 }}
      label: "n is ${{ steps.split.output.n }} for ${{ workflow.name }}"
  - name: tags
    handler: echo
    dependsOn: [split]
    input:
      first: ${{ steps.split.output.tags[0] }}
      all: ${{ steps.split.output.tags }}
      count: ${{ len(steps.split.output.tags) }}
  - name: extra
    handler: echo
    dependsOn: [split]
    when: ${{ input.optional == true }}
    input: {x: 1}
  - name: join
    handler: echo
    dependsOn: [double, tags, extra]
    input:
      doubled: ${{ steps.double.output.value }}
      extra: ${{ steps.extra.output }}
      extraStatus: ${{ steps.extra.status }}
      summary: "${{ steps.double.output.label }}; ${{ steps.tags.output.count }} tags"
      meta: ${{ input.meta }}
      literal: [1, 2.5, "three", true, null]
output:
  doubled: ${{ steps.join.output.doubled }}
  summary: ${{ steps.join.output.summary }}
`

// Scenario 2: fan-out/fan-in with a skipped branch; expression values keep
// their types (whole numbers stay whole, even past 2^53 and past int64; lists and maps pass
// through) and interpolation makes text.
func TestFanOutFanIn(t *testing.T) {
	forEachBackend(t, func(t *testing.T, db string) {
		e := newEnv(t, db, map[string]string{"fanout.yaml": fanoutWorkflow})
		input := `{"n": 21, "tags": ["a", "b", "c"], "meta": {"owner": "ops", "id": 9007199254740993, "big": 18446744073709551615, "nested": {"k": [1, 2.5]}}}`
		res := e.mustRun(t, "start", "fanout", "--input", input, "--json")
		var inst instance
		require.NoError(t, json.Unmarshal([]byte(res.stdout), &inst), res.stdout)
		require.Equal(t, "completed", inst.Status)

		meta := `{"big":18446744073709551615,"id":9007199254740993,"nested":{"k":[1,2.5]},"owner":"ops"}`
		want := map[string]struct{ status, input string }{
			"split":  {"completed", `{"meta":` + meta + `,"n":21,"tags":["a","b","c"]}`},
			"double": {"completed", `{"label":"n is 21 for fanout","ratio":5.25,"value":42}`},
			"tags":   {"completed", `{"all":["a","b","c"],"count":3,"first":"a"}`},
			"extra":  {"skipped", `null`},
			"join": {"completed", `{"doubled":42,"extra":null,"extraStatus":"skipped","literal":[1,2.5,"three",true,null],` +
				`"meta":` + meta + `,"summary":"n is 21 for fanout; 3 tags"}`},
		}
		require.Len(t, inst.Steps, len(want))
		for _, s := range inst.Steps {
			w := want[s.Name]
			require.Equal(t, w.status, s.Status, "step %s", s.Name)
			require.Equal(t, w.input, compact(t, s.Input), "resolved input of step %s", s.Name)
		}
		require.Equal(t, `{"doubled":42,"summary":"n is 21 for fanout; 3 tags"}`, compact(t, inst.Output))

		// The resolved inputs are what status shows, too.
		again := e.status(t, inst.ID)
		require.Equal(t, want["join"].input, compact(t, again.Steps[again.step(t, "join")].Input))
		require.Equal(t, 1, again.countEvents("step.skipped", "extra"))

		// With the optional branch on, it runs and join sees its output.
		res = e.mustRun(t, "start", "fanout", "--json", "--input", `{"n": 1, "tags": ["x"], "meta": {}, "optional": true}`)
		require.NoError(t, json.Unmarshal([]byte(res.stdout), &inst))
		join := inst.Steps[inst.step(t, "join")]
		require.Contains(t, compact(t, join.Input), `"extra":{"x":1},"extraStatus":"completed"`)
	})
}

const flakyWorkflow = `name: flaky
steps:
  - name: fetch
    handler: http
    retry: {maxAttempts: 3, backoff: 10ms}
    input:
      url: "${{ input.base }}/flaky"
output: ${{ steps.fetch.output.body }}
`

// Scenario 3: an endpoint that fails twice with 500 and then succeeds.
func TestHTTPRetries(t *testing.T) {
	forEachBackend(t, func(t *testing.T, db string) {
		srv := newPathServer(t, func(path string, n int) int {
			if n <= 2 {
				return http.StatusInternalServerError
			}
			return http.StatusOK
		})
		e := newEnv(t, db, map[string]string{"flaky.yaml": flakyWorkflow})
		res := e.mustRun(t, "start", "flaky", "--input", fmt.Sprintf(`{"base": %q}`, srv.URL), "--json")
		var inst instance
		require.NoError(t, json.Unmarshal([]byte(res.stdout), &inst), res.stdout)
		require.Equal(t, "completed", inst.Status)
		fetch := inst.Steps[0]
		require.Equal(t, "completed", fetch.Status)
		require.Equal(t, 3, fetch.Attempts)
		require.Nil(t, fetch.Error, "a step that finally succeeded carries no error")
		require.JSONEq(t, `{"path": "/flaky", "request": 3}`, string(inst.Output))
		require.Equal(t, 3, srv.count("/flaky"))

		// The progress lines and the history both show the retries.
		require.Equal(t, 2, strings.Count(res.stderr, "fetch        retrying after attempt"), res.stderr)
		require.Equal(t, 3, strings.Count(res.stderr, "fetch        running (attempt"), res.stderr)
		require.Contains(t, res.stderr, "500 Internal Server Error")
		inst = e.status(t, inst.ID)
		require.Equal(t, 2, inst.countEvents("step.retrying", "fetch"))
		require.Equal(t, 3, inst.countEvents("step.started", "fetch"))
		require.Equal(t, 1, inst.countEvents("step.completed", "fetch"))
		for _, ev := range inst.Events {
			if ev.Type == "step.retrying" {
				require.Contains(t, ev.Message, "500 Internal Server Error")
			}
		}
	})
}

const fragileWorkflow = `name: fragile
steps:
  - name: prepare
    handler: http
    input:
      url: "${{ input.base }}/prepare"
  - name: fetch
    handler: http
    dependsOn: [prepare]
    retry: {maxAttempts: 3, backoff: 10ms}
    input:
      url: "${{ input.base }}/item"
output:
  prepared: ${{ steps.prepare.output.status }}
  fetched: ${{ steps.fetch.output.status }}
`

// Scenario 4: a permanent 404 fails the instance; after the server is fixed,
// retry completes it without re-running the completed upstream step.
func TestPermanentFailureThenRetry(t *testing.T) {
	forEachBackend(t, func(t *testing.T, db string) {
		var fixed atomic.Bool
		srv := newPathServer(t, func(path string, _ int) int {
			if path == "/item" && !fixed.Load() {
				return http.StatusNotFound
			}
			return http.StatusOK
		})
		e := newEnv(t, db, map[string]string{"fragile.yaml": fragileWorkflow})
		res := e.run(t, "start", "fragile", "--input", fmt.Sprintf(`{"base": %q}`, srv.URL))
		require.Equal(t, 1, res.code, res.stderr)
		require.Empty(t, res.stdout, "a failed instance has no output")
		lines := strings.Split(strings.TrimSpace(res.stderr), "\n")
		last := lines[len(lines)-1]
		require.Regexp(t, `^dagrun: instance [0-9a-f-]{36} failed: step fetch failed: GET http://127\.0\.0\.1:\d+/item: 404 Not Found`, last)
		require.Contains(t, last, "dagrun retry ")
		require.Equal(t, 1, srv.count("/item"), "a 404 is permanent: no retries")

		id := e.listJSON(t)[0].ID
		inst := e.status(t, id)
		require.Equal(t, "failed", inst.Status)
		require.Contains(t, *inst.Error, "404")
		fetch := inst.Steps[inst.step(t, "fetch")]
		require.Equal(t, "failed", fetch.Status)
		require.Equal(t, 1, fetch.Attempts)

		fixed.Store(true)
		res = e.mustRun(t, "retry", id)
		require.JSONEq(t, `{"prepared": 200, "fetched": 200}`, res.stdout)
		// Progress shows what the retry did, not the history before it.
		require.NotContains(t, res.stderr, "prepare")
		require.NotContains(t, res.stderr, "Not Found", "the earlier 404 is history")
		require.Regexp(t, `(?m)^fetch +running \(attempt 1\)$`, res.stderr)
		require.Regexp(t, `(?m)^instance `+id+` completed in `, res.stderr)
		inst = e.status(t, id)
		require.Equal(t, "completed", inst.Status)
		require.Nil(t, inst.Error)
		require.Equal(t, 1, srv.count("/prepare"), "the completed upstream step is not re-run")
		require.Equal(t, 2, srv.count("/item"))
		require.Equal(t, 1, inst.Steps[inst.step(t, "prepare")].Attempts)
		require.Equal(t, 1, inst.Steps[inst.step(t, "fetch")].Attempts, "retry resets attempts")
		require.Equal(t, 1, inst.countEvents("instance.retried", ""))

		// A completed instance has nothing to retry.
		res = e.run(t, "retry", id)
		require.Equal(t, 2, res.code)
		require.Equal(t, "dagrun: instance "+id+" is completed; only a failed or cancelled instance can be retried, or with --from STEP a completed one\n", res.stderr)
	})
}

// Scenario 5: idempotency keys.
func TestIdempotencyKey(t *testing.T) {
	forEachBackend(t, func(t *testing.T, db string) {
		e := newEnv(t, db, nil)
		first := e.startDetached(t, "order-processing", quickstartInput, "--key", "order-A-1001")
		second := e.startDetached(t, "order-processing", `{"orderId": "other", "items": [1], "totalAmount": 1}`, "--key", "order-A-1001")
		require.Equal(t, first, second, "the same key returns the same instance")
		require.Len(t, e.listJSON(t), 1)

		// A following start with the same key follows the existing instance.
		res := e.mustRun(t, "start", "order-processing", "--input", quickstartInput, "--key", "order-A-1001")
		require.Contains(t, res.stderr, fmt.Sprintf("instance %s already exists for key \"order-A-1001\"", first))
		require.Contains(t, res.stdout, "paymentId")
		list := e.listJSON(t)
		require.Len(t, list, 1)
		require.Equal(t, "completed", list[0].Status)
		require.JSONEq(t, quickstartInput, string(list[0].Input), "the first start's input is kept")

		other := e.startDetached(t, "order-processing", quickstartInput, "--key", "order-A-1002")
		require.NotEqual(t, first, other)
		require.Len(t, e.listJSON(t), 2)
	})
}

const napWorkflow = `name: nap
input:
  type: object
  required: [duration]
steps:
  - name: before
    handler: echo
    input: {ready: true}
  - name: nap
    handler: sleep
    dependsOn: [before]
    input:
      duration: ${{ input.duration }}
  - name: after
    handler: noop
    dependsOn: [nap]
`

// Scenario 6: cancelling a sleeping instance, a following start seeing it,
// and the errors of cancelling what cannot be cancelled.
func TestCancel(t *testing.T) {
	forEachBackend(t, func(t *testing.T, db string) {
		e := newEnv(t, db, map[string]string{"nap.yaml": napWorkflow})

		// A following start of an hour-long sleep, cancelled from elsewhere.
		follower := e.spawn(t, "start", "nap", "--input", `{"duration": "1h"}`)
		var id string
		waitFor(t, 30*time.Second, "the nap step to snooze", func() bool {
			list := e.listJSON(t)
			if len(list) == 0 {
				return false
			}
			id = list[0].ID
			return e.status(t, id).countEvents("step.snoozed", "nap") == 1
		})
		res := e.mustRun(t, "cancel", id)
		require.Equal(t, "cancelled "+id+"\n", res.stdout)
		require.Equal(t, 1, follower.wait(t, 30*time.Second), "a cancelled instance exits 1")
		require.Empty(t, follower.stdout.String())
		require.True(t, strings.HasSuffix(follower.stderr.String(), "dagrun: instance "+id+" was cancelled\n"), follower.stderr.String())

		inst := e.status(t, id)
		require.Equal(t, "cancelled", inst.Status)
		for _, s := range inst.Steps {
			want := map[string]string{"before": "completed", "nap": "cancelled", "after": "cancelled"}[s.Name]
			require.Equal(t, want, s.Status, "step %s", s.Name)
		}
		require.Equal(t, 1, inst.countEvents("instance.cancelled", ""))

		// A detached, never-claimed instance cancels too.
		pending := e.startDetached(t, "nap", `{"duration": "1h"}`)
		e.mustRun(t, "cancel", pending)
		require.Equal(t, "cancelled", e.status(t, pending).Status)

		// Cancelling a finished instance is a usage error with a clear line.
		res = e.run(t, "cancel", id)
		require.Equal(t, 2, res.code)
		require.Equal(t, "dagrun: instance "+id+" is already cancelled; only a pending or running instance can be cancelled\n", res.stderr)
		done := e.startDetached(t, "nap", `{"duration": "0s"}`)
		res = e.mustRun(t, "retry", pending, "--detach") // re-armed: it runs again
		require.Equal(t, pending+"\n", res.stdout)
		require.Equal(t, "pending", e.status(t, pending).Status, "no step of it was ever claimed")
		e.mustRun(t, "cancel", pending)
		worker := e.spawn(t, "worker", "--poll", "50ms")
		waitFor(t, 30*time.Second, "the 0s nap to complete", func() bool { return e.status(t, done).Status == "completed" })
		worker.stop(t)
		res = e.run(t, "cancel", done)
		require.Equal(t, 2, res.code)
		require.Equal(t, "dagrun: instance "+done+" is already completed; only a pending or running instance can be cancelled\n", res.stderr)

		// Unknown IDs.
		for _, verb := range []string{"status", "cancel", "retry"} {
			res = e.run(t, verb, "01234567-89ab-cdef-0123-456789abcdef")
			require.Equal(t, 2, res.code, verb)
			require.Equal(t, "dagrun: no instance with ID \"01234567-89ab-cdef-0123-456789abcdef\" (list instances with: dagrun list)\n", res.stderr, verb)
		}
	})
}

const pipelineWorkflow = `name: pipeline
steps:
  - name: extract
    handler: echo
    input:
      n: ${{ input.n }}
  - name: transform
    handler: noop
    dependsOn: [extract]
  - name: load
    handler: echo
    dependsOn: [transform]
    input:
      n: ${{ steps.extract.output.n }}
output: ${{ steps.load.output.n }}
`

// Scenario 7: three worker processes on one database finish 100 instances;
// every step runs exactly once.
func TestThreeWorkersOneDatabase(t *testing.T) {
	const instances = 100
	forEachBackend(t, func(t *testing.T, db string) {
		e := newEnv(t, db, map[string]string{"pipeline.yaml": pipelineWorkflow})
		e.mustRun(t, "list") // create the schema before three processes race to
		workers := make([]*process, 3)
		for i := range workers {
			workers[i] = e.spawn(t, "worker", "--poll", "50ms", "--concurrency", "4")
		}

		began := time.Now()
		ids := make([]string, instances)
		var wg sync.WaitGroup
		sem := make(chan struct{}, 4)
		for i := range ids {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				res := e.run(t, "start", "pipeline", "--input", fmt.Sprintf(`{"n": %d}`, i), "--detach")
				if res.code == 0 {
					ids[i] = strings.TrimSpace(res.stdout)
				} else {
					t.Errorf("start %d: exit %d: %s", i, res.code, res.stderr)
				}
			}()
		}
		wg.Wait()
		require.False(t, t.Failed())
		t.Logf("%d detached starts in %s", instances, time.Since(began).Round(time.Millisecond))

		waitFor(t, 2*time.Minute, "every instance to complete", func() bool {
			return len(e.listJSON(t, "--status", "completed", "--limit", "1000")) == instances
		})
		t.Logf("all %d completed %s after the first start", instances, time.Since(began).Round(time.Millisecond))
		for i, w := range workers {
			w.stop(t)
			stderr := w.stderr.String()
			require.NotContains(t, stderr, " is locked", "worker %d: SQLite's \"database is locked\" or dagrun's words for it", i)
			require.NotContains(t, stderr, "level=ERROR", "worker %d", i)
		}

		list := e.listJSON(t, "--limit", "1000")
		require.Len(t, list, instances)
		for _, inst := range list {
			require.Equal(t, "completed", inst.Status)
			for _, s := range inst.Steps {
				require.Equal(t, "completed", s.Status, "%s/%s", inst.ID, s.Name)
				require.Equal(t, 1, s.Attempts, "%s/%s", inst.ID, s.Name)
			}
		}
		// The history: exactly one completion per step of every instance.
		var mu sync.Mutex
		seen := map[string]bool{}
		for _, id := range ids {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				res := e.run(t, "status", id, "--json")
				var inst instance
				if err := json.Unmarshal([]byte(res.stdout), &inst); err != nil {
					t.Errorf("status %s: %v", id, err)
					return
				}
				for _, step := range []string{"extract", "transform", "load"} {
					if n := inst.countEvents("step.completed", step); n != 1 {
						t.Errorf("instance %s step %s completed %d times", id, step, n)
					}
					if n := inst.countEvents("step.started", step); n != 1 {
						t.Errorf("instance %s step %s started %d times", id, step, n)
					}
				}
				mu.Lock()
				seen[string(inst.Output)] = true
				mu.Unlock()
			}()
		}
		wg.Wait()
		require.Len(t, seen, instances, "every instance produced its own output")
	})
}

// Scenario 8: a durable sleep survives a worker restart without a new attempt.
func TestSleepSurvivesWorkerRestart(t *testing.T) {
	forEachBackend(t, func(t *testing.T, db string) {
		e := newEnv(t, db, map[string]string{"nap.yaml": napWorkflow})
		id := e.startDetached(t, "nap", `{"duration": "2s"}`)

		first := e.spawn(t, "worker", "--poll", "50ms")
		waitFor(t, 30*time.Second, "the nap step to snooze", func() bool {
			return e.status(t, id).countEvents("step.snoozed", "nap") == 1
		})
		first.stop(t)
		inst := e.status(t, id)
		require.Equal(t, "running", inst.Status)
		nap := inst.Steps[inst.step(t, "nap")]
		require.Equal(t, "pending", nap.Status, "a snoozed step waits as pending, holding no worker")

		second := e.spawn(t, "worker", "--poll", "50ms")
		waitFor(t, 30*time.Second, "the instance to complete after the restart", func() bool {
			return e.status(t, id).Status == "completed"
		})
		second.stop(t)

		inst = e.status(t, id)
		nap = inst.Steps[inst.step(t, "nap")]
		require.Equal(t, "completed", nap.Status)
		require.Equal(t, 1, nap.Attempts, "a snooze is not a new attempt")
		require.Equal(t, 1, inst.countEvents("step.snoozed", "nap"))
		require.Equal(t, 1, inst.countEvents("step.completed", "nap"))
		require.Equal(t, 0, inst.countEvents("step.retrying", "nap"))
		var out struct {
			SleptUntil string `json:"sleptUntil"`
		}
		require.NoError(t, json.Unmarshal(nap.Output, &out))
		_, err := time.Parse(time.RFC3339, out.SleptUntil)
		require.NoError(t, err)
	})
}

const brokenWorkflow = `name: broken
description: several mistakes in one file
steps:
  - name: fetch
    handler: http
    retry: {maxAttempts: 0}
    timeout: 5x
  - name: fetch
    handler: echo
  - name: transform
    handler: no.such.handler
    dependsOn: [fetc]
    colour: blue
    input:
      x: ${{ steps.load.output.y }}
  - name: a
    handler: echo
    dependsOn: [b]
  - name: b
    handler: echo
    dependsOn: [a]
    when: ${{ input.x + }}
`

// Scenario 9: validate and graph. They read no database, so they run once
// rather than per backend.
func TestValidateAndGraph(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "unused.db", nil)
	res := e.mustRun(t, "validate")
	require.Equal(t, "ok greet-everyone (2 steps)\nok order-fulfilment (3 steps)\nok order-processing (4 steps)\nok refund-approval (4 steps)\nok shipping (2 steps)\n", res.stdout)
	require.Empty(t, res.stderr)

	e = newEnv(t, "unused.db", map[string]string{"broken.yaml": brokenWorkflow})
	res = e.run(t, "validate", "workflows/broken.yaml")
	require.Equal(t, 2, res.code)
	require.Empty(t, res.stdout)
	for _, line := range strings.Split(strings.TrimSpace(res.stderr), "\n") {
		require.Regexp(t, `^workflows/broken\.yaml:\d+:\d+: \S`, line)
	}
	golden(t, "validate-broken", res.stderr)

	// The whole folder: the good file passes, the bad one fails the run.
	res = e.run(t, "validate")
	require.Equal(t, 2, res.code)
	require.Equal(t, "ok greet-everyone (2 steps)\nok order-fulfilment (3 steps)\nok order-processing (4 steps)\nok refund-approval (4 steps)\nok shipping (2 steps)\n", res.stdout)
	require.Equal(t, strings.Count(golden0(t, "validate-broken"), "\n"), strings.Count(res.stderr, "\n"))

	// A file that cannot be read is an error at its start, in the same form.
	res = e.run(t, "validate", "nonexist.yaml")
	require.Equal(t, 2, res.code)
	require.Empty(t, res.stdout)
	require.Regexp(t, `^nonexist\.yaml:1:1: \S[^\n]*\n$`, res.stderr)
	golden(t, "validate-missing-file", res.stderr)

	golden(t, "graph-mermaid", e.mustRun(t, "graph", "order-processing", "--format", "mermaid").stdout)
	golden(t, "graph-dot", e.mustRun(t, "graph", "order-processing", "--format", "dot").stdout)
	require.Equal(t, e.mustRun(t, "graph", "order-processing").stdout, e.mustRun(t, "graph", "order-processing", "--format", "mermaid").stdout, "mermaid is the default")
	res = e.run(t, "graph", "order-processing", "--format", "png")
	require.Equal(t, 2, res.code)
	require.Equal(t, "dagrun: invalid --format \"png\": use mermaid or dot\n", res.stderr)
}

// golden0 reads a golden file as is.
func golden0(t *testing.T, name string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name+".golden"))
	require.NoError(t, err)
	return string(data)
}

// Scenario 10: handlers lists the built-ins and the order handlers.
func TestHandlers(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "unused.db", nil)
	res := e.mustRun(t, "handlers")
	golden(t, "handlers", res.stdout)
	for _, name := range []string{"echo", "noop", "http", "sleep", "orders.validate", "orders.charge", "orders.ship", "orders.notify"} {
		require.Contains(t, strings.Split(res.stdout, "\n"), name)
	}
}
