// dagrun web UI: plain JavaScript, no dependencies.
//
// Every value that comes from the API is put into the page with
// textContent or as an attribute value through the el()/svg() helpers
// below; nothing is ever parsed as HTML (no innerHTML, no
// insertAdjacentHTML, no document.write), so inputs, outputs and errors of
// steps cannot become markup or script.
//
// Pages are addressed by the URL fragment (#/instances/ID), so links and
// reloads work without server-side routes. With a server token the UI asks
// for it once and keeps it in sessionStorage (per tab, gone when the tab
// closes), sending it as "Authorization: Bearer <token>" on every call.
"use strict";

(() => {
  const POLL_MS = 1500;
  const TOKEN_KEY = "dagrun.token";
  const STATUSES = ["pending", "running", "completed", "failed", "cancelled"];
  const ICONS = {
    blocked: "\u22EF", pending: "\u25F7", running: "\u21BB", completed: "\u2713",
    failed: "\u2715", skipped: "\u21B7", cancelled: "\u2298",
  };
  const SVG_NS = "http://www.w3.org/2000/svg";

  const main = document.getElementById("main");
  const banner = document.getElementById("banner");
  const live = document.getElementById("live");
  const logout = document.getElementById("logout");

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
  function fmtTime(iso) {
    if (!iso) return "–";
    const d = new Date(iso);
    return d.toLocaleString(undefined, { year: "numeric", month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", second: "2-digit" });
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
  function pretty(value) {
    if (value === null || value === undefined) return "null";
    return JSON.stringify(value, null, 2);
  }
  function jsonBlock(value) {
    return el("pre", { class: "json mono" }, pretty(value));
  }
  function shortID(id) {
    return id.length > 13 ? id.slice(0, 8) + "…" + id.slice(-4) : id;
  }
  function truncate(s, n) {
    return s.length > n ? s.slice(0, n - 1) + "…" : s;
  }

  // ---- API ----

  class APIError extends Error {
    constructor(status, message) { super(message); this.status = status; }
  }

  async function api(method, path, body) {
    const headers = { Accept: "application/json" };
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (token) headers.Authorization = "Bearer " + token;
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
    try { data = await resp.json(); } catch (_) { /* not JSON */ }
    if (resp.status === 401) {
      setLive(false, "token needed");
      showLogin(token ? "That token was not accepted." : "");
      throw new APIError(401, (data && data.error) || "unauthorized");
    }
    setLive(true);
    if (!resp.ok) throw new APIError(resp.status, (data && data.error) || resp.status + " " + resp.statusText);
    return data;
  }

  function setLive(ok, why) {
    live.className = "live " + (ok ? "ok" : "down");
    live.textContent = ok ? "live" : why;
    logout.hidden = !sessionStorage.getItem(TOKEN_KEY);
  }

  function showError(err) {
    if (err && err.status === 401) return; // the login dialog says it
    banner.textContent = err ? String(err.message || err) : "";
    banner.hidden = !err;
  }

  // ---- Login ----

  const dialog = document.getElementById("login");
  const loginForm = document.getElementById("login-form");
  const tokenInput = document.getElementById("token");
  const loginError = document.getElementById("login-error");

  function showLogin(message) {
    loginError.textContent = message || "";
    if (!dialog.open) dialog.showModal();
    tokenInput.focus();
  }
  loginForm.addEventListener("submit", (ev) => {
    ev.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, tokenInput.value.trim());
    tokenInput.value = "";
    dialog.close();
    route();
  });
  dialog.addEventListener("cancel", (ev) => ev.preventDefault());
  logout.addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    route();
  });

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
      a.classList.toggle("active", a.dataset.nav === (parts[0] === "workflows" ? "workflows" : "instances"));
    }
    let page;
    if (parts[0] === "instances" && parts[1]) page = instancePage(parts[1]);
    else if (parts[0] === "workflows" && parts[1]) page = workflowPage(parts[1]);
    else if (parts[0] === "workflows") page = workflowsPage();
    else page = instancesPage(params);
    poll(generation, page);
  }

  async function poll(gen, page) {
    if (gen !== generation) return;
    if (!document.hidden) {
      try {
        const again = await page.refresh(gen);
        if (gen !== generation) return;
        showError(null);
        if (again === false) return;
      } catch (err) {
        if (gen !== generation) return;
        showError(err);
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
    const count = el("span", { class: "count" });
    const tbody = el("tbody");
    const more = el("button", { type: "button", hidden: true }, "Load more");
    let pages = 1;
    let next = "";

    function navigate() {
      const q = new URLSearchParams();
      if (workflowSel.value) q.set("workflow", workflowSel.value);
      if (statusSel.value) q.set("status", statusSel.value);
      const qs = q.toString();
      location.hash = "#/" + (qs ? "?" + qs : "");
    }
    workflowSel.addEventListener("change", navigate);
    statusSel.addEventListener("change", navigate);
    more.addEventListener("click", () => { pages++; refresh(generation).catch(showError); });

    append(main, [
      el("div", { class: "page-head" }, el("h1", {}, "Instances")),
      el("div", { class: "card" },
        el("div", { class: "filters" },
          el("div", {}, el("label", { for: "filter-workflow" }, "Workflow"), workflowSel),
          el("div", {}, el("label", { for: "filter-status" }, "Status"), statusSel),
          count),
        el("table", {},
          el("thead", {}, el("tr", {}, ["Instance", "Workflow", "Status", "Steps", "Created", "Duration"].map((h) => el("th", {}, h)))),
          tbody),
        el("div", { class: "actions" }, more)),
    ]);

    // The workflow filter lists the served workflows plus a filtered-for
    // name that is no longer served (its old instances still exist).
    api("GET", "workflows").then((data) => {
      const names = data.workflows.map((w) => w.name);
      const wanted = params.get("workflow");
      if (wanted && !names.includes(wanted)) names.push(wanted);
      for (const n of names) workflowSel.appendChild(el("option", { value: n }, n));
      workflowSel.value = wanted || "";
    }).catch(showError);

    async function refresh(gen) {
      const q = new URLSearchParams({ limit: String(Math.min(500, 50 * pages)) });
      if (params.get("workflow")) q.set("workflow", params.get("workflow"));
      if (params.get("status")) q.set("status", params.get("status"));
      const data = await api("GET", "instances?" + q.toString());
      if (gen !== generation) return;
      next = data.next;
      more.hidden = !next || pages * 50 >= 500;
      count.textContent = data.instances.length + (next ? "+" : "") + " shown";
      clear(tbody);
      if (data.instances.length === 0) {
        tbody.appendChild(el("tr", {}, el("td", { colspan: 6, class: "empty" }, "No instances yet. Start one with dagrun start WORKFLOW or from a workflow's page.")));
      }
      for (const inst of data.instances) {
        const done = inst.steps.filter((s) => ["completed", "failed", "skipped", "cancelled"].includes(s.status)).length;
        const row = el("tr", { class: "clickable", "data-id": inst.id },
          el("td", { class: "mono", title: inst.id }, link("/instances/" + encodeURIComponent(inst.id), shortID(inst.id))),
          el("td", {}, link("/workflows/" + encodeURIComponent(inst.workflow), inst.workflow)),
          el("td", {}, badge(inst.status)),
          el("td", {},
            el("div", { class: "strip", title: inst.steps.map((s) => s.name + ": " + s.status).join("\n") },
              inst.steps.map((s) => el("span", { class: "s-" + s.status }))),
            el("div", { class: "strip-label" }, done + "/" + inst.steps.length + " done")),
          el("td", { title: fmtTime(inst.createdAt) }, ago(inst.createdAt)),
          el("td", { class: "num" }, fmtDuration(between(inst.createdAt, inst.finishedAt)) + (inst.finishedAt ? "" : "…")));
        row.addEventListener("click", (ev) => {
          if (ev.target.closest("a")) return;
          location.hash = "#/instances/" + encodeURIComponent(inst.id);
        });
        tbody.appendChild(row);
      }
    }
    return { refresh };
  }

  // ---- Graph drawing (layout comes from the server) ----

  // drawGraph returns an <svg> of graph; stepInfo(name) gives the status
  // class, the status word and the detail line of a node; onSelect(name) is
  // called on click or Enter.
  function drawGraph(graph, stepInfo, selected, onSelect) {
    const root = svg("svg", {
      width: graph.width, height: graph.height, viewBox: "0 0 " + graph.width + " " + graph.height,
      role: "img", "aria-label": "workflow graph",
    });
    root.appendChild(svg("defs", {},
      svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" },
        svg("path", { d: "M 0 0 L 10 5 L 0 10 z", class: "arrow" }))));
    const byName = {};
    for (const n of graph.nodes) byName[n.id] = n;
    const edges = svg("g", {});
    for (const e of graph.edges) {
      const info = stepInfo(e.from);
      const hot = selected && (e.from === selected || e.to === selected);
      edges.appendChild(svg("path", {
        d: edgePath(e.points),
        class: "edge" + (info.status === "completed" ? " done" : "") + (hot ? " hot" : ""),
        "marker-end": "url(#arrow)",
      }, svg("title", {}, e.from + " \u2192 " + e.to)));
    }
    root.appendChild(edges);
    for (const n of graph.nodes) {
      const info = stepInfo(n.id);
      const g = svg("g", {
        class: "node s-" + info.status + (n.id === selected ? " selected" : ""),
        transform: "translate(" + n.x + "," + n.y + ")",
        tabindex: 0, role: "button", "data-step": n.id,
        "aria-label": n.id + ": " + info.label,
      },
        svg("title", {}, n.id + "\n" + info.label + (info.detail ? "\n" + info.detail : "")),
        svg("rect", { class: "box", width: n.width, height: n.height, rx: 8 }),
        svg("rect", { class: "bar", width: 5, height: n.height - 2, x: 1, y: 1, rx: 2 }),
        svg("text", { class: "name", x: 14, y: 20 }, truncate(n.id, 21)),
        svg("text", { class: "state", x: 14, y: 37 }, ((ICONS[info.status] || "") + " " + info.label).trim()),
        svg("text", { class: "sub", x: 14, y: 52 }, truncate(info.detail || "", 28)));
      g.addEventListener("click", () => onSelect(n.id));
      g.addEventListener("keydown", (ev) => {
        if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); onSelect(n.id); }
      });
      root.appendChild(g);
    }
    return root;
  }

  // showGraph puts a drawn graph into its scrollable frame. A graph a little
  // wider than the frame is scaled down to fit; a big one (30+ steps) keeps
  // its natural size, so labels stay readable, and scrolls.
  function showGraph(wrap, root, graph) {
    const scroll = [wrap.scrollLeft, wrap.scrollTop];
    clear(wrap);
    wrap.appendChild(root);
    const avail = wrap.clientWidth - 2;
    if (graph.width > avail && avail / graph.width >= 0.75) {
      root.setAttribute("width", String(avail));
      root.setAttribute("height", String(Math.round(graph.height * avail / graph.width)));
    }
    [wrap.scrollLeft, wrap.scrollTop] = scroll;
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

  function legend(statuses) {
    return el("div", { class: "legend" }, statuses.map(badge));
  }

  // ---- Instance page ----

  function instancePage(id) {
    let selected = null;
    let inst = null;
    let lastJSON = "";
    const head = el("div");
    const graphWrap = el("div", { class: "graph-wrap", id: "graph" });
    const side = el("div", { class: "card side", id: "details" });
    const timeline = el("ol", { class: "timeline", id: "timeline" });
    append(main, [
      head,
      el("div", { class: "layout" },
        el("div", {},
          el("div", { class: "card" }, el("h2", {}, "Graph"), graphWrap,
            legend(["blocked", "pending", "running", "completed", "failed", "skipped", "cancelled"])),
          el("div", { class: "card" }, el("h2", {}, "History"), timeline)),
        side),
    ]);

    function select(name) {
      selected = selected === name ? null : name;
      render();
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

    function stepInfo(name) {
      const s = inst.steps.find((x) => x.name === name);
      if (!s) return { status: "blocked", label: "unknown" };
      const parts = [];
      if (s.attempts > 0) parts.push(s.attempts === 1 ? "1 attempt" : s.attempts + " attempts");
      if (s.startedAt) parts.push(fmtDuration(between(s.startedAt, s.finishedAt)) + (s.finishedAt ? "" : "…"));
      if (!parts.length) parts.push(s.handler);
      return { status: s.status, label: s.status, detail: parts.join(" · ") };
    }

    function render() {
      renderHead();
      showGraph(graphWrap, drawGraph(inst.graph, stepInfo, selected, select), inst.graph);
      renderSide();
      renderTimeline();
    }

    function renderHead() {
      clear(head);
      const finished = ["completed", "failed", "cancelled"].includes(inst.status);
      const cancel = el("button", { type: "button", class: "danger", id: "cancel", disabled: finished, onclick: () => act("cancel") }, "Cancel");
      const retry = el("button", { type: "button", class: "primary", id: "retry", disabled: !(inst.status === "failed" || inst.status === "cancelled"), onclick: () => act("retry") }, "Retry");
      const rows = [
        ["Instance", el("span", { class: "mono value" }, inst.id)],
        ["Workflow", link("/workflows/" + encodeURIComponent(inst.workflow), inst.workflow)],
        ["Created", fmtTime(inst.createdAt)],
        ["Started", fmtTime(inst.startedAt)],
        ["Finished", fmtTime(inst.finishedAt)],
        ["Duration", fmtDuration(between(inst.createdAt, inst.finishedAt)) + (inst.finishedAt ? "" : "…")],
        ["Priority", String(inst.priority)],
      ];
      if (inst.key !== null) rows.push(["Key", el("span", { class: "mono value" }, inst.key)]);
      append(head, [
        el("div", { class: "crumbs" }, link("/", "Instances"), " / ", shortID(inst.id)),
        el("div", { class: "page-head" },
          el("h1", {}, inst.workflow, badge(inst.status)),
          el("span", { class: "spacer" }), cancel, retry),
        el("div", { class: "card" },
          el("div", { class: "meta" }, rows.map(([k, v]) => el("div", {}, el("span", {}, k), v instanceof Node ? v : el("span", { class: "value" }, v)))),
          inst.error !== null ? el("div", { class: "error-box", id: "instance-error" }, inst.error) : null,
          el("details", {}, el("summary", {}, "Instance input"), jsonBlock(inst.input)),
          inst.output !== null ? el("details", { open: inst.status === "completed" }, el("summary", {}, "Instance output"), jsonBlock(inst.output)) : null),
      ]);
    }

    function renderSide() {
      clear(side);
      const s = selected && inst.steps.find((x) => x.name === selected);
      if (!s) {
        append(side, [
          el("h2", {}, "Steps"),
          el("p", { class: "muted" }, "Click a step in the graph to see its attempts, inputs, outputs and errors."),
          el("table", {}, el("tbody", {}, inst.steps.map((st) => {
            const row = el("tr", { class: "clickable" },
              el("td", {}, st.name), el("td", {}, badge(st.status)),
              el("td", { class: "num muted" }, st.startedAt ? fmtDuration(between(st.startedAt, st.finishedAt)) : ""));
            row.addEventListener("click", () => select(st.name));
            return row;
          }))),
        ]);
        return;
      }
      const events = (inst.events || []).filter((e) => e.step === s.name);
      append(side, [
        el("div", { class: "page-head" }, el("h2", { id: "step-name" }, s.name), badge(s.status),
          el("span", { class: "spacer" }), el("button", { type: "button", onclick: () => select(null) }, "Close")),
        el("div", { class: "kv" },
          el("span", {}, "Handler"), el("span", { class: "mono" }, s.handler),
          el("span", {}, "Queue"), el("span", { class: "mono" }, s.queue),
          el("span", {}, "Attempts"), el("span", {}, String(s.attempts)),
          el("span", {}, "Started"), el("span", {}, fmtTime(s.startedAt)),
          el("span", {}, "Finished"), el("span", {}, fmtTime(s.finishedAt)),
          el("span", {}, "Duration"), el("span", {}, s.startedAt ? fmtDuration(between(s.startedAt, s.finishedAt)) + (s.finishedAt ? "" : "…") : "–"),
          el("span", {}, "Depends on"), el("span", {}, s.dependsOn.length ? s.dependsOn.map((d, i) => [i ? ", " : "", el("a", { href: "#", onclick: (ev) => { ev.preventDefault(); select(d); } }, d)]) : "–")),
        s.error !== null ? [el("h3", {}, "Error"), el("div", { class: "error-box", id: "step-error" }, s.error)] : null,
        el("h3", {}, "Input (resolved)"), el("pre", { class: "json mono", id: "step-input" }, pretty(s.input)),
        el("h3", {}, "Output"), el("pre", { class: "json mono", id: "step-output" }, pretty(s.output)),
        events.length ? [el("h3", {}, "Attempts and events"), el("ol", { class: "timeline" }, events.map((e) => eventItem(e, false)))] : null,
      ]);
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
        e.message ? el("span", { class: "msg" }, e.message) : null);
    }

    function renderTimeline() {
      clear(timeline);
      const events = inst.events || [];
      if (!events.length) timeline.appendChild(el("li", { class: "muted" }, "No events yet."));
      append(timeline, events.map((e) => eventItem(e, true)));
    }

    async function refresh(gen) {
      const data = await api("GET", "instances/" + encodeURIComponent(id));
      if (gen !== generation) return;
      const text = JSON.stringify(data);
      if (text === lastJSON) return; // nothing changed: keep the DOM (and any text selection) as it is
      lastJSON = text;
      inst = data;
      document.title = inst.workflow + " " + shortID(inst.id) + " · " + inst.status + " · dagrun";
      render();
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
      if (!data.workflows.length) {
        tbody.appendChild(el("tr", {}, el("td", { colspan: 4, class: "empty" }, "No workflows loaded: put WORKFLOW.yaml files in the folder given to --workflows and restart dagrun serve.")));
      }
      for (const w of data.workflows) {
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
    const graphWrap = el("div", { class: "graph-wrap", id: "graph" });
    const side = el("div", { class: "card side" });
    const body = el("div");
    append(main, body);

    function select(n) {
      selected = selected === n ? null : n;
      showGraph(graphWrap, drawGraph(wf.graph, stepInfo, selected, select), wf.graph);
      renderSide();
    }
    function stepInfo(n) {
      const s = wf.steps.find((x) => x.name === n);
      return { status: "definition", label: s ? s.handler : "", detail: s && s.when ? "when " + s.when : (s && s.queue !== "default" ? "queue " + s.queue : "") };
    }
    function renderSide() {
      clear(side);
      const s = selected && wf.steps.find((x) => x.name === selected);
      if (!s) {
        append(side, [el("h2", {}, "Start an instance"), startForm()]);
        return;
      }
      append(side, [
        el("div", { class: "page-head" }, el("h2", {}, s.name), el("span", { class: "spacer" }),
          el("button", { type: "button", onclick: () => select(null) }, "Close")),
        el("div", { class: "kv" },
          el("span", {}, "Handler"), el("span", { class: "mono" }, s.handler),
          el("span", {}, "Queue"), el("span", { class: "mono" }, s.queue),
          el("span", {}, "Depends on"), el("span", {}, s.dependsOn.join(", ") || "–"),
          el("span", {}, "Retry"), el("span", {}, s.retry.maxAttempts + " attempts, backoff " + s.retry.backoff + " up to " + s.retry.maxBackoff),
          el("span", {}, "Timeout"), el("span", {}, s.timeout || "none"),
          el("span", {}, "When"), el("span", { class: "mono" }, s.when || "always"),
          el("span", {}, "On error"), el("span", {}, s.continueOnError ? "continue" : "fail the instance")),
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
        try { value = JSON.parse(input.value || "{}"); } catch (err) { error.textContent = "Input is not valid JSON: " + err.message; return; }
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

    async function refresh(gen) {
      wf = await api("GET", "workflows/" + encodeURIComponent(name));
      if (gen !== generation) return false;
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
            el("div", { class: "card" }, el("h2", {}, "Graph (" + wf.steps.length + " steps)"), graphWrap),
            el("div", { class: "card" }, el("h2", {}, "Definition"), source,
              el("details", {}, el("summary", {}, "Mermaid"), el("pre", { class: "json mono" }, wf.graph.mermaid || "")),
              el("details", {}, el("summary", {}, "Definition hash"), el("span", { class: "mono" }, wf.hash)))),
          side),
      ]);
      showGraph(graphWrap, drawGraph(wf.graph, stepInfo, selected, select), wf.graph);
      renderSide();
      return false; // a definition does not change while the server runs
    }
    return { refresh };
  }

  route();
})();
