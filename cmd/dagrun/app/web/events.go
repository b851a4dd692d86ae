package web

import (
	"net/http"

	"github.com/dagrun/dagrun/cmd/dagrun/app/view"
	"github.com/dagrun/dagrun/storage"
)

// listEvents is GET /api/instances/{id}/events: a page of the instance's
// history in ID order, the events after the asked ID (?after=, ?limit=),
// so a history of any length is read a page at a time.
func (s *Server) listEvents(w http.ResponseWriter, r *http.Request) {
	after, limit, ok := pageParams(w, r, "the id of the last event read (the next of the previous page)", view.DefaultEventLimit, view.CheckEventPaging)
	if !ok {
		return
	}
	id := r.PathValue("id")
	// One more than asked tells whether another page follows.
	events, err := s.engine.Events(r.Context(), storage.EventsParams{InstanceID: id, AfterID: after, Limit: limit + 1})
	if err != nil {
		s.failInstance(w, r, id, err)
		return
	}
	writeJSON(w, http.StatusOK, view.NewEventPage(events, limit))
}
