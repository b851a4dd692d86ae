package web_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
)

// chainYAML is a chain of n echo steps: three events each, so n = 40 makes
// a history longer than the instance object shows.
func chainYAML(n int) string {
	var b strings.Builder
	b.WriteString("name: chain\nsteps:\n")
	for i := range n {
		fmt.Fprintf(&b, "  - {name: s%d, handler: echo", i)
		if i > 0 {
			fmt.Fprintf(&b, ", dependsOn: [s%d]", i-1)
		}
		b.WriteString("}\n")
	}
	return b.String()
}

type eventKind struct {
	Type string `json:"type"`
	Step string `json:"step"`
}

type historyEvent struct {
	ID int64 `json:"id"`
	eventKind
}

type eventPage struct {
	Events []historyEvent `json:"events"`
	Next   *int64         `json:"next"`
}

// TestEventsAPIPagesALongHistory: the instance object carries the latest
// events of a long history and says that older ones exist; the events
// route pages all of it in ID order.
func TestEventsAPIPagesALongHistory(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		b := setup(t, open, &setupOpts{worker: true, workflows: []string{chainYAML(40)}})
		id := b.start(t, "chain", "")
		require.Equal(t, storage.InstanceCompleted, b.wait(t, id).Status)

		var inst struct {
			Events          []eventKind `json:"events"`
			EventsTruncated bool        `json:"eventsTruncated"`
		}
		r := b.do(t, http.MethodGet, "/api/instances/"+id, "")
		require.Equal(t, http.StatusOK, r.status)
		require.NoError(t, json.Unmarshal(r.body, &inst))
		require.Len(t, inst.Events, storage.InstanceEvents)
		require.True(t, inst.EventsTruncated)

		var all []historyEvent
		after := "0"
		for pages := 1; ; pages++ {
			var page eventPage
			r := b.do(t, http.MethodGet, "/api/instances/"+id+"/events?limit=50&after="+after, "")
			require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
			require.NoError(t, json.Unmarshal(r.body, &page))
			all = append(all, page.Events...)
			if page.Next == nil {
				require.Equal(t, 3, pages, "%d events in pages of 50", len(all))
				break
			}
			require.Len(t, page.Events, 50)
			require.Equal(t, page.Events[49].ID, *page.Next)
			after = fmt.Sprint(*page.Next)
		}
		require.Greater(t, len(all), storage.InstanceEvents)
		require.Equal(t, "instance.created", all[0].Type)
		require.Equal(t, "instance.completed", all[len(all)-1].Type)
		for i := 1; i < len(all); i++ {
			require.Greater(t, all[i].ID, all[i-1].ID)
		}
		var latest []eventKind
		for _, e := range all[len(all)-storage.InstanceEvents:] {
			latest = append(latest, eventKind{Type: e.Type, Step: e.Step})
		}
		require.Equal(t, latest, inst.Events, "the instance object's events are the latest")

		empty := b.do(t, http.MethodGet, "/api/instances/"+id+"/events?after="+fmt.Sprint(all[len(all)-1].ID), "")
		require.Equal(t, http.StatusOK, empty.status)
		require.JSONEq(t, `{"events": []}`, string(empty.body), "nothing after the last event, and no next")

		for _, bad := range []string{"after=-1", "after=x", "limit=0", "limit=1001", "limit=x"} {
			requireError(t, b.do(t, http.MethodGet, "/api/instances/"+id+"/events?"+bad, ""), http.StatusBadRequest, strings.SplitN(bad, "=", 2)[0])
		}
		requireError(t, b.do(t, http.MethodGet, "/api/instances/nope/events", ""), http.StatusNotFound, "nope")
	})
}
