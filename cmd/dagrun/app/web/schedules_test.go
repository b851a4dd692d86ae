package web_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun"
	"github.com/dagrun/dagrun/cmd/dagrun/app/view"
	"github.com/dagrun/dagrun/cmd/dagrun/app/web"
	"github.com/dagrun/dagrun/dag"
	"github.com/dagrun/dagrun/handlers"
	"github.com/dagrun/dagrun/storage"
	"github.com/dagrun/dagrun/storage/storagetest"
)

const nightlyYAML = `name: nightly
schedule:
  - cron: "0 3 * * *"
    timezone: Europe/Berlin
  - cron: "@every 1m"
steps:
  - name: report
    handler: echo
`

// setupScheduled serves an engine with the nightly workflow, with a token.
func setupScheduled(t *testing.T, open func(t *testing.T) storage.Store) (*testBundle, *dagrun.Engine) {
	t.Helper()
	registry := handlers.NewRegistry()
	handlers.RegisterBuiltins(registry)
	w, err := dag.Parse("", []byte(nightlyYAML), nil)
	require.NoError(t, err)
	store := open(t)
	metrics := web.NewMetrics()
	engine, err := dagrun.New(store, registry, &dagrun.Config{Workflows: []*dag.Workflow{w}, Observer: metrics})
	require.NoError(t, err)
	srv, err := web.NewServer(engine, &web.Config{Token: "secret", Metrics: metrics})
	require.NoError(t, err)
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	return &testBundle{engine: engine, store: store, metrics: metrics, server: ts, token: "secret"}, engine
}

func decodeSchedules(t *testing.T, r *response) []view.Schedule {
	t.Helper()
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	var list []view.Schedule
	require.NoError(t, json.Unmarshal(r.body, &list))
	return list
}

func TestSchedulesAPI(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, open func(t *testing.T) storage.Store) {
		b, _ := setupScheduled(t, open)

		list := decodeSchedules(t, b.do(t, http.MethodGet, "/api/schedules?next=2", ""))
		require.Len(t, list, 2)
		require.Equal(t, "nightly", list[0].Workflow)
		require.Equal(t, "0 3 * * *", list[0].Cron)
		require.Equal(t, "Europe/Berlin", list[0].Timezone)
		require.Len(t, list[0].Next, 2)
		require.False(t, list[1].Paused)

		r := b.do(t, http.MethodPost, "/api/schedules/nightly/1/pause", "")
		require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
		var one view.Schedule
		require.NoError(t, json.Unmarshal(r.body, &one))
		require.Equal(t, 1, one.Index)
		require.True(t, one.Paused)
		list = decodeSchedules(t, b.do(t, http.MethodGet, "/api/schedules", ""))
		require.True(t, list[1].Paused)
		require.False(t, list[0].Paused)
		require.Len(t, list[0].Next, 3, "three next fire times by default")

		r = b.do(t, http.MethodPost, "/api/schedules/nightly/1/resume", "")
		require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
		require.NoError(t, json.Unmarshal(r.body, &one))
		require.False(t, one.Paused)

		requireError(t, b.do(t, http.MethodPost, "/api/schedules/nightly/2/pause", ""), http.StatusNotFound, "workflow nightly has no schedule 2: its schedules are numbered 0 to 1")
		requireError(t, b.do(t, http.MethodPost, "/api/schedules/nope/0/pause", ""), http.StatusNotFound, `unknown workflow "nope"`)
		requireError(t, b.do(t, http.MethodPost, "/api/schedules/nightly/first/pause", ""), http.StatusBadRequest, `invalid schedule index "first"`)
		requireError(t, b.do(t, http.MethodPost, "/api/schedules/nightly/0/resume", `{"bogus": 1}`), http.StatusBadRequest, `unknown field "bogus"`)
		requireError(t, b.do(t, http.MethodGet, "/api/schedules?next=0", ""), http.StatusBadRequest, `invalid next "0"`)

		b.token = ""
		require.Equal(t, http.StatusUnauthorized, b.do(t, http.MethodGet, "/api/schedules", "").status)
		require.Equal(t, http.StatusUnauthorized, b.do(t, http.MethodPost, "/api/schedules/nightly/0/pause", "").status)
		b.token = "secret"
		for _, s := range decodeSchedules(t, b.do(t, http.MethodGet, "/api/schedules", "")) {
			require.False(t, s.Paused, "refused requests write nothing")
		}
	})
}

func TestScheduleMetrics(t *testing.T) {
	t.Parallel()
	b, engine := setupScheduled(t, openSQLite)
	start := time.Date(2027, 5, 1, 12, 0, 0, 0, time.UTC)
	clock := storagetest.NewClock(start)
	s, err := engine.NewScheduler(&dagrun.SchedulerConfig{Now: clock.Now})
	require.NoError(t, err)
	require.NoError(t, s.Register(t.Context()))
	for range 2 { // the first tick starts an instance, the second is skipped: it is unfinished
		clock.Advance(time.Minute + 2*time.Second)
		_, err := s.FireDue(t.Context())
		require.NoError(t, err)
	}
	r := b.do(t, http.MethodGet, "/metrics", "")
	require.Equal(t, http.StatusOK, r.status)
	for _, want := range []string{
		`dagrun_schedule_ticks_fired_total{workflow="nightly"} 1`,
		`dagrun_schedule_ticks_skipped_total{workflow="nightly"} 1`,
		`dagrun_schedule_tick_lag_seconds_count{workflow="nightly"} 1`,
		`dagrun_schedule_tick_lag_seconds_sum{workflow="nightly"} 2`,
		`dagrun_instances_started_total{workflow="nightly"} 1`,
	} {
		require.Contains(t, string(r.body), want)
	}
}
