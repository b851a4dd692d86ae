package web_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"
	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/cmd/dagrun/app/web"
	"github.com/dagrun/dagrun/dag"
	"github.com/dagrun/dagrun/storage"
)

// guardedYAML has a workflow timeout and an onFailure step.
const guardedYAML = `name: guarded
timeout: 1h
steps:
  - name: fragile
    handler: test.flaky
onFailure:
  - name: report
    handler: echo
    input: {error: "${{ workflow.error }}"}
`

// callerYAML runs greet as a child instance.
const callerYAML = `name: caller
steps:
  - name: child
    workflow: greet
    input: {name: ada}
`

// contract validates real requests and responses against the served
// OpenAPI document and remembers which routes and statuses were seen.
//
// kin-openapi rather than pb33f's libopenapi-validator, which this test
// used first: both check requests and responses against an OpenAPI 3.1
// document, but on an empty build cache, as CI on a new machine has, a
// race-detector build of libopenapi-validator and its dependencies took
// 410 CPU-seconds, more than dagrun's, and one of kin-openapi's 56.
type contract struct {
	bundle *testBundle
	router routers.Router
	seen   map[string]bool // "GET /api/instances/{id}"
}

func newContract(t *testing.T, b *testBundle) *contract {
	t.Helper()
	r := b.do(t, http.MethodGet, "/api/openapi.json", "")
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	require.Equal(t, "application/json; charset=utf-8", r.header.Get("Content-Type"))
	doc, err := openapi3.NewLoader().LoadFromData(r.body)
	require.NoError(t, err)
	require.True(t, doc.IsOpenAPI31OrLater(), "the document is OpenAPI 3.1")
	require.NoError(t, doc.Validate(t.Context()), "the document is valid OpenAPI 3.1")
	// Its servers name a path prefix only; requests go to the test's server.
	doc.Servers = nil
	// kin-openapi checks a schema that has a $ref and no keyword of JSON
	// Schema 2020-12 by OpenAPI 3.0's rules, where a schema admits null
	// only if its type names it. In 3.1 a schema without a type (an
	// output: any JSON value) admits every value, null too: naming every
	// type keeps that meaning under either rules.
	anyType := openapi3.Types{"null", "boolean", "object", "array", "number", "string"}
	require.NoError(t, doc.WalkSchemas(func(_ string, ref *openapi3.SchemaRef) error {
		if ref.Value.Type == nil {
			ref.Value.Type = &anyType
		}
		return nil
	}))
	router, err := legacy.NewRouter(doc)
	require.NoError(t, err)
	return &contract{bundle: b, router: router, seen: map[string]bool{}}
}

// call sends a request for route (its pattern, for the coverage check),
// checks the status, validates request and response against the
// document, and returns the response.
func (c *contract) call(t *testing.T, route, path, body string, want int) *response {
	t.Helper()
	method, pattern, _ := strings.Cut(route, " ")
	r := c.bundle.do(t, method, path, body)
	require.Equal(t, want, r.status, "%s %s: body: %s", method, path, r.body)

	req, err := http.NewRequest(method, path, strings.NewReader(body))
	require.NoError(t, err)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.bundle.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.bundle.token)
	}
	found, params, err := c.router.FindRoute(req)
	require.NoError(t, err, "%s %s is not in the OpenAPI document", method, path)
	require.Equal(t, pattern, found.Path, "%s %s matched another route of the document", method, path)
	input := &openapi3filter.RequestValidationInput{
		Request:    req,
		PathParams: params,
		Route:      found,
		Options:    &openapi3filter.Options{MultiError: true, AuthenticationFunc: bearerSent},
	}
	var problems []string
	// A refusal may answer a request the document forbids on purpose (an
	// unknown field, a bad parameter): only its response must match.
	if want < 400 {
		if err := openapi3filter.ValidateRequest(t.Context(), input); err != nil {
			problems = append(problems, "request: "+err.Error())
		}
	}
	err = openapi3filter.ValidateResponse(t.Context(), &openapi3filter.ResponseValidationInput{
		RequestValidationInput: input,
		Status:                 r.status,
		Header:                 r.header,
		Body:                   io.NopCloser(bytes.NewReader(r.body)),
		Options:                &openapi3filter.Options{MultiError: true, IncludeResponseStatus: true},
	})
	if err != nil {
		problems = append(problems, "response: "+err.Error())
	}
	if len(problems) > 0 {
		t.Fatalf("%s %s -> %d does not match the OpenAPI document:\n  %s\nbody: %s", method, path, r.status, strings.Join(problems, "\n  "), r.body)
	}
	c.seen[route] = true
	return r
}

// bearerSent checks a request against a security scheme its route
// requires: the scheme is the bearer token or the sign-in cookie the
// server takes, and the request sends it. The server's own tests check
// the values.
func bearerSent(_ context.Context, in *openapi3filter.AuthenticationInput) error {
	req := in.RequestValidationInput.Request
	switch s := in.SecurityScheme; {
	case s.Type == "http" && strings.EqualFold(s.Scheme, "bearer"):
		if !strings.HasPrefix(req.Header.Get("Authorization"), "Bearer ") {
			return errors.New("the request sends no bearer token")
		}
	case s.Type == "apiKey" && s.In == "cookie" && s.Name == "dagrun_token":
		if _, err := req.Cookie(s.Name); err != nil {
			return errors.New("the request sends no sign-in cookie")
		}
	default:
		return fmt.Errorf("security scheme %q is neither the bearer token nor the cookie the server takes", in.SecuritySchemeName)
	}
	return nil
}

// TestOpenAPIDescribesEveryRoute keeps /api/openapi.json true: every route
// the server answers is in the document and the document names no other,
// and real responses of every route, successes and refusals, validate
// against it.
func TestOpenAPIDescribesEveryRoute(t *testing.T) {
	t.Parallel()
	broken := dag.ErrorList{{File: "workflows/broken.yaml", Line: 2, Col: 10, Msg: "timeout 10 has no unit"}}
	b := setup(t, openSQLite, &setupOpts{token: "s3cret", worker: true, workflows: []string{approvalYAML, nightlyYAML, fanoutYAML, guardedYAML, callerYAML},
		invalid: map[string]error{"broken": broken}})
	c := newContract(t, b)

	c.call(t, "GET /healthz", "/healthz", "", http.StatusOK)
	c.call(t, "GET /api/openapi.json", "/api/openapi.json", "", http.StatusOK)
	c.call(t, "GET /metrics", "/metrics", "", http.StatusOK)

	c.call(t, "GET /api/workflows", "/api/workflows", "", http.StatusOK)
	c.call(t, "GET /api/workflows/{name}", "/api/workflows/greet", "", http.StatusOK)
	c.call(t, "GET /api/workflows/{name}", "/api/workflows/approval", "", http.StatusOK)
	c.call(t, "GET /api/workflows/{name}", "/api/workflows/nope", "", http.StatusNotFound)

	started := c.call(t, "POST /api/workflows/{name}/instances", "/api/workflows/greet/instances", `{"input": {"name": "ada"}, "key": "k-1", "priority": 2}`, http.StatusCreated)
	greetID := started.json(t)["id"].(string)
	replay := c.call(t, "POST /api/workflows/{name}/instances", "/api/workflows/greet/instances", `{"input": {"name": "ada"}, "key": "k-1"}`, http.StatusCreated)
	require.Equal(t, "true", replay.header.Get("Idempotent-Replayed"))
	c.call(t, "POST /api/workflows/{name}/instances", "/api/workflows/greet/instances", `{"input": {}}`, http.StatusBadRequest)
	c.call(t, "POST /api/workflows/{name}/instances", "/api/workflows/greet/instances", `{"name": "ada"}`, http.StatusBadRequest)
	c.call(t, "POST /api/workflows/{name}/instances", "/api/workflows/nope/instances", ``, http.StatusNotFound)
	b.wait(t, greetID)
	c.call(t, "GET /api/instances/{id}/definition", "/api/instances/"+greetID+"/definition", "", http.StatusOK)
	c.call(t, "GET /api/instances/{id}/definition", "/api/instances/missing/definition", "", http.StatusNotFound)

	c.call(t, "GET /api/workflows/{name}", "/api/workflows/guarded", "", http.StatusOK)
	guarded := c.call(t, "POST /api/workflows/{name}/instances", "/api/workflows/guarded/instances", "", http.StatusCreated).json(t)["id"].(string)
	c.call(t, "GET /api/instances/{id}", "/api/instances/"+guarded, "", http.StatusOK)
	require.Equal(t, storage.InstanceFailed, b.wait(t, guarded).Status)
	failed := c.call(t, "GET /api/instances/{id}", "/api/instances/"+guarded, "", http.StatusOK).json(t)
	require.Equal(t, "fragile", failed["failedStep"])

	page := c.call(t, "GET /api/instances/{id}/events", "/api/instances/"+greetID+"/events?limit=2", "", http.StatusOK).json(t)
	require.Len(t, page["events"], 2)
	next := fmt.Sprint(page["next"])
	last := c.call(t, "GET /api/instances/{id}/events", "/api/instances/"+greetID+"/events?after="+next+"&limit=1000", "", http.StatusOK).json(t)
	require.NotContains(t, last, "next", "the last page")
	c.call(t, "GET /api/instances/{id}/events", "/api/instances/"+greetID+"/events?after=x", "", http.StatusBadRequest)
	c.call(t, "GET /api/instances/{id}/events", "/api/instances/"+greetID+"/events?limit=1001", "", http.StatusBadRequest)
	c.call(t, "GET /api/instances/{id}/events", "/api/instances/missing/events", "", http.StatusNotFound)
	c.call(t, "GET /api/instances/{id}/logs", "/api/instances/"+greetID+"/logs?limit=10", "", http.StatusOK)
	c.call(t, "GET /api/instances/{id}/logs", "/api/instances/"+greetID+"/logs?after=x", "", http.StatusBadRequest)
	c.call(t, "GET /api/instances/{id}/steps/{step}/logs", "/api/instances/"+greetID+"/steps/hello/logs?after=0", "", http.StatusOK)
	c.call(t, "GET /api/instances/{id}/steps/{step}/logs", "/api/instances/"+greetID+"/steps/nope/logs", "", http.StatusNotFound)

	c.call(t, "GET /api/workflows/{name}", "/api/workflows/caller", "", http.StatusOK)
	caller := c.call(t, "POST /api/workflows/{name}/instances", "/api/workflows/caller/instances", "", http.StatusCreated).json(t)["id"].(string)
	require.Equal(t, storage.InstanceCompleted, b.wait(t, caller).Status)
	c.call(t, "GET /api/instances/{id}", "/api/instances/"+caller, "", http.StatusOK)
	var children []struct {
		ID string `json:"id"`
	}
	require.NoError(t, json.Unmarshal(c.call(t, "GET /api/instances", "/api/instances?parent="+caller, "", http.StatusOK).body, &children))
	require.Len(t, children, 1)
	c.call(t, "GET /api/instances/{id}", "/api/instances/"+children[0].ID, "", http.StatusOK)
	c.call(t, "GET /api/instances", "/api/instances?all=true", "", http.StatusOK)

	c.call(t, "GET /api/instances", "/api/instances", "", http.StatusOK)
	c.call(t, "GET /api/instances", "/api/instances?workflow=greet&status=completed&limit=1", "", http.StatusOK)
	first := c.call(t, "GET /api/instances", "/api/instances?all=true&workflow=greet&status=completed&limit=1", "", http.StatusOK)
	require.NotEmpty(t, first.header.Get("Link"), "greet completed twice (once as caller's child): the first page links to the next")
	c.call(t, "GET /api/instances", "/api/instances?status=bogus", "", http.StatusBadRequest)
	c.call(t, "GET /api/instances/{id}", "/api/instances/"+greetID, "", http.StatusOK)
	c.call(t, "GET /api/instances/{id}", "/api/instances/missing", "", http.StatusNotFound)

	fanout := c.call(t, "POST /api/workflows/{name}/instances", "/api/workflows/fanout/instances", "", http.StatusCreated).json(t)["id"].(string)
	require.Eventually(t, func() bool {
		inst, err := b.engine.Get(t.Context(), fanout)
		return err == nil && inst.Steps[0].Items != nil
	}, 15*time.Second, 10*time.Millisecond)
	c.call(t, "GET /api/instances/{id}/steps/{step}/items", "/api/instances/"+fanout+"/steps/square/items?offset=10&limit=5", "", http.StatusOK)
	c.call(t, "GET /api/instances/{id}/steps/{step}/items", "/api/instances/"+fanout+"/steps/square/items?limit=0", "", http.StatusBadRequest)
	c.call(t, "GET /api/instances/{id}/steps/{step}/items", "/api/instances/"+fanout+"/steps/nope/items", "", http.StatusNotFound)
	// An instance waiting for a signal stays unfinished until cancelled.
	waiting := c.call(t, "POST /api/workflows/{name}/instances", "/api/workflows/approval/instances", "", http.StatusCreated).json(t)["id"].(string)
	c.call(t, "POST /api/instances/{id}/cancel", "/api/instances/"+waiting+"/cancel", "", http.StatusOK)
	c.call(t, "POST /api/instances/{id}/cancel", "/api/instances/"+waiting+"/cancel", "", http.StatusConflict)
	c.call(t, "POST /api/instances/{id}/retry", "/api/instances/"+waiting+"/retry", "", http.StatusOK)
	c.call(t, "POST /api/instances/{id}/retry", "/api/instances/"+greetID+"/retry", "", http.StatusConflict)

	c.call(t, "POST /api/instances/{id}/retry", "/api/instances/"+greetID+"/retry", `{"from": "nope"}`, http.StatusNotFound)
	c.call(t, "POST /api/instances/{id}/retry", "/api/instances/"+greetID+"/retry", `{"from": "shout"}`, http.StatusOK)
	b.wait(t, greetID)

	approval := c.call(t, "POST /api/workflows/{name}/instances", "/api/workflows/approval/instances", "", http.StatusCreated).json(t)["id"].(string)
	c.call(t, "POST /api/instances/{id}/signals/{name}", "/api/instances/"+approval+"/signals/approve", `{"data": {"approved": "yes"}}`, http.StatusBadRequest)
	c.call(t, "POST /api/instances/{id}/signals/{name}", "/api/instances/"+approval+"/signals/nope", `{"data": {"approved": true}}`, http.StatusNotFound)
	c.call(t, "POST /api/instances/{id}/pause", "/api/instances/"+approval+"/pause", "", http.StatusOK)
	c.call(t, "POST /api/instances/{id}/pause", "/api/instances/"+approval+"/pause", "", http.StatusConflict)
	c.call(t, "POST /api/instances/{id}/resume", "/api/instances/"+approval+"/resume", "", http.StatusOK)
	c.call(t, "POST /api/instances/{id}/resume", "/api/instances/"+approval+"/resume", "", http.StatusConflict)
	c.call(t, "POST /api/instances/{id}/signals/{name}", "/api/instances/"+approval+"/signals/approve", `{"data": {"approved": true}, "id": "s-1"}`, http.StatusOK)
	c.call(t, "POST /api/instances/{id}/signals/{name}", "/api/instances/"+approval+"/signals/approve", `{"data": {"approved": false}, "id": "s-2"}`, http.StatusConflict)
	keyed := c.call(t, "POST /api/workflows/{name}/instances", "/api/workflows/approval/instances", `{"key": "order-7"}`, http.StatusCreated).json(t)["id"].(string)
	c.call(t, "GET /api/instances", "/api/instances?workflow=approval&key=order-7", "", http.StatusOK)
	c.call(t, "POST /api/workflows/{name}/signals/{signal}", "/api/workflows/approval/signals/approve", `{"key": "order-7", "data": {"approved": true}}`, http.StatusOK)
	c.call(t, "POST /api/workflows/{name}/signals/{signal}", "/api/workflows/approval/signals/approve", `{"key": "order-8", "data": {"approved": true}}`, http.StatusNotFound)
	c.call(t, "POST /api/workflows/{name}/signals/{signal}", "/api/workflows/approval/signals/approve", `{"data": {}}`, http.StatusBadRequest)
	b.wait(t, keyed)

	skipped := c.call(t, "POST /api/workflows/{name}/instances", "/api/workflows/approval/instances", "", http.StatusCreated).json(t)["id"].(string)
	c.call(t, "POST /api/instances/{id}/steps/{step}/skip", "/api/instances/"+skipped+"/steps/approval/skip", `{"output": {"approved": true}}`, http.StatusOK)
	c.call(t, "POST /api/instances/{id}/steps/{step}/skip", "/api/instances/"+skipped+"/steps/approval/skip", ``, http.StatusConflict)
	c.call(t, "POST /api/instances/{id}/steps/{step}/skip", "/api/instances/"+skipped+"/steps/nope/skip", ``, http.StatusNotFound)
	c.call(t, "POST /api/instances/cancel", "/api/instances/cancel", `{"ids": ["`+skipped+`", "missing"]}`, http.StatusOK)
	c.call(t, "POST /api/instances/retry", "/api/instances/retry", `{"workflow": "approval", "status": "cancelled", "olderThan": "0s"}`, http.StatusOK)
	c.call(t, "POST /api/instances/retry", "/api/instances/retry", `{"ids": ["x"], "workflow": "approval"}`, http.StatusBadRequest)
	c.call(t, "POST /api/instances/cancel", "/api/instances/cancel", `{"workflow": "approval"}`, http.StatusOK)

	c.call(t, "POST /api/queues/{name}", "/api/queues/default", `{"concurrency": 4, "rate": "100/s"}`, http.StatusOK)
	c.call(t, "POST /api/queues/{name}", "/api/queues/default", `{"rate": "fast"}`, http.StatusBadRequest)
	c.call(t, "GET /api/queues", "/api/queues", "", http.StatusOK)
	c.call(t, "POST /api/queues/{name}", "/api/queues/default", `{"concurrency": 0, "rate": "none"}`, http.StatusOK)

	c.call(t, "GET /api/schedules", "/api/schedules?next=2", "", http.StatusOK)
	c.call(t, "GET /api/schedules", "/api/schedules?next=0", "", http.StatusBadRequest)
	c.call(t, "POST /api/schedules/{workflow}/{index}/pause", "/api/schedules/nightly/1/pause", "", http.StatusOK)
	c.call(t, "POST /api/schedules/{workflow}/{index}/resume", "/api/schedules/nightly/1/resume", "", http.StatusOK)
	c.call(t, "POST /api/schedules/{workflow}/{index}/pause", "/api/schedules/nightly/7/pause", "", http.StatusNotFound)
	c.call(t, "POST /api/schedules/{workflow}/{index}/resume", "/api/schedules/nightly/x/resume", "", http.StatusBadRequest)

	// A workflow whose file has errors is named as such wherever a route
	// takes a workflow's name.
	c.call(t, "GET /api/workflows/{name}", "/api/workflows/broken", "", http.StatusUnprocessableEntity)
	c.call(t, "POST /api/workflows/{name}/instances", "/api/workflows/broken/instances", "", http.StatusUnprocessableEntity)
	c.call(t, "POST /api/workflows/{name}/signals/{signal}", "/api/workflows/broken/signals/approve", `{"key": "k"}`, http.StatusUnprocessableEntity)
	c.call(t, "POST /api/instances/cancel", "/api/instances/cancel", `{"workflow": "broken"}`, http.StatusUnprocessableEntity)
	c.call(t, "POST /api/instances/retry", "/api/instances/retry", `{"workflow": "broken"}`, http.StatusUnprocessableEntity)
	c.call(t, "POST /api/schedules/{workflow}/{index}/pause", "/api/schedules/broken/0/pause", "", http.StatusUnprocessableEntity)
	c.call(t, "POST /api/schedules/{workflow}/{index}/resume", "/api/schedules/broken/0/resume", "", http.StatusUnprocessableEntity)

	// Without the token every route but /healthz is a 401.
	token := b.token
	b.token = ""
	c.call(t, "GET /api/instances", "/api/instances", "", http.StatusUnauthorized)
	c.call(t, "GET /api/openapi.json", "/api/openapi.json", "", http.StatusUnauthorized)
	// Too many wrong tokens from one address: a 429, right tokens too.
	web.SetGuessLimit(b.web, 1, time.Minute, time.Now)
	b.token = "wrong"
	c.call(t, "GET /api/instances", "/api/instances", "", http.StatusUnauthorized)
	c.call(t, "GET /api/instances", "/api/instances", "", http.StatusTooManyRequests)
	b.token = token
	c.call(t, "GET /api/instances", "/api/instances", "", http.StatusTooManyRequests)
	web.SetGuessLimit(b.web, 1, time.Minute, time.Now)

	routes := serverRoutes(t, b)
	documented := documentedRoutes(t, b)
	require.ElementsMatch(t, routes, documented, "the OpenAPI document describes exactly the server's routes")
	for _, route := range routes {
		require.True(t, c.seen[route], "route %s has no validated response in this test: add a call", route)
	}
}

// serverRoutes are the routes the server registers.
func serverRoutes(t *testing.T, b *testBundle) []string {
	t.Helper()
	srv, err := web.NewServer(b.engine, &web.Config{Metrics: b.metrics})
	require.NoError(t, err)
	return srv.Routes()
}

// documentedRoutes are the operations of the served document, as
// "METHOD /path" patterns.
func documentedRoutes(t *testing.T, b *testBundle) []string {
	t.Helper()
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	require.NoError(t, json.Unmarshal(b.do(t, http.MethodGet, "/api/openapi.json", "").body, &doc))
	var out []string
	for path, item := range doc.Paths {
		for method := range item {
			if slices.Contains([]string{"get", "post", "put", "patch", "delete"}, method) {
				out = append(out, strings.ToUpper(method)+" "+path)
			}
		}
	}
	return out
}

// TestOpenAPIIsServed: the document is OpenAPI 3.1 and, like every route
// but /healthz, needs the token.
func TestOpenAPIIsServed(t *testing.T) {
	t.Parallel()
	b := setup(t, openSQLite, &setupOpts{token: "s3cret"})
	anon := &testBundle{server: b.server}
	requireError(t, anon.do(t, http.MethodGet, "/api/openapi.json", ""), http.StatusUnauthorized, "missing token")
	r := b.do(t, http.MethodGet, "/api/openapi.json", "")
	require.Equal(t, http.StatusOK, r.status)
	var doc map[string]any
	require.NoError(t, json.Unmarshal(r.body, &doc))
	require.Equal(t, "3.1.0", doc["openapi"])
	want, err := web.OpenAPI()
	require.NoError(t, err)
	require.JSONEq(t, string(want), string(r.body))
}
