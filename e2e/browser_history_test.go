package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
)

// browserChain is a chain of 40 echo steps: three events each, a history
// longer than one page.
func browserChain() string {
	var b strings.Builder
	b.WriteString("name: chain\nsteps:\n  - {name: s00, handler: echo}\n")
	for i := 1; i < 40; i++ {
		fmt.Fprintf(&b, "  - {name: s%02d, handler: echo, dependsOn: [s%02d]}\n", i, i-1)
	}
	return b.String()
}

// TestBrowserHistory reads histories a page at a time in headless
// Chromium: a long one shows its first 100 events and "Load more", which
// reads the rest; a running instance's new events appear as they happen.
func TestBrowserHistory(t *testing.T) {
	chromium := browserChromium(t)
	dir, workflows := browserWorkflows(t, map[string]string{"chain.yaml": browserChain(), "hold.yaml": browserHold})
	const token = "browser-history-token"
	base := browserServe(t, binary, dir, workflows, token)
	apiClient := &browserAPI{base: base, token: token}
	long := apiClient.start(t, "chain")
	require.Eventually(t, func() bool { return apiClient.status(t, long) == "completed" }, 30*time.Second, 20*time.Millisecond)
	var page struct {
		Events []struct{ ID int64 } `json:"events"`
	}
	apiClient.call(t, http.MethodGet, "/api/instances/"+long+"/events?limit=1000", "", http.StatusOK, &page)
	total := len(page.Events)
	require.Greater(t, total, 100)

	ctx := browserContext(t, chromium)
	console := browserWatchConsole(ctx)
	browserSignIn(t, ctx, console, base, token, 1440, 1000)
	shown := func() int {
		t.Helper()
		n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("#timeline li").length`))
		require.NoError(t, err)
		return n
	}
	browserDo(t, ctx, console, "open the long history",
		chromedp.Navigate(base+"#/instances/"+long),
		chromedp.WaitVisible(chromedp.CSS(`#graph g.node[data-step="s39"].s-completed`)),
		chromedp.WaitVisible(chromedp.CSS("#events-more")),
	)
	require.Equal(t, 100, shown(), "the first page")
	browserRequireTrue(t, ctx, "the first event is the creation", `document.querySelector("#timeline li .type").textContent === "instance.created"`)
	browserDo(t, ctx, console, "load the rest",
		chromedp.Click(chromedp.CSS("#events-more")),
		chromedp.WaitNotVisible(chromedp.CSS("#events-more")),
	)
	require.Equal(t, total, shown(), "every event, each once")
	count, err := chromedp.Run(ctx, chromedp.TextContent(chromedp.CSS("#events-count")))
	require.NoError(t, err)
	require.Equal(t, fmt.Sprintf("%d events", total), count)
	browserScreenshot(t, ctx, "browser-history.png")

	held := apiClient.start(t, "hold")
	browserDo(t, ctx, console, "open a running instance",
		chromedp.Navigate(base+"#/instances/"+held),
		chromedp.WaitVisible(chromedp.CSS(`#graph g.node[data-step="approval"].s-waiting`)),
	)
	before := shown()
	apiClient.call(t, http.MethodPost, "/api/instances/"+held+"/signals/approve", `{"data": true}`, http.StatusOK, nil)
	browserDo(t, ctx, console, "see the new events come",
		chromedp.WaitVisible(chromedp.CSS("h1 .badge.s-completed")),
	)
	require.Eventually(t, func() bool {
		text, err := chromedp.Run(ctx, chromedp.TextContent(chromedp.CSS("#timeline")))
		return err == nil && strings.Contains(text, "instance.completed")
	}, 10*time.Second, 50*time.Millisecond)
	require.Greater(t, shown(), before)
	browserRequireTrue(t, ctx, "no event twice", `(() => {
		const seen = [...document.querySelectorAll("#timeline li .type")].map((n) => n.textContent);
		return seen.filter((t) => t === "instance.created").length === 1 && seen.filter((t) => t === "instance.completed").length === 1;
	})()`)
	browserRequireNoErrors(t, console)
}
