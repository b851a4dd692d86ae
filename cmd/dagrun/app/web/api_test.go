package web_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/dagrun/dagrun"
	"github.com/dagrun/dagrun/cmd/dagrun/app/web"
	"github.com/dagrun/dagrun/dag"
	"github.com/dagrun/dagrun/handlers"
	"github.com/dagrun/dagrun/storage"
)

// greet is a two-step chain with an input schema and an output.
const greetYAML = `name: greet
description: Say hello twice.
input:
  type: object
  required: [name]
  properties:
    name: {type: string}
defaults:
  retry: {maxAttempts: 2, backoff: 10ms}
steps:
  - name: hello
    handler: echo
    timeout: 5s
    input:
      greeting: "hello ${{ input.name }}"
      raw: ${{ input.name }}
  - name: shout
    handler: echo
    dependsOn: [hello]
    when: ${{ steps.hello.status == "completed" }}
    input:
      greeting: ${{ steps.hello.output.greeting }}
      raw: ${{ steps.hello.output.raw }}
output:
  greeting: ${{ steps.shout.output.greeting }}
`

// flaky fails for good until the test fixes it, then echoes its input.
const flakyYAML = `name: flaky
steps:
  - name: first
    handler: echo
  - name: fragile
    handler: test.flaky
    dependsOn: [first]
`

type testBundle struct {
	engine  *dagrun.Engine
	web     *web.Server
	store   storage.Store
	metrics *web.Metrics
	server  *httptest.Server
	token   string
	fixed   *atomic.Bool
}

type setupOpts struct {
	token   string
	maxBody int64
	// worker runs a worker against the store for the test's lifetime.
	worker bool
	// workflows are served besides greet and flaky.
	workflows []string
	// tokens are named tokens (Config.Tokens).
	tokens map[string]string
	// tracerProvider, when set, turns tracing on.
	tracerProvider trace.TracerProvider
	// invalid are workflows whose files have errors (Config.InvalidWorkflows).
	invalid map[string]error
}

func setup(t *testing.T, open func(t *testing.T) storage.Store, opts *setupOpts) *testBundle {
	t.Helper()
	if opts == nil {
		opts = &setupOpts{}
	}
	registry := handlers.NewRegistry()
	handlers.RegisterBuiltins(registry)
	fixed := &atomic.Bool{}
	registry.Register("test.flaky", func(_ context.Context, in json.RawMessage) (json.RawMessage, error) {
		if !fixed.Load() {
			return nil, handlers.Permanent(errors.New("the fragile thing is broken"))
		}
		return json.RawMessage(`{"ok":true}`), nil
	})
	var workflows []*dag.Workflow
	for _, src := range append([]string{greetYAML, flakyYAML}, opts.workflows...) {
		w, err := dag.Parse("", []byte(src), &dag.ParseOptions{HandlerExists: registry.Has})
		require.NoError(t, err)
		workflows = append(workflows, w)
	}
	store := open(t)
	metrics := web.NewMetrics()
	engine, err := dagrun.New(store, registry, &dagrun.Config{Workflows: workflows, InvalidWorkflows: opts.invalid, Observer: metrics, TracerProvider: opts.tracerProvider})
	require.NoError(t, err)
	srv, err := web.NewServer(engine, &web.Config{Token: opts.token, Tokens: opts.tokens, Metrics: metrics, MaxBodyBytes: opts.maxBody})
	require.NoError(t, err)
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	if opts.worker {
		worker, err := engine.NewWorker(&dagrun.WorkerConfig{Poll: 20 * time.Millisecond, Lease: 5 * time.Second})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = worker.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
	}
	return &testBundle{engine: engine, web: srv, store: store, metrics: metrics, server: ts, token: opts.token, fixed: fixed}
}

// response is a decoded API response.
type response struct {
	status int
	header http.Header
	body   []byte
}

func (r *response) json(t *testing.T) map[string]any {
	t.Helper()
	var v map[string]any
	require.NoError(t, json.Unmarshal(r.body, &v), "body: %s", r.body)
	return v
}

// do sends a request with the bundle's token (if any) and reads the answer.
func (b *testBundle) do(t *testing.T, method, path, body string, header ...string) *response {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, b.server.URL+path, rd)
	require.NoError(t, err)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if b.token != "" {
		req.Header.Set("Authorization", "Bearer "+b.token)
	}
	for i := 0; i+1 < len(header); i += 2 {
		if header[i] == "Host" {
			req.Host = header[i+1] // the client sends req.Host, not a Host header
			continue
		}
		req.Header.Set(header[i], header[i+1])
	}
	// A redirect is an answer to check, not to follow.
	client := *b.server.Client()
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return &response{status: resp.StatusCode, header: resp.Header, body: data}
}

// nextLink is the target of the rel="next" link of a list response, or ""
// on the last page.
func nextLink(t *testing.T, r *response) string {
	t.Helper()
	links := r.header.Values("Link")
	if len(links) == 0 {
		return ""
	}
	require.Len(t, links, 1, "one Link header")
	target, params, ok := strings.Cut(links[0], ">; ")
	require.True(t, ok && strings.HasPrefix(target, "<"), "Link header %q is not <URL>; rel=...", links[0])
	require.Equal(t, `rel="next"`, params, "Link header %q", links[0])
	return strings.TrimPrefix(target, "<")
}

// requireError checks an error response: the status and a JSON {"error"}
// whose message contains want.
func requireError(t *testing.T, r *response, status int, want string) {
	t.Helper()
	require.Equal(t, status, r.status, "body: %s", r.body)
	require.Equal(t, "application/json; charset=utf-8", r.header.Get("Content-Type"))
	body := r.json(t)
	require.Len(t, body, 1, "an error body holds only the error: %s", r.body)
	msg, ok := body["error"].(string)
	require.True(t, ok, "body: %s", r.body)
	require.Contains(t, msg, want)
}

// start starts an instance through the API and returns its ID.
func (b *testBundle) start(t *testing.T, workflow, body string) string {
	t.Helper()
	r := b.do(t, http.MethodPost, "/api/workflows/"+workflow+"/instances", body)
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	return r.json(t)["id"].(string)
}

// wait follows an instance until it is finished (a worker must run).
func (b *testBundle) wait(t *testing.T, id string) *storage.Instance {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	inst, err := b.engine.Follow(ctx, id, nil)
	require.NoError(t, err)
	return inst
}

func TestWorkflowsAPI(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		b := setup(t, open, nil)

		r := b.do(t, http.MethodGet, "/api/workflows", "")
		require.Equal(t, http.StatusOK, r.status)
		var list []map[string]any
		require.NoError(t, json.Unmarshal(r.body, &list))
		require.Len(t, list, 2)
		require.Equal(t, "flaky", list[0]["name"])
		greet := list[1]
		require.Equal(t, "greet", greet["name"])
		require.Equal(t, "Say hello twice.", greet["description"])
		require.EqualValues(t, 2, greet["steps"])
		require.Len(t, greet["hash"], 64)

		r = b.do(t, http.MethodGet, "/api/workflows/greet", "")
		require.Equal(t, http.StatusOK, r.status)
		var detail struct {
			Name        string          `json:"name"`
			Source      string          `json:"source"`
			InputSchema json.RawMessage `json:"inputSchema"`
			Steps       []struct {
				Name      string   `json:"name"`
				Handler   string   `json:"handler"`
				DependsOn []string `json:"dependsOn"`
				Queue     string   `json:"queue"`
				Retry     struct {
					MaxAttempts int    `json:"maxAttempts"`
					Backoff     string `json:"backoff"`
					MaxBackoff  string `json:"maxBackoff"`
				} `json:"retry"`
				Timeout *string `json:"timeout"`
				When    *string `json:"when"`
			} `json:"steps"`
			Graph web.Graph `json:"graph"`
		}
		require.NoError(t, json.Unmarshal(r.body, &detail))
		require.Equal(t, greetYAML, detail.Source)
		require.Contains(t, string(detail.InputSchema), `"required"`)
		require.Len(t, detail.Steps, 2)
		hello, shout := detail.Steps[0], detail.Steps[1]
		require.Equal(t, "hello", hello.Name)
		require.Equal(t, "echo", hello.Handler)
		require.Equal(t, []string{}, hello.DependsOn)
		require.Equal(t, "default", hello.Queue)
		require.Equal(t, 2, hello.Retry.MaxAttempts)
		require.Equal(t, "10ms", hello.Retry.Backoff)
		require.NotNil(t, hello.Timeout)
		require.Equal(t, "5s", *hello.Timeout)
		require.Nil(t, hello.When)
		require.Equal(t, []string{"hello"}, shout.DependsOn)
		require.Nil(t, shout.Timeout)
		require.NotNil(t, shout.When)
		require.Contains(t, *shout.When, `steps.hello.status == "completed"`)
		require.Len(t, detail.Graph.Nodes, 2)
		require.Equal(t, []web.GraphEdge{{From: "hello", To: "shout", Points: detail.Graph.Edges[0].Points}}, detail.Graph.Edges)
		require.Contains(t, detail.Graph.Mermaid, "hello")

		requireError(t, b.do(t, http.MethodGet, "/api/workflows/nope", ""), http.StatusNotFound, `unknown workflow "nope"`)
	})
}

func TestStartRunAndGet(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		b := setup(t, open, &setupOpts{worker: true})

		r := b.do(t, http.MethodPost, "/api/workflows/greet/instances", `{"input": {"name": "Ada"}, "priority": 3}`)
		require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
		created := r.json(t)
		id := created["id"].(string)
		require.Equal(t, "/api/instances/"+id, r.header.Get("Location"))
		require.Equal(t, "greet", created["workflow"])
		require.EqualValues(t, 3, created["priority"])

		b.wait(t, id)
		r = b.do(t, http.MethodGet, "/api/instances/"+id, "")
		require.Equal(t, http.StatusOK, r.status)
		require.Equal(t, "application/json; charset=utf-8", r.header.Get("Content-Type"))
		var inst struct {
			ID         string          `json:"id"`
			Workflow   string          `json:"workflow"`
			Status     string          `json:"status"`
			Input      json.RawMessage `json:"input"`
			Output     json.RawMessage `json:"output"`
			Error      *string         `json:"error"`
			CreatedAt  string          `json:"createdAt"`
			FinishedAt *string         `json:"finishedAt"`
			Steps      []struct {
				Name       string          `json:"name"`
				Handler    string          `json:"handler"`
				Status     string          `json:"status"`
				Attempts   int             `json:"attempts"`
				Input      json.RawMessage `json:"input"`
				Output     json.RawMessage `json:"output"`
				Error      *string         `json:"error"`
				StartedAt  *string         `json:"startedAt"`
				FinishedAt *string         `json:"finishedAt"`
			} `json:"steps"`
			Events []struct {
				At   string `json:"at"`
				Type string `json:"type"`
				Step string `json:"step"`
			} `json:"events"`
			Graph web.Graph `json:"graph"`
		}
		require.NoError(t, json.Unmarshal(r.body, &inst))
		require.Equal(t, id, inst.ID)
		require.Equal(t, "completed", inst.Status)
		require.JSONEq(t, `{"name":"Ada"}`, string(inst.Input))
		require.JSONEq(t, `{"greeting":"hello Ada"}`, string(inst.Output))
		require.Nil(t, inst.Error)
		_, err := time.Parse(time.RFC3339, inst.CreatedAt)
		require.NoError(t, err)
		require.NotNil(t, inst.FinishedAt)
		require.Len(t, inst.Steps, 2)
		for _, s := range inst.Steps {
			require.Equal(t, "completed", s.Status, s.Name)
			require.Equal(t, "echo", s.Handler)
			require.Equal(t, 1, s.Attempts)
			require.NotNil(t, s.StartedAt)
			require.NotNil(t, s.FinishedAt)
			require.Nil(t, s.Error)
		}
		require.JSONEq(t, `{"greeting":"hello Ada","raw":"Ada"}`, string(inst.Steps[1].Input))
		require.JSONEq(t, `{"greeting":"hello Ada","raw":"Ada"}`, string(inst.Steps[1].Output))
		var types []string
		for _, e := range inst.Events {
			types = append(types, e.Type)
		}
		require.Contains(t, types, string(storage.EventInstanceCreated))
		require.Contains(t, types, string(storage.EventStepCompleted))
		require.Contains(t, types, string(storage.EventInstanceCompleted))
		require.Len(t, inst.Graph.Nodes, 2)
		require.Len(t, inst.Graph.Edges, 1)

		// The list holds the same instance object, without events.
		r = b.do(t, http.MethodGet, "/api/instances?workflow=greet", "")
		require.Equal(t, http.StatusOK, r.status)
		var list []map[string]any
		require.NoError(t, json.Unmarshal(r.body, &list), "body: %s", r.body)
		require.Len(t, list, 1)
		require.Empty(t, r.header.Values("Link"), "the only page links to no next one")
		require.Equal(t, id, list[0]["id"])
		require.NotContains(t, list[0], "events")
		require.Len(t, list[0]["steps"], 2)

		requireError(t, b.do(t, http.MethodGet, "/api/instances/no-such-id", ""), http.StatusNotFound, `no instance with ID "no-such-id"`)
	})
}

func TestStartErrors(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		broken := dag.ErrorList{{File: "workflows/broken.yaml", Line: 2, Col: 10, Msg: "timeout 10 has no unit"}, {File: "workflows/broken.yaml", Line: 3, Col: 1, Msg: "more"}}
		b := setup(t, open, &setupOpts{maxBody: 4 << 10, invalid: map[string]error{"broken": broken}})
		for _, tc := range []struct {
			name, path, body string
			header           []string
			status           int
			want             string
		}{
			{"unknown workflow", "/api/workflows/nope/instances", `{}`, nil, http.StatusNotFound, `unknown workflow "nope" (available: flaky, greet)`},
			{"invalid workflow", "/api/workflows/broken/instances", `{}`, nil, http.StatusUnprocessableEntity,
				`workflow "broken" is invalid: workflows/broken.yaml:2:10: timeout 10 has no unit (and 1 more); dagrun validate lists every error`},
			{"input fails the schema", "/api/workflows/greet/instances", `{"input": {"name": 42}}`, nil, http.StatusBadRequest, "workflow greet"},
			{"input misses a field", "/api/workflows/greet/instances", `{}`, nil, http.StatusBadRequest, "name"},
			{"malformed body", "/api/workflows/greet/instances", `{"input": `, nil, http.StatusBadRequest, "invalid request body"},
			{"unknown field", "/api/workflows/greet/instances", `{"input": {"name": "x"}, "prority": 1}`, nil, http.StatusBadRequest, `unknown field "prority"`},
			{"two values", "/api/workflows/greet/instances", `{} {}`, nil, http.StatusBadRequest, "more than one JSON value"},
			{"fractional priority", "/api/workflows/greet/instances", `{"input": {"name": "x"}, "priority": 2.5}`, nil, http.StatusBadRequest,
				`invalid request body: "priority": want a whole number, got a number 2.5`},
			{"priority as text", "/api/workflows/greet/instances", `{"input": {"name": "x"}, "priority": "2"}`, nil, http.StatusBadRequest,
				`invalid request body: "priority": want a whole number, got a string`},
			{"bad delay", "/api/workflows/greet/instances", `{"input": {"name": "x"}, "delay": "soon"}`, nil, http.StatusBadRequest, `invalid delay "soon"`},
			{"negative delay", "/api/workflows/greet/instances", `{"input": {"name": "x"}, "delay": "-1s"}`, nil, http.StatusBadRequest, "invalid delay"},
			{"form body that is not JSON", "/api/workflows/greet/instances", `name=x`, []string{"Content-Type", "application/x-www-form-urlencoded"}, http.StatusBadRequest, "invalid request body"},
			{"not JSON", "/api/workflows/greet/instances", `<order/>`, []string{"Content-Type", "application/xml"}, http.StatusUnsupportedMediaType, "must be JSON"},
			{"body too large", "/api/workflows/greet/instances", `{"input": {"name": "` + strings.Repeat("x", 5<<10) + `"}}`, nil, http.StatusRequestEntityTooLarge, "over the limit of 4096 bytes"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				requireError(t, b.do(t, http.MethodPost, tc.path, tc.body, tc.header...), tc.status, tc.want)
			})
		}

		// A body without a declared length is cut off while it is read.
		req, err := http.NewRequest(http.MethodPost, b.server.URL+"/api/workflows/greet/instances",
			io.MultiReader(strings.NewReader(`{"input": {"name": "`), strings.NewReader(strings.Repeat("x", 8<<10)), strings.NewReader(`"}}`)))
		require.NoError(t, err)
		req.ContentLength = -1
		req.Header.Set("Content-Type", "application/json")
		resp, err := b.server.Client().Do(req)
		require.NoError(t, err)
		data, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		requireError(t, &response{status: resp.StatusCode, header: resp.Header, body: data}, http.StatusRequestEntityTooLarge, "over the limit")

		// Nothing was written by any of the failed starts.
		list, err := b.engine.List(context.Background(), storage.ListParams{})
		require.NoError(t, err)
		require.Empty(t, list)
	})
}

func TestIdempotentStart(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		b := setup(t, open, nil)
		first := b.do(t, http.MethodPost, "/api/workflows/greet/instances", `{"input": {"name": "a"}, "key": "order-1", "delay": "1h"}`)
		require.Equal(t, http.StatusCreated, first.status, "body: %s", first.body)
		require.Empty(t, first.header.Values("Idempotent-Replayed"), "a first start is no replay")
		// The repeat answers as the first start did, and says it is a replay.
		again := b.do(t, http.MethodPost, "/api/workflows/greet/instances", `{"input": {"name": "b"}, "key": "order-1"}`)
		require.Equal(t, http.StatusCreated, again.status, "body: %s", again.body)
		require.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
		require.Equal(t, first.header.Get("Location"), again.header.Get("Location"))
		require.JSONEq(t, string(first.body), string(again.body), "the first instance, unchanged")
		require.Equal(t, "order-1", again.json(t)["key"])
		require.JSONEq(t, `{"name":"a"}`, string(mustMarshal(t, again.json(t)["input"])))
		list, err := b.engine.List(t.Context(), storage.ListParams{})
		require.NoError(t, err)
		require.Len(t, list, 1, "the repeat started nothing")
	})
}

func TestListFiltersAndPaging(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		b := setup(t, open, nil)
		var ids []string
		for i := range 5 {
			ids = append(ids, b.start(t, "greet", `{"input": {"name": "n`+string(rune('0'+i))+`"}}`))
		}
		flaky := b.start(t, "flaky", "")
		require.Equal(t, http.StatusOK, b.do(t, http.MethodPost, "/api/instances/"+flaky+"/cancel", "").status)

		// Paging follows the Link header, which keeps the filter and the limit.
		var seen []string
		path := "/api/instances?workflow=greet&limit=2"
		for page := 0; path != ""; page++ {
			require.Less(t, page, 5, "paging does not end")
			r := b.do(t, http.MethodGet, path, "")
			require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
			var list []struct {
				ID string `json:"id"`
			}
			require.NoError(t, json.Unmarshal(r.body, &list), "body: %s", r.body)
			require.LessOrEqual(t, len(list), 2)
			for _, inst := range list {
				seen = append(seen, inst.ID)
			}
			path = nextLink(t, r)
			if path != "" {
				require.Equal(t, "/api/instances?before="+list[len(list)-1].ID+"&limit=2&workflow=greet", path)
			}
		}
		// Newest first, each exactly once.
		require.Equal(t, []string{ids[4], ids[3], ids[2], ids[1], ids[0]}, seen)

		r := b.do(t, http.MethodGet, "/api/instances?status=cancelled", "")
		require.Equal(t, http.StatusOK, r.status)
		var cancelled []map[string]any
		require.NoError(t, json.Unmarshal(r.body, &cancelled), "body: %s", r.body)
		require.Len(t, cancelled, 1)
		require.Equal(t, flaky, cancelled[0]["id"])

		r = b.do(t, http.MethodGet, "/api/instances?workflow=nothing", "")
		require.Equal(t, http.StatusOK, r.status)
		require.JSONEq(t, `[]`, string(r.body))
		require.Empty(t, r.header.Values("Link"))

		requireError(t, b.do(t, http.MethodGet, "/api/instances?status=done", ""), http.StatusBadRequest, `invalid status "done"`)
		requireError(t, b.do(t, http.MethodGet, "/api/instances?limit=0", ""), http.StatusBadRequest, `invalid limit "0"`)
		requireError(t, b.do(t, http.MethodGet, "/api/instances?limit=9999", ""), http.StatusBadRequest, "from 1 to 500")
		requireError(t, b.do(t, http.MethodGet, "/api/instances?before=zzz", ""), http.StatusBadRequest, `invalid page cursor (before) "zzz": use an instance ID`)
	})
}

func TestCancelAndRetry(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		b := setup(t, open, &setupOpts{worker: true})

		// flaky fails for good until fixed; retry then completes it,
		// keeping the output of the step that had completed.
		id := b.start(t, "flaky", "")
		require.Equal(t, storage.InstanceFailed, b.wait(t, id).Status)
		r := b.do(t, http.MethodGet, "/api/instances/"+id, "")
		failed := r.json(t)
		require.Contains(t, failed["error"], "the fragile thing is broken")
		requireError(t, b.do(t, http.MethodPost, "/api/instances/"+id+"/cancel", ""), http.StatusConflict, "is already failed; only a pending or running instance can be cancelled")

		b.fixed.Store(true)
		r = b.do(t, http.MethodPost, "/api/instances/"+id+"/retry", "")
		require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
		require.Equal(t, id, r.json(t)["id"])
		require.NotEqual(t, "failed", r.json(t)["status"])
		done := b.wait(t, id)
		require.Equal(t, storage.InstanceCompleted, done.Status)
		require.Equal(t, 1, done.Steps[0].Attempts, "the completed step did not run again")
		requireError(t, b.do(t, http.MethodPost, "/api/instances/"+id+"/retry", ""), http.StatusConflict, "is completed; only a failed or cancelled instance can be retried")

		requireError(t, b.do(t, http.MethodPost, "/api/instances/nope/cancel", ""), http.StatusNotFound, `no instance with ID "nope"`)
		requireError(t, b.do(t, http.MethodPost, "/api/instances/nope/retry", ""), http.StatusNotFound, `no instance with ID "nope"`)
	})
}

func TestCancelPending(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		b := setup(t, open, nil) // no worker: the instance stays pending
		// A delay in weeks, as --delay takes it.
		id := b.start(t, "greet", `{"input": {"name": "x"}, "delay": "1w"}`)
		got, err := b.engine.Get(t.Context(), id)
		require.NoError(t, err)
		require.WithinDuration(t, got.CreatedAt.Add(7*24*time.Hour), got.Steps[0].RunAfter, time.Minute)
		r := b.do(t, http.MethodPost, "/api/instances/"+id+"/cancel", "")
		require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
		inst := r.json(t)
		require.Equal(t, "cancelled", inst["status"])
		for _, s := range inst["steps"].([]any) {
			require.Equal(t, "cancelled", s.(map[string]any)["status"])
		}
		requireError(t, b.do(t, http.MethodPost, "/api/instances/"+id+"/cancel", ""), http.StatusConflict, "is already cancelled; only a pending or running instance can be cancelled")
		require.Equal(t, 1.0, web.InstancesFinished(b.metrics, "greet", "cancelled"))
	})
}

func TestTokenAuth(t *testing.T) {
	t.Parallel()
	b := setup(t, openSQLite, &setupOpts{token: "s3cret-token"})
	anon := &testBundle{server: b.server}
	wrong := &testBundle{server: b.server, token: "s3cret-tokeN"}

	for _, path := range []string{"/api/workflows", "/api/workflows/greet", "/api/instances", "/api/instances/x", "/metrics", "/api/nope"} {
		requireError(t, anon.do(t, http.MethodGet, path, ""), http.StatusUnauthorized, "missing token")
		r := wrong.do(t, http.MethodGet, path, "")
		requireError(t, r, http.StatusUnauthorized, "wrong token")
		require.Equal(t, `Bearer realm="dagrun"`, r.header.Get("WWW-Authenticate"))
	}
	requireError(t, anon.do(t, http.MethodPost, "/api/workflows/greet/instances", `{"input": {"name": "x"}}`), http.StatusUnauthorized, "missing token")
	requireError(t, anon.do(t, http.MethodPost, "/api/instances/x/cancel", ""), http.StatusUnauthorized, "missing token")
	requireError(t, anon.do(t, http.MethodGet, "/api/workflows", "", "Authorization", "Basic czNjcmV0LXRva2Vu"), http.StatusUnauthorized, "missing token")

	require.Equal(t, http.StatusOK, b.do(t, http.MethodGet, "/api/workflows", "").status)
	require.Equal(t, http.StatusOK, b.do(t, http.MethodGet, "/metrics", "").status)
	require.Equal(t, http.StatusOK, anon.do(t, http.MethodGet, "/api/workflows", "", "Authorization", "bearer s3cret-token").status, "the scheme is case-insensitive")
	// Open without the token: only the probe (TestEveryRouteNeedsTheToken
	// goes through all the others).
	require.Equal(t, http.StatusOK, anon.do(t, http.MethodGet, "/healthz", "").status)
	requireError(t, anon.do(t, http.MethodGet, "/", ""), http.StatusUnauthorized, "missing token")
	requireError(t, anon.do(t, http.MethodGet, "/ui/app.js", ""), http.StatusUnauthorized, "missing token")
	// With a token, any Host is fine (the token stops rebinding pages).
	require.Equal(t, http.StatusOK, b.do(t, http.MethodGet, "/api/workflows", "", "Host", "dagrun.internal:8080").status)
}

func TestRequestScreening(t *testing.T) {
	t.Parallel()
	b := setup(t, openSQLite, nil)

	// Without a token only loopback names are served (DNS rebinding).
	requireError(t, b.do(t, http.MethodGet, "/api/workflows", "", "Host", "evil.example:8080"), http.StatusForbidden, "loopback")
	require.Equal(t, http.StatusOK, b.do(t, http.MethodGet, "/api/workflows", "", "Host", "localhost:8080").status)
	require.Equal(t, http.StatusOK, b.do(t, http.MethodGet, "/api/workflows", "", "Host", "[::1]:8080").status)

	// A cross-site page cannot make the browser post to the API.
	requireError(t, b.do(t, http.MethodPost, "/api/workflows/greet/instances", `{"input": {"name": "x"}}`, "Sec-Fetch-Site", "cross-site"),
		http.StatusForbidden, "cross-origin request refused")
	requireError(t, b.do(t, http.MethodPost, "/api/instances/x/cancel", "", "Origin", "https://evil.example"),
		http.StatusForbidden, "cross-origin request refused")
	require.Equal(t, http.StatusCreated, b.do(t, http.MethodPost, "/api/workflows/greet/instances", `{"input": {"name": "x"}}`, "Sec-Fetch-Site", "same-origin").status)

	// Unknown routes and methods answer in JSON too.
	requireError(t, b.do(t, http.MethodGet, "/api/nope", ""), http.StatusNotFound, "no route GET /api/nope")
	r := b.do(t, http.MethodDelete, "/api/instances/x", "")
	requireError(t, r, http.StatusMethodNotAllowed, "method DELETE is not allowed")
	require.Equal(t, "GET, HEAD", r.header.Get("Allow"))
	requireError(t, b.do(t, http.MethodGet, "/api/instances/x/cancel", ""), http.StatusMethodNotAllowed, "allowed: POST")
	// The bulk operations' paths are not instance IDs.
	for _, path := range []string{"/api/instances/cancel", "/api/instances/retry"} {
		for _, method := range []string{http.MethodGet, http.MethodPut, http.MethodDelete} {
			r := b.do(t, method, path, "")
			requireError(t, r, http.StatusMethodNotAllowed, "method "+method+" is not allowed on "+path+" (allowed: POST)")
			require.Equal(t, "POST", r.header.Get("Allow"), "%s %s", method, path)
		}
	}
	requireError(t, b.do(t, http.MethodGet, "/ui/", ""), http.StatusNotFound, "no route")
	requireError(t, b.do(t, http.MethodGet, "/ui/nope.js", ""), http.StatusNotFound, "no route GET /ui/nope.js")
	requireError(t, b.do(t, http.MethodGet, "/ui", ""), http.StatusNotFound, "the web UI is at /")

	// Every response carries the security headers.
	for _, path := range []string{"/", "/ui/app.js", "/api/workflows", "/api/nope", "/healthz", "/metrics"} {
		r := b.do(t, http.MethodGet, path, "")
		require.Equal(t, "nosniff", r.header.Get("X-Content-Type-Options"), path)
		require.Contains(t, r.header.Get("Content-Security-Policy"), "default-src 'self'", path)
		require.Equal(t, "DENY", r.header.Get("X-Frame-Options"), path)
	}
}

func TestHealthz(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		b := setup(t, open, nil)
		r := b.do(t, http.MethodGet, "/healthz", "")
		require.Equal(t, http.StatusOK, r.status)
		require.JSONEq(t, `{"status":"ok"}`, string(r.body))

		require.NoError(t, b.store.Close())
		r = b.do(t, http.MethodGet, "/healthz", "")
		require.Equal(t, http.StatusServiceUnavailable, r.status, "body: %s", r.body)
		body := r.json(t)
		require.Equal(t, "unavailable", body["status"])
		require.Contains(t, body["error"], "storage does not answer")
	})
}

// TestNoMarkupFromData starts an instance whose step output holds a script
// tag and checks that nothing the server sends would run it: the API
// answers JSON (with < and > escaped, and nosniff), the HTML shell carries
// no data at all, and the UI script never parses strings as HTML.
func TestNoMarkupFromData(t *testing.T) {
	t.Parallel()
	const evil = `<script>alert(1)</script><img src=x onerror=alert(2)>`
	b := setup(t, openSQLite, &setupOpts{worker: true})
	body, err := json.Marshal(map[string]any{"input": map[string]string{"name": evil}})
	require.NoError(t, err)
	id := b.start(t, "greet", string(body))
	inst := b.wait(t, id)
	require.Equal(t, storage.InstanceCompleted, inst.Status)
	require.Contains(t, string(inst.Steps[1].Output), "alert(1)", "the payload reached a step output")

	for _, path := range []string{"/api/instances/" + id, "/api/instances", "/api/instances?workflow=greet"} {
		r := b.do(t, http.MethodGet, path, "")
		require.Equal(t, http.StatusOK, r.status)
		require.Equal(t, "application/json; charset=utf-8", r.header.Get("Content-Type"), path)
		require.Equal(t, "nosniff", r.header.Get("X-Content-Type-Options"))
		require.Contains(t, string(r.body), "alert(1)", path)
		require.NotContains(t, string(r.body), "<script", path)
		require.NotContains(t, string(r.body), "<img", path)
		require.Contains(t, string(r.body), `\u003cscript\u003e`, path)
	}

	shell := b.do(t, http.MethodGet, "/", "")
	require.Equal(t, http.StatusOK, shell.status)
	require.Equal(t, "text/html; charset=utf-8", shell.header.Get("Content-Type"))
	require.NotContains(t, string(shell.body), "alert(")
	require.NotContains(t, string(shell.body), id)
	require.NotContains(t, string(shell.body), "<script>", "no inline script: the CSP forbids it anyway")

	// Secondary check on the asset: the script must build the DOM from
	// text, never from HTML strings.
	js := b.do(t, http.MethodGet, "/ui/app.js", "")
	require.Equal(t, http.StatusOK, js.status)
	require.Contains(t, js.header.Get("Content-Type"), "javascript")
	code := stripJSComments(string(js.body))
	for _, sink := range []string{"innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function", "DOMParser", "createContextualFragment", "srcdoc"} {
		require.NotContains(t, code, sink, "app.js must not use %s", sink)
	}
	require.Contains(t, code, "textContent")
	require.Contains(t, code, "createTextNode")
}

// stripJSComments drops // line comments (the script's header comment
// names the sinks it avoids).
func stripJSComments(src string) string {
	var out strings.Builder
	for _, line := range strings.Split(src, "\n") {
		if t := strings.TrimSpace(line); strings.HasPrefix(t, "//") {
			continue
		}
		out.WriteString(line)
		out.WriteByte('\n')
	}
	return out.String()
}

func TestMetrics(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		b := setup(t, open, &setupOpts{worker: true})
		b.metrics.InitWorkflows("greet", "flaky")
		id := b.start(t, "greet", `{"input": {"name": "m"}}`)
		require.Equal(t, storage.InstanceCompleted, b.wait(t, id).Status)
		failed := b.start(t, "flaky", "")
		require.Equal(t, storage.InstanceFailed, b.wait(t, failed).Status)
		// The counters are fed after the commit that Follow saw; give the
		// worker a moment to report.
		require.Eventually(t, func() bool {
			return web.StepAttempts(b.metrics, "test.flaky", "failed") == 1
		}, 5*time.Second, 10*time.Millisecond)

		r := b.do(t, http.MethodGet, "/metrics", "")
		require.Equal(t, http.StatusOK, r.status)
		text := string(r.body)
		for _, want := range []string{
			`dagrun_instances_started_total{workflow="greet"} 1`,
			`dagrun_instances_started_total{workflow="flaky"} 1`,
			`dagrun_instances_finished_total{status="completed",workflow="greet"} 1`,
			`dagrun_instances_finished_total{status="failed",workflow="flaky"} 1`,
			`dagrun_instances_finished_total{status="cancelled",workflow="greet"} 0`,
			`dagrun_step_attempts_total{handler="echo",outcome="completed"} 3`,
			`dagrun_step_attempts_total{handler="test.flaky",outcome="failed"} 1`,
			`dagrun_step_duration_seconds_bucket{handler="echo",le="+Inf"} 3`,
			`dagrun_step_queue_wait_seconds_count{queue="default"} 4`,
			`dagrun_store_up 1`,
			`dagrun_instances{status="completed",workflow="greet"} 1`,
			`dagrun_instances{status="failed",workflow="flaky"} 1`,
			`dagrun_steps_ready{workflow="greet"} 0`,
			`dagrun_steps_running{workflow="greet"} 0`,
			`dagrun_steps_stuck{workflow="greet"} 0`,
			`dagrun_steps_waiting{workflow="greet"} 0`,
			`dagrun_oldest_ready_step_age_seconds{workflow="greet"} 0`,
			"go_goroutines ",
			"process_start_time_seconds ",
		} {
			require.Contains(t, text, want)
		}
		// Every step finished, so no queue has a series (see
		// TestMetricsQueueGauges for queues with work).
		require.NotContains(t, text, "dagrun_queue_steps_")
		// Every metric of our own carries the dagrun_ prefix.
		for _, line := range strings.Split(text, "\n") {
			if strings.HasPrefix(line, "# HELP ") {
				name := strings.Fields(line)[2]
				if !strings.HasPrefix(name, "go_") && !strings.HasPrefix(name, "process_") && !strings.HasPrefix(name, "promhttp_") {
					require.True(t, strings.HasPrefix(name, "dagrun_"), name)
				}
			}
		}

		// With the store gone the gauges say so instead of failing the scrape.
		require.NoError(t, b.store.Close())
		r = b.do(t, http.MethodGet, "/metrics", "")
		require.Equal(t, http.StatusOK, r.status)
		require.Contains(t, string(r.body), "dagrun_store_up 0")
	})
}

// TestMetricsQueueGauges checks the per-queue step gauges, with no worker
// running so that steps stay where the test puts them: ready (and served
// by no live worker), then claimed (running), then past their lease
// (stuck).
func TestMetricsQueueGauges(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		b := setup(t, open, nil)
		scrape := func() string {
			t.Helper()
			r := b.do(t, http.MethodGet, "/metrics", "")
			require.Equal(t, http.StatusOK, r.status)
			return string(r.body)
		}
		requireAll := func(text string, want ...string) {
			t.Helper()
			for _, w := range want {
				require.Contains(t, text, w)
			}
		}
		// Two instances: each one's first step is ready on the default queue.
		b.start(t, "greet", `{"input": {"name": "a"}}`)
		b.start(t, "greet", `{"input": {"name": "b"}}`)
		requireAll(scrape(),
			`dagrun_queue_steps_ready{queue="default"} 2`,
			`dagrun_queue_steps_running{queue="default"} 0`,
			`dagrun_queue_steps_stuck{queue="default"} 0`,
			`dagrun_steps_ready{workflow="greet"} 2`,
			`dagrun_steps_running{workflow="greet"} 0`,
			`dagrun_steps_unserved{handler="echo"} 2`,
		)

		// Claim one for a minute and one for a millisecond: both run, and the
		// second is soon stuck.
		claim := func(lease time.Duration) {
			t.Helper()
			got, err := b.store.ClaimSteps(t.Context(), storage.ClaimParams{WorkerID: "test", Limit: 1, Lease: lease})
			require.NoError(t, err)
			require.Len(t, got, 1)
		}
		claim(time.Minute)
		claim(time.Millisecond)
		require.Eventually(t, func() bool {
			return strings.Contains(scrape(), `dagrun_queue_steps_stuck{queue="default"} 1`)
		}, 5*time.Second, 10*time.Millisecond)
		requireAll(scrape(),
			`dagrun_queue_steps_ready{queue="default"} 0`,
			`dagrun_queue_steps_running{queue="default"} 2`,
			`dagrun_queue_steps_stuck{queue="default"} 1`,
			`dagrun_steps_ready{workflow="greet"} 0`,
			`dagrun_steps_running{workflow="greet"} 2`,
			`dagrun_steps_stuck{workflow="greet"} 1`,
			"# TYPE dagrun_queue_steps_ready gauge",
		)
		// No step is ready any more: the series seen stay, at 0.
		requireAll(scrape(),
			`dagrun_steps_unserved{handler="echo"} 0`,
			`dagrun_oldest_unserved_step_age_seconds{handler="echo"} 0`,
		)

		// Nothing left on the queue: its series stay too, at 0.
		r := b.do(t, http.MethodPost, "/api/instances/cancel", `{"workflow": "greet"}`)
		require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
		require.JSONEq(t, `{"count": 2}`, string(r.body))
		require.Eventually(t, func() bool {
			return strings.Contains(scrape(), `dagrun_queue_steps_running{queue="default"} 0`)
		}, 5*time.Second, 10*time.Millisecond)
		requireAll(scrape(),
			`dagrun_queue_steps_ready{queue="default"} 0`,
			`dagrun_queue_steps_stuck{queue="default"} 0`,
		)
	})
}

func TestNewServerConfig(t *testing.T) {
	t.Parallel()
	_, err := web.NewServer(nil, nil)
	require.ErrorContains(t, err, "nil engine")

	registry := handlers.NewRegistry()
	engine, err := dagrun.New(openSQLite(t), registry, nil)
	require.NoError(t, err)
	_, err = web.NewServer(engine, &web.Config{MaxBodyBytes: -1})
	require.ErrorContains(t, err, "MaxBodyBytes")

	// One Metrics reports one store.
	m := web.NewMetrics()
	_, err = web.NewServer(engine, &web.Config{Metrics: m})
	require.NoError(t, err)
	_, err = web.NewServer(engine, &web.Config{Metrics: m})
	require.NoError(t, err, "the same store again is fine")
	other, err := dagrun.New(openSQLite(t), registry, nil)
	require.NoError(t, err)
	_, err = web.NewServer(other, &web.Config{Metrics: m})
	require.ErrorContains(t, err, "another store")

	// Defaults: a nil config serves, without a token.
	srv, err := web.NewServer(engine, nil)
	require.NoError(t, err)
	ts := httptest.NewServer(srv)
	defer ts.Close()
	resp, err := ts.Client().Get(ts.URL + "/api/workflows")
	require.NoError(t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.JSONEq(t, `[]`, string(bytes.TrimSpace(data)))
}

func TestIsLoopbackHost(t *testing.T) {
	t.Parallel()
	for host, want := range map[string]bool{
		"127.0.0.1": true, "127.1.2.3": true, "::1": true, "[::1]": true, "localhost": true, "LocalHost": true, "app.localhost": true,
		"": false, "0.0.0.0": false, "::": false, "192.168.1.10": false, "10.0.0.1": false, "example.com": false, "localhost.example.com": false,
	} {
		require.Equal(t, want, web.IsLoopbackHost(host), host)
	}
}

func mustMarshal(t *testing.T, v any) []byte {
	t.Helper()
	data, err := json.Marshal(v)
	require.NoError(t, err)
	return data
}

// TestStartWithCurlDefaults: `curl -d '{...}'` sends JSON labelled as a
// form; the API reads it as JSON rather than refusing it.
func TestStartWithCurlDefaults(t *testing.T) {
	t.Parallel()
	b := setup(t, openSQLite, nil)
	r := b.do(t, http.MethodPost, "/api/workflows/greet/instances", `{"input": {"name": "curl"}}`,
		"Content-Type", "application/x-www-form-urlencoded")
	require.Equal(t, http.StatusCreated, r.status, string(r.body))
}

// TestInputAtTheLimitFitsTheBody: at the default limits an input the
// engine takes is taken through the API too (the body wraps it), and one
// over the engine's limit is a 400 naming that limit, as on the CLI.
func TestInputAtTheLimitFitsTheBody(t *testing.T) {
	t.Parallel()
	b := setup(t, openSQLite, nil)
	padded := func(size int) string {
		name := `{"name": "`
		return name + strings.Repeat("a", size-len(name)-2) + `"}`
	}
	res := b.do(t, http.MethodPost, "/api/workflows/greet/instances", `{"input": `+padded(dagrun.DefaultMaxInputBytes)+`, "key": "big"}`)
	require.Equal(t, http.StatusCreated, res.status, string(res.body))
	res = b.do(t, http.MethodPost, "/api/workflows/greet/instances", `{"input": `+padded(dagrun.DefaultMaxInputBytes+1)+`}`)
	require.Equal(t, http.StatusBadRequest, res.status, string(res.body))
	require.Contains(t, string(res.body), "1048576")
}

// TestUnreadableQueryIsRefused: a query string with pairs Go cannot read
// (a ";" separator, a bad escape), or with a parameter given twice, is a
// 400, not a list that silently ignores a filter.
func TestUnreadableQueryIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, openSQLite, nil)
	for _, query := range []string{"workflow=greet&status=completed;", "workflow=gr%zzeet"} {
		res := b.do(t, http.MethodGet, "/api/instances?"+query, "")
		require.Equal(t, http.StatusBadRequest, res.status, "%s: %s", query, res.body)
		require.Contains(t, string(res.body), "invalid query string")
	}
	require.Equal(t, http.StatusOK, b.do(t, http.MethodGet, "/api/instances?workflow=greet&status=completed", "").status)

	// A parameter given twice would apply its first value alone.
	res := b.do(t, http.MethodGet, "/api/instances?status=completed&status=failed", "")
	requireError(t, res, http.StatusBadRequest, `query parameter "status" is given 2 times: give it once`)
}

// limitedYAML has a workflow concurrency limit, a schedule and both kinds
// of step concurrency.
const limitedYAML = `name: limited
concurrency: {key: "${{ input.customer }}", limit: 2}
schedule:
  - cron: "0 3 * * *"
    timezone: Europe/Berlin
    input: {customer: c-1}
    catchup: 1h
steps:
  - name: charge
    handler: echo
    concurrency: {key: "${{ input.customer }}", limit: 1}
  - name: each
    handler: echo
    forEach: [1, 2]
    concurrency: 3
`

// TestWorkflowDefinitionShowsLimitsAndSchedules: GET /api/workflows/{name}
// shows the workflow's concurrency limit and schedule as written, and a
// step's keyed concurrency apart from a forEach step's cap.
func TestWorkflowDefinitionShowsLimitsAndSchedules(t *testing.T) {
	t.Parallel()
	b := setup(t, openSQLite, &setupOpts{token: "s3cret", workflows: []string{limitedYAML}})
	c := newContract(t, b)
	got := c.call(t, "GET /api/workflows/{name}", "/api/workflows/limited", "", http.StatusOK).json(t)
	require.Equal(t, map[string]any{"key": "${{ input.customer }}", "limit": 2.0}, got["concurrency"])
	require.Equal(t, []any{map[string]any{
		"index": 0.0, "cron": "0 3 * * *", "timezone": "Europe/Berlin",
		"input": map[string]any{"customer": "c-1"}, "overlap": "skip", "catchup": "1h",
	}}, got["schedule"])
	steps := got["steps"].([]any)
	charge, each := steps[0].(map[string]any), steps[1].(map[string]any)
	require.Equal(t, map[string]any{"key": "${{ input.customer }}", "limit": 1.0}, charge["concurrencyLimit"])
	require.Equal(t, 0.0, charge["concurrency"])
	require.Equal(t, 3.0, each["concurrency"])
	require.NotContains(t, each, "concurrencyLimit")

	greet := c.call(t, "GET /api/workflows/{name}", "/api/workflows/greet", "", http.StatusOK).json(t)
	require.NotContains(t, greet, "concurrency", "absent without a limit")
	require.NotContains(t, greet, "schedule")
}

// TestStartTakesAWholeNumberWrittenAsAFloat: JSON does not tell 4.0 from
// 4, and some clients send every number as a float: such a priority is
// the whole number it writes.
func TestStartTakesAWholeNumberWrittenAsAFloat(t *testing.T) {
	t.Parallel()
	b := setup(t, openSQLite, nil)
	for body, want := range map[string]int{
		`{"input": {"name": "Bo"}, "priority": 4.0}`:  4,
		`{"input": {"name": "Bo"}, "priority": 1e2}`:  100,
		`{"input": {"name": "Bo"}, "priority": -2.0}`: -2,
	} {
		r := b.do(t, http.MethodPost, "/api/workflows/greet/instances", body)
		require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
		require.EqualValues(t, want, r.json(t)["priority"], body)
	}
}
