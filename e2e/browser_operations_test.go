package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
)

// browserOps is a two-step chain, and browserHold a step that waits for a
// signal, so that its instances stay running until cancelled.
const (
	browserOps = `name: ops
steps:
  - {name: first, handler: echo, input: {v: 1}}
  - {name: second, handler: echo, dependsOn: [first], input: {v: 2}}
`
	browserHold = `name: hold
steps:
  - name: approval
    wait: {signal: approve}
`
)

// TestBrowserOperations repairs and acts in bulk from the web UI in
// headless Chromium: on a completed instance, "Retry from this step" in the
// step panel runs the step again and the history says who asked; on the
// list filtered by a workflow, the checkboxes and "Cancel selected" cancel
// the picked instances and say how many.
func TestBrowserOperations(t *testing.T) {
	chromium := browserChromium(t)
	dir, workflows := browserWorkflows(t, map[string]string{"ops.yaml": browserOps, "hold.yaml": browserHold})
	const token = "browser-ops-token"
	base := browserServe(t, binary, dir, workflows, token)
	apiClient := &browserAPI{base: base, token: token}
	done := apiClient.start(t, "ops")
	require.Eventually(t, func() bool { return apiClient.status(t, done) == "completed" }, 15*time.Second, 20*time.Millisecond)
	held := []string{apiClient.start(t, "hold"), apiClient.start(t, "hold")}
	for _, id := range held {
		require.Eventually(t, func() bool { return apiClient.status(t, id) == "running" }, 15*time.Second, 20*time.Millisecond)
	}

	ctx := browserContext(t, chromium)
	console := browserWatchConsole(ctx)
	browserSignIn(t, ctx, console, base, token, 1440, 1000)
	// The page asks before acting; the user says yes.
	accept := chromedp.Evaluate[chromedp.Void](`window.confirm = () => true`)

	first := `#graph g.node[data-step="first"]`
	browserDo(t, ctx, console, "retry the completed instance from its first step",
		chromedp.Navigate(base+"#/instances/"+done),
		chromedp.WaitVisible(chromedp.CSS(first+".s-completed")),
		accept,
		chromedp.Click(chromedp.CSS(first)),
		chromedp.WaitEnabled(chromedp.CSS("#retry-from")),
		chromedp.Click(chromedp.CSS("#retry-from")),
		chromedp.WaitVisible(chromedp.CSS("#timeline .actor")),
		chromedp.WaitVisible(chromedp.CSS("h1 .badge.s-completed")),
	)
	history, err := chromedp.Run(ctx, chromedp.TextContent(chromedp.CSS("#timeline")))
	require.NoError(t, err)
	require.Contains(t, history, "from first")
	require.Contains(t, history, "by api")
	require.Regexp(t, `"message":\s*"from first",\s*"actor":\s*"api"`, apiClient.instanceJSON(t, done))
	require.Eventually(t, func() bool { return apiClient.status(t, done) == "completed" }, 15*time.Second, 20*time.Millisecond)

	// A refusal stays on the page: the page's refreshes, every 1.5 s, do
	// not clear what a click reported; a click on the banner does.
	approval := `#graph g.node[data-step="approval"]`
	browserDo(t, ctx, console, "a refused skip says why, and keeps saying it",
		chromedp.Navigate(base+"#/instances/"+held[0]),
		chromedp.WaitVisible(chromedp.CSS(approval+".s-waiting")),
		chromedp.Evaluate[chromedp.Void](`window.prompt = () => "{oops"`),
		chromedp.Click(chromedp.CSS(approval)),
		chromedp.WaitEnabled(chromedp.CSS("#skip-step")),
		chromedp.Click(chromedp.CSS("#skip-step")),
		chromedp.WaitVisible(chromedp.CSS("#banner")),
	)
	// Two refreshes' time: what is checked is that nothing happens.
	time.Sleep(3500 * time.Millisecond)
	said, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById("banner").hidden ? "" : document.getElementById("banner").textContent`))
	require.NoError(t, err)
	require.Contains(t, said, "the output is not valid JSON")
	browserDo(t, ctx, console, "a click on the banner dismisses it",
		chromedp.Click(chromedp.CSS("#banner")),
		chromedp.WaitNotVisible(chromedp.CSS("#banner")),
	)

	browserDo(t, ctx, console, "cancel the held instances from the list",
		chromedp.Navigate(base+"#/?workflow=hold"),
		chromedp.WaitVisible(chromedp.CSS(fmt.Sprintf(`#instances input[data-id="%s"]`, held[1]))),
		accept,
		chromedp.Click(chromedp.CSS("#pick-all")),
		chromedp.WaitEnabled(chromedp.CSS("#cancel-selected")),
		chromedp.Click(chromedp.CSS("#cancel-selected")),
		chromedp.WaitVisible(chromedp.CSS("#bulk-result")),
	)
	require.Eventually(t, func() bool {
		text, err := chromedp.Run(ctx, chromedp.TextContent(chromedp.CSS("#bulk-result")))
		return err == nil && text == "cancelled 2 instances"
	}, 10*time.Second, 20*time.Millisecond)
	for _, id := range held {
		require.Equal(t, "cancelled", apiClient.status(t, id))
	}
	browserDo(t, ctx, console, "retry every instance the filter picks, the question naming the filter",
		chromedp.Evaluate[chromedp.Void](`window.confirm = (q) => { window.__asked = q; return true; }`),
		chromedp.Click(chromedp.CSS("#retry-matching")),
		chromedp.Poll[chromedp.Void](`document.querySelector("#bulk-result").textContent === "retried 2 instances"`),
	)
	asked, err := chromedp.Run(ctx, chromedp.Evaluate[string](`window.__asked`))
	require.NoError(t, err)
	require.Equal(t, "Retry every failed or cancelled instance matching the filter (workflow hold; 2 shown here)?", asked)
	browserScreenshot(t, ctx, "browser-operations.png")
	browserRequireNoErrors(t, console)
}
