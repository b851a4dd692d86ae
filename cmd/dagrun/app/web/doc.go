// Package web is what `dagrun serve` serves: the HTTP JSON API, the web UI
// (embedded in the binary, no CDN, works offline) and Prometheus metrics.
//
// It builds on the engine (package dagrun) and the CLI's JSON shapes
// (cmd/dagrun/app/view), so the API's instance object is exactly the one
// `dagrun status --json` prints. It imports no storage backend.
//
// # Routes
//
// All bodies are JSON (Content-Type: application/json; a JSON body sent
// as curl -d sends it, labelled form-urlencoded or text/plain, is read as
// JSON too). Errors are
// {"error": "message"} with 400 (bad request or input), 401 (missing or
// wrong token), 404 (unknown workflow, instance or route), 405, 409 (the
// instance's state does not allow it, e.g. cancelling a finished one), 413
// (body over Config.MaxBodyBytes), 415 (a body of another media type), 503
// (storage unavailable) or 500.
//
//	GET  /api/workflows
//	     [{"name", "description", "steps": N, "hash"}]
//	GET  /api/workflows/{name}
//	     {"name", "description", "hash", "inputSchema", "source" (the YAML),
//	      "steps": [{"name", "handler", "dependsOn", "queue",
//	                 "retry": {"maxAttempts", "backoff", "maxBackoff"},
//	                 "timeout", "when", "continueOnError", "forEach" (bool),
//	                 "concurrency" (its items' cap, 0 for none),
//	                 "concurrencyLimit": {"key", "limit"} (absent
//	                 without a keyed step concurrency),
//	                 "wait": null, or for a wait step (whose "handler" is
//	                 "") {"signal", "timeout" (null: for ever), "schema"}}],
//	      "graph": Graph (with "mermaid"), and when set "timeout",
//	      "onFailure" (steps), "concurrency": {"key", "limit"} and
//	      "schedule": [{"index", "cron", "timezone", "input", "overlap",
//	      "catchup"}]}
//	POST /api/workflows/{name}/instances
//	     body {"input": any, "key": "k", "priority": 0, "delay": "10s"}
//	     201 with the instance; when the idempotency key matched one, 201
//	     with that instance and the header Idempotent-Replayed: true
//	     (nothing is started); 400 for input the workflow rejects.
//	GET  /api/instances?workflow=W&status=S&limit=N&before=ID
//	     [instance...], newest first, as `dagrun list --json` prints them;
//	     limit 1..500 (default 50). Unless it is the last, a page has a
//	     header Link: </api/instances?...&before=ID>; rel="next", the URL
//	     of the next page. List items carry steps but no events.
//	GET  /api/instances/{id}
//	     the instance with "events", the latest 100 of its history (and
//	     "eventsTruncated": true when older ones exist), plus "graph": its
//	     steps laid out.
//	     A waiting step carries "signal" and "deadline" (null: no timeout);
//	     a pending step "runAfter", when it may run. A forEach step carries "items": {"total", "pending", "running",
//	     "completed", "failed", "cancelled"}, counts only, and as its
//	     "output" the list of its items' outputs up to
//	     view.MaxInlineItemsOutput bytes, past which "output" is null and
//	     "outputOmitted": true (page the items), so the object stays small
//	     whatever the number of items. An onFailure
//	     step carries "onFailure": true and comes after the main steps; an
//	     instance with a workflow timeout carries "timeout" and, while it
//	     runs, "deadline"; a failed one "failedStep" (when a step failed
//	     it), and one whose onFailure steps run (still "running")
//	     "failing": true.
//	GET  /api/instances/{id}/steps/{step}/items?offset=N&limit=N&status=S
//	     {"items": [{"index", "status", "attempts", "input", "output",
//	      "error", "startedAt", "finishedAt", "workerId"}], "offset",
//	      "limit", "total"}: a page of a forEach step's items in index
//	     order, limit 1..1000 (default 100); total counts the items in
//	     status S (all when no status). 404 for an unknown instance or
//	     step, or a step that is not a forEach step.
//	GET  /api/instances/{id}/events?after=ID&limit=N
//	     {"events": [{"id", "at", "type", ...}], "next": ID}: a page of the
//	     history in ID order, the events after the event ID after (default
//	     0: from the first), limit 1..1000 (default 100); next, present
//	     when more follow, is the after of the next page. 404 for an
//	     unknown instance.
//	POST /api/instances/{id}/cancel   200 with the instance; 409 if finished
//	POST /api/instances/{id}/retry    200 with the instance; 409 unless failed
//	                                  or cancelled
//	POST /api/instances/{id}/signals/{name}
//	     body {"data": any (the payload, null when absent), "id": "optional
//	     signal ID"}. 200 {"delivered": bool, "duplicate": bool, "instance"}:
//	     delivered when it completed a waiting step now, false when it is
//	     stored until the step waits; duplicate when the same id was sent
//	     before (nothing changed). 400 for a payload the wait step's schema
//	     refuses (nothing written), 404 for an unknown instance or a name
//	     none of its wait steps waits for (the message lists those), 409
//	     when the instance is finished or the signal was sent before
//	     without the same id.
//	GET  /healthz   {"status": "ok"}, or 503 with an "error" when the store
//	                does not answer; never needs the token
//	GET  /metrics   Prometheus text format
//	GET  /          the web UI (static files under /ui/)
//	POST /ui/login  with a token only: the form of the sign-in page
//	                (token=<token>, next=<path>); sets the sign-in cookie
//	                and answers 303 to next, or 401 and the page again
//	POST /ui/logout clears the sign-in cookie; 303 to /
//
// Durations in definitions are Go duration strings ("1m30s"); times are
// RFC 3339 in UTC. Graph is {"nodes": [{"id", "layer", "order", "x", "y",
// "width", "height"}], "edges": [{"from", "to", "points": [{"x", "y"}],
// "direct"}], "width", "height"}, a layered (Sugiyama-style) layout computed
// here so the UI only draws it. Its size is proportional to steps plus
// edges: an edge that skips columns is routed through them within a budget
// of that size, and one left over is "direct": true (two points). An
// instance's graph draws its onFailure steps below the others: their
// nodes carry "onFailure": true, and "groups": [{"label", "y"}] gives the
// top of their band.
//
// # Security
//
// With Config.Token set, every route but /healthz (open so load balancers
// can probe it) needs the token, the web UI and /api/openapi.json included:
// as "Authorization: Bearer <token>", or as the HttpOnly, SameSite=Lax
// cookie dagrun_token, which holds an HMAC of the token rather than the
// token (both compared in constant time). A browser cannot attach a header
// to a page navigation, so when one asks for / or /ui/... without the
// token (its Accept names text/html) it gets, with the 401, a sign-in page
// whose form posts the token to /ui/login; that route, the one other that
// needs no token, sets the cookie, which the UI's API calls then carry
// (they are same-origin). Every other refused request gets the JSON 401.
// What a request does is recorded under its token's name either way.
//
// Without a token the server is meant for loopback use only (`dagrun serve`
// refuses a non-loopback address without one), and it then rejects requests
// whose Host is not a loopback name, so a web page cannot reach it through
// DNS rebinding. Cross-origin browser POSTs are refused either way
// (net/http.CrossOriginProtection; so another site cannot sign a browser
// in or out either), request bodies are capped, and every
// response carries Content-Security-Policy: default-src 'self' and
// X-Content-Type-Options: nosniff. The UI builds its DOM with textContent,
// never innerHTML, so data in inputs, outputs and errors is never markup.
//
// Workflow definitions are read once, when the server starts; restart it
// to serve edited files (running instances always keep the definition
// snapshot they started with).
package web
