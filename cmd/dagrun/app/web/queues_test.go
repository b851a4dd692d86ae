package web_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/cmd/dagrun/app/view"
	"github.com/dagrun/dagrun/storage"
)

func decodeQueues(t *testing.T, r *response) []view.Queue {
	t.Helper()
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	var list []view.Queue
	require.NoError(t, json.Unmarshal(r.body, &list))
	return list
}

func TestQueuesAPI(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		b, _ := setupScheduled(t, open)
		require.Empty(t, decodeQueues(t, b.do(t, http.MethodGet, "/api/queues", "")))

		r := b.do(t, http.MethodPost, "/api/queues/mail", `{"concurrency": 3, "rate": "10/s"}`)
		require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
		var one view.Queue
		require.NoError(t, json.Unmarshal(r.body, &one))
		require.Equal(t, view.Queue{Queue: "mail", Concurrency: 3, Rate: &view.Rate{Count: 10, Per: "1s"}}, one)

		// A field left out keeps its limit.
		r = b.do(t, http.MethodPost, "/api/queues/mail", `{"rate": "none"}`)
		require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
		require.Equal(t, []view.Queue{{Queue: "mail", Concurrency: 3}}, decodeQueues(t, b.do(t, http.MethodGet, "/api/queues", "")))

		for body, want := range map[string]string{
			`{}`:                    `give "concurrency"`,
			`{"concurrency": -1}`:   "concurrency -1 is out of range",
			`{"rate": "ten/s"}`:     "does not start with a whole number",
			`{"concurrency": "x"}`:  "invalid request body",
			`{"concurency": 1}`:     "unknown field",
			`{"rate": "1/0s"}`:      "has a period of 0s: it must be positive",
			`{"rate": "100/1ns"}`:   "rate period",
			`{"concurrency": 1e12}`: "concurrency 1000000000000 is out of range",
			`{"concurrency": 2.5}`:  `invalid request body: "concurrency": want a whole number, got a number 2.5`,
		} {
			requireError(t, b.do(t, http.MethodPost, "/api/queues/mail", body), http.StatusBadRequest, want)
		}
		require.Equal(t, []view.Queue{{Queue: "mail", Concurrency: 3}}, decodeQueues(t, b.do(t, http.MethodGet, "/api/queues", "")),
			"a refused change changes nothing")

		b.token = ""
		require.Equal(t, http.StatusUnauthorized, b.do(t, http.MethodGet, "/api/queues", "").status)
		require.Equal(t, http.StatusUnauthorized, b.do(t, http.MethodPost, "/api/queues/mail", `{"concurrency": 0}`).status)
	})
}

// TestQueuesAPIScheduled: starts a queue's rate spaced out and delayed
// starts are scheduled, apart from the depth, rather than nowhere.
func TestQueuesAPIScheduled(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		b, _ := setupScheduled(t, open)
		r := b.do(t, http.MethodPost, "/api/queues/default", `{"rate": "1/10s"}`)
		require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
		for range 3 {
			b.start(t, "nightly", `{}`)
		}
		b.start(t, "nightly", `{"delay": "1h"}`)
		list := decodeQueues(t, b.do(t, http.MethodGet, "/api/queues", ""))
		require.Len(t, list, 1)
		require.Equal(t, view.Queue{Queue: "default", Depth: 1, Ready: 1, Scheduled: 3, Rate: &view.Rate{Count: 1, Per: "10s"},
			OldestWaitSeconds: list[0].OldestWaitSeconds}, list[0])
	})
}
