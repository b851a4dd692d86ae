package web

import (
	"net/http"

	"github.com/dagrun/dagrun"
	"github.com/dagrun/dagrun/cmd/dagrun/app/view"
)

// listQueues is GET /api/queues: every queue with a limit or with ready,
// held, running or scheduled steps.
func (s *Server) listQueues(w http.ResponseWriter, r *http.Request) {
	list, err := s.engine.Queues(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, view.NewQueues(list))
}

// queueLimitRequest is the body of POST /api/queues/{name}: a field left
// out keeps its limit; 0 and "none" clear one.
type queueLimitRequest struct {
	Concurrency *wholeNumber `json:"concurrency"`
	Rate        *string      `json:"rate"`
}

// setQueueLimit is POST /api/queues/{name}; it answers with the queue
// object as it now is.
func (s *Server) setQueueLimit(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	var req queueLimitRequest
	if err := decodeBody(r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	if req.Concurrency == nil && req.Rate == nil {
		writeError(w, http.StatusBadRequest, `give "concurrency" (a number, 0: no limit), "rate" ("N/DUR" such as "10/s", or "none") or both`)
		return
	}
	change := dagrun.QueueLimitChange{Queue: name}
	if req.Concurrency != nil {
		n := int(*req.Concurrency)
		change.Concurrency = &n
	}
	if req.Rate != nil {
		n, per, err := dagrun.ParseRate(*req.Rate)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		change.Rate = &dagrun.QueueRate{Rate: n, Per: per}
	}
	if _, err := s.engine.ChangeQueueLimit(r.Context(), change); err != nil {
		s.fail(w, r, err)
		return
	}
	list, err := s.engine.Queues(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := view.Queue{Queue: name}
	for _, q := range view.NewQueues(list) {
		if q.Queue == name {
			out = q
		}
	}
	writeJSON(w, http.StatusOK, out)
}
