package web

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"

	"gopkg.in/yaml.v3"
)

// openAPISource describes the HTTP API in OpenAPI 3.1. It is written in
// YAML, which reads better than JSON for a document this long, and served
// as JSON; TestOpenAPIDescribesEveryRoute validates real responses of every
// route against it, so it cannot drift from the code.
//
//go:embed openapi.yaml
var openAPISource []byte

// openAPIJSON converts the document once, on first request.
var openAPIJSON = sync.OnceValues(func() ([]byte, error) {
	var doc any
	if err := yaml.Unmarshal(openAPISource, &doc); err != nil {
		return nil, fmt.Errorf("web: openapi.yaml: %w", err)
	}
	return json.Marshal(doc)
})

// OpenAPI returns the OpenAPI 3.1 description of the HTTP API as JSON.
func OpenAPI() ([]byte, error) { return openAPIJSON() }

// serveOpenAPI answers GET /api/openapi.json. Like every route but
// /healthz it needs the token: the document holds no data, but it tells
// a stranger what the server is and what it can do.
func (s *Server) serveOpenAPI(w http.ResponseWriter, r *http.Request) {
	doc, err := openAPIJSON()
	if err != nil {
		s.fail(w, r, err)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/json; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	_, _ = w.Write(doc)
}
