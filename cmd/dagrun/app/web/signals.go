package web

import (
	"encoding/json"
	"net/http"

	"github.com/dagrun/dagrun"
	"github.com/dagrun/dagrun/cmd/dagrun/app/view"
)

// signalRequest is the body of POST /api/instances/{id}/signals/{name}.
// Data is the payload (absent: null); ID, when set, makes a repeat of the
// same signal a harmless duplicate instead of a conflict, so a webhook
// that retries is safe.
type signalRequest struct {
	Data json.RawMessage `json:"data"`
	ID   string          `json:"id"`
}

// signalResponse tells what became of a signal, with the instance as it
// is afterwards.
type signalResponse struct {
	// Delivered: a waiting step completed with the payload now; false when
	// the signal was stored until its step waits, or was a duplicate.
	Delivered bool `json:"delivered"`
	// Duplicate: the same signal ID was sent before; nothing changed.
	Duplicate bool          `json:"duplicate"`
	Instance  view.Instance `json:"instance"`
}

func (s *Server) sendSignal(w http.ResponseWriter, r *http.Request) {
	var req signalRequest
	if err := decodeBody(r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	id := r.PathValue("id")
	res, err := s.engine.Signal(r.Context(), dagrun.SignalRequest{InstanceID: id, Name: r.PathValue("name"), ID: req.ID, Data: req.Data})
	if err != nil {
		s.failInstance(w, r, id, err)
		return
	}
	s.writeSignalled(w, r, res)
}

// keyedSignalRequest is the body of POST
// /api/workflows/{name}/signals/{signal}: a signalRequest for the instance
// of the workflow started with Key, the way a webhook knows an order by
// its number rather than by the instance's ID.
type keyedSignalRequest struct {
	Key  string          `json:"key"`
	Data json.RawMessage `json:"data"`
	ID   string          `json:"id"`
}

func (s *Server) sendSignalByKey(w http.ResponseWriter, r *http.Request) {
	var req keyedSignalRequest
	if err := decodeBody(r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	if req.Key == "" {
		writeError(w, http.StatusBadRequest, `key is required: the idempotency key the instance was started with (or signal it by ID: POST /api/instances/{id}/signals/{name})`)
		return
	}
	res, err := s.engine.Signal(r.Context(), dagrun.SignalRequest{Workflow: r.PathValue("name"), Key: req.Key, Name: r.PathValue("signal"), ID: req.ID, Data: req.Data})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.writeSignalled(w, r, res)
}

// writeSignalled answers a signal with what became of it and the instance
// as it is afterwards.
func (s *Server) writeSignalled(w http.ResponseWriter, r *http.Request, res dagrun.SignalResult) {
	inst, err := s.engine.Get(r.Context(), res.InstanceID)
	if err != nil {
		s.failInstance(w, r, res.InstanceID, err)
		return
	}
	writeJSON(w, http.StatusOK, signalResponse{Delivered: res.Delivered, Duplicate: res.Duplicate, Instance: view.NewInstance(inst)})
}
