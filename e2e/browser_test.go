package e2e

// The browser test drives the web UI of `dagrun serve` in headless Chromium
// over the DevTools protocol (github.com/chromedp/chromedp, the one import
// here beyond the package's usual standard library and testify). It uses
// the binary that TestMain builds.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
)

// browserWorkflow fails at its fetch step (an http step against a server
// that answers 404, a permanent error) until the test flips the server to
// 200. Its note travels into step outputs, so the page must show markup in
// it as text.
const browserWorkflow = `name: fragile
description: Fetches a resource that is missing until the test fixes it.
steps:
  - name: validate
    handler: echo
    input:
      note: ${{ input.note }}
  - name: fetch
    handler: http
    dependsOn: [validate]
    retry: {maxAttempts: 1}
    input:
      url: ${{ input.url }}
  - name: enrich
    handler: echo
    dependsOn: [validate]
    input: {source: enrich}
  - name: audit
    handler: noop
    dependsOn: [validate]
  - name: report
    handler: echo
    dependsOn: [fetch, enrich]
    input:
      status: ${{ steps.fetch.output.status }}
  - name: notify
    handler: echo
    dependsOn: [report, audit]
    input:
      note: ${{ steps.validate.output.note }}
`

// browserPipeline is a 34-step workflow, to check that a big graph stays
// readable (it is only drawn, never run).
func browserPipeline() string {
	var b strings.Builder
	b.WriteString("name: pipeline\ndescription: A wide ETL graph.\nsteps:\n  - {name: ingest, handler: noop}\n")
	for i := range 10 {
		fmt.Fprintf(&b, "  - {name: extract-%02d, handler: noop, dependsOn: [ingest]}\n", i)
		fmt.Fprintf(&b, "  - {name: transform-%02d, handler: noop, dependsOn: [extract-%02d]}\n", i, i)
	}
	for i := range 5 {
		fmt.Fprintf(&b, "  - {name: merge-%d, handler: noop, dependsOn: [transform-%02d, transform-%02d]}\n", i, 9-i, i)
		fmt.Fprintf(&b, "  - {name: load-%d, handler: noop, dependsOn: [merge-%d]}\n", i, i)
	}
	b.WriteString("  - {name: publish, handler: noop, dependsOn: [load-0, load-1, load-2, load-3, load-4]}\n")
	b.WriteString("  - {name: cleanup, handler: noop, dependsOn: [ingest, publish]}\n")
	b.WriteString("  - {name: verify-publication-and-notify-downstream-teams, handler: noop, dependsOn: [publish, extract-03]}\n")
	return b.String()
}

const browserXSS = `<script>alert(1)</script><img src=x onerror=alert(2)>`

// TestBrowserRetryFlow drives the web UI in headless Chromium as a user
// would: sign in with the token, find the failed instance in the list, open
// it, see the failing step, fix the cause, click Retry and watch it
// complete. It saves a screenshot of the instance page.
func TestBrowserRetryFlow(t *testing.T) {
	chromium := browserChromium(t)
	dir, workflows := browserWorkflows(t, map[string]string{"fragile.yaml": browserWorkflow, "pipeline.yaml": browserPipeline()})

	var fixed atomic.Bool
	upstream := browserUpstream(t, func(*http.Request) bool { return fixed.Load() })

	const token = "browser-test-token"
	base := browserServe(t, binary, dir, workflows, token)
	apiClient := &browserAPI{base: base, token: token}

	input, err := json.Marshal(map[string]any{"input": map[string]string{"url": upstream.URL + "/thing", "note": browserXSS}})
	require.NoError(t, err)
	var started struct {
		ID string `json:"id"`
	}
	apiClient.call(t, http.MethodPost, "/api/workflows/fragile/instances", string(input), http.StatusCreated, &started)
	require.Eventually(t, func() bool { return apiClient.status(t, started.ID) == "failed" }, 15*time.Second, 50*time.Millisecond)

	ctx := browserContext(t, chromium)
	var dialogs atomic.Int32
	require.NoError(t, chromedp.Listen(ctx, func(ev any) {
		if _, ok := ev.(*page.EventJavascriptDialogOpening); ok {
			dialogs.Add(1)
		}
	}))
	console := browserWatchConsole(ctx)

	row := fmt.Sprintf(`a[href="#/instances/%s"]`, started.ID)
	browserSignIn(t, ctx, console, base, token, 1440, 1000)
	browserDo(t, ctx, console, "open the failed instance from the list",
		chromedp.WaitVisible(chromedp.CSS(row)),
		chromedp.Click(chromedp.CSS(row)),
		chromedp.WaitVisible(chromedp.CSS(`#graph g.node[data-step="fetch"].s-failed`)),
		chromedp.WaitEnabled(chromedp.CSS("#retry")),
	)
	instErr, err := chromedp.Run(ctx, chromedp.TextContent(chromedp.CSS("#instance-error")))
	require.NoError(t, err)
	require.Contains(t, instErr, "404")

	// The failing step's details show its error.
	browserDo(t, ctx, console, "select the failed step",
		chromedp.Click(chromedp.CSS(`#graph g.node[data-step="fetch"]`)),
		chromedp.WaitVisible(chromedp.CSS("#step-error")),
	)
	stepErr, err := chromedp.Run(ctx, chromedp.TextContent(chromedp.CSS("#step-error")))
	require.NoError(t, err)
	require.Contains(t, stepErr, "404")
	browserScreenshot(t, ctx, "browser-instance-failed.png")

	// Fix the cause, retry from the UI, and watch it complete.
	fixed.Store(true)
	browserDo(t, ctx, console, "retry until completed",
		chromedp.Click(chromedp.CSS("#retry")),
		chromedp.WaitVisible(chromedp.CSS("h1 .badge.s-completed")),
		chromedp.WaitVisible(chromedp.CSS(`#graph g.node[data-step="notify"].s-completed`)),
		chromedp.Click(chromedp.CSS(`#graph g.node[data-step="notify"]`)),
		chromedp.WaitVisible(chromedp.CSS("#step-output")),
	)
	require.Equal(t, "completed", apiClient.status(t, started.ID))

	// Markup in the data is shown as text and never runs.
	output, err := chromedp.Run(ctx, chromedp.TextContent(chromedp.CSS("#step-output")))
	require.NoError(t, err)
	require.Contains(t, output, "<script>alert(1)</script>")
	injected, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("main script, main img[src=x]").length`))
	require.NoError(t, err)
	require.Zero(t, injected)
	require.Zero(t, dialogs.Load(), "a script from the data ran")

	// The history shows the retry.
	history, err := chromedp.Run(ctx, chromedp.TextContent(chromedp.CSS("#timeline")))
	require.NoError(t, err)
	require.Contains(t, history, "instance.retried")

	browserScreenshot(t, ctx, "browser-instance.png")

	// The other pages, for a look: the list and two workflow definitions,
	// one of them with 34 steps.
	browserDo(t, ctx, console, "open the list",
		chromedp.Navigate(base+"#/"),
		chromedp.WaitVisible(chromedp.CSS(row+" ~ *, "+row)),
	)
	browserScreenshot(t, ctx, "browser-list.png")
	browserDo(t, ctx, console, "open the big workflow",
		chromedp.Navigate(base+"#/workflows/pipeline"),
		chromedp.WaitVisible(chromedp.CSS(`#graph g.node[data-step="cleanup"]`)),
		chromedp.WaitVisible(chromedp.CSS("#source")),
	)
	nodes, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("#graph g.node").length`))
	require.NoError(t, err)
	require.Equal(t, 34, nodes)
	browserScreenshot(t, ctx, "browser-workflow-large.png")

	browserRequireNoErrors(t, console)
}

// browserSlow runs its wait step until the test's upstream server answers;
// the other steps are there to be counted. Its five columns are wider than
// the graph's frame in a 1,280 px window.
const browserSlow = `name: slow
steps:
  - name: wait
    handler: http
    retry: {maxAttempts: 1}
    input:
      url: ${{ input.url }}
      timeout: 2m
  - name: after
    handler: echo
    dependsOn: [wait]
    input: {done: true}
  - {name: report, handler: noop, dependsOn: [after]}
  - {name: notify, handler: noop, dependsOn: [report]}
  - {name: archive, handler: noop, dependsOn: [notify]}
  - name: quick
    handler: noop
`

// browserWide is a chain of 60 steps with names of 41 characters: a graph
// far wider than any window.
func browserWide() string {
	var b strings.Builder
	b.WriteString("name: wide\nsteps:\n")
	for i := range 60 {
		fmt.Fprintf(&b, "  - {name: %s, handler: noop", browserWideName(i))
		if i > 0 {
			fmt.Fprintf(&b, ", dependsOn: [%s]", browserWideName(i-1))
		}
		b.WriteString("}\n")
	}
	return b.String()
}

func browserWideName(i int) string {
	return fmt.Sprintf("stage-%02d-normalise-and-validate-records", i)
}

// TestBrowserLivePage checks what a user sees while an instance runs and
// on big graphs, in headless Chromium at 1,280 and 2,400 pixels wide: a
// running step's duration ticks without new data, an opened panel stays
// open when the page redraws, a small graph has no scrollbar, a big one
// fits the window with zoom controls and shows whole names, and cancelled
// steps are counted apart from completed ones.
func TestBrowserLivePage(t *testing.T) {
	chromium := browserChromium(t)
	dir, workflows := browserWorkflows(t, map[string]string{"slow.yaml": browserSlow, "wide.yaml": browserWide(), "pipeline.yaml": browserPipeline()})
	// /release answers once the test says so; anything else never answers
	// (until its step is cancelled).
	release := make(chan struct{})
	var releaseOnce sync.Once
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gate := release
		if r.URL.Path != "/release" {
			gate = nil
		}
		select {
		case <-gate:
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"ok": true}`)
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(upstream.Close)
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })

	const token = "browser-test-token"
	base := browserServe(t, binary, dir, workflows, token)
	apiClient := &browserAPI{base: base, token: token}
	startSlow := func(path string) string {
		var started struct {
			ID string `json:"id"`
		}
		apiClient.call(t, http.MethodPost, "/api/workflows/slow/instances", `{"input": {"url": "`+upstream.URL+path+`"}}`, http.StatusCreated, &started)
		require.Eventually(t, func() bool { return apiClient.stepStatus(t, started.ID, "wait") == "running" }, 15*time.Second, 50*time.Millisecond)
		// quick has no dependencies: waiting for it makes the counts a
		// cancel leaves behind known (one completed, five cancelled).
		require.Eventually(t, func() bool { return apiClient.stepStatus(t, started.ID, "quick") == "completed" }, 15*time.Second, 50*time.Millisecond)
		return started.ID
	}
	running := startSlow("/release")

	ctx := browserContext(t, chromium)
	console := browserWatchConsole(ctx)
	browserSignIn(t, ctx, console, base, token, 1280, 900)

	// 1. The running step's duration moves on its own: the data does not
	// change meanwhile, so a page that only redraws on new data freezes it.
	waitDuration := `document.querySelector('#graph g.node[data-step="wait"] text.sub').textContent`
	before := apiClient.instanceJSON(t, running)
	browserDo(t, ctx, console, "open the running instance",
		chromedp.Navigate(base+"#/instances/"+running),
		chromedp.WaitVisible(chromedp.CSS(`#graph g.node[data-step="wait"].s-running`)),
		chromedp.Poll[chromedp.Void](waitDuration+` !== ""`),
	)
	first, err := chromedp.Run(ctx, chromedp.Evaluate[string](waitDuration))
	require.NoError(t, err)
	browserDo(t, ctx, console, "see the running duration tick",
		chromedp.Poll[chromedp.Void](waitDuration+" !== "+browserJS(first), chromedp.WithPollingTimeout(5*time.Second)),
	)
	second, err := chromedp.Run(ctx, chromedp.Evaluate[string](waitDuration))
	require.NoError(t, err)
	require.Equal(t, before, apiClient.instanceJSON(t, running), "the instance changed while the duration was read")
	t.Logf("running step shown as %q, then %q", first, second)

	// 3. A small graph needs no scrollbar, in a narrow window or a wide one.
	browserRequireTrue(t, ctx, "the small graph fits its frame at 1280 px", browserGraphFits)

	// 2. Open the instance's input and a step's panel, zoom into the graph
	// and scroll it; all of that stays when the step finishes and the page
	// redraws.
	browserDo(t, ctx, console, "open the input and the step, zoom and scroll",
		chromedp.Click(chromedp.CSS("#instance-input summary")),
		chromedp.Click(chromedp.CSS(`#graph g.node[data-step="wait"]`)),
		chromedp.WaitVisible(chromedp.CSS("#step-name")),
		chromedp.Click(chromedp.CSS("#zoom-in")),
	)
	zoom, err := chromedp.Run(ctx, chromedp.Evaluate[string](`(() => {
		document.querySelector("#graph").scrollLeft = 40;
		return document.querySelector("#zoom-level").textContent + " " + document.querySelector("#graph").scrollLeft;
	})()`))
	require.NoError(t, err)
	require.NotEqual(t, "100% 0", zoom, "the graph did not zoom in and scroll")
	browserScreenshot(t, ctx, "browser-live-1280.png")
	releaseOnce.Do(func() { close(release) })
	browserDo(t, ctx, console, "watch the instance complete",
		chromedp.WaitVisible(chromedp.CSS(`#graph g.node[data-step="archive"].s-completed`)),
		chromedp.WaitVisible(chromedp.CSS("h1 .badge.s-completed")),
	)
	browserRequireTrue(t, ctx, "the input stays open", `document.querySelector("#instance-input").open`)
	browserRequireTrue(t, ctx, "the step's panel stays open", `document.querySelector("#step-name").textContent === "wait"`)
	// The panel was open before the step logged anything: its logs arrive
	// live.
	browserDo(t, ctx, console, "see the step's logs arrive in its open panel",
		chromedp.Poll[chromedp.Void](`document.querySelector("#step-logs").textContent.includes("http response")`,
			chromedp.WithPollingTimeout(10*time.Second)),
	)
	browserRequireTrue(t, ctx, "the log line shows the status", `document.querySelector("#step-logs").textContent.includes("status=200")`)
	browserRequireTrue(t, ctx, "the graph keeps its zoom and scroll position",
		`document.querySelector("#zoom-level").textContent + " " + document.querySelector("#graph").scrollLeft === `+browserJS(zoom))
	browserDo(t, ctx, console, "see the same page at 2400 px",
		chromedp.EmulateViewport(2400, 1200),
		chromedp.Click(chromedp.CSS("#zoom-fit")),
		// Fitted to the wider frame, and not enlarged.
		chromedp.Poll[chromedp.Void](`document.querySelector("#graph").clientWidth > 1500 && document.querySelector("#zoom-level").textContent === "100%"`,
			chromedp.WithPollingTimeout(5*time.Second)),
	)
	browserRequireTrue(t, ctx, "the small graph fits its frame at 2400 px", browserGraphFits)
	browserScreenshot(t, ctx, "browser-live-2400.png")

	// 4. Cancelled steps are counted apart from completed ones, in the list
	// and on the instance page.
	cancelled := startSlow("/never")
	apiClient.call(t, http.MethodPost, "/api/instances/"+cancelled+"/cancel", "", http.StatusOK, nil)
	require.Eventually(t, func() bool { return apiClient.stepStatus(t, cancelled, "wait") == "cancelled" }, 15*time.Second, 50*time.Millisecond)
	row := fmt.Sprintf(`tr[data-id="%s"]`, cancelled)
	browserDo(t, ctx, console, "find the cancelled instance in the list",
		chromedp.EmulateViewport(1280, 900),
		chromedp.Navigate(base+"#/"),
		chromedp.WaitVisible(chromedp.CSS(row+` .strip-label [data-status="cancelled"]`)),
	)
	label, err := chromedp.Run(ctx, chromedp.TextContent(chromedp.CSS(row+" .strip-label")))
	require.NoError(t, err)
	require.Contains(t, label, "/6 completed")
	require.Contains(t, label, "5 cancelled")
	require.NotContains(t, label, "6/6")
	browserScreenshot(t, ctx, "browser-list-cancelled.png")
	browserDo(t, ctx, console, "open the cancelled instance",
		chromedp.Navigate(base+"#/instances/"+cancelled),
		chromedp.WaitVisible(chromedp.CSS(`#step-counts [data-status="cancelled"]`)),
		chromedp.WaitVisible(chromedp.CSS(`.legend [data-status="cancelled"]`)),
	)
	counts, err := chromedp.Run(ctx, chromedp.TextContent(chromedp.CSS("#step-counts")))
	require.NoError(t, err)
	require.NotContains(t, counts, "6/6", "cancelled steps are not completed")

	// 3. A graph far wider than the window fits it, zooms in to full size
	// (where the frame scrolls), and fits again; whole names everywhere.
	browserDo(t, ctx, console, "open the wide workflow at 2400 px",
		chromedp.EmulateViewport(2400, 1200),
		chromedp.Navigate(base+"#/workflows/wide"),
		chromedp.WaitVisible(chromedp.CSS(`#graph g.node[data-step="`+browserWideName(59)+`"]`)),
	)
	browserRequireTrue(t, ctx, "the wide graph fits the window", browserGraphFits)
	browserRequireTrue(t, ctx, "the wide graph is scaled down", `parseInt(document.querySelector("#zoom-level").textContent) < 100`)
	browserRequireTrue(t, ctx, "every name is shown whole", browserNamesWhole)
	browserScreenshot(t, ctx, "browser-wide-fit-2400.png")
	browserDo(t, ctx, console, "zoom to full size",
		chromedp.Click(chromedp.CSS("#zoom-actual")),
		chromedp.Poll[chromedp.Void](`document.querySelector("#zoom-level").textContent === "100%"`),
	)
	browserRequireTrue(t, ctx, "the zoomed graph scrolls", "!("+browserGraphFits+")")
	browserScreenshot(t, ctx, "browser-wide-100-2400.png")
	browserDo(t, ctx, console, "fit again",
		chromedp.Click(chromedp.CSS("#zoom-fit")),
		chromedp.Poll[chromedp.Void](browserGraphFits),
	)

	for _, width := range []int64{1280, 2400} {
		browserDo(t, ctx, console, fmt.Sprintf("open the 34-step workflow at %d px", width),
			chromedp.EmulateViewport(width, 1000),
			chromedp.Navigate(base+"#/workflows/pipeline"),
			chromedp.WaitVisible(chromedp.CSS(`#graph g.node[data-step="cleanup"]`)),
		)
		browserRequireTrue(t, ctx, "the 34-step graph fits", browserGraphFits)
		browserRequireTrue(t, ctx, "every name is shown whole", browserNamesWhole)
		browserScreenshot(t, ctx, fmt.Sprintf("browser-pipeline-%d.png", width))
	}

	browserRequireNoErrors(t, console)
}

// browserGraphFits is true when the graph's frame has no horizontal
// scrollbar.
const browserGraphFits = `(() => { const g = document.querySelector("#graph"); return g.scrollWidth <= g.clientWidth; })()`

// browserNamesWhole is true when every node shows its whole name, within
// its box.
const browserNamesWhole = `[...document.querySelectorAll("#graph g.node")].every((g) => {
	const name = g.querySelector("text.name");
	return name.textContent === g.dataset.step && name.getComputedTextLength() <= g.querySelector("rect.box").width.baseVal.value - 14;
})`

// browserRequireTrue evaluates a JavaScript condition in the page.
func browserRequireTrue(t *testing.T, ctx context.Context, what, condition string) {
	t.Helper()
	ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](condition))
	require.NoError(t, err, what)
	require.True(t, ok, what)
}

// browserJS is s as a JavaScript string literal.
func browserJS(s string) string {
	data, _ := json.Marshal(s)
	return string(data)
}

// TestServeRefusesPublicBindWithoutToken checks that `dagrun serve` will
// not expose an unauthenticated API beyond the machine: exit code 2 and one
// line saying how to fix it.
func TestServeRefusesPublicBindWithoutToken(t *testing.T) {
	t.Parallel()
	env := make([]string, 0, len(os.Environ()))
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DAGRUN_TOKEN=") {
			env = append(env, kv)
		}
	}
	for _, addr := range []string{"0.0.0.0:0", ":0", "[::]:0", "192.0.2.1:0", "example.com:0"} {
		cmd := exec.Command(binary, "serve", "--addr", addr, "--db", filepath.Join(t.TempDir(), "dagrun.db"))
		cmd.Env = append(env, "GORACE=atexit_sleep_ms=0 "+os.Getenv("GORACE"))
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		var exit *exec.ExitError
		require.ErrorAs(t, err, &exit, addr)
		require.Equal(t, 2, exit.ExitCode(), addr)
		require.Empty(t, stdout.String())
		msg := stderr.String()
		require.Equal(t, 1, strings.Count(msg, "\n"), "one line: %q", msg)
		require.Contains(t, msg, "refusing to serve on "+addr+" without a token")
		require.Contains(t, msg, "--token")
	}
}

// browserSignIn opens the UI in a window of that size and gives the
// server's token to the sign-in page the server answers with.
func browserSignIn(t *testing.T, ctx context.Context, console *browserConsole, base, token string, width, height int64) {
	t.Helper()
	browserDo(t, ctx, console, "sign in",
		chromedp.EmulateViewport(width, height),
		chromedp.Navigate(base),
		browserSubmitToken(token),
		browserWaitSignedIn(),
	)
}

// browserLoginForm is the server's sign-in form.
const browserLoginForm = `form[action="/ui/login"]`

// browserSubmitToken fills in the sign-in page and sends it.
func browserSubmitToken(token string) chromedp.Action[chromedp.Void] {
	return chromedp.Steps(
		// The server has a token: instead of the UI it sends a sign-in page.
		chromedp.WaitVisible(chromedp.CSS(browserLoginForm+" #token")),
		chromedp.SendKeys(chromedp.CSS(browserLoginForm+" #token"), token),
		chromedp.Click(chromedp.CSS(browserLoginForm+` button[type="submit"]`)),
	)
}

// browserWaitSignedIn waits for the UI, signed in, to have reached the API.
func browserWaitSignedIn() chromedp.Action[chromedp.Void] {
	return chromedp.Steps(
		chromedp.WaitVisible(chromedp.CSS(`#logout button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS("#live.ok")),
	)
}

// TestBrowserSignInAndOut signs in on the server's sign-in page, first
// with a wrong token, and out again: by the UI's button, and in another
// tab, which sends the open UI back to the sign-in page.
func TestBrowserSignInAndOut(t *testing.T) {
	chromium := browserChromium(t)
	dir, workflows := browserWorkflows(t, map[string]string{"fragile.yaml": browserWorkflow})
	const token = "browser-signin-token"
	base := browserServe(t, binary, dir, workflows, token)
	ctx := browserContext(t, chromium)
	console := browserWatchConsole(ctx)

	browserDo(t, ctx, console, "give a wrong token",
		chromedp.Navigate(base+"#/workflows"),
		browserSubmitToken("not-the-token"),
		chromedp.WaitVisible(chromedp.CSS(browserLoginForm+" .error")),
	)
	refusal, err := chromedp.Run(ctx, chromedp.TextContent(chromedp.CSS(browserLoginForm+" .error")))
	require.NoError(t, err)
	require.Equal(t, "That token was not accepted.", refusal)
	browserScreenshot(t, ctx, "browser-sign-in-refused.png")

	// Signed in, the browser is back at the page it was opened at: the
	// sign-in page keeps the address's fragment, which the server never sees.
	browserDo(t, ctx, console, "give the token, and land on the page asked for",
		browserSubmitToken(token), browserWaitSignedIn(),
		chromedp.WaitVisible(chromedp.CSS(`a[href="#/workflows/fragile"]`)),
	)
	landed, err := chromedp.Run(ctx, chromedp.Location())
	require.NoError(t, err)
	require.Equal(t, base+"#/workflows", landed)
	// The token is in a cookie the page's script cannot read, and nowhere
	// else in the page's reach.
	kept, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.cookie + "|" + sessionStorage.length + "|" + localStorage.length`))
	require.NoError(t, err)
	require.Equal(t, "|0|0", kept)
	browserDo(t, ctx, console, "open a page of the UI by its address",
		chromedp.Navigate(base+"#/workflows"),
		chromedp.WaitVisible(chromedp.CSS(`a[href="#/workflows/fragile"]`)),
	)
	browserScreenshot(t, ctx, "browser-signed-in.png")

	browserDo(t, ctx, console, "sign out with the button",
		chromedp.Click(chromedp.CSS(`#logout button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS(browserLoginForm+" #token")),
	)
	where, err := chromedp.Run(ctx, chromedp.Location())
	require.NoError(t, err)
	require.Equal(t, base, where)

	browserDo(t, ctx, console, "sign in again", browserSubmitToken(token), browserWaitSignedIn())
	browserDo(t, ctx, console, "sign out in another tab; the open UI goes to the sign-in page",
		chromedp.Evaluate[chromedp.Void](`fetch("ui/logout", {method: "POST"}).then(() => {})`, chromedp.EvalAwaitPromise),
		chromedp.WaitVisible(chromedp.CSS(browserLoginForm+" #token")),
	)
	browserRequireNoErrors(t, console)
}

// browserRequireNoErrors fails the test if the page threw or broke its
// Content Security Policy; a 401 before signing in is expected.
func browserRequireNoErrors(t *testing.T, console *browserConsole) {
	t.Helper()
	var problems []string
	for _, m := range console.messages() {
		if m.IsException() || strings.Contains(m.Text, "Content Security Policy") {
			problems = append(problems, m.String())
		}
	}
	require.Empty(t, problems, "the page logged errors")
}

// browserDo runs one user step in the page; on failure it reports what the
// page showed, to tell a slow page from a broken one.
func browserDo(t *testing.T, ctx context.Context, console *browserConsole, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	stepCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := chromedp.Do(stepCtx, actions...); err != nil {
		text, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body ? document.body.innerText : ""`))
		where, _ := chromedp.Run(ctx, chromedp.Location())
		var log strings.Builder
		for _, m := range console.messages() {
			log.WriteString(m.String() + "\n")
		}
		t.Fatalf("%s: %v\nat %s, page text:\n%s\nconsole:\n%s", what, err, where, text, log.String())
	}
}

// browserConsole collects what the page writes to its console. The
// collecting goroutine never touches t, so it may outlive the test.
type browserConsole struct {
	mu   sync.Mutex
	list []chromedp.ConsoleMessage
}

func browserWatchConsole(ctx context.Context) *browserConsole {
	c := &browserConsole{}
	messages := chromedp.Console(ctx)
	go func() {
		for m, err := range messages {
			if err != nil {
				return
			}
			c.mu.Lock()
			c.list = append(c.list, m)
			c.mu.Unlock()
		}
	}()
	return c
}

func (c *browserConsole) messages() []chromedp.ConsoleMessage {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]chromedp.ConsoleMessage(nil), c.list...)
}

// browserScreenshot saves the page to $DAGRUN_ARTIFACTS (or the test's
// temporary folder) and logs where.
func browserScreenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	dir := os.Getenv("DAGRUN_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir()
	}
	require.NoError(t, os.MkdirAll(dir, 0o755))
	path := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(path, shot, 0o644))
	t.Logf("screenshot: %s", path)
}

// browserChromium finds Debian's Chromium; without it the test skips,
// except under CI=true, where a missing browser must not pass unnoticed.
func browserChromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"/usr/bin/chromium", "chromium", "chromium-browser"} {
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("Chromium is not installed (apt-get install -y chromium); the browser test is required under CI=true")
	}
	t.Skip("Chromium is not installed (apt-get install -y chromium); skipping the browser test")
	return ""
}

// browserUpstream is a server for http steps: {"ok": true} for a request
// found says is there, 404 (a permanent failure) for any other.
func browserUpstream(t *testing.T, found func(*http.Request) bool) *httptest.Server {
	t.Helper()
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !found(r) {
			http.Error(w, "not here", http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"ok": true}`)
	}))
	t.Cleanup(upstream.Close)
	return upstream
}

// browserWorkflows writes workflow files into a new folder and returns the
// test's folder (for the database) and the workflows folder.
func browserWorkflows(t *testing.T, files map[string]string) (dir, workflows string) {
	t.Helper()
	dir = t.TempDir()
	workflows = filepath.Join(dir, "workflows")
	require.NoError(t, os.MkdirAll(workflows, 0o755))
	for name, src := range files {
		require.NoError(t, os.WriteFile(filepath.Join(workflows, name), []byte(src), 0o644))
	}
	return dir, workflows
}

var browserListening = regexp.MustCompile(`url=(http://127\.0\.0\.1:\d+/)`)

// browserServe runs `dagrun serve --worker` on a free loopback port and
// returns its base URL. At cleanup it sends SIGINT and requires a clean
// exit (graceful shutdown).
func browserServe(t *testing.T, bin, dir, workflows, token string) string {
	t.Helper()
	cmd := exec.Command(bin, "serve", "--worker", "--addr", "127.0.0.1:0",
		"--db", "sqlite:"+filepath.Join(dir, "dagrun.db"), "--workflows", workflows)
	cmd.Env = append(os.Environ(), "DAGRUN_TOKEN="+token, "GORACE=atexit_sleep_ms=0 "+os.Getenv("GORACE"))
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	var logs bytes.Buffer
	var logsMu sync.Mutex
	require.NoError(t, cmd.Start())
	found := make(chan string, 1)
	scanDone := make(chan struct{})
	go func() {
		defer close(scanDone)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			logsMu.Lock()
			logs.WriteString(line + "\n")
			logsMu.Unlock()
			if m := browserListening.FindStringSubmatch(line); m != nil {
				select {
				case found <- m[1]:
				default:
				}
			}
		}
	}()
	exited := make(chan error, 1)
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		select {
		case err := <-exited:
			<-scanDone
			logsMu.Lock()
			defer logsMu.Unlock()
			require.NoError(t, err, "dagrun serve did not exit cleanly:\n%s", logs.String())
			require.Contains(t, logs.String(), "dagrun serve stopped")
			require.NotContains(t, logs.String(), "WARNING: DATA RACE")
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			t.Error("dagrun serve did not stop within 15s of SIGINT")
		}
	})
	go func() {
		<-scanDone
		exited <- cmd.Wait()
	}()
	select {
	case url := <-found:
		return url
	case <-time.After(15 * time.Second):
		logsMu.Lock()
		defer logsMu.Unlock()
		t.Fatalf("dagrun serve did not report its address within 15s:\n%s", logs.String())
	}
	return ""
}

// browserContext starts headless Chromium with a throwaway profile.
func browserContext(t *testing.T, chromium string) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx,
		chromedp.ExecPath(chromium),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1440, 1000),
	)
	t.Cleanup(cancelAlloc)
	browserCtx, cancelBrowser := chromedp.NewContext(allocCtx)
	t.Cleanup(cancelBrowser)
	return browserCtx
}

// browserAPI calls the server's JSON API directly, for setup and checks.
type browserAPI struct {
	base  string
	token string
}

func (a *browserAPI) call(t *testing.T, method, path, body string, wantStatus int, out any) {
	t.Helper()
	resp, data := apiCall(t, method, strings.TrimSuffix(a.base, "/")+path, body, "Authorization", "Bearer "+a.token)
	require.Equal(t, wantStatus, resp.StatusCode, "%s %s: %s", method, path, data)
	if out != nil {
		require.NoError(t, json.Unmarshal([]byte(data), out))
	}
}

// start starts an instance of workflow without input and returns its ID.
func (a *browserAPI) start(t *testing.T, workflow string) string {
	t.Helper()
	var started struct {
		ID string `json:"id"`
	}
	a.call(t, http.MethodPost, "/api/workflows/"+workflow+"/instances", "", http.StatusCreated, &started)
	return started.ID
}

func (a *browserAPI) instanceJSON(t *testing.T, id string) string {
	t.Helper()
	var inst json.RawMessage
	a.call(t, http.MethodGet, "/api/instances/"+id, "", http.StatusOK, &inst)
	return string(inst)
}

func (a *browserAPI) stepStatus(t *testing.T, id, step string) string {
	t.Helper()
	var inst struct {
		Steps []struct {
			Name   string `json:"name"`
			Status string `json:"status"`
		} `json:"steps"`
	}
	a.call(t, http.MethodGet, "/api/instances/"+id, "", http.StatusOK, &inst)
	for _, s := range inst.Steps {
		if s.Name == step {
			return s.Status
		}
	}
	return ""
}

func (a *browserAPI) status(t *testing.T, id string) string {
	t.Helper()
	var inst struct {
		Status string `json:"status"`
	}
	a.call(t, http.MethodGet, "/api/instances/"+id, "", http.StatusOK, &inst)
	return inst.Status
}
