package e2e

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
)

// browserSubflows is a parent whose step inner runs the child workflow
// once, and whose forEach step each runs it once per item.
var browserSubflows = map[string]string{
	"wrap.yaml": `name: wrap
steps:
  - name: inner
    workflow: doubler
    input: {n: 1}
  - name: each
    workflow: doubler
    dependsOn: [inner]
    forEach: [2, 3]
    input: {n: "${{ item }}"}
`,
	"doubler.yaml": `name: doubler
input: {type: object, required: [n]}
steps:
  - name: double
    handler: echo
    input: {n2: "${{ input.n * 2 }}"}
output: ${{ steps.double.output }}
`,
}

// TestBrowserSubflow follows the links between a parent and its children
// in headless Chromium: the workflow step's panel links to its child, the
// child's page names its parent and step and links back, and the item
// table of a forEach workflow step links each item's child.
func TestBrowserSubflow(t *testing.T) {
	chromium := browserChromium(t)
	dir, workflows := browserWorkflows(t, browserSubflows)
	const token = "browser-subflow-token"
	base := browserServe(t, binary, dir, workflows, token)
	apiClient := &browserAPI{base: base, token: token}

	var started struct {
		ID string `json:"id"`
	}
	apiClient.call(t, http.MethodPost, "/api/workflows/wrap/instances", "", http.StatusCreated, &started)
	require.Eventually(t, func() bool { return apiClient.status(t, started.ID) == "completed" },
		30*time.Second, 50*time.Millisecond, "the parent never completed")
	var parent struct {
		Steps []struct {
			Name     string   `json:"name"`
			Children []string `json:"children"`
		} `json:"steps"`
	}
	require.NoError(t, json.Unmarshal([]byte(apiClient.instanceJSON(t, started.ID)), &parent))
	require.Len(t, parent.Steps[0].Children, 1)
	require.Len(t, parent.Steps[1].Children, 2)
	child := parent.Steps[0].Children[0]

	// The list shows the parent only; ?all=true its children too.
	var list []struct {
		ID string `json:"id"`
	}
	apiClient.call(t, http.MethodGet, "/api/instances", "", http.StatusOK, &list)
	require.Len(t, list, 1)
	apiClient.call(t, http.MethodGet, "/api/instances?all=true", "", http.StatusOK, &list)
	require.Len(t, list, 4)
	apiClient.call(t, http.MethodGet, "/api/instances?parent="+started.ID, "", http.StatusOK, &list)
	require.Len(t, list, 3)

	ctx := browserContext(t, chromium)
	console := browserWatchConsole(ctx)
	browserSignIn(t, ctx, console, base, token, 1440, 1000)

	browserDo(t, ctx, console, "open the parent and its workflow step",
		chromedp.Navigate(base+"#/instances/"+started.ID),
		chromedp.WaitVisible(chromedp.CSS(`#graph g.node[data-step="inner"].s-completed`)),
		chromedp.Click(chromedp.CSS(`#graph g.node[data-step="inner"]`)),
		chromedp.WaitVisible(chromedp.CSS("#step-child-link")),
	)
	workflow, err := chromedp.Run(ctx, chromedp.TextContent(chromedp.CSS("#step-workflow")))
	require.NoError(t, err)
	require.Equal(t, "doubler", workflow)
	browserScreenshot(t, ctx, "browser-subflow-parent.png")
	browserDo(t, ctx, console, "follow the link to the child",
		chromedp.Click(chromedp.CSS("#step-child-link")),
		chromedp.WaitVisible(chromedp.CSS("#parent-link")),
	)
	hash, err := chromedp.Run(ctx, chromedp.Evaluate[string](`location.hash`))
	require.NoError(t, err)
	require.Equal(t, "#/instances/"+child, hash)
	title, err := chromedp.Run(ctx, chromedp.TextContent(chromedp.CSS("h1")))
	require.NoError(t, err)
	require.Contains(t, title, "doubler")
	step, err := chromedp.Run(ctx, chromedp.TextContent(chromedp.CSS("#parent-step")))
	require.NoError(t, err)
	require.Equal(t, "inner", step)
	browserScreenshot(t, ctx, "browser-subflow-child.png")

	browserDo(t, ctx, console, "go back to the parent through its link",
		chromedp.Click(chromedp.CSS("#parent-link")),
		chromedp.WaitVisible(chromedp.CSS(`#graph g.node[data-step="each"]`)),
	)
	hash, err = chromedp.Run(ctx, chromedp.Evaluate[string](`location.hash`))
	require.NoError(t, err)
	require.Equal(t, "#/instances/"+started.ID, hash)

	// The workflow step's node opens the child on a double click too.
	browserDo(t, ctx, console, "double-click the workflow step's node",
		chromedp.DoubleClick(chromedp.CSS(`#graph g.node[data-step="inner"]`)),
		chromedp.WaitVisible(chromedp.CSS("#parent-link")),
	)
	hash, err = chromedp.Run(ctx, chromedp.Evaluate[string](`location.hash`))
	require.NoError(t, err)
	require.Equal(t, "#/instances/"+child, hash)
	browserDo(t, ctx, console, "back to the parent",
		chromedp.Click(chromedp.CSS("#parent-link")),
		chromedp.WaitVisible(chromedp.CSS(`#graph g.node[data-step="each"]`)),
	)

	browserDo(t, ctx, console, "open the forEach workflow step's items",
		chromedp.Click(chromedp.CSS(`#graph g.node[data-step="each"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#items-table tr[data-index="1"] a.item-child`)),
	)
	browserRequireTrue(t, ctx, "each item links its own child",
		`document.querySelector('#items-table tr[data-index="0"] a.item-child').getAttribute("href") === `+browserJS("#/instances/"+parent.Steps[1].Children[0])+
			` && document.querySelector('#items-table tr[data-index="1"] a.item-child').getAttribute("href") === `+browserJS("#/instances/"+parent.Steps[1].Children[1]))
	browserDo(t, ctx, console, "follow an item's child",
		chromedp.Click(chromedp.CSS(`#items-table tr[data-index="1"] a.item-child`)),
		chromedp.WaitVisible(chromedp.CSS("#parent-link")),
	)
	text, err := chromedp.Run(ctx, chromedp.TextContent(chromedp.CSS("#parent")))
	require.NoError(t, err)
	require.Contains(t, text, "each")
	require.Contains(t, text, "item 1")

	// With child instances listed too, each child row names its parent and
	// step, as dagrun list --all does; the parent's row names none.
	browserDo(t, ctx, console, "list the child instances too",
		chromedp.Navigate(base+"#/?all=true"),
		chromedp.WaitVisible(chromedp.CSS(`#instances tr[data-id="`+child+`"] .child-of`)),
	)
	of, err := chromedp.Run(ctx, chromedp.TextContent(chromedp.CSS(`#instances tr[data-id="`+child+`"] .child-of`)))
	require.NoError(t, err)
	require.Equal(t, "\u21B3 "+started.ID[:8]+"\u2026"+started.ID[len(started.ID)-4:]+" inner", of)
	browserRequireTrue(t, ctx, "the parent's row names no parent",
		`document.querySelector('#instances tr[data-id=`+browserJS(started.ID)+`] .child-of') === null`)
	browserRequireNoErrors(t, console)
}
