package web

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/dagrun/dagrun/cmd/dagrun/app/view"
)

// Bounds of GET /api/schedules?next=N.
const (
	defaultScheduleNext = 3
	maxScheduleNext     = 100
)

// listSchedules is GET /api/schedules: every loaded schedule with its next
// fire times (?next=N of them), last instance and pause.
func (s *Server) listSchedules(w http.ResponseWriter, r *http.Request) {
	next := defaultScheduleNext
	if v := r.URL.Query().Get("next"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxScheduleNext {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("invalid next %q: use a number from 1 to %d", v, maxScheduleNext))
			return
		}
		next = n
	}
	list, err := s.engine.Schedules(r.Context(), time.Now(), next)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, view.NewSchedules(list))
}

func (s *Server) pauseSchedule(w http.ResponseWriter, r *http.Request) {
	s.setSchedulePaused(w, r, true)
}

func (s *Server) resumeSchedule(w http.ResponseWriter, r *http.Request) {
	s.setSchedulePaused(w, r, false)
}

// setSchedulePaused is POST /api/schedules/{workflow}/{index}/pause|resume;
// it answers with the schedule object as it now is.
func (s *Server) setSchedulePaused(w http.ResponseWriter, r *http.Request, paused bool) {
	workflow, raw := r.PathValue("workflow"), r.PathValue("index")
	index, err := strconv.Atoi(raw)
	if err != nil || index < 0 {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("invalid schedule index %q: use the schedule's number from GET /api/schedules (0 for the first)", raw))
		return
	}
	if !s.noFields(w, r) {
		return
	}
	if err := s.engine.PauseSchedule(r.Context(), workflow, index, paused); err != nil {
		s.fail(w, r, err)
		return
	}
	list, err := s.engine.Schedules(r.Context(), time.Now(), defaultScheduleNext)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	for _, v := range view.NewSchedules(list) {
		if v.Workflow == workflow && v.Index == index {
			writeJSON(w, http.StatusOK, v)
			return
		}
	}
	writeError(w, http.StatusNotFound, fmt.Sprintf("workflow %s has no schedule %d", workflow, index))
}
