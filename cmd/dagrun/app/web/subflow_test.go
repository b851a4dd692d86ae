package web_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
)

// wrapYAML calls greet as a child instance.
const wrapYAML = `name: wrap
steps:
  - name: call
    workflow: greet
    input: {name: child}
`

// TestListChildren: GET /api/instances lists the instances started from
// outside; ?all=true adds the children and ?parent=ID lists those of one
// instance. The instance object of a parent names its step's workflow and
// child, and the child's names its parent.
func TestListChildren(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		b := setup(t, open, &setupOpts{worker: true, workflows: []string{wrapYAML}})
		parent := b.start(t, "wrap", "")
		require.Equal(t, storage.InstanceCompleted, b.wait(t, parent).Status)
		lone := b.start(t, "greet", `{"input": {"name": "lone"}}`)

		list := func(query string) []string {
			t.Helper()
			r := b.do(t, http.MethodGet, "/api/instances"+query, "")
			require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
			var out []struct {
				ID string `json:"id"`
			}
			require.NoError(t, json.Unmarshal(r.body, &out), "body: %s", r.body)
			ids := []string{}
			for _, inst := range out {
				ids = append(ids, inst.ID)
			}
			return ids
		}
		r := b.do(t, http.MethodGet, "/api/instances/"+parent, "")
		require.Equal(t, http.StatusOK, r.status)
		var inst struct {
			Parent *json.RawMessage `json:"parent"`
			Steps  []struct {
				Workflow string   `json:"workflow"`
				Children []string `json:"children"`
				Output   json.RawMessage
			} `json:"steps"`
		}
		require.NoError(t, json.Unmarshal(r.body, &inst))
		require.Nil(t, inst.Parent, "a top-level instance has no parent key")
		require.Equal(t, "greet", inst.Steps[0].Workflow)
		require.Len(t, inst.Steps[0].Children, 1)
		child := inst.Steps[0].Children[0]
		require.JSONEq(t, `{"greeting": "hello child"}`, string(inst.Steps[0].Output))

		r = b.do(t, http.MethodGet, "/api/instances/"+child, "")
		require.Equal(t, http.StatusOK, r.status)
		require.Equal(t, map[string]any{"id": parent, "step": "call"}, r.json(t)["parent"])

		require.Equal(t, []string{lone, parent}, list(""))
		require.Equal(t, []string{lone, parent}, list("?all=false"))
		require.ElementsMatch(t, []string{lone, child, parent}, list("?all=true"))
		require.Equal(t, []string{child}, list("?parent="+parent))
		require.Equal(t, []string{}, list("?parent="+child))
		require.Equal(t, []string{}, list("?parent=no-such-id"))
		require.Equal(t, []string{child}, list("?all=true&workflow=greet&parent="+parent))
		requireError(t, b.do(t, http.MethodGet, "/api/instances?all=yes", ""), http.StatusBadRequest, `invalid all "yes": use true or false`)

		// The definition names the workflow a step runs; other steps have no key.
		def := b.do(t, http.MethodGet, "/api/workflows/wrap", "").json(t)
		require.Equal(t, "greet", def["steps"].([]any)[0].(map[string]any)["workflow"])
		def = b.do(t, http.MethodGet, "/api/workflows/greet", "").json(t)
		require.NotContains(t, def["steps"].([]any)[0].(map[string]any), "workflow")
	})
}

// TestBulkCancelAllPicksChildren: a bulk cancel by a filter picks what the
// list shows, top-level instances; "all": true picks child instances too,
// and a child cancelled by itself fails its parent's step.
func TestBulkCancelAllPicksChildren(t *testing.T) {
	t.Parallel()
	b := setup(t, openSQLite, &setupOpts{workflows: []string{wrapYAML}})
	parent := b.start(t, "wrap", "") // no worker: its greet child waits, pending
	for _, tc := range []struct{ body, want string }{
		{`{"workflow": "greet", "status": "pending"}`, `{"count": 0}`},
		{`{"workflow": "greet", "status": "pending", "all": true}`, `{"count": 1}`},
	} {
		r := b.do(t, http.MethodPost, "/api/instances/cancel", tc.body)
		require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
		require.JSONEq(t, tc.want, string(r.body), tc.body)
	}
	require.Equal(t, "failed", b.status(t, parent))
}
