package web_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/dag"
	"github.com/dagrun/dagrun/storage"
)

// approvalYAML waits for an approval between two echo steps.
const approvalYAML = `name: approval
steps:
  - name: request
    handler: echo
    input: {order: 42}
  - name: approval
    dependsOn: [request]
    wait:
      signal: approve
      timeout: 1h
      schema:
        type: object
        required: [approved]
        additionalProperties: false
        properties:
          approved: {type: boolean}
  - name: done
    handler: echo
    dependsOn: [approval]
    input:
      approved: ${{ steps.approval.output.approved }}
output:
  approved: ${{ steps.done.output.approved }}
`

// signalPath is the route that sends instance id the signal name.
func signalPath(id, name string) string { return "/api/instances/" + id + "/signals/" + name }

// stepOf returns the named step of an instance object from the API.
func stepOf(t *testing.T, inst map[string]any, name string) map[string]any {
	t.Helper()
	for _, s := range inst["steps"].([]any) {
		if st := s.(map[string]any); st["name"] == name {
			return st
		}
	}
	require.Failf(t, "no such step", "the instance has no step %q", name)
	return nil
}

// waitForStep polls the API until the instance's step has the status.
func (b *testBundle) waitForStep(t *testing.T, id, step, status string) map[string]any {
	t.Helper()
	var inst map[string]any
	require.Eventually(t, func() bool {
		inst = b.do(t, http.MethodGet, "/api/instances/"+id, "").json(t)
		return stepOf(t, inst, step)["status"] == status
	}, 15*time.Second, 10*time.Millisecond, "step %s of %s never became %s", step, id, status)
	return inst
}

// signalAnswer is the body of a 200 from the signals route.
type signalAnswer struct {
	Delivered bool           `json:"delivered"`
	Duplicate bool           `json:"duplicate"`
	Instance  map[string]any `json:"instance"`
}

func (b *testBundle) signal(t *testing.T, id, name, body string) signalAnswer {
	t.Helper()
	r := b.do(t, http.MethodPost, signalPath(id, name), body)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	var out signalAnswer
	require.NoError(t, json.Unmarshal(r.body, &out))
	return out
}

// TestSignalAPI walks a wait step through the API: it shows its signal and
// deadline while waiting, refuses what it must (each refusal writing
// nothing), completes with the payload, takes a repeat with the same ID as
// a duplicate and any other as a conflict.
func TestSignalAPI(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		b := setup(t, open, &setupOpts{worker: true, workflows: []string{approvalYAML}})
		id := b.start(t, "approval", "")
		waiting := stepOf(t, b.waitForStep(t, id, "approval", "waiting"), "approval")
		require.Equal(t, "approve", waiting["signal"])
		deadline, err := time.Parse(time.RFC3339Nano, waiting["deadline"].(string))
		require.NoError(t, err, "a waiting step with a timeout shows its deadline")
		require.WithinDuration(t, time.Now().Add(time.Hour), deadline, 5*time.Minute)
		metrics := string(b.do(t, http.MethodGet, "/metrics", "").body)
		require.Contains(t, metrics, `dagrun_steps_waiting{workflow="approval"} 1`)

		for _, tt := range []struct {
			name, path, body string
			status           int
			want             string
		}{
			{"payload the schema refuses", signalPath(id, "approve"), `{"data": {"approved": "yes"}}`, http.StatusBadRequest, "/approved"},
			{"no payload where the schema wants one", signalPath(id, "approve"), ``, http.StatusBadRequest, "got null, want object"},
			{"unknown field in the body", signalPath(id, "approve"), `{"payload": {"approved": true}}`, http.StatusBadRequest, `unknown field "payload"`},
			{"unknown signal name", signalPath(id, "aprove"), `{"data": {"approved": true}}`, http.StatusNotFound, "approve"},
			{"signal ID over its limit", signalPath(id, "approve"), `{"data": {"approved": true}, "id": "` + strings.Repeat("a", 600) + `"}`, http.StatusBadRequest, "invalid signal ID: it is 600 bytes"},
			{"unknown instance", signalPath("nope", "approve"), `{"data": {"approved": true}}`, http.StatusNotFound, `no instance with ID "nope"`},
		} {
			t.Run(tt.name, func(t *testing.T) {
				requireError(t, b.do(t, http.MethodPost, tt.path, tt.body), tt.status, tt.want)
				require.Equal(t, "waiting", stepOf(t, b.do(t, http.MethodGet, "/api/instances/"+id, "").json(t), "approval")["status"],
					"a refused signal changes nothing")
			})
		}

		sent := b.signal(t, id, "approve", `{"data": {"approved": true}, "id": "reviewer-1"}`)
		require.True(t, sent.Delivered)
		require.False(t, sent.Duplicate)
		require.Equal(t, id, sent.Instance["id"])
		approval := stepOf(t, sent.Instance, "approval")
		require.Equal(t, "completed", approval["status"])
		require.Equal(t, map[string]any{"approved": true}, approval["output"])

		again := b.signal(t, id, "approve", `{"data": {"approved": false}, "id": "reviewer-1"}`)
		require.True(t, again.Duplicate, "the same signal ID again is a harmless duplicate")
		require.False(t, again.Delivered)
		requireError(t, b.do(t, http.MethodPost, signalPath(id, "approve"), `{"data": {"approved": false}, "id": "reviewer-2"}`),
			http.StatusConflict, "")
		requireError(t, b.do(t, http.MethodPost, signalPath(id, "approve"), `{"data": {"approved": false}}`), http.StatusConflict, "")

		done := b.wait(t, id)
		require.Equal(t, storage.InstanceCompleted, done.Status)
		require.JSONEq(t, `{"approved": true}`, string(done.Output), "the repeats changed nothing")
		requireError(t, b.do(t, http.MethodPost, signalPath(id, "approve"), `{"data": {"approved": true}, "id": "late"}`),
			http.StatusConflict, "")
	})
}

// TestSignalBeforeTheStepWaits: a signal sent while its step is still
// blocked is stored (delivered false) and refuses a second one.
func TestSignalBeforeTheStepWaits(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		b := setup(t, open, &setupOpts{workflows: []string{approvalYAML}}) // no worker: request never runs
		id := b.start(t, "approval", "")
		sent := b.signal(t, id, "approve", `{"data": {"approved": false}}`)
		require.False(t, sent.Delivered, "the step does not wait yet: the signal is stored")
		require.False(t, sent.Duplicate)
		require.Equal(t, "blocked", stepOf(t, sent.Instance, "approval")["status"])
		requireError(t, b.do(t, http.MethodPost, signalPath(id, "approve"), `{"data": {"approved": true}}`), http.StatusConflict, "")
	})
}

// TestSignalByKey: a sender that knows an instance only by the key it was
// started with finds it in the list by key, and signals it through its
// workflow and key; a key no instance has, or none at all, is refused with
// nothing written.
func TestSignalByKey(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		b := setup(t, open, &setupOpts{worker: true, workflows: []string{approvalYAML}})
		id := b.start(t, "approval", `{"key": "order-42"}`)
		other := b.start(t, "approval", `{"key": "order-43"}`)
		b.waitForStep(t, id, "approval", "waiting")

		var found []map[string]any
		r := b.do(t, http.MethodGet, "/api/instances?workflow=approval&key=order-42", "")
		require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
		require.NoError(t, json.Unmarshal(r.body, &found))
		require.Len(t, found, 1)
		require.Equal(t, id, found[0]["id"])
		requireError(t, b.do(t, http.MethodGet, "/api/instances?key=order-42", ""), http.StatusBadRequest, "needs a workflow filter")

		path := "/api/workflows/approval/signals/approve"
		r = b.do(t, http.MethodPost, path, `{"key": "order-99", "data": {"approved": true}}`)
		requireError(t, r, http.StatusNotFound, `no instance of workflow approval with key "order-99"`)
		require.JSONEq(t, `{"error": "no instance of workflow approval with key \"order-99\""}`, string(r.body), "the reason alone")
		requireError(t, b.do(t, http.MethodPost, "/api/workflows/aproval/signals/approve", `{"key": "order-42"}`), http.StatusNotFound, `unknown workflow "aproval" (available: `)
		requireError(t, b.do(t, http.MethodPost, path, `{"data": {"approved": true}}`), http.StatusBadRequest, "key is required")
		requireError(t, b.do(t, http.MethodPost, path, `{"key": "order-42", "data": {"approved": "yes"}}`), http.StatusBadRequest, "/approved")
		require.Equal(t, "waiting", stepOf(t, b.do(t, http.MethodGet, "/api/instances/"+id, "").json(t), "approval")["status"], "refusals change nothing")

		r = b.do(t, http.MethodPost, path, `{"key": "order-42", "data": {"approved": true}, "id": "hook-1"}`)
		require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
		var sent signalAnswer
		require.NoError(t, json.Unmarshal(r.body, &sent))
		require.True(t, sent.Delivered)
		require.Equal(t, id, sent.Instance["id"], "the answer names the instance the key found")
		require.Equal(t, storage.InstanceCompleted, b.wait(t, id).Status)
		require.Equal(t, "waiting", stepOf(t, b.do(t, http.MethodGet, "/api/instances/"+other, "").json(t), "approval")["status"], "the other key's instance is untouched")
	})
}

// TestWorkflowDetailShowsWait: the definition API gives a wait step's
// signal, timeout and schema, which the UI needs for its signal form.
func TestWorkflowDetailShowsWait(t *testing.T) {
	t.Parallel()
	b := setup(t, openSQLite, &setupOpts{workflows: []string{approvalYAML}})
	var detail struct {
		Steps []struct {
			Name    string           `json:"name"`
			Handler string           `json:"handler"`
			Wait    *json.RawMessage `json:"wait"`
		} `json:"steps"`
	}
	r := b.do(t, http.MethodGet, "/api/workflows/approval", "")
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	require.NoError(t, json.Unmarshal(r.body, &detail))
	require.Nil(t, detail.Steps[0].Wait, "a handler step has no wait")
	require.Equal(t, "approval", detail.Steps[1].Name)
	require.Empty(t, detail.Steps[1].Handler)
	require.NotNil(t, detail.Steps[1].Wait)
	require.JSONEq(t, `{"signal": "approve", "timeout": "1h", "schema": {"type": "object", "required": ["approved"],
		"additionalProperties": false, "properties": {"approved": {"type": "boolean"}}}}`, string(*detail.Steps[1].Wait))
}

// TestInstanceDefinitionIsTheSnapshot: GET /api/instances/{id}/definition
// is the definition the instance started under, after its workflow's file
// changed (the web UI builds a wait step's form from it: the schema a
// signal must satisfy is the instance's, not the file's).
func TestInstanceDefinitionIsTheSnapshot(t *testing.T) {
	t.Parallel()
	b := setup(t, openSQLite, &setupOpts{workflows: []string{approvalYAML}})
	id := b.start(t, "approval", `{}`)
	changed, err := dag.Parse("", []byte(strings.Replace(approvalYAML, "approved: {type: boolean}", "approved: {type: string}", 1)), nil)
	require.NoError(t, err)
	require.NoError(t, b.engine.SetWorkflows([]*dag.Workflow{changed}, nil))

	schemaOf := func(path string) string {
		t.Helper()
		r := b.do(t, http.MethodGet, path, "")
		require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
		var def struct {
			Steps []struct {
				Name string `json:"name"`
				Wait *struct {
					Schema json.RawMessage `json:"schema"`
				} `json:"wait"`
			} `json:"steps"`
		}
		require.NoError(t, json.Unmarshal(r.body, &def))
		for _, st := range def.Steps {
			if st.Name == "approval" {
				return string(st.Wait.Schema)
			}
		}
		t.Fatalf("no approval step in %s", r.body)
		return ""
	}
	require.Contains(t, schemaOf("/api/instances/"+id+"/definition"), `"boolean"`, "the instance's own")
	require.Contains(t, schemaOf("/api/workflows/approval"), `"string"`, "the file's, as it is now")
	requireError(t, b.do(t, http.MethodGet, "/api/instances/nope/definition", ""), http.StatusNotFound, "nope")
}
