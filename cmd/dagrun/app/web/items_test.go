package web_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/cmd/dagrun/app/view"
	"github.com/dagrun/dagrun/storage"
)

// fakeItems is a store whose step "hello" has n items, item i completed
// when i is even and failed when odd, so the API's paging, filtering and
// error mapping are tested apart from how a backend stores items.
type fakeItems struct {
	storage.Store
	n    int
	seen []storage.ItemsParams
}

func (f *fakeItems) item(i int) storage.Item {
	started := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	finished := started.Add(time.Duration(i) * time.Millisecond)
	it := storage.Item{Index: i, Status: storage.StepCompleted, Attempts: 1, Input: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i)),
		Output: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i)), StartedAt: &started, FinishedAt: &finished, WorkerID: "w1"}
	if i%2 == 1 {
		it.Status, it.Output, it.Error = storage.StepFailed, nil, fmt.Sprintf("item %d: boom", i)
	}
	return it
}

func (f *fakeItems) GetInstance(ctx context.Context, id string) (*storage.Instance, error) {
	inst, err := f.Store.GetInstance(ctx, id)
	if err != nil {
		return nil, err
	}
	for i := range inst.Steps {
		if inst.Steps[i].Name == "hello" {
			inst.Steps[i].Items = &storage.ItemCounts{Total: f.n, Completed: (f.n + 1) / 2, Failed: f.n / 2}
		}
	}
	return inst, nil
}

func (f *fakeItems) ListItems(_ context.Context, p storage.ItemsParams) ([]storage.Item, error) {
	f.seen = append(f.seen, p)
	var out []storage.Item
	skipped := 0
	for i := 0; i < f.n && len(out) < p.Limit; i++ {
		it := f.item(i)
		if p.Status != "" && it.Status != p.Status {
			continue
		}
		if skipped < p.Offset {
			skipped++
			continue
		}
		out = append(out, it)
	}
	return out, nil
}

func TestItemsAPIPaging(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		fake := &fakeItems{n: 250}
		b := setup(t, func(t *testing.T) storage.Store { fake.Store = open(t); return fake }, &setupOpts{token: "items-token"})
		id := b.start(t, "greet", `{"input": {"name": "Ada"}}`)
		base := "/api/instances/" + id + "/steps/hello/items"

		get := func(t *testing.T, query string) view.ItemPage {
			t.Helper()
			r := b.do(t, http.MethodGet, base+query, "")
			require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
			var page view.ItemPage
			require.NoError(t, json.Unmarshal(r.body, &page))
			return page
		}
		tests := []struct {
			query                string
			offset, limit, total int
			first, count         int
			status               string
		}{
			{query: "", offset: 0, limit: 100, total: 250, first: 0, count: 100},
			{query: "?offset=200", offset: 200, limit: 100, total: 250, first: 200, count: 50},
			{query: "?offset=240&limit=5", offset: 240, limit: 5, total: 250, first: 240, count: 5},
			{query: "?offset=300", offset: 300, limit: 100, total: 250, count: 0},
			{query: "?status=failed&limit=3", offset: 0, limit: 3, total: 125, first: 1, count: 3, status: "failed"},
			{query: "?status=completed&offset=124", offset: 124, limit: 100, total: 125, first: 248, count: 1, status: "completed"},
			{query: "?status=running", offset: 0, limit: 100, total: 0, count: 0, status: "running"},
			{query: "?limit=1000", offset: 0, limit: 1000, total: 250, first: 0, count: 250},
		}
		for _, tt := range tests {
			t.Run(tt.query, func(t *testing.T) {
				page := get(t, tt.query)
				require.Equal(t, tt.offset, page.Offset)
				require.Equal(t, tt.limit, page.Limit)
				require.Equal(t, tt.total, page.Total)
				require.Len(t, page.Items, tt.count)
				require.NotNil(t, page.Items, "an empty page is [], not null")
				if tt.count > 0 {
					require.Equal(t, tt.first, page.Items[0].Index)
				}
				for _, it := range page.Items {
					if tt.status != "" {
						require.Equal(t, tt.status, it.Status)
					}
				}
				last := fake.seen[len(fake.seen)-1]
				require.Equal(t, storage.ItemsParams{InstanceID: id, Step: "hello", Offset: tt.offset, Limit: tt.limit, Status: storage.StepStatus(tt.status)}, last)
			})
		}

		// An item's fields, as the UI and scripts read them.
		r := b.do(t, http.MethodGet, base+"?offset=1&limit=1", "")
		require.Equal(t, http.StatusOK, r.status)
		require.JSONEq(t, `{"items": [{"index": 1, "status": "failed", "attempts": 1, "input": {"n": 1}, "output": null,
			"error": "item 1: boom", "startedAt": "2026-01-02T03:04:05Z", "finishedAt": "2026-01-02T03:04:05.001Z", "workerId": "w1"}],
			"offset": 1, "limit": 1, "total": 250}`, string(r.body))

		// The instance object carries the counts, not the items.
		inst := b.do(t, http.MethodGet, "/api/instances/"+id, "").json(t)
		steps := inst["steps"].([]any)
		require.Equal(t, map[string]any{"total": 250.0, "pending": 0.0, "running": 0.0, "completed": 125.0, "failed": 125.0, "cancelled": 0.0},
			steps[0].(map[string]any)["items"])
		require.NotContains(t, steps[1].(map[string]any), "items", "a step without items has no items field")
	})
}

func TestItemsAPIErrors(t *testing.T) {
	t.Parallel()
	fake := &fakeItems{n: 3}
	b := setup(t, func(t *testing.T) storage.Store { fake.Store = openSQLite(t); return fake },
		&setupOpts{token: "items-token", workflows: []string{laterEachYAML}})
	id := b.start(t, "greet", `{"input": {"name": "Ada"}}`)
	base := "/api/instances/" + id + "/steps/"
	tests := []struct {
		path   string
		status int
		want   string
	}{
		{base + "hello/items?offset=-1", http.StatusBadRequest, "invalid offset -1: must be 0 or more"},
		{base + "hello/items?offset=x", http.StatusBadRequest, `invalid offset "x": want a whole number`},
		{base + "hello/items?limit=0", http.StatusBadRequest, "invalid limit 0: use a number from 1 to 1000"},
		{base + "hello/items?limit=1001", http.StatusBadRequest, "invalid limit 1001: use a number from 1 to 1000"},
		{base + "hello/items?limit=", http.StatusOK, ""},
		{base + "hello/items?status=done", http.StatusBadRequest, `invalid item status "done": use pending, running, completed, failed or cancelled`},
		{base + "hello/items?status=skipped", http.StatusBadRequest, `invalid item status "skipped"`},
		{base + "nope/items", http.StatusNotFound, `instance ` + id + ` has no step "nope" (its steps: hello, shout)`},
		{"/api/instances/no-such-id/steps/hello/items", http.StatusNotFound, `no instance with ID "no-such-id"`},
	}
	for _, tt := range tests {
		r := b.do(t, http.MethodGet, tt.path, "")
		if tt.status == http.StatusOK {
			require.Equal(t, http.StatusOK, r.status, "%s: %s", tt.path, r.body)
			continue
		}
		requireError(t, r, tt.status, tt.want)
	}
	// Bad paging reaches no store.
	require.Len(t, fake.seen, 1)

	// A step that is no forEach step answers a 404 saying so, without
	// asking the store for items; a forEach step not expanded yet, a page
	// of none.
	requireError(t, b.do(t, http.MethodGet, base+"shout/items", ""), http.StatusNotFound,
		`step "shout" of instance `+id+` is not a forEach step: it has no items`)
	require.Len(t, fake.seen, 1)
	later := b.start(t, "later-each", "") // no worker: first never runs
	r := b.do(t, http.MethodGet, "/api/instances/"+later+"/steps/each/items", "")
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	var page view.ItemPage
	require.NoError(t, json.Unmarshal(r.body, &page))
	require.Zero(t, page.Total, "not expanded: no items yet")

	// The route needs the token like every other.
	anon := &testBundle{server: b.server}
	requireError(t, anon.do(t, http.MethodGet, base+"hello/items", ""), http.StatusUnauthorized, "missing token")
	requireError(t, b.do(t, http.MethodPost, base+"hello/items", ""), http.StatusMethodNotAllowed, "method POST is not allowed")
}

// fanoutYAML squares 250 numbers; every hundredth item waits for a time
// that is not one, which fails it for good.
// laterEachYAML has a forEach step that expands only after its first step.
const laterEachYAML = `name: later-each
steps:
  - name: first
    handler: echo
  - name: each
    dependsOn: [first]
    forEach: [1, 2]
    handler: echo
`

const fanoutYAML = `name: fanout
steps:
  - name: square
    forEach: ${{ 0..249 }}
    continueOnError: true
    retry: {maxAttempts: 1}
    handler: sleep
    input:
      until: "${{ index % 100 == 99 ? 'never' : '2000-01-01T00:00:00Z' }}"
  - name: done
    handler: noop
    dependsOn: [square]
`

// TestItemsAPI pages the items of a real forEach step on every backend.
func TestItemsAPI(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		b := setup(t, open, &setupOpts{worker: true, workflows: []string{fanoutYAML}})
		def := b.do(t, http.MethodGet, "/api/workflows/fanout", "").json(t)
		require.Equal(t, true, def["steps"].([]any)[0].(map[string]any)["forEach"])
		require.Equal(t, false, def["steps"].([]any)[1].(map[string]any)["forEach"])

		id := b.start(t, "fanout", "")
		b.wait(t, id)
		base := "/api/instances/" + id + "/steps/square/items"

		inst := b.do(t, http.MethodGet, "/api/instances/"+id, "").json(t)
		square := inst["steps"].([]any)[0].(map[string]any)
		require.Equal(t, "failed", square["status"])
		// 250 small outputs are under the inline bound (a long list is left
		// out; see view.MaxInlineItemsOutput): null for each failed item.
		outputs, ok := square["output"].([]any)
		require.True(t, ok, "output %v", square["output"])
		require.Len(t, outputs, 250)
		require.Nil(t, outputs[99])
		require.NotNil(t, outputs[0])
		require.Nil(t, square["outputOmitted"])
		require.Equal(t, map[string]any{"total": 250.0, "pending": 0.0, "running": 0.0, "completed": 248.0, "failed": 2.0, "cancelled": 0.0}, square["items"])

		var page view.ItemPage
		r := b.do(t, http.MethodGet, base+"?offset=98&limit=3", "")
		require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
		require.NoError(t, json.Unmarshal(r.body, &page))
		require.Equal(t, []int{98, 99, 100}, indexes(page))
		require.Equal(t, 250, page.Total)
		require.Equal(t, "failed", page.Items[1].Status)
		require.Contains(t, *page.Items[1].Error, "never")
		require.Equal(t, "completed", page.Items[0].Status)
		require.JSONEq(t, `{"until": "2000-01-01T00:00:00Z"}`, string(page.Items[0].Input))

		r = b.do(t, http.MethodGet, base+"?status=failed", "")
		require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
		page = view.ItemPage{}
		require.NoError(t, json.Unmarshal(r.body, &page))
		require.Equal(t, []int{99, 199}, indexes(page), "the failed items, in index order")
		require.Equal(t, 2, page.Total)

		r = b.do(t, http.MethodGet, base+"?offset=240", "")
		page = view.ItemPage{}
		require.NoError(t, json.Unmarshal(r.body, &page))
		require.Len(t, page.Items, 10)
		require.Equal(t, 249, page.Items[9].Index)
	})
}

func indexes(p view.ItemPage) []int {
	out := []int{}
	for _, it := range p.Items {
		out = append(out, it.Index)
	}
	return out
}
