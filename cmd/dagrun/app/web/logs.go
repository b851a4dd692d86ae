package web

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/dagrun/dagrun/cmd/dagrun/app/view"
)

// logPage is GET /api/instances/{id}/logs and
// /api/instances/{id}/steps/{step}/logs: the records after the asked seq.
// Next is the after of the following call (the last record's seq, or the
// asked one when there is none), so a follower polls with it; Finished
// says the instance finished, after which only records still on their way
// from its workers can come.
type logPage struct {
	Records  []view.LogRecord `json:"records"`
	Next     int64            `json:"next"`
	Finished bool             `json:"finished"`
}

func (s *Server) listLogs(w http.ResponseWriter, r *http.Request) {
	after, limit, ok := pageParams(w, r, "the next of the previous page", view.DefaultLogLimit, view.CheckLogPaging)
	if !ok {
		return
	}
	id := r.PathValue("id")
	inst, records, err := view.LoadLogs(r.Context(), s.engine.Store(), id, r.PathValue("step"), after, limit)
	var noStep *view.StepNotFoundError
	switch {
	case errors.As(err, &noStep):
		writeError(w, http.StatusNotFound, err.Error())
		return
	case err != nil:
		s.failInstance(w, r, id, err)
		return
	}
	page := logPage{Records: view.NewLogRecords(records), Next: after, Finished: inst.Status.Finished()}
	if len(records) > 0 {
		page.Next = records[len(records)-1].Seq
	}
	writeJSON(w, http.StatusOK, page)
}

// pageParams reads the after and limit parameters of a paged route (after
// defaults to 0, limit to defaultLimit), and answers 400 and returns false
// when they are not whole numbers or check refuses them. afterIs says what
// a caller passes as after.
func pageParams(w http.ResponseWriter, r *http.Request, afterIs string, defaultLimit int, check func(after int64, limit int, prefix string) error) (after int64, limit int, ok bool) {
	q := r.URL.Query()
	limit = defaultLimit
	var err error
	if raw := q.Get("after"); raw != "" {
		if after, err = strconv.ParseInt(raw, 10, 64); err != nil {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("invalid after %q: want a whole number, %s", raw, afterIs))
			return 0, 0, false
		}
	}
	if raw := q.Get("limit"); raw != "" {
		if limit, err = strconv.Atoi(raw); err != nil {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("invalid limit %q: want a whole number", raw))
			return 0, 0, false
		}
	}
	if err := check(after, limit, ""); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return 0, 0, false
	}
	return after, limit, true
}
