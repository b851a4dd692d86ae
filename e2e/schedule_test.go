package e2e

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
)

const everySecondYAML = `name: every-second
schedule:
  - cron: "@every 1s"
    overlap: allow
steps:
  - name: tick
    handler: echo
`

// scheduledTicks lists the every-second instances and returns the tick
// each was started for (from its idempotency key), sorted, duplicates kept.
func (e *env) scheduledTicks(t *testing.T) []time.Time {
	t.Helper()
	res := e.mustRun(t, "list", "--workflow", "every-second", "--limit", "10000", "--json")
	var list []struct {
		Key *string `json:"key"`
	}
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &list), res.stdout)
	ticks := make([]time.Time, 0, len(list))
	for _, in := range list {
		require.NotNil(t, in.Key, "a scheduled instance has the tick as its key")
		parts := strings.SplitN(*in.Key, ":", 3) // schedule:FINGERPRINT:TICK
		require.Len(t, parts, 3, *in.Key)
		tick, err := time.Parse(time.RFC3339, parts[2])
		require.NoError(t, err, *in.Key)
		ticks = append(ticks, tick)
	}
	sort.Slice(ticks, func(i, j int) bool { return ticks[i].Before(ticks[j]) })
	return ticks
}

// TestScheduleOneInstancePerTickAcrossProcesses runs three workers, each
// with its scheduler, on one database, with a schedule that ticks every
// second, for about 12 seconds, and SIGKILLs one of them in the middle:
// every tick from the first to the last started exactly one instance.
func TestScheduleOneInstancePerTickAcrossProcesses(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, db string) {
		e := newEnv(t, db, map[string]string{"every-second.yaml": everySecondYAML})
		e.mustRun(t, "schedules") // creates and migrates the database once
		var procs []*process
		for range 3 {
			procs = append(procs, e.spawn(t, "worker", "--concurrency", "4"))
		}
		for _, p := range procs {
			waitFor(t, 30*time.Second, "the scheduler to start", func() bool {
				return strings.Contains(p.stderr.String(), "scheduler started")
			})
		}
		waitFor(t, 30*time.Second, "six ticks", func() bool { return len(e.scheduledTicks(t)) >= 6 })
		procs[1].kill(t)
		killedAt := len(e.scheduledTicks(t))
		waitFor(t, 30*time.Second, "six more ticks after the kill", func() bool { return len(e.scheduledTicks(t)) >= killedAt+6 })
		procs[0].stop(t)
		procs[2].stop(t)

		ticks := e.scheduledTicks(t)
		require.GreaterOrEqual(t, len(ticks), 12)
		t.Logf("%d ticks, %s to %s, the kill after the %dth", len(ticks), ticks[0].Format(time.TimeOnly), ticks[len(ticks)-1].Format(time.TimeOnly), killedAt)
		for i := 1; i < len(ticks); i++ {
			require.Equal(t, time.Second, ticks[i].Sub(ticks[i-1]),
				"ticks %s and %s: one instance per tick, no gap and no duplicate", ticks[i-1].Format(time.TimeOnly), ticks[i].Format(time.TimeOnly))
		}
		for _, p := range []*process{procs[0], procs[2]} {
			require.NotContains(t, p.stderr.String(), "could not start due ticks", "dagrun %v", p.args)
		}
	})
}

const browserNightly = `name: nightly
schedule:
  - cron: "0 3 * * *"
    timezone: Europe/Berlin
  - cron: "@every 1h"
steps:
  - name: report
    handler: echo
`

// TestBrowserSchedulesPage opens the Schedules page, pauses a schedule with
// its button, and checks the pause through the API.
func TestBrowserSchedulesPage(t *testing.T) {
	chromium := browserChromium(t)
	dir := t.TempDir()
	workflows := filepath.Join(dir, "workflows")
	require.NoError(t, os.MkdirAll(workflows, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(workflows, "nightly.yaml"), []byte(browserNightly), 0o644))
	const token = "browser-test-token"
	base := browserServe(t, binary, dir, workflows, token)
	apiClient := &browserAPI{base: base, token: token}

	ctx := browserContext(t, chromium)
	console := browserWatchConsole(ctx)
	browserSignIn(t, ctx, console, base, token, 1280, 800)
	button := `button[data-schedule="nightly/0"]`
	browserDo(t, ctx, console, "open the schedules",
		chromedp.Navigate(base+"#/schedules"),
		chromedp.WaitVisible(chromedp.CSS(`#schedules `+button)),
		chromedp.WaitVisible(chromedp.CSS(`#schedules button[data-schedule="nightly/1"]`)),
	)
	text, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector("#schedules").innerText`))
	require.NoError(t, err)
	require.Contains(t, text, "0 3 * * *")
	require.Contains(t, text, "Europe/Berlin")
	require.Contains(t, text, "@every 1h")
	browserDo(t, ctx, console, "pause the nightly schedule",
		chromedp.Click(chromedp.CSS(`#schedules `+button)),
		chromedp.WaitVisible(chromedp.CSS(`#schedules tr.paused `+button)),
	)
	browserScreenshot(t, ctx, "browser-schedules.png")
	var list []struct {
		Index  int  `json:"index"`
		Paused bool `json:"paused"`
	}
	apiClient.call(t, http.MethodGet, "/api/schedules", "", http.StatusOK, &list)
	require.Len(t, list, 2)
	require.True(t, list[0].Paused)
	require.False(t, list[1].Paused)
	browserRequireNoErrors(t, console)
}

// TestServeScheduleCountersStartAtZero: the tick counters of a workflow
// whose schedule `dagrun serve` runs are in /metrics at zero from the
// first scrape, as every per-workflow series is, so that an alert on
// skipped ticks has a series before the first skip; a server that runs no
// scheduler (--no-schedules) shows none.
func TestServeScheduleCountersStartAtZero(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		args []string
		want bool
	}{
		{"scheduler", nil, true},
		{"no-schedules", []string{"--no-schedules"}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, filepath.Join(t.TempDir(), "dagrun.db"), map[string]string{"nightly.yaml": browserNightly})
			_, base := e.serveAPI(t, binary, c.args...)
			resp, metrics := apiCall(t, http.MethodGet, base+"/metrics", "")
			require.Equal(t, http.StatusOK, resp.StatusCode, metrics)
			require.Contains(t, metrics, `dagrun_instances_started_total{workflow="nightly"} 0`)
			for _, series := range []string{
				`dagrun_schedule_ticks_fired_total{workflow="nightly"} 0`,
				`dagrun_schedule_ticks_skipped_total{workflow="nightly"} 0`,
			} {
				if c.want {
					require.Contains(t, metrics, series)
				} else {
					require.NotContains(t, metrics, series)
				}
			}
		})
	}
}
