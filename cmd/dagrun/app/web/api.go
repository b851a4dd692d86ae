package web

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/google/uuid"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"unicode/utf8"

	"go.opentelemetry.io/otel/propagation"

	"github.com/dagrun/dagrun"
	"github.com/dagrun/dagrun/cmd/dagrun/app/view"
	"github.com/dagrun/dagrun/dag"
	"github.com/dagrun/dagrun/handlers"
	"github.com/dagrun/dagrun/storage"
)

// List limits of GET /api/instances.
const (
	defaultListLimit = 50
	maxListLimit     = 500
)

// workflowSummary is one item of GET /api/workflows, which answers a bare
// array as every list of the API does.
type workflowSummary struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	Steps       int    `json:"steps"`
	Hash        string `json:"hash"`
}

func (s *Server) listWorkflows(w http.ResponseWriter, _ *http.Request) {
	out := []workflowSummary{}
	for _, wf := range s.engine.Workflows() {
		out = append(out, workflowSummary{Name: wf.Name, Description: wf.Description, Steps: len(wf.Steps), Hash: wf.Hash})
	}
	writeJSON(w, http.StatusOK, out)
}

// workflowDetail is GET /api/workflows/{name}.
type workflowDetail struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Hash        string          `json:"hash"`
	InputSchema json.RawMessage `json:"inputSchema"`
	Source      string          `json:"source"`
	Steps       []stepDef       `json:"steps"`
	Graph       *Graph          `json:"graph"`
	// Timeout is the workflow timeout; OnFailure the steps run when an
	// instance fails (drawn below the others in Graph). Absent when unset.
	Timeout   *string   `json:"timeout,omitempty"`
	OnFailure []stepDef `json:"onFailure,omitempty"`
	// Concurrency is the workflow's concurrency limit; Schedule its
	// schedule: list as written (GET /api/schedules has their state).
	// Absent when unset.
	Concurrency *concurrencyDef `json:"concurrency,omitempty"`
	Schedule    []scheduleDef   `json:"schedule,omitempty"`
}

// concurrencyDef is a concurrency mapping: at most Limit instances (or
// running steps of one name) share one value of Key, the expression as
// written; null Key: all share one group.
type concurrencyDef struct {
	Key   *string `json:"key"`
	Limit int     `json:"limit"`
}

func newConcurrencyDef(c *dag.Concurrency) *concurrencyDef {
	if c == nil {
		return nil
	}
	d := &concurrencyDef{Limit: c.Limit}
	if c.Key != nil {
		d.Key = &c.KeySource
	}
	return d
}

// scheduleDef is an entry of a workflow's schedule: list.
type scheduleDef struct {
	Index    int             `json:"index"`
	Cron     string          `json:"cron"`
	Timezone string          `json:"timezone"`
	Input    json.RawMessage `json:"input"`
	Overlap  string          `json:"overlap"`
	Catchup  string          `json:"catchup"`
}

// stepDef is a step of a definition, with the workflow defaults applied.
type stepDef struct {
	Name            string    `json:"name"`
	Handler         string    `json:"handler"`
	DependsOn       []string  `json:"dependsOn"`
	Queue           string    `json:"queue"`
	Retry           retryJSON `json:"retry"`
	Timeout         *string   `json:"timeout"`
	When            *string   `json:"when"`
	ContinueOnError bool      `json:"continueOnError"`
	// ForEach marks a step that runs once per element of a list;
	// Concurrency caps its items running at once (0: no cap).
	ForEach     bool `json:"forEach"`
	Concurrency int  `json:"concurrency"`
	// ConcurrencyLimit is a step-level concurrency written as {key,
	// limit}: at most limit running steps of this name share one key
	// value. Absent without one.
	ConcurrencyLimit *concurrencyDef `json:"concurrencyLimit,omitempty"`
	// Wait is a wait step's wait (its handler is empty); null for others.
	Wait *waitDef `json:"wait"`
	// Workflow is the child workflow a workflow step runs (its handler is
	// empty); absent for others.
	Workflow string `json:"workflow,omitempty"`
}

// waitDef is what a wait step waits for. The UI reads Schema to offer
// approve/reject buttons or a JSON editor.
type waitDef struct {
	Signal string `json:"signal"`
	// Timeout is a Go duration string; null when it waits for ever.
	Timeout *string         `json:"timeout"`
	Schema  json.RawMessage `json:"schema"`
}

type retryJSON struct {
	MaxAttempts int    `json:"maxAttempts"`
	Backoff     string `json:"backoff"`
	MaxBackoff  string `json:"maxBackoff"`
}

func (s *Server) getWorkflow(w http.ResponseWriter, r *http.Request) {
	wf, ok := s.engine.Workflow(r.PathValue("name"))
	if !ok {
		s.fail(w, r, s.engine.UnknownWorkflow(r.PathValue("name")))
		return
	}
	writeJSON(w, http.StatusOK, newWorkflowDetail(wf))
}

func newWorkflowDetail(wf *dag.Workflow) workflowDetail {
	out := workflowDetail{
		Name:        wf.Name,
		Description: wf.Description,
		Hash:        wf.Hash,
		InputSchema: view.RawOrNull(wf.InputSchema),
		Source:      string(wf.Source),
		Steps:       make([]stepDef, len(wf.Steps)),
	}
	gs := make([]graphStep, len(wf.Steps))
	for i, st := range wf.Steps {
		out.Steps[i] = newStepDef(st)
		gs[i] = graphStep{Name: st.Name, DependsOn: st.DependsOn}
	}
	out.Graph = layoutGraph(gs)
	addOnFailure(&out, wf)
	out.Graph.Mermaid = wf.Mermaid()
	out.Concurrency = newConcurrencyDef(wf.Concurrency)
	for _, sc := range wf.Schedules {
		out.Schedule = append(out.Schedule, scheduleDef{
			Index: sc.Index, Cron: sc.Cron, Timezone: sc.Timezone, Input: view.RawOrNull(sc.Input),
			Overlap: string(sc.Overlap), Catchup: storage.FormatDuration(sc.Catchup),
		})
	}
	return out
}

// newStepDef is a step of a definition as the API shows it.
func newStepDef(st *dag.Step) stepDef {
	deps := st.DependsOn
	if deps == nil {
		deps = []string{}
	}
	d := stepDef{
		Name:      st.Name,
		Handler:   st.Handler,
		DependsOn: deps,
		Queue:     st.Queue,
		Retry: retryJSON{
			MaxAttempts: st.Retry.MaxAttempts,
			Backoff:     storage.FormatDuration(st.Retry.Backoff),
			MaxBackoff:  storage.FormatDuration(st.Retry.MaxBackoff),
		},
		ContinueOnError:  st.ContinueOnError,
		ForEach:          st.ForEach != nil,
		Concurrency:      st.Concurrency,
		ConcurrencyLimit: newConcurrencyDef(st.KeyConcurrency),
		Workflow:         st.Workflow,
	}
	if st.Timeout > 0 {
		t := storage.FormatDuration(st.Timeout)
		d.Timeout = &t
	}
	if st.When != nil {
		when := st.When.String()
		d.When = &when
	}
	if st.Wait != nil {
		d.Wait = &waitDef{Signal: st.Wait.Signal, Schema: view.RawOrNull(st.Wait.Schema)}
		if st.Wait.Timeout > 0 {
			t := storage.FormatDuration(st.Wait.Timeout)
			d.Wait.Timeout = &t
		}
	}
	return d
}

// startRequest is the body of POST /api/workflows/{name}/instances.
type startRequest struct {
	Input    json.RawMessage `json:"input"`
	Key      string          `json:"key"`
	Priority wholeNumber     `json:"priority"`
	// Delay is a duration such as "10s", "1h30m" or "2d".
	Delay string `json:"delay"`
}

func (s *Server) startInstance(w http.ResponseWriter, r *http.Request) {
	var req startRequest
	if err := decodeBody(r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	opts := dagrun.StartOptions{Key: req.Key, Priority: int(req.Priority)}
	if req.Delay != "" {
		d, err := view.ParseDuration(req.Delay) // days and weeks too, as the CLI's --delay
		if err != nil {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("invalid delay %q: use a duration such as \"30s\", \"5m\" or \"2d\"", req.Delay))
			return
		}
		opts.Delay = d
	}
	// A traceparent header makes the instance's span a child of the
	// caller's; an invalid one is ignored, as W3C Trace Context asks.
	ctx := propagation.TraceContext{}.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	res, err := s.engine.Start(ctx, r.PathValue("name"), req.Input, &opts)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	inst, err := s.engine.Get(r.Context(), res.ID)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	// A repeat with the key answers as the first start did, so a client
	// that retries a start it never saw the answer of needs no other
	// branch; the header tells one that cares that nothing was started.
	if res.Existed {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	w.Header().Set("Location", "/api/instances/"+res.ID)
	writeJSON(w, http.StatusCreated, view.NewInstance(inst))
}

// listInstances is GET /api/instances: a JSON array of instance objects,
// newest first, as `dagrun list --json` prints it. The next page, when
// there is one, is in the Link header, so the body stays the bare array.
func (s *Server) listInstances(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	p := storage.ListParams{Workflow: q.Get("workflow"), Key: q.Get("key"), BeforeID: q.Get("before"), Limit: defaultListLimit, Parent: q.Get("parent")}
	// Top-level instances only, unless ?all=true or ?parent=ID (a child
	// is listed under its parent).
	switch all := q.Get("all"); all {
	case "", "false":
		p.TopLevel = p.Parent == ""
	case "true":
	default:
		writeError(w, http.StatusBadRequest, fmt.Sprintf("invalid all %q: use true or false", all))
		return
	}
	if st := q.Get("status"); st != "" {
		switch status := storage.InstanceStatus(st); status {
		case storage.InstancePending, storage.InstanceRunning, storage.InstanceCompleted, storage.InstanceFailed, storage.InstanceCancelled:
			p.Status = status
		default:
			writeError(w, http.StatusBadRequest, fmt.Sprintf("invalid status %q: use pending, running, completed, failed or cancelled", st))
			return
		}
	}
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > maxListLimit {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("invalid limit %q: use a number from 1 to %d", l, maxListLimit))
			return
		}
		p.Limit = n
	}
	if p.BeforeID != "" {
		// A cursor is the ID of the last instance of a page (the Link
		// header's): any other text would page from wherever it sorts.
		if _, err := uuid.Parse(p.BeforeID); err != nil || len(p.BeforeID) != 36 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("invalid page cursor (before) %s: use an instance ID, as the Link header of the previous page gives it", view.QuoteShort(p.BeforeID)))
			return
		}
	}
	// One more than asked tells whether another page exists.
	want := p.Limit
	p.Limit++
	list, err := s.engine.List(r.Context(), p)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := make([]view.Instance, 0, min(len(list), want))
	for i := range list {
		if i == want {
			w.Header().Set("Link", nextLink(r, "before", list[i-1].ID))
			break
		}
		out = append(out, view.NewInstance(&list[i]))
	}
	writeJSON(w, http.StatusOK, out)
}

// nextLink is a Link header (RFC 8288) to the page after this one: the
// request's URL with param set to value, so the filters and the limit
// carry over.
func nextLink(r *http.Request, param, value string) string {
	q := r.URL.Query()
	q.Set(param, value)
	u := url.URL{Path: r.URL.Path, RawQuery: q.Encode()}
	return "<" + u.String() + `>; rel="next"`
}

// instanceDetail is GET /api/instances/{id}: the instance object plus its
// steps laid out as a graph, so the UI draws it without a layout engine.
type instanceDetail struct {
	view.Instance
	Graph *Graph `json:"graph"`
}

func (s *Server) getInstance(w http.ResponseWriter, r *http.Request) {
	s.writeInstance(w, r, http.StatusOK, r.PathValue("id"))
}

// getInstanceDefinition is GET /api/instances/{id}/definition: the
// definition the instance runs under, the snapshot it started with, in the
// shape of GET /api/workflows/{name}. The file may have changed since (a
// wait step's schema, say), and a client that builds a form for the
// instance must read this one.
func (s *Server) getInstanceDefinition(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	inst, err := s.engine.Get(r.Context(), id)
	if err != nil {
		s.failInstance(w, r, id, err)
		return
	}
	wf, err := s.engine.Definition(inst)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, newWorkflowDetail(wf))
}

func (s *Server) writeInstance(w http.ResponseWriter, r *http.Request, status int, id string) {
	inst, err := s.engine.Get(r.Context(), id)
	if err != nil {
		s.failInstance(w, r, id, err)
		return
	}
	writeJSON(w, status, instanceDetail{Instance: view.NewInstance(inst), Graph: instanceGraph(inst.Steps)})
}

// listItems is GET /api/instances/{id}/steps/{step}/items: a page of a
// forEach step's items in index order (?offset=, ?limit=, ?status=), so a
// step of 10,000 items is read a page at a time, never all at once.
func (s *Server) listItems(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	p := storage.ItemsParams{InstanceID: r.PathValue("id"), Step: r.PathValue("step"), Limit: view.DefaultItemLimit}
	for _, v := range []struct {
		name string
		dst  *int
	}{{"offset", &p.Offset}, {"limit", &p.Limit}} {
		raw := q.Get(v.name)
		if raw == "" {
			continue
		}
		n, err := strconv.Atoi(raw)
		if err != nil {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("invalid %s %q: want a whole number", v.name, raw))
			return
		}
		*v.dst = n
	}
	if err := view.CheckItemPaging(p.Offset, p.Limit, ""); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	status, err := view.ParseItemStatus(q.Get("status"))
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	p.Status = status
	page, err := view.LoadItems(r.Context(), s.engine.Store(), p, view.ForEachOf(s.engine))
	var (
		noStep     *view.StepNotFoundError
		notForEach *view.NotForEachError
	)
	switch {
	case errors.As(err, &noStep), errors.As(err, &notForEach):
		writeError(w, http.StatusNotFound, err.Error())
	case err != nil:
		s.failInstance(w, r, p.InstanceID, err)
	default:
		writeJSON(w, http.StatusOK, page.Page())
	}
}

func (s *Server) cancelInstance(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if !s.noFields(w, r) {
		return
	}
	if err := s.engine.Cancel(r.Context(), id); err != nil {
		s.failInstance(w, r, id, err)
		return
	}
	s.writeInstance(w, r, http.StatusOK, id)
}

func (s *Server) retryInstance(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if s.retryFrom(w, r, id) {
		return
	}
	if err := s.engine.Retry(r.Context(), id); err != nil {
		s.failInstance(w, r, id, err)
		return
	}
	s.writeInstance(w, r, http.StatusOK, id)
}

// decodeBody reads a JSON request body into v. An empty body leaves v
// zero. Unknown fields are errors, so a typo ("prority") is not silently
// ignored.
func decodeBody(r *http.Request, v any) error {
	data, err := io.ReadAll(r.Body)
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return &requestError{status: http.StatusRequestEntityTooLarge, msg: fmt.Sprintf("request body is over the limit of %d bytes", tooBig.Limit)}
		}
		return &requestError{status: http.StatusBadRequest, msg: "read request body: " + err.Error()}
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil
	}
	if ct := r.Header.Get("Content-Type"); ct != "" && !jsonContentType(ct) {
		return &requestError{status: http.StatusUnsupportedMediaType, msg: fmt.Sprintf("request body must be JSON (Content-Type: application/json), got %q", ct)}
	}
	// encoding/json would read U+FFFD in place of each bad byte or
	// unpaired \uD800-\uDFFF escape, and two different keys could name
	// one instance.
	if !utf8.Valid(data) {
		return &requestError{status: http.StatusBadRequest, msg: "invalid request body: it is not valid UTF-8"}
	}
	if storage.LoneSurrogate(data) {
		return &requestError{status: http.StatusBadRequest, msg: "invalid request body: it escapes half of a UTF-16 surrogate pair (\\uD800-\\uDFFF), which is no character"}
	}
	if err := checkFieldNames(data, v); err != nil {
		return &requestError{status: http.StatusBadRequest, msg: "invalid request body: " + err.Error()}
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return &requestError{status: http.StatusBadRequest, msg: "invalid request body: " + handlers.DecodeProblem(err)}
	}
	if dec.More() {
		return &requestError{status: http.StatusBadRequest, msg: "invalid request body: more than one JSON value"}
	}
	return nil
}

// noFields refuses, answering it, a request to a route that takes no body
// fields but got some: a mistake to report, not to ignore. It reports
// whether the request may go on.
func (s *Server) noFields(w http.ResponseWriter, r *http.Request) bool {
	if err := decodeBody(r, &struct{}{}); err != nil {
		s.fail(w, r, err)
		return false
	}
	return true
}

// jsonContentType reports whether a body of this type is read as JSON:
// application/json and +json types, and the types curl -d and other plain
// clients send by default (form-urlencoded, text/plain), whose body is then
// parsed as JSON like any other. Cross-site requests of those types are
// refused by the server's cross-origin protection, not by their type.
func jsonContentType(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return false
	}
	switch {
	case mt == "application/json", strings.HasSuffix(mt, "+json"):
		return true
	case mt == "application/x-www-form-urlencoded", mt == "text/plain":
		return true
	}
	return false
}

// requestError is a client error found before the engine was called.
type requestError struct {
	status int
	msg    string
}

func (e *requestError) Error() string { return e.msg }

// failInstance is fail with a not-found message that names the instance.
func (s *Server) failInstance(w http.ResponseWriter, r *http.Request, id string, err error) {
	if errors.Is(err, storage.ErrNotFound) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no instance with ID %s", view.QuoteShort(id)))
		return
	}
	s.fail(w, r, err)
}

// fail maps an error to a status code and writes it. Client errors carry
// their message; unexpected errors are logged and described only vaguely,
// since their text may expose database details.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	var (
		reqErr    *requestError
		inputErr  *dagrun.InputError
		argErr    *dagrun.ArgumentError
		signalErr *dagrun.SignalDataError
		unknown   *dagrun.UnknownWorkflowError
		noSignal  *dagrun.UnknownSignalError
		tooBig    *http.MaxBytesError
	)
	switch {
	case errors.As(err, &reqErr):
		writeError(w, reqErr.status, reqErr.msg)
	case errors.As(err, &tooBig):
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body is over the limit of %d bytes", tooBig.Limit))
	case errors.As(err, &inputErr), errors.As(err, &argErr), errors.As(err, &signalErr):
		writeError(w, http.StatusBadRequest, err.Error())
	case errors.As(err, &unknown) && unknown.Invalid != nil:
		writeError(w, http.StatusUnprocessableEntity, err.Error())
	case errors.As(err, &unknown), errors.As(err, &noSignal):
		writeError(w, http.StatusNotFound, err.Error())
	case errors.Is(err, storage.ErrNotFound):
		writeError(w, http.StatusNotFound, refusalReason(err))
	case errors.Is(err, storage.ErrConflict):
		writeError(w, http.StatusConflict, refusalReason(err))
	case errors.Is(err, storage.ErrUnavailable):
		s.logger.ErrorContext(r.Context(), "web: storage unavailable", slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.Any("error", err))
		writeError(w, http.StatusServiceUnavailable, "storage unavailable; try again later")
	case errors.Is(err, context.Canceled) && r.Context().Err() != nil:
		// The client went away; nobody reads this.
		writeError(w, http.StatusServiceUnavailable, "request cancelled")
	default:
		s.logger.ErrorContext(r.Context(), "web: request failed", slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.Any("error", err))
		writeError(w, http.StatusInternalServerError, "internal server error; see the server log")
	}
}

// refusalReason is the message of a refused request: a store's reason,
// without the layers it went through, when it gave one.
func refusalReason(err error) string {
	var refusal *storage.RefusalError
	if errors.As(err, &refusal) {
		return refusal.Reason
	}
	return err.Error()
}
