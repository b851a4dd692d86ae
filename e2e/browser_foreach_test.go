package e2e

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
)

// browserForEachItems is the size of the forEach step of the browser test,
// the largest a step may have by default.
const browserForEachItems = 10000

// browserForEach fans out over 10,000 numbers, each item one request to
// the test's server, which answers at most 1,000 a second so that the
// items run for seconds while the page is watched, and answers 404 (a
// permanent failure) for every thousandth item: the step, with
// continueOnError, ends failed with ten failed items and 9,990 completed.
var browserForEach = fmt.Sprintf(`name: fanout
steps:
  - name: work
    forEach: ${{ 0..%d }}
    continueOnError: true
    retry: {maxAttempts: 1}
    handler: http
    input:
      url: "${{ input.url }}/item/${{ index }}"
  - name: after
    handler: noop
    dependsOn: [work]
`, browserForEachItems-1)

// browserHeartbeat starts a page timer that records the longest gap
// between its 50 ms ticks, and records the longest task the page's main
// thread ran (the Long Tasks API reports those over 50 ms). A page that
// freezes (rendering thousands of rows, say) shows it as a long task; a
// long gap with no long task is a machine too loaded to schedule the page.
const browserHeartbeat = `(() => {
	window.__beat = { last: performance.now(), maxGap: 0, ticks: 0, longestTask: 0, longTasks: 0 };
	setInterval(() => {
		const now = performance.now();
		window.__beat.maxGap = Math.max(window.__beat.maxGap, now - window.__beat.last);
		window.__beat.last = now;
		window.__beat.ticks++;
	}, 50);
	new PerformanceObserver((list) => {
		for (const task of list.getEntries()) {
			window.__beat.longestTask = Math.max(window.__beat.longestTask, task.duration);
			window.__beat.longTasks++;
		}
	}).observe({ type: "longtask" });
	return PerformanceObserver.supportedEntryTypes.includes("longtask");
})()`

// TestBrowserForEach opens an instance whose forEach step has 10,000 items
// while they run: the page loads, the step is one node with its counts and
// a progress bar, the step's panel pages its items (next, previous, a
// status filter) fetching only the page shown, and the page never freezes
// while it refreshes. It logs the load time, the longest gap of a page
// timer and the slowest round trip of a script evaluated meanwhile.
func TestBrowserForEach(t *testing.T) {
	chromium := browserChromium(t)
	dir, workflows := browserWorkflows(t, map[string]string{"fanout.yaml": browserForEach})

	pace := time.NewTicker(time.Millisecond)
	t.Cleanup(pace.Stop)
	upstream := browserUpstream(t, func(r *http.Request) bool {
		select {
		case <-pace.C:
		case <-r.Context().Done():
		}
		return !strings.HasSuffix(r.URL.Path, "999")
	})

	const token = "browser-test-token"
	base := browserServe(t, binary, dir, workflows, token)
	apiClient := &browserAPI{base: base, token: token}

	ctx := browserContext(t, chromium)
	console := browserWatchConsole(ctx)
	browserSignIn(t, ctx, console, base, token, 1440, 1000)

	var started struct {
		ID string `json:"id"`
	}
	apiClient.call(t, http.MethodPost, "/api/workflows/fanout/instances", `{"input": {"url": "`+upstream.URL+`"}}`, http.StatusCreated, &started)
	require.Eventually(t, func() bool { return apiClient.stepStatus(t, started.ID, "work") == "running" }, 30*time.Second, 20*time.Millisecond)

	// 1. Load the instance page while the items run.
	node := `#graph g.node[data-step="work"]`
	begin := time.Now()
	browserDo(t, ctx, console, "open the instance while its items run",
		chromedp.Navigate(base+"#/instances/"+started.ID),
		chromedp.WaitVisible(chromedp.CSS(node+" .progress")),
		chromedp.Poll[chromedp.Void](`/\/10,000/.test(document.querySelector('`+node+` text.sub').textContent)`),
	)
	loaded := time.Since(begin)
	t.Logf("instance page with a step of %d items loaded in %s", browserForEachItems, loaded.Round(time.Millisecond))
	browserRequireTrue(t, ctx, "start the page timer", browserHeartbeat)

	// 2. Open the step's panel: one page of items, not 10,000.
	browserDo(t, ctx, console, "open the forEach step",
		chromedp.Click(chromedp.CSS(node)),
		chromedp.WaitVisible(chromedp.CSS(`#items-table tbody tr[data-index="0"]`)),
		chromedp.WaitVisible(chromedp.CSS("#items-counts .items-progress")),
	)
	browserRequireTrue(t, ctx, "one page of rows", `document.querySelectorAll("#items-table tbody tr").length === 50`)
	browserRequireTrue(t, ctx, "the range", `document.querySelector("#items-range").textContent === "1\u201350 of 10,000"`)
	browserScreenshot(t, ctx, "browser-foreach-running.png")

	// 3. While the items run and the page refreshes with new counts,
	// scripts answer promptly: evaluate a trivial one again and again.
	var slowest time.Duration
	doneBefore := apiClient.itemsDone(t, started.ID, "work")
	for i := 0; i < 40; i++ {
		t0 := time.Now()
		_, err := chromedp.Run(ctx, chromedp.Evaluate[int](`1`))
		require.NoError(t, err)
		slowest = max(slowest, time.Since(t0))
		time.Sleep(50 * time.Millisecond)
	}
	doneAfter := apiClient.itemsDone(t, started.ID, "work")
	t.Logf("items finished: %d when the evaluations began, %d when they ended", doneBefore, doneAfter)

	// 4. Page forward and back, and filter.
	browserDo(t, ctx, console, "next page",
		browserClickLive("#items-next"),
		chromedp.WaitVisible(chromedp.CSS(`#items-table tbody tr[data-index="50"]`)),
		chromedp.Poll[chromedp.Void](`document.querySelector("#items-range").textContent === "51\u2013100 of 10,000"`),
	)
	browserRequireTrue(t, ctx, "page two holds items 50 to 99",
		`[...document.querySelectorAll("#items-table tbody tr")].map((r) => +r.dataset.index).join() === Array.from({length: 50}, (_, i) => 50 + i).join()`)
	browserDo(t, ctx, console, "previous page",
		browserClickLive("#items-prev"),
		chromedp.WaitVisible(chromedp.CSS(`#items-table tbody tr[data-index="0"]`)),
		chromedp.WaitEnabled(chromedp.CSS("#items-next")),
	)
	browserRequireTrue(t, ctx, "back at the first page", `document.querySelector("#items-prev").disabled`)
	browserDo(t, ctx, console, "go to item 7,321, 147 pages on",
		// Set and announce the number as a person typing it and leaving the field does.
		chromedp.Poll[chromedp.Void](`(() => { const f = document.querySelector("#items-goto"); f.value = "7321"; f.dispatchEvent(new Event("change")); return true; })()`),
		chromedp.WaitVisible(chromedp.CSS(`#items-table tbody tr[data-index="7321"]`)),
		chromedp.Poll[chromedp.Void](`document.querySelector("#items-range").textContent === "7,301\u20137,350 of 10,000"`),
	)
	browserDo(t, ctx, console, "last page",
		browserClickLive("#items-last"),
		chromedp.WaitVisible(chromedp.CSS(`#items-table tbody tr[data-index="9999"]`)),
		chromedp.WaitEnabled(chromedp.CSS("#items-prev")),
	)
	browserRequireTrue(t, ctx, "at the last page, nothing further", `document.querySelector("#items-next").disabled && document.querySelector("#items-last").disabled`)

	// 5. Let the step finish: 9,990 completed, 10 failed.
	require.Eventually(t, func() bool {
		s := apiClient.stepStatus(t, started.ID, "work")
		return s != "running" && s != "pending"
	}, 5*time.Minute, 100*time.Millisecond)
	require.Equal(t, "failed", apiClient.stepStatus(t, started.ID, "work"))
	browserDo(t, ctx, console, "see the step finish",
		chromedp.WaitVisible(chromedp.CSS(node+".s-failed")),
		chromedp.Poll[chromedp.Void](`document.querySelector('`+node+` text.sub').textContent === "9,990/10,000 \u00B7 10 failed"`),
	)
	// Each item logged its request: the panel keeps the newest lines and
	// says where the others are.
	browserDo(t, ctx, console, "the log panel keeps the newest lines",
		chromedp.Poll[chromedp.Void](`!document.querySelector("#step-logs-cut").hidden &&
			document.querySelector("#step-logs-cut").textContent.includes("dagrun logs") &&
			document.querySelectorAll("#step-logs li").length === 200`),
	)
	beat, err := chromedp.Run(ctx, chromedp.Evaluate[map[string]float64](`window.__beat`))
	require.NoError(t, err)
	t.Logf("while the items ran: longest task %.0f ms (%.0f over 50 ms); longest gap of a 50 ms page timer %.0f ms over %.0f ticks; slowest evaluate round trip %s",
		beat["longestTask"], beat["longTasks"], beat["maxGap"], beat["ticks"], slowest.Round(time.Millisecond))
	// A frozen page runs a task of seconds and leaves scripts waiting, not
	// the 90-460 ms measured here alone on a 2-vCPU VM (opening the step's
	// panel, the longest; 1,352 ms once in CI beside the other packages'
	// tests, before the panel's times and layouts got cheaper; 154-185 ms
	// beside three busy loops once the log panel laid out only the lines in
	// view, against 221-348 before). The timer's gap is logged,
	// not asserted: on a loaded machine it counts the time the page was
	// not scheduled at all (3.1 s in one CI run on a loaded machine).
	require.Less(t, beat["longestTask"], 1000.0, "the page froze")
	require.Less(t, slowest, 3*time.Second, "the page froze")

	browserDo(t, ctx, console, "filter the failed items",
		chromedp.SetValue(chromedp.CSS("#items-status"), "failed"),
		chromedp.Evaluate[chromedp.Void](`document.querySelector("#items-status").dispatchEvent(new Event("change"))`),
		chromedp.Poll[chromedp.Void](`document.querySelector("#items-range").textContent === "1\u201310 of 10"`),
	)
	failed, err := chromedp.Run(ctx, chromedp.Evaluate[string](`[...document.querySelectorAll("#items-table tbody tr")].map((r) => r.dataset.index).join()`))
	require.NoError(t, err)
	require.Equal(t, "999,1999,2999,3999,4999,5999,6999,7999,8999,9999", failed)
	browserDo(t, ctx, console, "open a failed item",
		chromedp.Click(chromedp.CSS(`#items-table tbody tr[data-index="1999"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#items-table tr[data-detail="1999"] .error-box`)),
	)
	detail, err := chromedp.Run(ctx, chromedp.TextContent(chromedp.CSS(`#items-table tr[data-detail="1999"]`)))
	require.NoError(t, err)
	require.Contains(t, detail, "404")
	browserScreenshot(t, ctx, "browser-foreach-failed-items.png")

	// The instance object holds counts, not items, whatever their number,
	// and the step's output list only up to its bound.
	size := len(apiClient.instanceJSON(t, started.ID))
	t.Logf("GET /api/instances/{id}: %s bytes", strconv.Itoa(size))
	require.Less(t, size, (256+16)<<10, "the output list inlined up to 256 KiB, and the rest")
	require.False(t, strings.Contains(apiClient.instanceJSON(t, started.ID), `"index"`), "items are not inlined")

	browserRequireNoErrors(t, console)
}

// itemsDone is how many items of a forEach step have finished.
func (a *browserAPI) itemsDone(t *testing.T, id, step string) int {
	t.Helper()
	var inst struct {
		Steps []struct {
			Name  string         `json:"name"`
			Items map[string]int `json:"items"`
		} `json:"steps"`
	}
	a.call(t, http.MethodGet, "/api/instances/"+id, "", http.StatusOK, &inst)
	for _, s := range inst.Steps {
		if s.Name == step {
			return s.Items["completed"] + s.Items["failed"] + s.Items["cancelled"]
		}
	}
	return 0
}

// browserClickLive clicks the enabled element of selector inside the page,
// in one evaluation, retried until it is there. The items panel redraws as
// live counts arrive: a node that chromedp.Click found in one DevTools call
// may be gone by the next ("Could not find node with given id"), a race the
// test lost now and then while the items ran.
func browserClickLive(selector string) chromedp.Action[chromedp.Void] {
	return chromedp.Poll[chromedp.Void](`(() => {
		const el = document.querySelector(` + browserJS(selector) + `);
		if (!el || el.disabled) return false;
		el.click();
		return true;
	})()`)
}
