package e2e

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// browserParked waits for a signal that never comes: its instances stay
// running, holding no worker slot.
const browserParked = `name: parked
steps:
  - name: park
    wait: {signal: never}
`

// TestBrowserListLoadsPastTheAPILimit lists more instances than one API
// request returns (500): "Load more" goes on to the oldest, and every row
// shown stays live, the oldest included.
func TestBrowserListLoadsPastTheAPILimit(t *testing.T) {
	chromium := browserChromium(t)
	dir, workflows := browserWorkflows(t, map[string]string{"parked.yaml": browserParked})
	const token = "browser-list-token"
	base := browserServe(t, binary, dir, workflows, token)
	apiClient := &browserAPI{base: base, token: token}

	const total = 560
	ids := make([]string, total)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := w; i < total; i += 4 {
				ids[i] = apiClient.start(t, "parked")
			}
		})
	}
	wg.Wait()
	oldest := ids[0]
	for _, id := range ids[1:] {
		if id < oldest {
			oldest = id // IDs sort by creation
		}
	}

	ctx := browserContext(t, chromium)
	console := browserWatchConsole(ctx)
	browserSignIn(t, ctx, console, base, token, 1440, 1000)
	rows := `document.querySelectorAll("#instances tbody tr[data-id]").length`
	browserDo(t, ctx, console, "open the list of parked instances",
		chromedp.Navigate(base+"#/?workflow=parked"),
		chromedp.Poll[chromedp.Void](rows+" === 50"),
	)
	for shown := 50; shown < total; {
		shown = min(shown+50, total)
		browserDo(t, ctx, console, fmt.Sprintf("load instances up to %d", shown),
			chromedp.Click(chromedp.CSS("#list-more")),
			chromedp.Poll[chromedp.Void](fmt.Sprintf("%s === %d", rows, shown)),
		)
	}
	browserRequireTrue(t, ctx, "every instance is shown, and nothing more to load",
		`document.querySelector("#list-more").hidden && document.querySelector(".filters .count").textContent === "`+fmt.Sprint(total)+` shown"`)

	apiClient.call(t, http.MethodPost, "/api/instances/"+oldest+"/cancel", "", http.StatusOK, nil)
	row := `#instances tbody tr[data-id="` + oldest + `"]`
	browserDo(t, ctx, console, "see the oldest instance, past the first 500, cancelled",
		chromedp.Poll[chromedp.Void](`document.querySelector(`+browserJS(row+" .badge.s-cancelled")+`) !== null`, chromedp.WithPollingTimeout(10*time.Second)),
	)
	// A filter that matches nothing says so, not that nothing was started.
	browserDo(t, ctx, console, "filter the list to a status none of them has",
		chromedp.Navigate(base+"#/?workflow=parked&status=failed"),
		chromedp.Poll[chromedp.Void](`document.querySelector("#instances td.empty")?.textContent === "No instances match these filters."`),
	)
	browserDo(t, ctx, console, "open an address no page has",
		chromedp.Navigate(base+"#/nope"),
		chromedp.Poll[chromedp.Void](`(document.querySelector("#not-found")?.textContent || "") === "No page at #/nope. See the instances."`),
	)
	browserDo(t, ctx, console, "open a workflow that does not exist",
		chromedp.Navigate(base+"#/workflows/nope"),
		chromedp.Poll[chromedp.Void](`(document.querySelector("#not-found")?.textContent || "").startsWith('unknown workflow "nope" (available: parked)')`),
	)
	browserRequireNoErrors(t, console)
}
