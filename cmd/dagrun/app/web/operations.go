package web

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"unicode"

	"github.com/dagrun/dagrun"
	"github.com/dagrun/dagrun/cmd/dagrun/app/view"
	"github.com/dagrun/dagrun/storage"
)

// operationRoutes adds the operations on instances: skip a step, pause and
// resume, and cancel or retry many instances at once. (Retry from a step
// is POST /api/instances/{id}/retry with {"from": STEP}.)
func (s *Server) operationRoutes(api func(string, http.HandlerFunc)) {
	api("POST /api/instances/{id}/steps/{step}/skip", s.skipStep)
	api("POST /api/instances/{id}/pause", s.onInstance((*dagrun.Engine).Pause))
	api("POST /api/instances/{id}/resume", s.onInstance((*dagrun.Engine).Resume))
	api("POST /api/instances/cancel", s.bulk("cancelled", (*dagrun.Engine).Cancel, (*dagrun.Engine).CancelSelected))
	api("POST /api/instances/retry", s.bulk("retried", (*dagrun.Engine).Retry, (*dagrun.Engine).RetrySelected))
	for _, pattern := range postOnlyReads {
		s.mux.HandleFunc(pattern, postOnly) // a refusal, not a route of the API's
	}
}

// postOnlyReads are the reads of the bulk operations' paths, which GET
// /api/instances/{id} would otherwise take for an instance named "cancel"
// or "retry" and answer 404: they are answered 405, as any other method
// a route does not serve (Server.noRoute). They still need the token.
var postOnlyReads = []string{"GET /api/instances/cancel", "GET /api/instances/retry"}

func postOnly(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Allow", http.MethodPost)
	writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s is not allowed on %s (allowed: %s)", r.Method, r.URL.Path, http.MethodPost))
}

// tokenNameSyntax is what a named token's name may be: it is shown in the
// history as who did what. Its length, at most 64, is checked apart: a
// counted repetition ({0,63}) compiles into as many copies of its class,
// built at every process start.
var tokenNameSyntax = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._@-]*$`)

// CheckTokenSecret refuses a token's secret that no client could send:
// an Authorization header drops the spaces around it, and carries no
// control character.
func CheckTokenSecret(secret string) error {
	if strings.TrimSpace(secret) != secret {
		return errors.New("the token begins or ends with whitespace, which an Authorization header drops: give it without")
	}
	if strings.ContainsFunc(secret, unicode.IsControl) {
		return errors.New("the token holds a control character (a newline, a tab), which an Authorization header cannot carry")
	}
	return nil
}

// CheckTokenName reports why name cannot name a token.
func CheckTokenName(name string) error {
	if len(name) > 64 || !tokenNameSyntax.MatchString(name) {
		return fmt.Errorf("invalid token name %q: use 1 to 64 letters, digits, '.', '_', '@' or '-', starting with a letter or digit", name)
	}
	return nil
}

// failOperation writes an operation's refusal (409 for a state that does
// not allow it, 404 for an unknown instance or step) or any other error.
func (s *Server) failOperation(w http.ResponseWriter, r *http.Request, id string, err error) {
	var refusal *storage.RefusalError
	if errors.As(err, &refusal) {
		status := http.StatusConflict
		if errors.Is(err, storage.ErrNotFound) {
			status = http.StatusNotFound
		}
		writeError(w, status, refusal.Reason)
		return
	}
	s.failInstance(w, r, id, err)
}

// retryRequest is the optional body of POST /api/instances/{id}/retry.
type retryRequest struct {
	// From, when set, re-runs this step and every step downstream of it.
	From *string `json:"from"`
}

// retryFrom handles a retry whose body names a step; it reports false,
// having written nothing, for a plain retry.
func (s *Server) retryFrom(w http.ResponseWriter, r *http.Request, id string) bool {
	var req retryRequest
	if err := decodeBody(r, &req); err != nil {
		s.fail(w, r, err)
		return true
	}
	if req.From == nil {
		return false
	}
	if *req.From == "" {
		s.fail(w, r, &requestError{status: http.StatusBadRequest, msg: `"from" is empty: name the step to re-run from, or leave "from" out to retry the failed and cancelled steps`})
		return true
	}
	if err := s.engine.RetryFrom(r.Context(), id, *req.From); err != nil {
		s.failOperation(w, r, id, err)
		return true
	}
	s.writeInstance(w, r, http.StatusOK, id)
	return true
}

// skipRequest is the body of POST /api/instances/{id}/steps/{step}/skip.
type skipRequest struct {
	// Output is the step's output; absent means null.
	Output json.RawMessage `json:"output"`
}

func (s *Server) skipStep(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	var req skipRequest
	if err := decodeBody(r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	if err := s.engine.Skip(r.Context(), id, r.PathValue("step"), req.Output); err != nil {
		s.failOperation(w, r, id, err)
		return
	}
	s.writeInstance(w, r, http.StatusOK, id)
}

// onInstance handles POST /api/instances/{id}/VERB: run op, answer the
// instance object.
func (s *Server) onInstance(op func(*dagrun.Engine, context.Context, string) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		if !s.noFields(w, r) {
			return
		}
		if err := op(s.engine, r.Context(), id); err != nil {
			s.failOperation(w, r, id, err)
			return
		}
		s.writeInstance(w, r, http.StatusOK, id)
	}
}

// bulkRequest is the body of POST /api/instances/cancel and /retry: either
// IDs, or a filter (a workflow, a status or both, and an age such as "30d"
// or "12h").
type bulkRequest struct {
	IDs       []string               `json:"ids"`
	Workflow  string                 `json:"workflow"`
	Status    storage.InstanceStatus `json:"status"`
	OlderThan string                 `json:"olderThan"`
	// All picks child instances too, as the list's all=true shows them.
	All bool `json:"all"`
}

// bulkResponse tells how many instances a bulk operation changed and, for
// IDs, which it left as they were and why.
type bulkResponse struct {
	Count   int               `json:"count"`
	Skipped map[string]string `json:"skipped,omitempty"`
}

// maxBulkIDs bounds the IDs of one bulk request.
const maxBulkIDs = 1000

func (s *Server) bulk(done string, one func(*dagrun.Engine, context.Context, string) error,
	selected func(*dagrun.Engine, context.Context, dagrun.Selection) (int, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req bulkRequest
		if err := decodeBody(r, &req); err != nil {
			s.fail(w, r, err)
			return
		}
		filter := req.Workflow != "" || req.Status != "" || req.OlderThan != "" || req.All
		// An ids list, even an empty one, is the selection: a client that
		// sends the list it picked beside the filter it picked from must not
		// act on the whole filter when it picked nothing.
		ids := req.IDs != nil
		switch {
		case ids && filter:
			writeError(w, http.StatusBadRequest, "give either ids or a filter (workflow, status, olderThan, all), not both")
			return
		case len(req.IDs) > maxBulkIDs:
			writeError(w, http.StatusBadRequest, fmt.Sprintf("%d ids are over the limit of %d; use a filter or several requests", len(req.IDs), maxBulkIDs))
			return
		case ids:
			out := bulkResponse{}
			seen := make(map[string]bool, len(req.IDs))
			for _, id := range req.IDs {
				if seen[id] {
					continue // one instance, acted on once: not done and refused too
				}
				seen[id] = true
				err := one(s.engine, r.Context(), id)
				switch {
				case err == nil:
					out.Count++
				case errors.Is(err, storage.ErrConflict), errors.Is(err, storage.ErrNotFound):
					if out.Skipped == nil {
						out.Skipped = map[string]string{}
					}
					out.Skipped[id] = refusalText(id, err)
				default:
					s.fail(w, r, fmt.Errorf("%s %d instances, then: %w", done, out.Count, err))
					return
				}
			}
			writeJSON(w, http.StatusOK, out)
			return
		}
		sel := dagrun.Selection{Workflow: req.Workflow, Status: req.Status, Children: req.All}
		if req.OlderThan != "" {
			d, err := view.ParseAge(req.OlderThan)
			if err != nil {
				writeError(w, http.StatusBadRequest, view.AgeError("olderThan", req.OlderThan, err).Error())
				return
			}
			sel.OlderThan = d
		}
		if err := sel.Validate(); err != nil {
			writeError(w, http.StatusBadRequest, err.Error()+" (or send ids)")
			return
		}
		n, err := selected(s.engine, r.Context(), sel)
		if err != nil && n > 0 {
			err = fmt.Errorf("%s %d instances, then: %w", done, n, err)
		}
		if err != nil {
			s.fail(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, bulkResponse{Count: n})
	}
}

// refusalText says in one line why the operation left instance id as it
// was.
func refusalText(id string, err error) string {
	var refusal *storage.RefusalError
	switch {
	case errors.As(err, &refusal):
		return refusal.Reason
	case errors.Is(err, storage.ErrNotFound):
		return fmt.Sprintf("no instance with ID %s", view.QuoteShort(id))
	}
	return strings.TrimSuffix(err.Error(), ": "+storage.ErrConflict.Error())
}
