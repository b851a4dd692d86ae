// dagrun web UI: plain JavaScript, no dependencies.
//
// Every value that comes from the API is put into the page with
// textContent or as an attribute value through the el()/svg() helpers
// below; nothing is ever parsed as HTML (no innerHTML, no
// insertAdjacentHTML, no document.write), so inputs, outputs and errors of
// steps cannot become markup or script.
//
// Pages are addressed by the URL fragment (#/instances/ID), so links and
// reloads work without server-side routes. With a server token the server
// asks for it on a sign-in page, and the browser then holds an HttpOnly
// cookie, which this script never sees and every API call (same origin)
// carries.
"use strict";

(() => {
  const POLL_MS = 1500;
  // The instance list shows LIST_PAGE more instances per "Load more"; the
  // API answers at most LIST_MAX per request.
  const LIST_PAGE = 50;
  const LIST_MAX = 500;
  const STATUSES = ["pending", "running", "completed", "failed", "cancelled"];
  const ICONS = {
    blocked: "\u22EF", pending: "\u25F7", running: "\u21BB", waiting: "\u25D4", completed: "\u2713",
    failed: "\u2715", skipped: "\u21B7", cancelled: "\u2298",
  };
  const SVG_NS = "http://www.w3.org/2000/svg";

  const main = document.getElementById("main");
  const banner = document.getElementById("banner");
  const live = document.getElementById("live");

  // ---- DOM helpers: the only way this UI creates elements. ----

  // el("tag", {class, attr: value, onclick: fn}, child, ...): strings become
  // text nodes, arrays are flattened, null/false are skipped.
  function el(tag, attrs, ...children) {
    return build(document.createElement(tag), attrs, children);
  }
  function svg(tag, attrs, ...children) {
    return build(document.createElementNS(SVG_NS, tag), attrs, children);
  }
  function build(node, attrs, children) {
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else if (k === "text") node.textContent = String(v);
      else node.setAttribute(k, v === true ? "" : String(v));
    }
    append(node, children);
    return node;
  }
  function append(node, children) {
    for (const c of [children].flat(Infinity)) {
      if (c === null || c === undefined || c === false) continue;
      node.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
    }
  }
  function clear(node) {
    while (node.firstChild) node.removeChild(node.firstChild);
  }
  // Links only ever point inside the UI (a fragment built here), never at a
  // URL taken from data, so no javascript: URL can sneak in.
  function link(path, ...children) {
    return el("a", { href: "#" + path }, ...children);
  }

  // ---- Formatting ----

  function badge(status) {
    return el("span", { class: "badge s-" + status }, (ICONS[status] || "") + " " + status);
  }
  function fmtDuration(ms) {
    if (ms === null || ms === undefined || isNaN(ms)) return "–";
    if (ms < 1000) return Math.max(0, Math.round(ms)) + "ms";
    const s = ms / 1000;
    if (s < 60) return (s < 10 ? s.toFixed(2) : s.toFixed(1)) + "s";
    const m = Math.floor(s / 60);
    if (m < 60) return m + "m " + Math.round(s % 60) + "s";
    const h = Math.floor(m / 60);
    if (h < 48) return h + "h " + (m % 60) + "m";
    return Math.floor(h / 24) + "d " + (h % 24) + "h";
  }
  function between(a, b) {
    if (!a) return null;
    return (b ? Date.parse(b) : Date.now()) - Date.parse(a);
  }
  // TIME_FORMAT formats as toLocaleString with the same options does, made
  // once: toLocaleString builds a formatter on every call, about 0.1 ms,
  // and a step's log panel asks for 200 at a time (a fifth of the task
  // that opens a forEach step's panel, in a profile of TestBrowserForEach).
  const TIME_FORMAT = new Intl.DateTimeFormat(undefined,
    { year: "numeric", month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", second: "2-digit" });
  function fmtTime(iso) {
    if (!iso) return "–";
    return TIME_FORMAT.format(new Date(iso));
  }
  function fmtClock(iso) {
    const d = new Date(iso);
    const p = (n, w) => String(n).padStart(w || 2, "0");
    return p(d.getHours()) + ":" + p(d.getMinutes()) + ":" + p(d.getSeconds()) + "." + p(d.getMilliseconds(), 3);
  }
  function ago(iso) {
    const ms = Date.now() - Date.parse(iso);
    if (ms < 5000) return "just now";
    return fmtDuration(ms).replace(/\.\d+s$/, "s") + " ago";
  }
  // parseJSON is JSON.parse keeping every digit of a whole number past
  // 2^53 (IDs, amounts in minor units), which a JavaScript number would
  // round: shown, or sent back, it is the text the server wrote. Where
  // the browser cannot read a number's source text, it is JSON.parse.
  const exactNumbers = typeof JSON.rawJSON === "function";
  function keepDigits(key, value, context) {
    if (typeof value === "number" && !Number.isSafeInteger(value) && context &&
        /^-?\d+$/.test(context.source)) {
      return JSON.rawJSON(context.source);
    }
    return value;
  }
  function parseJSON(text) {
    return exactNumbers ? JSON.parse(text, keepDigits) : JSON.parse(text);
  }
  function pretty(value) {
    if (value === null || value === undefined) return "null";
    return JSON.stringify(value, null, 2);
  }
  function jsonBlock(value) {
    return el("pre", { class: "json mono" }, pretty(value));
  }
  // heldBadge marks an instance its workflow's concurrency limit holds: its
  // steps wait (a first wait step only shows blocked) until a slot frees.
  function heldBadge(inst, id) {
    if (!inst.held) return null;
    return el("span", { class: "badge paused", id: id || null,
      title: "Waits for a slot of its workflow's concurrency limit (key " + JSON.stringify(inst.concurrencyKey || "") +
        "): it starts when an instance of that key finishes" }, "waits for a slot");
  }

  function shortID(id) {
    return id.length > 13 ? id.slice(0, 8) + "…" + id.slice(-4) : id;
  }

  // ---- Live values: durations that tick without a refetch ----

  // An element with data-since shows prefix + the time from then until now,
  // one with data-until prefix + the time from now until then + suffix (a
  // countdown: a wait's time left, a pending step's start), and one with
  // data-ago how long ago it was; tick() redraws just these texts every
  // second, so a running step's duration moves while the data (and the
  // rest of the page) stays as it is.
  function setSince(node, since, prefix) {
    delete node.dataset.until;
    if (since) {
      node.dataset.since = since;
      node.dataset.prefix = prefix || "";
    } else {
      delete node.dataset.since;
    }
    setText(node, since ? sinceText(node) : prefix || "");
    return node;
  }
  function setUntil(node, until, prefix, lead, suffix) {
    delete node.dataset.since;
    node.dataset.until = until;
    node.dataset.prefix = prefix || "";
    node.dataset.lead = lead || "";
    node.dataset.suffix = suffix || "";
    setText(node, untilText(node));
    return node;
  }
  function sinceText(node) {
    return node.dataset.prefix + fmtDuration(Date.now() - Date.parse(node.dataset.since)) + "\u2026";
  }
  function untilText(node) {
    const left = Date.parse(node.dataset.until) - Date.now();
    // A second late is normal: the database's clock decides, and the page
    // polls; "due" says the time has come without counting backwards.
    return node.dataset.prefix + (left > 0 ? node.dataset.lead + fmtDuration(left).replace(/\.\d+s$/, "s") + node.dataset.suffix : "due");
  }
  // countdown is a span counting down to iso, e.g. "3h 12m left".
  function countdown(iso, lead, suffix) {
    return setUntil(el("span", { class: "ticking" }), iso, "", lead, suffix);
  }
  function setAgo(node, iso) {
    node.dataset.ago = iso;
    setText(node, ago(iso));
    return node;
  }
  function tick() {
    for (const n of main.querySelectorAll("[data-since]")) setText(n, sinceText(n));
    for (const n of main.querySelectorAll("[data-until]")) setText(n, untilText(n));
    for (const n of main.querySelectorAll("[data-ago]")) setText(n, ago(n.dataset.ago));
  }
  setInterval(tick, 1000);

  // A duration from start to finish, or a ticking one while unfinished.
  function duration(start, finish) {
    if (!start) return el("span", {}, "\u2013");
    if (finish) return el("span", {}, fmtDuration(between(start, finish)));
    return setSince(el("span", { class: "ticking" }), start);
  }

  // setText and setAttr touch the DOM only for a real change, so an update
  // that changes nothing leaves selections, focus and animations alone.
  function setText(node, text) {
    if (node.textContent !== text) node.textContent = text;
  }
  function setAttr(node, name, value) {
    if (node.getAttribute(name) !== value) node.setAttribute(name, value);
  }

  // section(node) returns update(key, build): build() replaces the
  // node's content only when key differs from last time, and what the user
  // opened or scrolled survives it: the node's own scroll position, and
  // the open state and scroll position of every element marked
  // data-keep="name" (matched by name in the new content).
  function section(node) {
    let last = null;
    return (key, build) => {
      if (key === last) return;
      last = key;
      const marked = () => [node, ...node.querySelectorAll("[data-keep]")];
      const kept = new Map();
      for (const n of marked()) kept.set(n === node ? "" : n.dataset.keep, { open: n.open, top: n.scrollTop, left: n.scrollLeft });
      clear(node);
      append(node, build());
      for (const n of marked()) {
        const k = kept.get(n === node ? "" : n.dataset.keep);
        if (!k) continue;
        if (n.tagName === "DETAILS") n.open = k.open;
        // New content starts unscrolled; setting a scroll position lays the
        // page out at once, inside this task, so only one that moved is.
        if (k.top) n.scrollTop = k.top;
        if (k.left) n.scrollLeft = k.left;
      }
    };
  }

  // Step counts, each status apart: cancelled steps are not "done".
  const STEP_STATUSES = ["blocked", "pending", "running", "waiting", "completed", "failed", "skipped", "cancelled"];
  function countSteps(steps) {
    const c = {};
    for (const s of steps) c[s.status] = (c[s.status] || 0) + 1;
    return c;
  }
  function progress(steps) {
    const c = countSteps(steps);
    const parts = [el("span", { class: "count s-completed" }, (c.completed || 0) + "/" + steps.length + " completed")];
    for (const st of ["running", "waiting", "failed", "cancelled", "skipped"]) {
      if (c[st]) parts.push(" \u00B7 ", el("span", { class: "count s-" + st, "data-status": st }, c[st] + " " + st));
    }
    return parts;
  }

  // A forEach step's item counts, e.g. "9,990/10,000 items · 2 failed".
  const fmtNum = (n) => n.toLocaleString("en-US");
  function itemSummary(c) {
    const parts = [fmtNum(c.completed) + "/" + fmtNum(c.total) + " items"];
    for (const st of ["running", "failed", "cancelled"]) if (c[st]) parts.push(fmtNum(c[st]) + " " + st);
    return parts.join(" \u00B7 ");
  }

  // itemCounts is a forEach step's counts with a progress bar, for its panel.
  function itemCounts(c) {
    const seg = (st) => c[st] ? el("span", { class: "s-" + st, "data-share": c[st] / c.total }) : null;
    const bar = el("div", { class: "items-progress", role: "progressbar", "aria-label": "items completed", "aria-valuemin": 0, "aria-valuemax": c.total, "aria-valuenow": c.completed },
      ["completed", "failed", "cancelled", "running"].map(seg));
    // Widths through the CSSOM: the Content Security Policy refuses inline style attributes.
    for (const sp of bar.children) sp.style.width = (100 * sp.dataset.share) + "%";
    return el("div", { id: "items-counts" }, bar, el("div", { class: "small" }, itemSummary(c) + (c.pending ? " \u00B7 " + fmtNum(c.pending) + " pending" : "")));
  }

  // fitText shortens text with an ellipsis to fit width pixels in font
  // (the full text stays in the node's tooltip).
  const measure = document.createElement("canvas").getContext("2d");
  function fitText(text, width, font) {
    measure.font = font;
    if (measure.measureText(text).width <= width) return text;
    let lo = 0, hi = text.length;
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if (measure.measureText(text.slice(0, mid) + "\u2026").width <= width) lo = mid;
      else hi = mid - 1;
    }
    return text.slice(0, lo) + "\u2026";
  }

  // ---- API ----

  class APIError extends Error {
    constructor(status, message) { super(message); this.status = status; }
  }

  // api resolves to the response's JSON, or with withHeaders to
  // {data, headers}, for a list whose next page is in its Link header.
  async function api(method, path, body, withHeaders) {
    const headers = { Accept: "application/json" };
    const init = { method, headers, cache: "no-store" };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    let resp;
    try {
      resp = await fetch("api/" + path, init);
    } catch (err) {
      setLive(false, "cannot reach the server");
      throw new APIError(0, "cannot reach the server: " + err.message);
    }
    let data = null;
    try { data = parseJSON(await resp.text()); } catch (_) { /* not JSON */ }
    if (resp.status === 401) {
      // Signed out elsewhere, or the server's token changed: loading the
      // page again gets the sign-in page.
      setLive(false, "signed out");
      location.reload();
      throw new APIError(401, (data && data.error) || "unauthorized");
    }
    setLive(true);
    if (!resp.ok) throw new APIError(resp.status, (data && data.error) || resp.status + " " + resp.statusText);
    return withHeaders ? { data, headers: resp.headers } : data;
  }

  // nextParam is a parameter of the rel="next" URL of a Link header
  // (RFC 8288), or "" when there is no next page.
  function nextParam(link, name) {
    const m = /<([^>]*)>\s*;\s*rel="?next"?/.exec(link || "");
    return m ? new URL(m[1], location.href).searchParams.get(name) || "" : "";
  }

  function setLive(ok, why) {
    live.className = "live " + (ok ? "ok" : "down");
    live.textContent = ok ? "live" : why;
  }

  // showError shows an error in the banner, or hides it. What an action
  // (a click) reported stays until the next action, a navigation or a
  // click on the banner: a page's refresh (fromPoll) clears only what a
  // refresh reported, so that a refusal is not gone before it is read.
  let actionError = false;
  function showError(err, fromPoll) {
    if (err && err.status === 401) return; // the sign-in page is on its way
    if (!err && fromPoll && actionError) return;
    banner.textContent = err ? String(err.message || err) : "";
    banner.hidden = !err;
    actionError = Boolean(err) && !fromPoll;
  }
  banner.title = "Click to dismiss";
  banner.addEventListener("click", () => showError(null));

  // ---- Router and polling ----

  // Each page is a function that renders into main and returns a refresh
  // function; the poller calls it every POLL_MS while the tab is visible.
  // generation invalidates the timers and responses of a page left behind.
  let generation = 0;
  let timer = null;

  function route() {
    generation++;
    clearTimeout(timer);
    showError(null);
    clear(main);
    const hash = location.hash.replace(/^#/, "") || "/";
    const [path, query] = hash.split("?");
    const params = new URLSearchParams(query || "");
    const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
    for (const a of document.querySelectorAll("[data-nav]")) {
      const nav = ["workflows", "schedules", "queues"].includes(parts[0]) ? parts[0] : "instances";
      a.classList.toggle("active", a.dataset.nav === nav);
    }
    let page;
    if (parts[0] === "instances" && parts[1]) page = instancePage(parts[1]);
    else if (parts[0] === "workflows" && parts[1]) page = workflowPage(parts[1]);
    else if (parts[0] === "workflows") page = workflowsPage();
    else if (parts[0] === "schedules") page = schedulesPage();
    else if (parts[0] === "queues") page = queuesPage();
    else if (parts.length === 0 || parts[0] === "instances") page = instancesPage(params);
    else page = noSuchPage(path);
    poll(generation, page);
  }

  // noSuchPage answers an address no page has (a mistyped link), rather
  // than show the instance list as if it were that page.
  function noSuchPage(path) {
    append(main, el("div", { class: "card" }, el("p", { class: "empty", id: "not-found" },
      "No page at #" + path + ". ", link("/", "See the instances"), ".")));
    return { refresh: async () => false };
  }

  async function poll(gen, page) {
    if (gen !== generation) return;
    if (!document.hidden) {
      try {
        const again = await page.refresh(gen);
        if (gen !== generation) return;
        showError(null, true);
        if (again === false) return;
      } catch (err) {
        if (gen !== generation) return;
        showError(err, true);
        if (err.status === 401 || err.status === 404) return;
      }
    }
    timer = setTimeout(() => poll(gen, page), POLL_MS);
  }

  window.addEventListener("hashchange", route);

  // ---- Instances list ----

  function instancesPage(params) {
    const workflowSel = el("select", { id: "filter-workflow" }, el("option", { value: "" }, "all workflows"));
    const statusSel = el("select", { id: "filter-status" }, el("option", { value: "" }, "any status"),
      STATUSES.map((s) => el("option", { value: s }, s)));
    statusSel.value = params.get("status") || "";
    // Child instances (started by workflow steps) are listed under their
    // parent's page unless asked for here.
    const allBox = el("input", { type: "checkbox", id: "filter-all" });
    allBox.checked = params.get("all") === "true";
    const count = el("span", { class: "count" });
    const tbody = el("tbody");
    const rows = section(tbody);
    const more = el("button", { type: "button", id: "list-more", hidden: true }, "Load more");
    let pages = 1, seq = 0;
    const bulk = bulkActions(params, () => refresh(generation));

    function navigate() {
      const q = new URLSearchParams();
      if (workflowSel.value) q.set("workflow", workflowSel.value);
      if (statusSel.value) q.set("status", statusSel.value);
      if (allBox.checked) q.set("all", "true");
      const qs = q.toString();
      location.hash = "#/" + (qs ? "?" + qs : "");
    }
    workflowSel.addEventListener("change", navigate);
    statusSel.addEventListener("change", navigate);
    allBox.addEventListener("change", navigate);
    more.addEventListener("click", () => { pages++; refresh(generation).catch(showError); });

    append(main, [
      el("div", { class: "page-head" }, el("h1", {}, "Instances")),
      el("div", { class: "card" },
        el("div", { class: "filters" },
          el("div", {}, el("label", { for: "filter-workflow" }, "Workflow"), workflowSel),
          el("div", {}, el("label", { for: "filter-status" }, "Status"), statusSel),
          el("div", {}, el("label", { for: "filter-all" }, allBox, " child instances too")),
          count),
        bulk.bar,
        el("table", { id: "instances" },
          el("thead", {}, el("tr", {}, el("th", {}, bulk.all), ["Instance", "Workflow", "Status", "Steps", "Created", "Duration"].map((h) => el("th", {}, h)))),
          tbody),
        el("div", { class: "actions" }, more)),
    ]);

    // The workflow filter lists the served workflows plus a filtered-for
    // name that is no longer served (its old instances still exist).
    api("GET", "workflows").then((data) => {
      const names = data.map((w) => w.name);
      const wanted = params.get("workflow");
      if (wanted && !names.includes(wanted)) names.push(wanted);
      for (const n of names) workflowSel.appendChild(el("option", { value: n }, n));
      workflowSel.value = wanted || "";
    }).catch(showError);

    // refresh reads the pages shown so far, newest first, in requests of
    // at most LIST_MAX instances each (the API's limit), following the
    // list's cursor: every shown instance stays live, however many pages
    // "Load more" added. A refresh overtaken by a later one (a poll still
    // reading when "Load more" was clicked) draws nothing: its pages are
    // fewer than those now asked for.
    async function refresh(gen) {
      const mine = ++seq;
      const wanted = LIST_PAGE * pages;
      const instances = [];
      let cursor = "";
      do {
        const q = new URLSearchParams({ limit: String(Math.min(LIST_MAX, wanted - instances.length)) });
        if (cursor) q.set("before", cursor);
        if (params.get("workflow")) q.set("workflow", params.get("workflow"));
        if (params.get("status")) q.set("status", params.get("status"));
        if (params.get("all") === "true") q.set("all", "true");
        const page = await api("GET", "instances?" + q.toString(), undefined, true);
        if (gen !== generation || mine !== seq) return;
        instances.push(...page.data);
        cursor = nextParam(page.headers.get("Link"), "before");
      } while (cursor && instances.length < wanted);
      more.hidden = !cursor;
      count.textContent = instances.length + (cursor ? "+" : "") + " shown";
      bulk.shown(instances);
      rows(JSON.stringify(instances), () => {
        if (instances.length === 0) {
          const filtered = params.get("workflow") || params.get("status");
          return el("tr", {}, el("td", { colspan: 7, class: "empty" }, filtered
            ? "No instances match these filters."
            : "No instances yet. Start one with dagrun start WORKFLOW or from a workflow's page."));
        }
        return instances.map((inst) => {
          const row = el("tr", { class: "clickable", "data-id": inst.id },
            el("td", { class: "pick" }, bulk.box(inst.id)),
            el("td", { class: "mono", title: inst.id }, link("/instances/" + encodeURIComponent(inst.id), shortID(inst.id)),
              // With child instances listed too, a child says whose it is,
              // as dagrun list --all's PARENT column does.
              inst.parent ? el("div", { class: "muted small child-of", title: "child of " + inst.parent.id + ", step " + inst.parent.step },
                "\u21B3 ", link("/instances/" + encodeURIComponent(inst.parent.id), shortID(inst.parent.id)),
                " " + inst.parent.step + (inst.parent.item != null ? "[" + inst.parent.item + "]" : "")) : null),
            el("td", {}, link("/workflows/" + encodeURIComponent(inst.workflow), inst.workflow)),
            el("td", {}, badge(inst.status), inst.paused ? el("span", { class: "badge paused" }, "paused") : null, heldBadge(inst)),
            el("td", {},
              el("div", { class: "strip", title: inst.steps.map((s) => s.name + ": " + s.status + (s.items ? " (" + itemSummary(s.items) + ")" : "")).join("\n") },
                inst.steps.map((s) => el("span", { class: "s-" + s.status }))),
              el("div", { class: "strip-label" }, progress(inst.steps))),
            setAgo(el("td", { title: fmtTime(inst.createdAt) }), inst.createdAt),
            el("td", { class: "num" }, duration(inst.createdAt, inst.finishedAt)));
          row.addEventListener("click", (ev) => {
            if (ev.target.closest("a") || ev.target.closest(".pick")) return;
            location.hash = "#/instances/" + encodeURIComponent(inst.id);
          });
          return row;
        });
      });
    }
    return { refresh };
  }

  // bulkActions are the instance list's checkboxes and its bulk cancel and
  // retry: of the checked instances, or of every instance the filter picks
  // (a workflow, a status or both), however many pages that is. The checked
  // IDs survive the list's refreshes.
  function bulkActions(params, after) {
    const chosen = new Set();
    let ids = [];
    const all = el("input", { type: "checkbox", id: "pick-all", title: "Select every shown instance" });
    const result = el("span", { class: "muted", id: "bulk-result" });
    const filtered = () => Boolean(params.get("workflow") || params.get("status"));
    const selectedButtons = [];
    function button(id, label, cls, onclick) {
      return el("button", { type: "button", id, class: cls, onclick }, label);
    }
    function sync() {
      for (const b of selectedButtons) b.disabled = chosen.size === 0;
      all.checked = ids.length > 0 && ids.every((id) => chosen.has(id));
      for (const box of document.querySelectorAll("#instances .pick input")) box.checked = chosen.has(box.dataset.id);
    }
    async function run(verb, body, question) {
      if (!confirm(question)) return;
      try {
        const res = await api("POST", "instances/" + verb, body);
        const done = verb === "cancel" ? "cancelled" : "retried";
        const skipped = res.skipped ? Object.keys(res.skipped).length : 0;
        result.textContent = done + " " + res.count + " instance" + (res.count === 1 ? "" : "s") +
          (skipped ? " (" + skipped + " left as they were: " + Object.values(res.skipped)[0] + (skipped > 1 ? "; hover for all" : "") + ")" : "");
        // Every refusal, one a line, for whoever wants more than the first.
        result.title = skipped ? Object.entries(res.skipped).map(([id, why]) => id + ": " + why).join("\n") : "";
        chosen.clear();
        showError(null);
        await after();
        sync();
      } catch (err) { showError(err); }
    }
    function filterBody() {
      const body = {};
      if (params.get("workflow")) body.workflow = params.get("workflow");
      if (params.get("status")) body.status = params.get("status");
      // What the list shows: its child instances only when it shows them.
      if (params.get("all") === "true") body.all = true;
      return body;
    }
    const cancelSel = button("cancel-selected", "Cancel selected", "danger",
      () => run("cancel", { ids: [...chosen] }, "Cancel " + chosen.size + " instance(s)? Running steps are stopped."));
    const retrySel = button("retry-selected", "Retry selected", "primary",
      () => run("retry", { ids: [...chosen] }, "Retry " + chosen.size + " instance(s)?"));
    selectedButtons.push(cancelSel, retrySel);
    // The question names the filter and what the list shows of it: the
    // server picks on every page, so more may match than are shown.
    const matching = () => {
      const what = [params.get("workflow") ? "workflow " + params.get("workflow") : "", params.get("status") ? "status " + params.get("status") : ""]
        .filter(Boolean).join(", ");
      const shown = document.querySelector(".filters .count");
      return " (" + what + (shown ? "; " + shown.textContent + " here" : "") + ")";
    };
    const cancelAll = button("cancel-matching", "Cancel all matching", "danger",
      () => run("cancel", filterBody(), "Cancel every instance matching the filter" + matching() + "? Running steps are stopped."));
    const retryAll = button("retry-matching", "Retry all matching", "",
      () => run("retry", filterBody(), "Retry every failed or cancelled instance matching the filter" + matching() + "?"));
    cancelAll.disabled = retryAll.disabled = !filtered();
    cancelAll.title = retryAll.title = filtered() ?
      "Every instance the filter picks, on every page" + (params.get("all") === "true" ? ", child instances included" : " (child instances go with their parents)") :
      "Choose a workflow or a status first";
    all.addEventListener("change", () => {
      for (const id of ids) { if (all.checked) chosen.add(id); else chosen.delete(id); }
      sync();
    });
    sync();
    return {
      all,
      bar: el("div", { class: "actions bulk" }, result, el("span", { class: "spacer" }), cancelSel, retrySel, cancelAll, retryAll),
      box(id) {
        const box = el("input", { type: "checkbox", "data-id": id, "aria-label": "select " + id });
        box.checked = chosen.has(id);
        box.addEventListener("change", () => { if (box.checked) chosen.add(id); else chosen.delete(id); sync(); });
        return box;
      },
      shown(list) {
        ids = list.map((inst) => inst.id);
        for (const id of [...chosen]) if (!ids.includes(id)) chosen.delete(id);
        queueMicrotask(sync);
      },
    };
  }

  // ---- Graph drawing (layout comes from the server) ----

  // failureRows are the instance's rows about its workflow timeout and
  // its failure: the timeout and, while it runs, when it times out; the
  // step that failed it; and, while its running steps finish or its
  // onFailure steps run, that it failed already although it still runs.
  function failureRows(inst) {
    const rows = [];
    if (inst.timeout) rows.push(["Timeout", inst.deadline ? inst.timeout + " (until " + fmtTime(inst.deadline) + ")" : inst.timeout]);
    if (inst.failing) {
      // A step failed for good while others ran a handler: those finish
      // their attempt before the onFailure steps run.
      const finishing = (inst.steps || []).some((s) => !s.onFailure && (s.status === "running" || s.status === "pending"));
      rows.push(["Failing", el("span", { class: "value", id: "failing" },
        finishing ? "failed; its running steps finish first" : "failed; running its onFailure steps")]);
    }
    if (inst.failedStep) rows.push(["Failed step", el("span", { class: "mono value", id: "failed-step" }, inst.failedStep)]);
    return rows;
  }

  // drawGroups draws the labelled bands below the main graph (an
  // instance's onFailure steps, which run only when it fails): a dashed
  // separator across the graph and the band's label under it.
  function drawGroups(root, graph) {
    for (const grp of graph.groups || []) {
      root.appendChild(svg("line", { class: "group-line", x1: 12, x2: graph.width - 12, y1: grp.y + 4, y2: grp.y + 4 }));
      root.appendChild(svg("text", { class: "group-label", x: 16, y: grp.y + 22 }, grp.label));
    }
  }

  const NAME_FONT = '650 13px system-ui, -apple-system, "Segoe UI", Roboto, sans-serif';
  const SUB_FONT = '11px system-ui, -apple-system, "Segoe UI", Roboto, sans-serif';
  const MIN_ZOOM = 0.02, MAX_ZOOM = 3, ZOOM_STEP = 1.25;

  // graphView is a zoomable frame for a laid-out graph. By default the
  // graph fits the frame's width (never enlarged past 100%), so there is no
  // scrollbar when it fits and a big graph shows whole; the zoom buttons
  // (or Ctrl + wheel) zoom around the view's centre (or the pointer), and
  // the frame scrolls to pan. set(graph, stepInfo, selected) draws the
  // graph once per layout and afterwards only updates what changed in its
  // nodes and edges, so zoom, scroll and focus survive every refresh.
  // stepInfo(name) gives {status, label, detail, since}: a node shows
  // detail, followed by a ticking duration when since is set.
  function graphView(onSelect) {
    const wrap = el("div", { class: "graph-wrap", id: "graph" });
    const level = el("span", { class: "zoom-level", id: "zoom-level" });
    const tool = (id, label, title, action) => el("button", { type: "button", class: "tool", id, title, "aria-label": title, onclick: action }, label);
    const tools = el("div", { class: "graph-tools", role: "toolbar", "aria-label": "zoom" },
      tool("zoom-out", "\u2212", "Zoom out", () => zoomAround(scale / ZOOM_STEP)),
      level,
      tool("zoom-in", "+", "Zoom in", () => zoomAround(scale * ZOOM_STEP)),
      tool("zoom-fit", "Fit", "Fit the width of the frame", () => fitWidth()),
      tool("zoom-actual", "1:1", "Actual size (100%)", () => zoomAround(1)));
    let graph = null, layoutKey = null, root = null;
    let scale = 1, fitting = true;
    let nodes = new Map(); // name -> {g, state, sub, title}
    let edges = [];        // [{edge, path}]

    function build() {
      root = svg("svg", { viewBox: "0 0 " + graph.width + " " + graph.height, role: "img", "aria-label": "workflow graph" });
      root.appendChild(svg("defs", {},
        svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" },
          svg("path", { d: "M 0 0 L 10 5 L 0 10 z", class: "arrow" }))));
      const edgeLayer = svg("g", {});
      edges = graph.edges.map((e) => {
        const path = svg("path", { d: edgePath(e.points), "marker-end": "url(#arrow)" }, svg("title", {}, e.from + " \u2192 " + e.to));
        edgeLayer.appendChild(path);
        return { edge: e, path };
      });
      root.appendChild(edgeLayer);
      drawGroups(root, graph);
      nodes = new Map();
      for (const n of graph.nodes) {
        const title = svg("title", {});
        const state = svg("text", { class: "state", x: 14, y: 37 });
        const sub = svg("text", { class: "sub", x: 14, y: 52 });
        const progress = itemsBar(n);
        const g = svg("g", { transform: "translate(" + n.x + "," + n.y + ")", tabindex: 0, role: "button", "data-step": n.id },
          title,
          svg("rect", { class: "box", width: n.width, height: n.height, rx: 8 }),
          svg("rect", { class: "bar", width: 5, height: n.height - 2, x: 1, y: 1, rx: 2 }),
          svg("text", { class: "name", x: 14, y: 20 }, fitText(n.id, n.width - 24, NAME_FONT)),
          state, sub, progress.g);
        g.addEventListener("click", () => onSelect(n.id));
        // A workflow step's node opens its child instance on a double click.
        g.addEventListener("dblclick", () => {
          const child = nodes.get(n.id).child;
          if (child) location.hash = "#/instances/" + encodeURIComponent(child);
        });
        g.addEventListener("keydown", (ev) => {
          if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); onSelect(n.id); }
        });
        root.appendChild(g);
        nodes.set(n.id, { node: n, g, state, sub, title, progress });
      }
      clear(wrap);
      wrap.appendChild(root);
    }

    function update(stepInfo, selected) {
      const status = {};
      for (const [name, v] of nodes) {
        const info = stepInfo(name);
        status[name] = info.status;
        setAttr(v.g, "class", "node s-" + info.status + (v.node.onFailure ? " on-failure" : "") + (name === selected ? " selected" : ""));
        setAttr(v.g, "aria-label", name + ": " + info.label);
        setText(v.title, name + "\n" + info.label + (info.title || info.detail ? "\n" + (info.title || info.detail) : ""));
        setText(v.state, ((ICONS[info.status] || "") + " " + info.label).trim());
        const clock = info.since || info.until;
        const detail = fitText(info.detail || "", v.node.width - 24 - (clock ? 72 : 0), SUB_FONT);
        const prefix = clock && detail ? detail + " \u00B7 " : detail;
        if (info.until) setUntil(v.sub, info.until, prefix, info.untilLead, info.untilSuffix);
        else setSince(v.sub, info.since, prefix);
        v.progress.set(info.items);
        v.child = info.child || null;
      }
      for (const { edge, path } of edges) {
        const hot = selected && (edge.from === selected || edge.to === selected);
        setAttr(path, "class", "edge" + (status[edge.from] === "completed" ? " done" : "") + (edge.direct ? " direct" : "") + (hot ? " hot" : ""));
      }
    }

    // The drawn size is the layout's times the zoom, rounded down, so a
    // graph fitted to the frame is never a pixel wider than it.
    function applyScale() {
      if (!graph) return; // nothing drawn yet (or no such instance)
      setAttr(root, "width", String(Math.max(1, Math.floor(graph.width * scale))));
      setAttr(root, "height", String(Math.max(1, Math.floor(graph.height * scale))));
      setText(level, Math.round(scale * 100) + "%");
      wrap.classList.toggle("fitted", fitting);
    }
    function fitWidth() {
      fitting = true;
      if (!graph) return;
      // Twice: drawing it may add or remove the frame's vertical
      // scrollbar, which changes the width there is.
      for (let i = 0; i < 2; i++) {
        scale = Math.max(MIN_ZOOM, Math.min(1, wrap.clientWidth / graph.width));
        applyScale();
      }
    }
    // zoomAround zooms keeping the point at (x, y) of the frame in place,
    // by default its centre.
    function zoomAround(to, x, y) {
      if (!graph) return;
      if (x === undefined) { x = wrap.clientWidth / 2; y = wrap.clientHeight / 2; }
      const gx = (wrap.scrollLeft + x) / scale, gy = (wrap.scrollTop + y) / scale;
      fitting = false;
      scale = Math.max(MIN_ZOOM, Math.min(MAX_ZOOM, to));
      applyScale();
      wrap.scrollLeft = gx * scale - x;
      wrap.scrollTop = gy * scale - y;
    }
    wrap.addEventListener("wheel", (ev) => {
      if (!ev.ctrlKey || !root) return;
      ev.preventDefault();
      const box = wrap.getBoundingClientRect();
      zoomAround(scale * (ev.deltaY < 0 ? 1.1 : 1 / 1.1), ev.clientX - box.left, ev.clientY - box.top);
    }, { passive: false });
    window.addEventListener("resize", () => {
      if (root && fitting && wrap.isConnected) fitWidth();
    });

    function set(g, stepInfo, selected) {
      const key = JSON.stringify(g);
      if (key !== layoutKey) {
        const first = layoutKey === null;
        layoutKey = key;
        graph = g;
        build();
        if (first || fitting) fitWidth(); else applyScale();
      }
      update(stepInfo, selected);
    }
    return { tools, wrap, set };
  }

  // itemsBar is the progress bar along the bottom of a forEach step's
  // node: one segment per finished or running status, in proportion to
  // the items in it, over a track for the rest; hidden for other steps.
  const BAR_STATUSES = ["completed", "failed", "cancelled", "running"];
  function itemsBar(n) {
    const width = n.width - 28;
    const segs = BAR_STATUSES.map((st) => svg("rect", { class: "seg s-" + st, y: n.height - 6, height: 3, width: 0 }));
    const g = svg("g", { class: "progress", display: "none" },
      svg("rect", { class: "track", x: 14, y: n.height - 6, width, height: 3, rx: 1.5 }), segs);
    function set(items) {
      setAttr(g, "display", items ? "inline" : "none");
      if (!items) return;
      let x = 14;
      BAR_STATUSES.forEach((st, i) => {
        const w = items.total ? width * items[st] / items.total : 0;
        setAttr(segs[i], "x", x.toFixed(1));
        setAttr(segs[i], "width", w.toFixed(1));
        x += w;
      });
    }
    return { g, set };
  }

  // edgePath draws straight runs through columns and an S-curve between
  // columns, where the layout left room for it.
  function edgePath(points) {
    let d = "M " + points[0].x + " " + points[0].y;
    for (let i = 1; i < points.length; i++) {
      const a = points[i - 1], b = points[i];
      if (a.y === b.y) { d += " L " + b.x + " " + b.y; continue; }
      const mx = (a.x + b.x) / 2;
      d += " C " + mx + " " + a.y + " " + mx + " " + b.y + " " + b.x + " " + b.y;
    }
    return d;
  }

  // legend shows each status with its number of steps, when counts is set.
  function legend(counts) {
    return el("div", { class: "legend" }, STEP_STATUSES.map((st) =>
      el("span", { class: "badge s-" + st, "data-status": st }, (ICONS[st] || "") + " " + st + (counts ? " " + (counts[st] || 0) : ""))));
  }

  // ---- Items of a forEach step ----

  const ITEMS_PAGE = 50;

  // itemsView is the paged item table of one forEach step: it fetches only
  // the page shown (prev/next, a status filter), so a step of 10,000 items
  // costs what one of 50 does. A click on a row shows that item's input,
  // output and error below it.
  // logsView is the live log of one step: what its handlers logged,
  // oldest first, every attempt and item. Each refresh asks only for the
  // records after the last one it has (after=next), and refreshes stop once
  // the instance finished and a last read brought nothing new.
  // LOG_LINES_SHOWN bounds the lines a step's log panel keeps, the newest:
  // a forEach step of 10,000 logging items grew the list by a thousand
  // lines a poll, and laying it out took the page's main thread for up to
  // 1.6 s each time (TestBrowserForEach; 2,000 lines still took 0.66 s,
  // 200 take under 0.25 s). `dagrun logs` and the API have every record.
  const LOG_LINES_SHOWN = 200;

  function logsView(instanceID, step) {
    let next = 0, done = false, seq = 0, count = 0;
    const list = el("ol", { class: "logs mono", id: "step-logs" });
    const empty = el("p", { class: "muted small", id: "step-logs-empty" }, "No logs yet. Handlers log with handlers.Logger(ctx).");
    const cut = el("p", { class: "muted small", id: "step-logs-cut", hidden: true });
    const node = el("div", { class: "logs-box", "data-keep": "step-logs" }, empty, cut, list);
    // Whether the list follows new lines: at its end, unless scrolled up to
    // read. Kept as it scrolls, so that a refresh reads no layout before it
    // appends; the follow itself waits for the next frame's layout.
    let following = true;
    list.addEventListener("scroll", () => { following = list.scrollTop + list.clientHeight >= list.scrollHeight - 4; }, { passive: true });

    function line(r) {
      const where = (r.item !== undefined && r.item !== null ? "[" + r.item + "]" : "") + "#" + r.attempt;
      const attrs = r.attrs ? Object.entries(flatten(r.attrs, "")).map(([k, v]) => " " + k + "=" + v).join("") : "";
      return el("li", { class: "log-" + r.level.toLowerCase().replace(/[^a-z]/g, ""), "data-seq": r.seq },
        el("span", { class: "when", title: fmtTime(r.time) }, fmtClock(r.time)),
        el("span", { class: "level" }, r.level),
        el("span", { class: "muted" }, where),
        el("span", { class: "msg" }, r.message),
        attrs ? el("span", { class: "attrs" }, attrs) : null);
    }

    function flatten(obj, prefix) {
      const out = {};
      for (const [k, v] of Object.entries(obj)) {
        if (v !== null && typeof v === "object" && !Array.isArray(v)) Object.assign(out, flatten(v, prefix + k + "."));
        else out[prefix + k] = typeof v === "string" ? v : JSON.stringify(v);
      }
      return out;
    }

    async function refresh() {
      if (done) return;
      const mine = ++seq;
      const data = await api("GET", "instances/" + encodeURIComponent(instanceID) + "/steps/" + encodeURIComponent(step) + "/logs?after=" + next);
      if (mine !== seq) return;
      // One insertion for the lot, then the oldest lines beyond the bound
      // go: the page lays the list out once a poll.
      list.append(...data.records.slice(-LOG_LINES_SHOWN).map(line));
      while (list.childElementCount > LOG_LINES_SHOWN) list.firstElementChild.remove();
      count += data.records.length;
      next = data.next;
      empty.hidden = count > 0;
      cut.hidden = count <= LOG_LINES_SHOWN;
      cut.textContent = "The newest " + LOG_LINES_SHOWN.toLocaleString("en-US") + " of the " + count.toLocaleString("en-US") +
        " records read; dagrun logs " + instanceID + " " + step + " shows them all.";
      if (following) requestAnimationFrame(() => { list.scrollTop = list.scrollHeight; });
      if (data.finished && data.records.length === 0) done = true;
    }
    return { step, node, refresh };
  }

  // withChildren adds a column linking each item's child instance, for a
  // forEach workflow step.
  function itemsView(instanceID, step, withChildren) {
    let offset = 0, status = "", seq = 0;
    const cols = withChildren ? 6 : 5;
    const open = new Set();
    const filter = el("select", { id: "items-status", "aria-label": "item status" },
      el("option", { value: "" }, "all items"), STATUSES.map((st) => el("option", { value: st }, st)));
    const range = el("span", { class: "muted", id: "items-range" });
    const prev = el("button", { type: "button", id: "items-prev", title: "Previous page" }, "\u2039 Prev");
    const next = el("button", { type: "button", id: "items-next", title: "Next page" }, "Next \u203A");
    const last = el("button", { type: "button", id: "items-last", title: "Last page" }, "Last \u00BB");
    // Item N is on page N / ITEMS_PAGE of the unfiltered list: 10,000
    // items are 200 pages, too many to click through.
    const jump = el("input", { type: "number", min: "0", step: "1", id: "items-goto", placeholder: "item #",
      "aria-label": "go to item", class: "items-goto", title: "Go to the page of this item" });
    const tbody = el("tbody");
    const rows = section(tbody);
    const node = el("div", { class: "items", id: "items" },
      el("div", { class: "items-bar" }, filter, range, el("span", { class: "spacer" }), jump, prev, next, last),
      el("div", { class: "items-scroll", "data-keep": "items" },
        el("table", { id: "items-table" },
          el("thead", {}, el("tr", {}, ["#", "Status", "Attempts", "Duration", "Error"].concat(withChildren ? ["Child"] : []).map((h) => el("th", {}, h)))),
          tbody)));
    let page = null;

    filter.addEventListener("change", () => { status = filter.value; offset = 0; refresh().catch(showError); });
    prev.addEventListener("click", () => { offset = Math.max(0, offset - ITEMS_PAGE); refresh().catch(showError); });
    next.addEventListener("click", () => { offset += ITEMS_PAGE; refresh().catch(showError); });
    last.addEventListener("click", () => {
      offset = Math.max(0, Math.floor((page.total - 1) / ITEMS_PAGE) * ITEMS_PAGE);
      refresh().catch(showError);
    });
    jump.addEventListener("change", () => {
      const n = Math.floor(Number(jump.value));
      if (!Number.isFinite(n) || n < 0 || status) return;
      offset = Math.floor(n / ITEMS_PAGE) * ITEMS_PAGE;
      refresh().catch(showError);
    });

    async function refresh() {
      const mine = ++seq;
      const q = new URLSearchParams({ offset: String(offset), limit: String(ITEMS_PAGE) });
      if (status) q.set("status", status);
      const data = await api("GET", "instances/" + encodeURIComponent(instanceID) + "/steps/" + encodeURIComponent(step) + "/items?" + q);
      if (mine !== seq) return; // a later page was asked for meanwhile
      // A filter can leave the page past the end: go back to the last one.
      if (data.items.length === 0 && offset > 0 && data.total > 0) {
        offset = Math.floor((data.total - 1) / ITEMS_PAGE) * ITEMS_PAGE;
        return refresh();
      }
      page = data;
      draw();
    }

    function draw() {
      const n = page.items.length;
      setText(range, n ? fmtNum(page.offset + 1) + "\u2013" + fmtNum(page.offset + n) + " of " + fmtNum(page.total)
        : (status ? "no " + status + " items" : "no items"));
      prev.disabled = page.offset === 0;
      next.disabled = last.disabled = page.offset + n >= page.total;
      // With a status filter the list's positions are not item numbers.
      jump.disabled = Boolean(status);
      rows(JSON.stringify([page, [...open]]), () => {
        if (!n) return el("tr", {}, el("td", { colspan: cols, class: "empty" }, status ? "No " + status + " items." : "No items yet."));
        return page.items.map((it) => {
          const row = el("tr", { class: "clickable", "data-index": it.index, tabindex: 0, "aria-expanded": String(open.has(it.index)) },
            el("td", { class: "num" }, String(it.index)),
            el("td", {}, badge(it.status)),
            el("td", { class: "num" }, String(it.attempts)),
            el("td", { class: "num" }, duration(it.startedAt, it.status === "running" ? null : it.finishedAt || it.startedAt)),
            el("td", { class: "item-error", title: it.error || "" }, it.error || ""),
            // An item of a forEach workflow step runs as a child instance.
            withChildren ? el("td", { class: "mono" }, it.child ? el("a", { href: "#/instances/" + encodeURIComponent(it.child), class: "item-child", title: it.child }, shortID(it.child)) : "") : null);
          const toggle = () => {
            if (open.has(it.index)) open.delete(it.index); else open.add(it.index);
            draw();
            const again = tbody.querySelector('tr[data-index="' + it.index + '"]');
            if (again) again.focus();
          };
          row.addEventListener("click", (ev) => { if (!ev.target.closest("a")) toggle(); });
          row.addEventListener("keydown", (ev) => {
            if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); toggle(); }
          });
          if (!open.has(it.index)) return row;
          return [row, el("tr", { class: "item-detail", "data-detail": it.index }, el("td", { colspan: cols },
            el("div", { class: "muted" }, "Input"), jsonBlock(it.input),
            el("div", { class: "muted" }, "Output"), jsonBlock(it.output),
            it.error !== null ? el("div", { class: "error-box" }, it.error) : null,
            it.workerId ? el("div", { class: "muted" }, "worker " + it.workerId) : null))];
        });
      });
    }
    return { step, node, refresh };
  }

  // ---- Signals of wait steps ----

  // approvalProperty is the property of a schema that is an object with
  // exactly one boolean property, which approve/reject buttons can set;
  // null for any other schema.
  function approvalProperty(schema) {
    if (!schema || schema.type !== "object" || !schema.properties) return null;
    const names = Object.keys(schema.properties);
    if (names.length !== 1) return null;
    const p = schema.properties[names[0]];
    return p && p.type === "boolean" ? names[0] : null;
  }

  // signalView is the form that sends a waiting step its signal: approve
  // and reject buttons when its schema is one boolean property, a JSON
  // editor otherwise. send(request) posts it; an error (a payload the
  // schema refuses, a conflict) is shown in the form, as the server wrote it.
  function signalView(step, schemaOf, send) {
    const error = el("div", { class: "error-box", id: "signal-error", role: "alert", hidden: true });
    const body = el("div", { class: "muted small" }, "Loading the signal's schema\u2026");
    const node = el("div", { class: "signal-form", id: "signal-form" },
      el("h3", {}, "Send signal ", el("span", { class: "mono" }, step.signal)), body, error);
    const buttons = [];

    function showFailure(message) {
      error.textContent = message;
      error.hidden = !message;
    }
    async function submit(req) {
      showFailure("");
      for (const b of buttons) b.disabled = true;
      try {
        await send(req);
      } catch (err) {
        showFailure(err.message);
      } finally {
        for (const b of buttons) b.disabled = false;
      }
    }
    function button(attrs, label) {
      const b = el("button", Object.assign({ type: "button" }, attrs), label);
      buttons.push(b);
      return b;
    }

    function approval(prop) {
      return [
        el("p", { class: "muted small" }, "Sends {\"" + prop + "\": true} or {\"" + prop + "\": false}."),
        el("div", { class: "actions" },
          button({ class: "primary", id: "signal-approve", onclick: () => submit({ data: { [prop]: true } }) }, "Approve"),
          button({ class: "danger", id: "signal-reject", onclick: () => submit({ data: { [prop]: false } }) }, "Reject")),
      ];
    }
    function editor(schema) {
      const data = el("textarea", { id: "signal-data", spellcheck: "false", "aria-label": "signal payload (JSON)" }, "{}");
      const sigID = el("input", { id: "signal-id", placeholder: "optional: makes a resend harmless" });
      const form = el("form", {},
        el("label", { for: "signal-data" }, "Payload (JSON)"), data,
        el("label", { for: "signal-id" }, "Signal ID"), sigID,
        el("div", { class: "actions" }, button({ type: "submit", class: "primary", id: "signal-send" }, "Send")),
        schema ? el("details", {}, el("summary", {}, "Payload schema"), jsonBlock(schema)) : null);
      form.addEventListener("submit", (ev) => {
        ev.preventDefault();
        let value;
        try { value = parseJSON(data.value); } catch (err) { showFailure("The payload is not valid JSON: " + err.message); return; }
        const req = { data: value };
        if (sigID.value.trim()) req.id = sigID.value.trim();
        submit(req);
      });
      return form;
    }

    schemaOf(step.name).then((schema) => {
      clear(body);
      body.className = "";
      const prop = approvalProperty(schema);
      append(body, prop ? approval(prop) : editor(schema));
    }).catch((err) => {
      clear(body);
      body.className = "";
      append(body, editor(null));
      showFailure("Could not read the wait step's schema: " + err.message);
    });
    return { step: step.name, node };
  }

  // ---- Instance history ----

  const EVENTS_PAGE = 100;
  // TAIL_PAGES bounds the pages one refresh of a live tail reads; past
  // them "Load more" reads on.
  const TAIL_PAGES = 5;
  // TAIL_LAG is how many refreshes back a live tail starts reading again.
  // On PostgreSQL an event takes its ID before its transaction commits, so
  // it can become visible after events with greater IDs: asking again from
  // the last ID known a few refreshes ago (and skipping the IDs already
  // read) picks up such a late event.
  const TAIL_LAG = 3;

  // historyView is an instance's history, read a page at a time, never
  // whole: the first page when the page opens, the next one on "Load
  // more", and once it has read up to the end, the new events at each
  // change of the instance (a live tail). It keeps what it read by event
  // ID, for the timeline and the step panel; render draws one event.
  function historyView(instanceID, render) {
    const byID = new Map();
    let events = [];     // what was read, in ID order
    let after = 0;       // the greatest ID read page after page
    let more = true;     // events follow `after`; true until the first page came
    let marks = [];      // `after` at the last TAIL_LAG tail reads
    let seq = 0;
    let version = 0;     // grows whenever events change
    const list = el("ol", { class: "timeline", id: "timeline" });
    const rows = section(list);
    const moreButton = el("button", { type: "button", id: "events-more", hidden: true, title: "Read the next " + EVENTS_PAGE + " events" }, "Load more");
    const count = el("span", { class: "muted small", id: "events-count" });
    const node = el("div", { id: "history" }, list, el("div", { class: "actions history-bar" }, count, moreButton));
    moreButton.addEventListener("click", () => {
      readFrom(after, 1).then(draw).catch(showError);
    });

    // readFrom reads up to pages pages of events after the ID from.
    async function readFrom(from, pages) {
      const mine = ++seq;
      for (let i = 0; i < pages; i++) {
        const page = await api("GET", "instances/" + encodeURIComponent(instanceID) + "/events?limit=" + EVENTS_PAGE + "&after=" + from);
        if (mine !== seq) return;
        let added = false;
        for (const e of page.events) {
          if (byID.has(e.id)) continue;
          byID.set(e.id, e);
          added = true;
        }
        if (added) {
          events = [...byID.values()].sort((a, b) => a.id - b.id);
          version++;
        }
        if (page.events.length) {
          from = page.events[page.events.length - 1].id;
          after = Math.max(after, from);
        }
        more = page.next !== undefined;
        if (!more) return;
      }
    }

    function draw() {
      rows(String(version), () => events.length ? events.map((e) => render(e, true)) : el("li", { class: "muted" }, "No events yet."));
      moreButton.hidden = !more;
      count.textContent = events.length + (events.length === 1 ? " event" : " events") + (more ? " read so far" : "");
    }

    // refresh reads the first page, or, once the end was reached, the new
    // events: called when the instance changed.
    async function refresh() {
      if (version === 0 && after === 0) {
        await readFrom(0, 1);
      } else if (!more) {
        marks.push(after);
        if (marks.length > TAIL_LAG) marks = marks.slice(-TAIL_LAG);
        await readFrom(marks[0], TAIL_PAGES);
      }
      draw();
    }
    return {
      node, refresh,
      // of returns the events read so far of one step, and whether more
      // of the history is unread.
      of: (step) => ({ events: events.filter((e) => e.step === step), partial: more }),
      version: () => version,
    };
  }

  // ---- Instance page ----

  // The page is made of sections that each redraw only when their own
  // data changed (see section), and a graph that updates in place, so a
  // refresh keeps open panels, scroll positions and the graph's zoom.
  function instancePage(id) {
    let selected = null;
    let inst = null;
    let lastJSON = "";
    const headNode = el("div");
    const metaNode = el("div");
    const ioNode = el("div");
    const legendNode = el("div");
    const side = el("div", { class: "card side", id: "details" });
    const history = historyView(id, eventItem);
    const graph = graphView(select);
    const head = section(headNode), meta = section(metaNode), io = section(ioNode);
    const legendSection = section(legendNode), sideSection = section(side);
    append(main, [
      headNode,
      el("div", { class: "card" }, metaNode, ioNode),
      el("div", { class: "layout" },
        el("div", {},
          el("div", { class: "card" }, el("div", { class: "card-head" }, el("h2", {}, "Graph"), graph.tools), graph.wrap, legendNode),
          el("div", { class: "card" }, el("h2", {}, "History"), history.node)),
        side),
    ]);

    function select(name) {
      selected = selected === name ? null : name;
      render();
      // On a narrow window the panel sits under the graph and the history:
      // bring it into view, or a click would seem to do nothing.
      if (selected && side.getBoundingClientRect().top > window.innerHeight) side.scrollIntoView({ block: "start" });
      if (items && items.step === selected) items.refresh().catch(showError);
      if (logs && logs.step === selected) logs.refresh().catch(showError);
    }

    // logs is the live log of the selected step; like items it outlives
    // the panel's redraws, so what it read and its scroll stay.
    let logs = null;
    function logsFor(s) {
      if (!logs || logs.step !== s.name) logs = logsView(id, s.name);
      return logs;
    }

    // items is the item table of the selected forEach step. It outlives
    // the panel's redraws (the panel re-attaches the same node), so its
    // page, filter and scroll stay while counts change.
    let items = null;
    function itemsFor(s) {
      if (!items || items.step !== s.name) items = itemsView(id, s.name, !!s.workflow);
      return items;
    }

    // signal is the form that sends the selected waiting step its signal.
    // Like items it outlives the panel's redraws, so a half-typed payload
    // and the server's last error stay while the page refreshes.
    let signal = null;
    function signalFor(s) {
      if (!signal || signal.step !== s.name) {
        signal = signalView(s, waitSchema, async (req) => {
          const res = await api("POST", "instances/" + encodeURIComponent(id) + "/signals/" + encodeURIComponent(s.signal), req);
          lastJSON = "";
          await refresh(generation);
          return res;
        });
      }
      return signal;
    }

    // waitSchema resolves to the payload schema of a wait step, read from
    // the definition the instance runs under, which the server checks a
    // signal against, not from the workflow's file, which may have
    // changed since (null when it cannot be read: the form then offers a
    // JSON editor).
    let definition = null;
    function waitSchema(step) {
      if (!definition) {
        definition = api("GET", "instances/" + encodeURIComponent(id) + "/definition").catch((err) => {
          if (err.status === 404) return null;
          definition = null; // try again next time
          throw err;
        });
      }
      return definition.then((wf) => {
        const def = wf && wf.steps.find((x) => x.name === step);
        return def && def.wait ? def.wait.schema : null;
      });
    }

    async function act(verb) {
      if (verb === "cancel" && !confirm("Cancel instance " + id + "? Running steps are stopped.")) return;
      try {
        inst = await api("POST", "instances/" + encodeURIComponent(id) + "/" + verb);
        lastJSON = "";
        showError(null);
        render();
      } catch (err) { showError(err); }
    }

    let stepsByName = new Map();
    function stepInfo(name) {
      const s = stepsByName.get(name);
      if (!s) return { status: "blocked", label: "unknown" };
      if (s.items) {
        // The node is narrow: the done/total count and failures; the
        // tooltip and the panel have the rest.
        const c = s.items;
        const detail = fmtNum(c.completed) + "/" + fmtNum(c.total) + (c.failed ? " \u00B7 " + fmtNum(c.failed) + " failed" : "");
        return { status: s.status, label: s.status, detail, title: itemSummary(c), items: c };
      }
      if (s.status === "waiting") {
        return s.deadline
          ? { status: s.status, label: "waiting", detail: s.signal, title: "signal " + s.signal + ", times out " + fmtTime(s.deadline), until: s.deadline, untilSuffix: " left" }
          : { status: s.status, label: "waiting", detail: "signal " + s.signal, title: "signal " + s.signal + ", no timeout" };
      }
      if (s.status === "pending" && s.held) {
        return { status: s.status, label: "held", title: "waits for a slot of its concurrency limit" };
      }
      if (s.workflow && !s.items) {
        // A workflow step runs no handler: its node names the child workflow.
        const child = s.children ? s.children[0] : null;
        return { status: s.status, label: s.status, detail: "\u21B3 " + s.workflow, child,
          title: "workflow " + s.workflow + (child ? ", child instance " + child + " (double-click to open it)" : ""), since: s.startedAt && !s.finishedAt ? s.startedAt : null };
      }
      if (s.status === "pending" && s.runAfter && Date.parse(s.runAfter) > Date.now()) {
        return { status: s.status, label: "pending", title: "runs at " + fmtTime(s.runAfter), until: s.runAfter, untilLead: "runs in " };
      }
      const parts = [];
      if (s.attempts > 0) parts.push(s.attempts === 1 ? "1 attempt" : s.attempts + " attempts");
      if (s.startedAt && s.finishedAt) parts.push(fmtDuration(between(s.startedAt, s.finishedAt)));
      if (!parts.length && !s.startedAt) parts.push(s.signal ? "signal " + s.signal : s.handler);
      return { status: s.status, label: s.status, detail: parts.join(" \u00B7 "), since: s.startedAt && !s.finishedAt ? s.startedAt : null };
    }

    function render() {
      const { steps, events: _events, eventsTruncated: _truncated, graph: _, ...instance } = inst;
      const counts = countSteps(steps);
      stepsByName = new Map(steps.map((st) => [st.name, st]));
      head(JSON.stringify([inst.status, inst.workflow, inst.paused, inst.held]), renderHead);
      meta(JSON.stringify([instance, counts]), renderMeta);
      io(JSON.stringify([inst.input, inst.output]), renderIO);
      graph.set(inst.graph, stepInfo, selected);
      legendSection(JSON.stringify(counts), () => legend(counts));
      const s = selected && steps.find((x) => x.name === selected);
      // A redraw re-attaches the signal form, which blurs the field being
      // typed in: the keys after it went nowhere. The field gets its focus
      // and caret back.
      const typing = document.activeElement;
      const caret = typing && (typing.id === "signal-data" || typing.id === "signal-id")
        ? [typing, typing.selectionStart, typing.selectionEnd] : null;
      sideSection(s ? JSON.stringify([s, inst.status, history.version()])
        : JSON.stringify(steps.map((st) => [st.name, st.status, st.startedAt, st.finishedAt, st.items])), renderSide);
      if (caret && caret[0].isConnected && document.activeElement !== caret[0]) {
        caret[0].focus();
        caret[0].setSelectionRange(caret[1], caret[2]);
      }
    }

    function renderHead() {
      const finished = ["completed", "failed", "cancelled"].includes(inst.status);
      return [
        el("div", { class: "crumbs" }, link("/", "Instances"), " / ",
          inst.parent ? [link("/instances/" + encodeURIComponent(inst.parent.id), shortID(inst.parent.id)), " / "] : null, shortID(inst.id)),
        el("div", { class: "page-head" },
          el("h1", {}, inst.workflow, badge(inst.status), inst.paused ? el("span", { class: "badge paused", id: "paused" }, "paused") : null,
            heldBadge(inst, "held")),
          el("span", { class: "spacer" }),
          pauseButton(),
          el("button", { type: "button", class: "danger", id: "cancel", disabled: finished, onclick: () => act("cancel") }, "Cancel"),
          el("button", { type: "button", class: "primary", id: "retry",
            disabled: Boolean(inst.parent) || !(inst.status === "failed" || inst.status === "cancelled"),
            title: inst.parent ? "A child instance is retried through its parent: retry " + shortID(inst.parent.id) : "",
            onclick: () => act("retry") }, "Retry")),
      ];
    }

    // pauseButton holds back or lets go an unfinished instance's steps.
    function pauseButton() {
      const finished = ["completed", "failed", "cancelled"].includes(inst.status);
      return inst.paused
        ? el("button", { type: "button", id: "resume", onclick: () => act("resume") }, "Resume")
        : el("button", { type: "button", id: "pause", disabled: finished, onclick: () => act("pause") }, "Pause");
    }

    // stepActions are the step panel's repairs: re-run the instance from
    // this step (once it finished), or complete the step by hand.
    function stepActions(s) {
      const finished = ["completed", "failed", "cancelled"].includes(inst.status);
      // A failed child's steps are skipped through its parent: skipping
      // one would run the child again while its parent's step stays failed.
      const skippable = ["blocked", "pending", "waiting", "failed", "cancelled"].includes(s.status) &&
        inst.status !== "completed" && inst.status !== "cancelled" && !(inst.parent && inst.status === "failed");
      const base = "instances/" + encodeURIComponent(id);
      return el("div", { class: "actions step-actions" },
        el("button", { type: "button", id: "retry-from", disabled: !finished || Boolean(inst.parent),
          title: inst.parent ? "A child instance is retried through its parent: retry " + shortID(inst.parent.id)
            : finished ? "Run this step and every step after it again" : "The instance must finish first",
          onclick: () => operate("Re-run " + s.name + " and every step after it?", () => api("POST", base + "/retry", { from: s.name })) }, "Retry from this step"),
        el("button", { type: "button", id: "skip-step", disabled: !skippable,
          title: "Complete this step by hand; its dependents proceed",
          onclick: () => {
            const text = prompt("Complete " + s.name + " by hand with this output (JSON):", "null");
            if (text === null) return;
            let output;
            try { output = parseJSON(text); } catch (err) { showError(new Error("the output is not valid JSON: " + err.message)); return; }
            operate(null, () => api("POST", base + "/steps/" + encodeURIComponent(s.name) + "/skip", { output }));
          } }, "Skip step"));
    }

    async function operate(question, call) {
      if (question && !confirm(question)) return;
      try {
        inst = await call();
        lastJSON = "";
        showError(null);
        render();
      } catch (err) { showError(err); }
    }

    function renderMeta() {
      const rows = [
        ["Instance", el("span", { class: "mono value" }, inst.id)],
        ["Workflow", link("/workflows/" + encodeURIComponent(inst.workflow), inst.workflow)],
        ["Created", fmtTime(inst.createdAt)],
        ["Started", fmtTime(inst.startedAt)],
        ["Finished", fmtTime(inst.finishedAt)],
        ["Duration", duration(inst.createdAt, inst.finishedAt)],
        ["Steps", el("span", { class: "value", id: "step-counts" }, progress(inst.steps))],
        ["Priority", String(inst.priority)],
      ];
      if (inst.key !== null) rows.push(["Key", el("span", { class: "mono value" }, inst.key)]);
      rows.push(...failureRows(inst));
      if (inst.parent) {
        // A child instance names the step (and item) of the instance that started it.
        const p = inst.parent;
        rows.push(["Parent", el("span", { class: "value", id: "parent" },
          el("a", { href: "#/instances/" + encodeURIComponent(p.id), class: "mono", id: "parent-link", title: p.id }, shortID(p.id)),
          " step ", el("span", { class: "mono", id: "parent-step" }, p.step), p.item !== undefined ? " item " + p.item : "")]);
      }
      return [
        el("div", { class: "meta" }, rows.map(([k, v]) => el("div", {}, el("span", {}, k), v instanceof Node ? v : el("span", { class: "value" }, v)))),
        inst.error !== null ? el("div", { class: "error-box", id: "instance-error" }, inst.error) : null,
      ];
    }

    function renderIO() {
      return [
        el("details", { "data-keep": "input", id: "instance-input" }, el("summary", {}, "Instance input"),
          el("pre", { class: "json mono", "data-keep": "input-json" }, pretty(inst.input))),
        inst.output !== null ? el("details", { "data-keep": "output", id: "instance-output", open: inst.status === "completed" },
          el("summary", {}, "Instance output"), el("pre", { class: "json mono", "data-keep": "output-json" }, pretty(inst.output))) : null,
      ];
    }

    function renderSide() {
      const s = selected && inst.steps.find((x) => x.name === selected);
      if (!s) {
        return [
          el("h2", {}, "Steps"),
          el("p", { class: "muted" }, "Click a step in the graph to see its attempts, inputs, outputs and errors."),
          el("table", {}, el("tbody", {}, inst.steps.map((st) => {
            const row = el("tr", { class: "clickable", "data-step": st.name },
              el("td", {}, st.name, st.onFailure ? el("span", { class: "muted small" }, " onFailure") : null,
                st.items ? el("div", { class: "muted small" }, itemSummary(st.items)) : null), el("td", {}, badge(st.status)),
              el("td", { class: "num muted" }, st.startedAt ? duration(st.startedAt, st.finishedAt) : ""));
            row.addEventListener("click", () => select(st.name));
            return row;
          }))),
        ];
      }
      const { events, partial } = history.of(s.name);
      return [
        el("div", { class: "page-head" }, el("h2", { id: "step-name" }, s.name), badge(s.status),
          el("span", { class: "spacer" }), el("button", { type: "button", onclick: () => select(null) }, "Close")),
        stepActions(s),
        el("div", { class: "kv" },
          s.signal ? [el("span", {}, "Waits for"), el("span", { class: "mono", id: "step-signal" }, "signal " + s.signal)]
            : s.workflow ? [el("span", {}, "Workflow"), el("span", { class: "mono", id: "step-workflow" }, link("/workflows/" + encodeURIComponent(s.workflow), s.workflow)),
              // A forEach workflow step's children are in its item table.
              s.items ? null : [el("span", {}, "Child instance"), el("span", { class: "mono", id: "step-child" }, s.children
                ? el("a", { href: "#/instances/" + encodeURIComponent(s.children[0]), id: "step-child-link", title: s.children[0] }, shortID(s.children[0]))
                : "not started")]]
              : [el("span", {}, "Handler"), el("span", { class: "mono" }, s.handler),
                el("span", {}, "Queue"), el("span", { class: "mono" }, s.queue)],
          s.status === "waiting" ? [el("span", {}, "Times out"), el("span", { id: "step-deadline" },
            s.deadline ? [fmtTime(s.deadline), " (", countdown(s.deadline, "", " left"), ")"] : "never")] : null,
          s.status === "pending" && s.runAfter ? [el("span", {}, "Runs at"), el("span", { id: "step-run-after" },
            fmtTime(s.runAfter), " (", countdown(s.runAfter, "in "), ")")] : null,
          s.items || s.signal || s.workflow ? null : [el("span", {}, "Attempts"), el("span", {}, String(s.attempts))],
          el("span", {}, "Started"), el("span", {}, fmtTime(s.startedAt)),
          el("span", {}, "Finished"), el("span", {}, fmtTime(s.finishedAt)),
          el("span", {}, "Duration"), el("span", { id: "step-duration" }, duration(s.startedAt, s.finishedAt)),
          el("span", {}, "Depends on"), el("span", {}, s.dependsOn.length ? s.dependsOn.map((d, i) => [i ? ", " : "", el("a", { href: "#", onclick: (ev) => { ev.preventDefault(); select(d); } }, d)]) : "\u2013")),
        s.error !== null ? [el("h3", {}, "Error"), el("div", { class: "error-box", id: "step-error", "data-keep": "error" }, s.error)] : null,
        s.status === "waiting" ? signalFor(s).node : null,
        s.items ? [el("h3", {}, "Items"), itemCounts(s.items), itemsFor(s).node] : null,
        s.items || s.signal ? null : [el("h3", {}, "Input (resolved)"), el("pre", { class: "json mono", id: "step-input", "data-keep": "step-input" }, pretty(s.input))],
        // A waiting step has no output yet: the signal's payload will be it.
        s.status === "waiting" ? null : [el("h3", {}, "Output"), s.items
          ? el("p", { class: "muted", id: "step-output" }, "The list of the items' outputs, in index order. Click an item for its input and output.")
          : el("pre", { class: "json mono", id: "step-output", "data-keep": "step-output" }, pretty(s.output))],
        s.signal ? null : [el("h3", {}, "Logs"), logsFor(s).node],
        events.length || partial ? [el("h3", {}, "Attempts and events"),
          events.length ? el("ol", { class: "timeline", "data-keep": "step-events" }, events.map((e) => eventItem(e, false))) : null,
          partial ? el("p", { class: "muted small", id: "step-events-partial" },
            events.length ? "Among the events read so far: load more in History." : "None among the events read so far: load more in History.") : null] : null,
      ];
    }

    function eventItem(e, withStep) {
      const kind = e.type.split(".")[1] || e.type;
      const cls = { completed: "completed", failed: "failed", retrying: "pending", started: "running", cancelled: "cancelled", skipped: "skipped", ready: "pending", created: "blocked", retried: "pending", lease_expired: "failed", released: "blocked", snoozed: "pending" }[kind] || "blocked";
      const t0 = inst.createdAt;
      return el("li", { class: "s-" + cls },
        el("span", { class: "when", title: fmtTime(e.at) }, fmtClock(e.at) + "  +" + fmtDuration(between(t0, e.at))),
        el("span", { class: "type" }, e.type),
        withStep && e.step ? el("a", { href: "#", class: "step-link", onclick: (ev) => { ev.preventDefault(); select(e.step); } }, e.step) : null,
        e.attempt ? el("span", { class: "muted" }, " attempt " + e.attempt) : null,
        e.message ? el("span", { class: "msg" }, e.message) : null,
        e.actor ? el("span", { class: "actor muted" }, " by " + e.actor) : null);
    }

    async function refresh(gen) {
      let data;
      try {
        data = await api("GET", "instances/" + encodeURIComponent(id));
      } catch (err) {
        if (err.status === 404 && gen === generation && !inst) {
          // No such instance (a mistyped or pruned ID): say so instead of
          // an empty page.
          clear(main);
          main.appendChild(el("div", { class: "crumbs" }, link("/", "Instances")));
          main.appendChild(el("p", { class: "empty", id: "no-instance" }, String(err.message)));
        }
        throw err;
      }
      if (gen !== generation) return;
      // Logs come while nothing else changes: read them on every poll.
      if (logs && logs.step === selected) await logs.refresh();
      const text = JSON.stringify(data);
      if (text === lastJSON) return; // nothing changed; running durations tick on their own
      lastJSON = text;
      inst = data;
      document.title = inst.workflow + " " + shortID(inst.id) + " · " + inst.status + " · dagrun";
      // The instance object's events change with every new event: the
      // history reads what is new only then.
      await history.refresh();
      if (gen !== generation) return;
      render();
      // The shown page of items changes only when the counts do.
      if (items && items.step === selected) await items.refresh();
    }
    return { refresh };
  }

  // ---- Schedules ----

  // One row per schedule of the loaded workflows, with its next fire times
  // in its own zone, its last instance, and a pause/resume button (the
  // pause is stored: every scheduler obeys it, restarts keep it).
  function schedulesPage() {
    const tbody = el("tbody");
    append(main, [
      el("div", { class: "page-head" }, el("h1", {}, "Schedules")),
      el("div", { class: "card" }, el("table", { id: "schedules" },
        el("thead", {}, el("tr", {}, ["Workflow", "#", "Cron", "Timezone", "Next", "Last instance", "Fired / skipped", ""].map((h) => el("th", {}, h)))),
        tbody)),
    ]);
    function zoned(iso, zone) {
      try {
        return new Date(iso).toLocaleString(undefined, { timeZone: zone, dateStyle: "medium", timeStyle: "short" }) + " " + zone;
      } catch (_) { return fmtTime(iso); }
    }
    async function toggle(s, button) {
      button.disabled = true;
      try {
        await api("POST", "schedules/" + encodeURIComponent(s.workflow) + "/" + s.index + "/" + (s.paused ? "resume" : "pause"));
        showError(null);
        await refresh(generation);
      } catch (err) { showError(err); button.disabled = false; }
    }
    let shown = null;
    async function refresh(gen) {
      const list = await api("GET", "schedules");
      if (gen !== generation) return false;
      // Rebuilt only when something changed, so that a focused or
      // half-clicked button is not replaced under the pointer.
      const json = JSON.stringify(list);
      if (json === shown) return;
      shown = json;
      clear(tbody);
      if (!list.length) {
        tbody.appendChild(el("tr", {}, el("td", { colspan: 8, class: "empty" }, "No schedules: add a schedule: list to a workflow file; dagrun serve picks it up in a moment.")));
      }
      for (const s of list) {
        const next = s.paused ? el("span", { class: "muted" }, "paused")
          : el("span", { title: s.next.map((t) => zoned(t, s.timezone)).join("\n") }, s.next.length ? zoned(s.next[0], s.timezone) : "never");
        const last = s.lastInstance
          ? el("span", {}, link("/instances/" + encodeURIComponent(s.lastInstance.id), shortID(s.lastInstance.id)), " ",
            s.lastInstance.status ? badge(s.lastInstance.status) : el("span", { class: "muted" }, "pruned"))
          : el("span", { class: "muted" }, "none yet");
        const button = el("button", { type: "button", class: s.paused ? "primary" : "", "data-schedule": s.workflow + "/" + s.index },
          s.paused ? "Resume" : "Pause");
        button.addEventListener("click", () => toggle(s, button));
        tbody.appendChild(el("tr", { class: s.paused ? "paused" : "" },
          el("td", {}, link("/workflows/" + encodeURIComponent(s.workflow), s.workflow)),
          el("td", { class: "num" }, String(s.index)),
          el("td", { class: "mono" }, s.cron),
          el("td", {}, s.timezone),
          el("td", {}, next),
          el("td", {}, last),
          el("td", { class: "num" }, s.fired + " / " + s.skipped),
          el("td", {}, button)));
      }
    }
    return { refresh };
  }

  // ---- Queues ----

  // One row per queue with a limit or with ready, held or running steps:
  // its depth and load, and its limits, which the form beside them sets
  // (stored in the database: every worker obeys them at once).
  function queuesPage() {
    const tbody = el("tbody");
    const name = el("input", { type: "text", placeholder: "queue name", "aria-label": "queue name" });
    const addForm = el("form", { class: "inline-form", id: "queue-add" }, name,
      el("button", { type: "submit" }, "Add limits"));
    append(main, [
      el("div", { class: "page-head" }, el("h1", {}, "Queues")),
      el("div", { class: "card" }, el("table", { id: "queues" },
        el("thead", {}, el("tr", {}, ["Queue", "Depth", "Held", "Running", "Scheduled", "Oldest wait", "Concurrency", "Rate (N/DUR)", ""].map((h) => el("th", {}, h)))),
        tbody)),
      addForm,
    ]);
    const extra = new Set(); // queues added in this page, not yet limited
    addForm.addEventListener("submit", (ev) => {
      ev.preventDefault();
      if (name.value.trim()) extra.add(name.value.trim());
      name.value = "";
      refresh(generation);
    });
    function rateText(q) { return q.rate ? q.rate.count + "/" + q.rate.per : "none"; }
    async function save(q, concurrency, rate, button) {
      button.disabled = true;
      try {
        await api("POST", "queues/" + encodeURIComponent(q.queue), { concurrency: Number(concurrency.value || 0), rate: rate.value.trim() || "none" });
        extra.delete(q.queue);
        showError(null);
        await refresh(generation);
      } catch (err) { showError(err); button.disabled = false; }
    }
    let editing = false; // a row being edited is not redrawn under the user
    async function refresh(gen) {
      if (editing) return true;
      const list = await api("GET", "queues");
      if (gen !== generation) return false;
      for (const q of extra) {
        if (!list.some((x) => x.queue === q)) list.push({ queue: q, depth: 0, ready: 0, held: 0, running: 0, scheduled: 0, oldestWaitSeconds: 0, concurrency: 0, rate: null });
      }
      clear(tbody);
      if (!list.length) {
        tbody.appendChild(el("tr", {}, el("td", { colspan: 9, class: "empty" }, "No queues: no step is ready, running or scheduled, and no queue has a limit.")));
      }
      for (const q of list) {
        const concurrency = el("input", { type: "number", min: "0", value: String(q.concurrency), "aria-label": "concurrency of " + q.queue, class: "narrow" });
        const rate = el("input", { type: "text", value: rateText(q), "aria-label": "rate of " + q.queue, class: "narrow" });
        for (const input of [concurrency, rate]) {
          input.addEventListener("focus", () => { editing = true; });
          input.addEventListener("blur", () => { editing = false; });
        }
        const button = el("button", { type: "button", "data-queue": q.queue }, "Save");
        button.addEventListener("mousedown", () => { editing = false; });
        button.addEventListener("click", () => save(q, concurrency, rate, button));
        tbody.appendChild(el("tr", {},
          el("td", { class: "mono" }, q.queue),
          el("td", { class: "num" }, String(q.depth)),
          el("td", { class: "num" }, String(q.held)),
          el("td", { class: "num" }, String(q.running)),
          el("td", { class: "num", title: "pending, not due yet: a delayed start, a retry's backoff, a rate's spacing" }, String(q.scheduled)),
          el("td", { class: "num" }, q.depth ? q.oldestWaitSeconds.toFixed(1) + "s" : "-"),
          el("td", {}, concurrency),
          el("td", {}, rate),
          el("td", {}, button)));
      }
    }
    return { refresh };
  }

  // ---- Workflows ----

  function workflowsPage() {
    const tbody = el("tbody");
    append(main, [
      el("div", { class: "page-head" }, el("h1", {}, "Workflows")),
      el("div", { class: "card" }, el("table", {},
        el("thead", {}, el("tr", {}, ["Workflow", "Description", "Steps", "Definition hash"].map((h) => el("th", {}, h)))),
        tbody)),
    ]);
    async function refresh(gen) {
      const data = await api("GET", "workflows");
      if (gen !== generation) return false;
      clear(tbody);
      if (!data.length) {
        tbody.appendChild(el("tr", {}, el("td", { colspan: 4, class: "empty" }, "No workflows loaded: put WORKFLOW.yaml files in the folder given to --workflows; dagrun serve picks them up in a moment.")));
      }
      for (const w of data) {
        tbody.appendChild(el("tr", {},
          el("td", {}, link("/workflows/" + encodeURIComponent(w.name), w.name)),
          el("td", {}, w.description),
          el("td", { class: "num" }, String(w.steps)),
          el("td", { class: "mono muted", title: w.hash }, w.hash.slice(0, 12))));
      }
      return false; // definitions change only on restart: no polling
    }
    return { refresh };
  }

  function workflowPage(name) {
    let wf = null;
    let selected = null;
    const graph = graphView(select);
    const side = el("div", { class: "card side" });
    const body = el("div");
    append(main, body);

    function select(n) {
      selected = selected === n ? null : n;
      graph.set(wf.graph, stepInfo, selected);
      renderSide();
    }
    let stepsByName = new Map();
    function stepInfo(n) {
      const s = stepsByName.get(n);
      let detail = s && s.when ? "when " + s.when : (s && s.queue !== "default" ? "queue " + s.queue : "");
      if (s && s.forEach) detail = "for each item" + (s.concurrency ? ", " + s.concurrency + " at once" : "") + (detail ? " \u00B7 " + detail : "");
      if (s && s.wait) return { status: "definition", label: "wait", detail: "signal " + s.wait.signal + (s.wait.timeout ? " \u00B7 " + s.wait.timeout : "") };
      if (s && s.workflow) return { status: "definition", label: "\u21B3 " + s.workflow, detail: detail || "workflow step" };
      return { status: "definition", label: s ? s.handler : "", detail };
    }
    function renderSide() {
      clear(side);
      const s = selected && stepsByName.get(selected);
      if (!s) {
        append(side, [el("h2", {}, "Start an instance"), startForm()]);
        return;
      }
      append(side, [
        el("div", { class: "page-head" }, el("h2", {}, s.name), el("span", { class: "spacer" }),
          el("button", { type: "button", onclick: () => select(null) }, "Close")),
        el("div", { class: "kv" },
          s.wait ? [
            el("span", {}, "Waits for"), el("span", { class: "mono" }, "signal " + s.wait.signal),
            el("span", {}, "Times out"), el("span", {}, s.wait.timeout ? "after " + s.wait.timeout : "never"),
          ] : s.workflow ? [
            // A workflow step runs its child workflow, not a handler.
            el("span", {}, "Workflow"), el("span", { class: "mono", id: "def-workflow" }, link("/workflows/" + encodeURIComponent(s.workflow), s.workflow)),
          ] : [
            el("span", {}, "Handler"), el("span", { class: "mono" }, s.handler),
            el("span", {}, "Queue"), el("span", { class: "mono" }, s.queue),
          ],
          el("span", {}, "Depends on"), el("span", {}, s.dependsOn.join(", ") || "–"),
          s.wait || s.workflow ? null : [
            el("span", {}, "Retry"), el("span", {}, s.retry.maxAttempts + " attempts, backoff " + s.retry.backoff + " up to " + s.retry.maxBackoff),
            el("span", {}, "Timeout"), el("span", {}, s.timeout || "none"),
          ],
          el("span", {}, "When"), el("span", { class: "mono" }, s.when || "always"),
          s.forEach ? [el("span", {}, "For each"), el("span", {}, "runs once per item of its forEach list" + (s.concurrency ? ", at most " + s.concurrency + " at once" : ""))] : null,
          el("span", {}, "On error"), el("span", {}, s.continueOnError ? "continue" : "fail the instance")),
        s.wait && s.wait.schema ? [el("h3", {}, "Payload schema"), el("pre", { class: "json mono", id: "wait-schema" }, pretty(s.wait.schema))] : null,
      ]);
    }
    function startForm() {
      const input = el("textarea", { id: "start-input", spellcheck: "false" }, "{}");
      const key = el("input", { id: "start-key", placeholder: "optional" });
      const priority = el("input", { id: "start-priority", type: "number", value: "0" });
      const delay = el("input", { id: "start-delay", placeholder: "e.g. 30s" });
      const error = el("p", { class: "error-text" });
      const form = el("form", {},
        el("label", { for: "start-input" }, "Input (JSON)"), input,
        el("div", { class: "form-grid" },
          el("div", {}, el("label", { for: "start-key" }, "Key"), key),
          el("div", {}, el("label", { for: "start-priority" }, "Priority"), priority),
          el("div", {}, el("label", { for: "start-delay" }, "Delay"), delay)),
        error,
        el("div", { class: "actions" }, el("button", { type: "submit", class: "primary" }, "Start")));
      form.addEventListener("submit", async (ev) => {
        ev.preventDefault();
        error.textContent = "";
        let value;
        try { value = parseJSON(input.value || "{}"); } catch (err) { error.textContent = "Input is not valid JSON: " + err.message; return; }
        const req = { input: value, priority: Number(priority.value) || 0 };
        if (key.value.trim()) req.key = key.value.trim();
        if (delay.value.trim()) req.delay = delay.value.trim();
        try {
          const inst = await api("POST", "workflows/" + encodeURIComponent(name) + "/instances", req);
          location.hash = "#/instances/" + encodeURIComponent(inst.id);
        } catch (err) { error.textContent = err.message; }
      });
      return form;
    }

    // The server reloads a workflow file that changed: the page looks again
    // at every poll, and draws itself again when the definition did.
    let shownHash = null;
    async function refresh(gen) {
      let next;
      try {
        next = await api("GET", "workflows/" + encodeURIComponent(name));
      } catch (err) {
        if (err.status !== 404 || gen !== generation) throw err;
        // The page says what is wrong, as an unknown instance's does,
        // rather than stay empty under the banner.
        clear(body);
        append(body, [
          el("div", { class: "crumbs" }, link("/workflows", "Workflows"), " / ", name),
          el("div", { class: "card" }, el("p", { class: "empty", id: "not-found" }, err.message)),
        ]);
        return false;
      }
      if (gen !== generation) return false;
      if (next.hash === shownHash) return true;
      wf = next;
      shownHash = wf.hash;
      stepsByName = new Map(wf.steps.concat(wf.onFailure || []).map((st) => [st.name, st]));
      document.title = wf.name + " · dagrun";
      clear(body);
      const source = el("pre", { class: "source", id: "source" }, wf.source.replace(/\n$/, "").split("\n").map((line) => el("span", {}, line || " ")));
      append(body, [
        el("div", { class: "crumbs" }, link("/workflows", "Workflows"), " / ", wf.name),
        el("div", { class: "page-head" }, el("h1", {}, wf.name),
          el("span", { class: "spacer" }), link("/?workflow=" + encodeURIComponent(wf.name), "Instances of this workflow \u2192")),
        wf.description ? el("p", { class: "muted" }, wf.description) : null,
        el("div", { class: "layout" },
          el("div", {},
            el("div", { class: "card" }, el("div", { class: "card-head" }, el("h2", {}, "Graph (" + wf.steps.length + " steps)"), graph.tools), graph.wrap),
            el("div", { class: "card" }, el("h2", {}, "Definition"), source,
              el("details", {}, el("summary", {}, "Mermaid"), el("pre", { class: "json mono" }, wf.graph.mermaid || "")),
              el("details", {}, el("summary", {}, "Definition hash"), el("span", { class: "mono" }, wf.hash)))),
          side),
      ]);
      graph.set(wf.graph, stepInfo, selected);
      renderSide();
      return true;
    }
    return { refresh };
  }

  route();
})();
