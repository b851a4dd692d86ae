package e2e

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
)

// browserDelivery waits for a delivery confirmation whose schema is not a
// single boolean, so the UI offers a JSON editor for it.
const browserDelivery = `name: delivery
steps:
  - name: ship
    handler: noop
  - name: confirm
    dependsOn: [ship]
    wait:
      schema:
        type: object
        required: [trackingNo]
        properties:
          trackingNo: {type: string, minLength: 3}
  - name: close
    handler: echo
    dependsOn: [confirm]
    input:
      trackingNo: ${{ steps.confirm.output.trackingNo }}
`

// browserOnePerCustomer runs one instance per customer at a time; the
// others wait for a slot, their first (wait) step blocked.
const browserOnePerCustomer = `name: one-per-customer
concurrency: {key: "${{ input.customer }}", limit: 1}
steps:
  - {name: approve, wait: {}}
`

// browserLedger carries whole numbers past 2^53, which a JavaScript
// number would round, through the page: shown and sent back.
const browserLedger = `name: ledger
steps:
  - name: amount
    wait: {schema: {type: object}}
  - name: book
    handler: echo
    dependsOn: [amount]
    input: ${{ steps.amount.output }}
`

// TestBrowserSignals drives a person's side of wait steps in headless
// Chromium: the shipped refund-approval example waits for approval; its
// page shows the waiting step with its signal and the time left, and a
// click on Approve completes the instance. A wait with another schema gets
// a JSON editor, where a payload the schema refuses shows the server's
// error in the form and a good one completes the instance. A delayed step
// counts down to its start, and the definition names a wait's signal.
func TestBrowserSignals(t *testing.T) {
	chromium := browserChromium(t)
	refund, err := os.ReadFile("../workflows/refund-approval.yaml")
	require.NoError(t, err)
	dir, workflows := browserWorkflows(t, map[string]string{"refund-approval.yaml": string(refund), "delivery.yaml": browserDelivery,
		"one-per-customer.yaml": browserOnePerCustomer, "ledger.yaml": browserLedger})
	const token = "browser-signal-token"
	base := browserServe(t, binary, dir, workflows, token)
	apiClient := &browserAPI{base: base, token: token}

	start := func(workflow, body, waitStep string) string {
		t.Helper()
		var started struct {
			ID string `json:"id"`
		}
		apiClient.call(t, http.MethodPost, "/api/workflows/"+workflow+"/instances", body, http.StatusCreated, &started)
		require.Eventually(t, func() bool { return apiClient.stepStatus(t, started.ID, waitStep) == "waiting" },
			15*time.Second, 20*time.Millisecond, "step %s never waited", waitStep)
		return started.ID
	}
	refundID := start("refund-approval", `{"input": {"orderId": "A-1001", "amount": 42.5}}`, "approval")
	deliveryID := start("delivery", "", "confirm")

	ctx := browserContext(t, chromium)
	console := browserWatchConsole(ctx)
	browserSignIn(t, ctx, console, base, token, 1440, 1000)

	approval := `#graph g.node[data-step="approval"]`
	browserDo(t, ctx, console, "open the waiting refund",
		chromedp.Navigate(base+"#/instances/"+refundID),
		chromedp.WaitVisible(chromedp.CSS(approval+".s-waiting")),
	)
	// The node names the signal and counts down to the deadline (72h).
	node, err := chromedp.Run(ctx, chromedp.TextContent(chromedp.CSS(approval+" text.sub")))
	require.NoError(t, err)
	require.Regexp(t, `^approve · (2d 23h|3d 0h) left$`, node)
	browserRequireTrue(t, ctx, "the time left ticks", `document.querySelector(`+browserJS(approval+" text.sub")+`).dataset.until !== undefined`)

	browserDo(t, ctx, console, "select the waiting step",
		chromedp.Click(chromedp.CSS(approval)),
		chromedp.WaitVisible(chromedp.CSS("#signal-approve")),
		chromedp.WaitVisible(chromedp.CSS("#signal-reject")),
	)
	signal, err := chromedp.Run(ctx, chromedp.TextContent(chromedp.CSS("#step-signal")))
	require.NoError(t, err)
	require.Equal(t, "signal approve", signal)
	deadline, err := chromedp.Run(ctx, chromedp.TextContent(chromedp.CSS("#step-deadline")))
	require.NoError(t, err)
	require.Contains(t, deadline, "left")
	browserScreenshot(t, ctx, "browser-signal-waiting.png")

	browserDo(t, ctx, console, "approve until completed",
		chromedp.Click(chromedp.CSS("#signal-approve")),
		chromedp.WaitVisible(chromedp.CSS("h1 .badge.s-completed")),
		chromedp.WaitVisible(chromedp.CSS(`#graph g.node[data-step="refund"].s-completed`)),
	)
	var done struct {
		Output map[string]any `json:"output"`
	}
	apiClient.call(t, http.MethodGet, "/api/instances/"+refundID, "", http.StatusOK, &done)
	require.Equal(t, map[string]any{"approved": true, "refunded": 42.5}, done.Output)

	// Another schema: a JSON editor, and the server's verdict in the form.
	confirm := `#graph g.node[data-step="confirm"]`
	browserDo(t, ctx, console, "open the waiting delivery and send a payload the schema refuses",
		chromedp.Navigate(base+"#/instances/"+deliveryID),
		chromedp.WaitVisible(chromedp.CSS(confirm+".s-waiting")),
		chromedp.Click(chromedp.CSS(confirm)),
		chromedp.WaitVisible(chromedp.CSS("#signal-data")),
		chromedp.SetValue(chromedp.CSS("#signal-data"), `{"trackingNo": 7}`),
		chromedp.Click(chromedp.CSS("#signal-send")),
		chromedp.WaitVisible(chromedp.CSS("#signal-error")),
	)
	refused, err := chromedp.Run(ctx, chromedp.TextContent(chromedp.CSS("#signal-error")))
	require.NoError(t, err)
	require.Contains(t, refused, "trackingNo")
	require.Equal(t, "waiting", apiClient.stepStatus(t, deliveryID, "confirm"), "a refused payload changes nothing")
	browserScreenshot(t, ctx, "browser-signal-refused.png")

	// The page redraws the step panel as the instance changes (here a pause
	// and a resume) while a payload is typed: the field keeps its focus,
	// and what is typed after the redraw lands in it.
	focused := func(when string) {
		t.Helper()
		active, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.activeElement ? document.activeElement.id : ""`))
		require.NoError(t, err)
		require.Equal(t, "signal-data", active, "the payload field keeps its focus %s", when)
	}
	browserDo(t, ctx, console, "type half a payload",
		chromedp.Evaluate[chromedp.Void](`document.querySelector("#signal-data").value = ""`),
		chromedp.Focus(chromedp.CSS("#signal-data")),
		chromedp.KeyEvent(`{"trackingNo": `),
	)
	apiClient.call(t, http.MethodPost, "/api/instances/"+deliveryID+"/pause", "", http.StatusOK, nil)
	browserDo(t, ctx, console, "see the pause", chromedp.WaitVisible(chromedp.CSS("#paused")))
	focused("after the pause")
	apiClient.call(t, http.MethodPost, "/api/instances/"+deliveryID+"/resume", "", http.StatusOK, nil)
	browserDo(t, ctx, console, "see the resume", chromedp.WaitNotPresent(chromedp.CSS("#paused")))
	focused("after the resume")
	browserDo(t, ctx, console, "type the rest", chromedp.KeyEvent(`"TRK-1"}`))
	typed, err := chromedp.Run(ctx, chromedp.Value(chromedp.CSS("#signal-data")))
	require.NoError(t, err)
	require.Equal(t, `{"trackingNo": "TRK-1"}`, typed)

	browserDo(t, ctx, console, "send a good payload until completed",
		chromedp.Click(chromedp.CSS("#signal-send")),
		chromedp.WaitVisible(chromedp.CSS("h1 .badge.s-completed")),
	)
	require.Equal(t, "completed", apiClient.status(t, deliveryID))

	// Whole numbers past 2^53 keep every digit on the page and in what it
	// sends.
	ledgerID := start("ledger", `{"input": {"accountId": 9007199254740993}}`, "amount")
	amount := `#graph g.node[data-step="amount"]`
	browserDo(t, ctx, console, "open the ledger and send a payload with a big number",
		chromedp.Navigate(base+"#/instances/"+ledgerID),
		chromedp.WaitVisible(chromedp.CSS(amount+".s-waiting")),
		chromedp.Poll[chromedp.Void](`document.querySelector("#instance-input pre").textContent.includes("9007199254740993")`),
		chromedp.Click(chromedp.CSS(amount)),
		chromedp.WaitVisible(chromedp.CSS("#signal-data")),
		chromedp.SetValue(chromedp.CSS("#signal-data"), `{"cents": 9007199254740995}`),
		chromedp.Click(chromedp.CSS("#signal-send")),
		chromedp.WaitVisible(chromedp.CSS("h1 .badge.s-completed")),
	)
	var booked struct {
		Steps []struct {
			Name   string          `json:"name"`
			Output json.RawMessage `json:"output"`
		} `json:"steps"`
	}
	apiClient.call(t, http.MethodGet, "/api/instances/"+ledgerID, "", http.StatusOK, &booked)
	require.Equal(t, "book", booked.Steps[1].Name)
	require.JSONEq(t, `{"cents": 9007199254740995}`, string(booked.Steps[1].Output))
	require.Contains(t, string(booked.Steps[1].Output), "9007199254740995", "every digit, not the nearest float")

	// A step that may not run yet says when it will; the definition shows
	// what a wait step waits for.
	var delayed struct {
		ID string `json:"id"`
	}
	apiClient.call(t, http.MethodPost, "/api/workflows/refund-approval/instances", `{"input": {"orderId": "A-1002", "amount": 1}, "delay": "1h"}`, http.StatusCreated, &delayed)
	request := `#graph g.node[data-step="request"]`
	browserDo(t, ctx, console, "open the delayed refund",
		chromedp.Navigate(base+"#/instances/"+delayed.ID),
		chromedp.WaitVisible(chromedp.CSS(request+".s-pending")),
		chromedp.Click(chromedp.CSS(request)),
		chromedp.WaitVisible(chromedp.CSS("#step-run-after")),
	)
	runs, err := chromedp.Run(ctx, chromedp.TextContent(chromedp.CSS(request+" text.sub")))
	require.NoError(t, err)
	require.Regexp(t, `^runs in (59m \d+s|60m 0s)$`, runs)
	browserDo(t, ctx, console, "watch the countdown tick",
		chromedp.Poll[chromedp.Void](`document.querySelector(`+browserJS(request+" text.sub")+`).textContent !== `+browserJS(runs)))
	browserDo(t, ctx, console, "open the definition",
		chromedp.Navigate(base+"#/workflows/refund-approval"),
		chromedp.WaitVisible(chromedp.CSS(approval)),
	)
	def, err := chromedp.Run(ctx, chromedp.TextContent(chromedp.CSS(approval+" text.sub")))
	require.NoError(t, err)
	require.Equal(t, "signal approve · 72h", def)
	browserDo(t, ctx, console, "select the wait step of the definition",
		chromedp.Click(chromedp.CSS(approval)),
		chromedp.WaitVisible(chromedp.CSS("#wait-schema")),
	)
	browserScreenshot(t, ctx, "browser-signal-definition.png")

	// The server reloads a workflow file that changed, and the open
	// definition page draws the new definition.
	browserDo(t, ctx, console, "open a definition",
		chromedp.Navigate(base+"#/workflows/delivery"),
		chromedp.WaitVisible(chromedp.CSS(`#graph g.node[data-step="close"]`)),
	)
	grown := browserDelivery + `  - {name: notify, handler: noop, dependsOn: [close]}
`
	require.NoError(t, os.WriteFile(filepath.Join(workflows, "delivery.yaml"), []byte(grown), 0o644))
	browserDo(t, ctx, console, "see the definition grow a step",
		chromedp.WaitVisible(chromedp.CSS(`#graph g.node[data-step="notify"]`)),
	)

	// An instance its workflow's concurrency limit holds says so, until
	// the one before it finishes.
	first := start("one-per-customer", `{"input": {"customer": "c-1"}}`, "approve")
	var second struct {
		ID string `json:"id"`
	}
	apiClient.call(t, http.MethodPost, "/api/workflows/one-per-customer/instances", `{"input": {"customer": "c-1"}}`, http.StatusCreated, &second)
	browserDo(t, ctx, console, "open the instance that waits for a slot",
		chromedp.Navigate(base+"#/instances/"+second.ID),
		chromedp.WaitVisible(chromedp.CSS("h1 #held")),
	)
	apiClient.call(t, http.MethodPost, "/api/instances/"+first+"/signals/approve", `{}`, http.StatusOK, nil)
	browserDo(t, ctx, console, "see it start once the first finished",
		chromedp.WaitNotPresent(chromedp.CSS("h1 #held")),
		chromedp.WaitVisible(chromedp.CSS(`#graph g.node[data-step="approve"].s-waiting`)),
	)

	browserRequireNoErrors(t, console)
}
