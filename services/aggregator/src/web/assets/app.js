// The web view of kai-aggregator. Draws /api/v1/view; refetches it when
// /api/v1/view/events says the cluster changed (or every 5 s when the
// event stream cannot be held open). Lists are virtualised: only the rows
// in sight exist in the DOM, and an update rewrites those rows in place.
// With access control on, the API answers 401 until the page sends a
// Kubernetes bearer token: the page asks for one, keeps it in this tab's
// sessionStorage only and sends it as X-Kai-Authorization on every call.
"use strict";

(function () {
  const $ = (id) => document.getElementById(id);
  const MIB = 1024 * 1024;
  const GIB = 1024 * MIB;

  function bytes(n) {
    if (n === null || n === undefined) return "–";
    if (n >= GIB) return (n / GIB).toFixed(n >= 10 * GIB ? 0 : 1) + " GiB";
    return Math.round(n / MIB) + " MiB";
  }
  function shortUuid(u) {
    return u.length > 14 ? u.slice(0, 13) + "…" : u || "–";
  }
  function shortId(id) {
    return id.length > 8 ? id.slice(0, 4) + "…" : id;
  }
  // What a share grants this container: "16 GiB", or where several of the
  // pod's containers hold it at once "8 GiB (16 GiB split 2 ways)" (the
  // slice is split evenly; split 0 is an older agent's 1).
  function granted(s) {
    if (!s.grantedBytes) return null;
    const split = s.split > 1 ? s.split : 1;
    if (split === 1) return bytes(s.grantedBytes);
    return bytes(Math.floor(s.grantedBytes / split)) + " (" + bytes(s.grantedBytes) + " split " + split + " ways)";
  }
  // A DRA share as the row shows it: "claim <namespace>/<claim>, share 3f2a…,
  // granted 16 GiB"; the whole of it on hover (shareTitle).
  function shareText(namespace, s) {
    return "claim " + namespace + "/" + s.claim +
      (s.shareId ? ", share " + shortId(s.shareId) : ", whole device") +
      ", granted " + (granted(s) || "unknown");
  }
  function shareTitle(namespace, s) {
    return "DRA claim " + namespace + "/" + s.claim + (s.request ? ", request " + s.request : "") +
      "\nshare " + (s.shareId || "none (device allocated whole)") +
      "\ndevice " + [s.driver, s.pool, s.device].filter(Boolean).join("/") +
      " (" + (s.gpuUuid || "GPU not known yet") + ")" +
      "\ngranted " + (granted(s) || "unknown (the allocation does not say)");
  }

  // A list that keeps one absolutely positioned element per visible row.
  class VList {
    constructor(el, build, fill) {
      this.el = el;
      this.build = build;
      this.fill = fill;
      this.h = Number(el.dataset.rowHeight) || 26;
      this.items = [];
      this.pool = [];
      this.spacer = document.createElement("div");
      this.spacer.className = "spacer";
      el.appendChild(this.spacer);
      this.empty = document.createElement("div");
      this.empty.className = "empty";
      el.appendChild(this.empty);
      let queued = false;
      el.addEventListener("scroll", () => {
        if (queued) return;
        queued = true;
        requestAnimationFrame(() => { queued = false; this.render(); });
      });
    }
    setItems(items, emptyText) {
      this.items = items;
      this.spacer.style.height = items.length * this.h + "px";
      this.empty.textContent = items.length ? "" : emptyText;
      this.empty.style.display = items.length ? "none" : "";
      this.render();
    }
    render() {
      const first = Math.floor(this.el.scrollTop / this.h);
      const count = Math.ceil(this.el.clientHeight / this.h) + 2;
      while (this.pool.length < count) {
        const row = this.build();
        row.classList.add("row");
        this.el.appendChild(row);
        this.pool.push(row);
      }
      for (let i = 0; i < this.pool.length; i++) {
        const row = this.pool[i];
        const item = this.items[first + i];
        if (i >= count || item === undefined) {
          row.style.display = "none";
          row.removeAttribute("data-key");
          continue;
        }
        row.style.display = "";
        row.style.transform = "translateY(" + (first + i) * this.h + "px)";
        this.fill(row, item);
      }
    }
  }

  function cells(row, n, numeric) {
    for (let i = 0; i < n; i++) {
      const span = document.createElement("span");
      if (numeric.includes(i)) span.className = "num";
      row.appendChild(span);
    }
  }
  function bar() {
    const b = document.createElement("div");
    b.className = "bar";
    const fill = document.createElement("div");
    fill.className = "fill";
    const stale = document.createElement("div");
    stale.className = "stale";
    b.append(fill, stale);
    return b;
  }
  // Used and stale as parts of `whole`; clamped so an overrun shows full.
  function setBar(b, used, stale, whole, cls) {
    const pct = (x) => (whole > 0 ? Math.min(100, (100 * x) / whole) : 0);
    const u = pct(used);
    const s = Math.min(100 - u, pct(stale));
    b.className = "bar" + (cls ? " " + cls : "");
    b.children[0].style.width = u.toFixed(1) + "%";
    b.children[1].style.left = u.toFixed(1) + "%";
    b.children[1].style.width = s.toFixed(1) + "%";
    b.dataset.used = Math.round(u);
  }

  const gpuList = new VList(
    $("gpus"),
    () => {
      const row = document.createElement("div");
      row.classList.add("gpu-grid");
      cells(row, 7, [2, 3, 4, 5, 6]);
      row.appendChild(bar());
      return row;
    },
    (row, g) => {
      const c = row.children;
      row.dataset.key = g.node + "/" + g.uuid;
      c[0].textContent = g.node;
      c[0].title = "agent " + g.nodeState;
      c[1].textContent = (g.name ? g.name + " " : "") + shortUuid(g.uuid);
      c[1].title = g.uuid;
      c[2].textContent = g.capacity ? bytes(g.capacity) : "unknown";
      c[3].textContent = bytes(g.allocated);
      c[4].textContent = bytes(g.used);
      c[5].textContent = bytes(g.stale);
      c[6].textContent = g.capacity ? bytes(g.headroom) : "–";
      // Caps against capacity; without a known capacity, against the caps.
      const whole = g.capacity || g.allocated || g.used + g.stale;
      setBar(c[7], g.allocated, 0, whole, g.allocated > g.capacity && g.capacity ? "over" : "");
      c[7].title = "allocated " + bytes(g.allocated) + " of " + (g.capacity ? bytes(g.capacity) : "unknown");
    }
  );

  const containerList = new VList(
    $("containers"),
    () => {
      const row = document.createElement("div");
      row.classList.add("container-grid");
      cells(row, 3, []);
      row.appendChild(bar());
      cells(row, 4, [0, 1, 2]);
      // cells() appends; the last four are used, limit, headroom, state.
      row.children[7].className = "state";
      return row;
    },
    (row, r) => {
      const c = row.children;
      row.dataset.key = r.key;
      row.dataset.state = r.state;
      c[0].textContent = r.namespace + " / " + r.pod + " / " + r.container;
      if (r.nearCap) c[0].insertAdjacentHTML("beforeend", '<b class="flag near">near cap</b>');
      if (r.escaped) c[0].insertAdjacentHTML("beforeend", '<b class="flag escaped">' + r.escaped + " escaped</b>");
      // DRA shares: built as nodes (names come from tenants' objects, never as HTML).
      for (const s of r.shares) {
        const flag = document.createElement("b");
        flag.className = "flag claim";
        flag.textContent = shareText(r.namespace, s);
        flag.title = shareTitle(r.namespace, s);
        c[0].appendChild(flag);
      }
      c[1].textContent = r.node;
      c[2].textContent = shortUuid(r.gpu);
      c[2].title = r.gpu;
      if (r.limit > 0) {
        setBar(c[3], r.used, r.stale, r.limit, r.state === "over_cap" || r.used > r.limit ? "over" : r.nearCap ? "near" : "");
      } else {
        setBar(c[3], r.used, r.stale, r.gpuCapacity || r.used + r.stale, "uncapped");
      }
      c[3].title = bytes(r.used) + " used, " + bytes(r.stale) + " stale charge, limit " + (r.limit ? bytes(r.limit) : "none") +
        r.shares.map((s) => ", granted " + (granted(s) || "unknown") + " (claim " + s.claim + ")").join("");
      c[4].textContent = bytes(r.used);
      c[5].textContent = r.limit ? bytes(r.limit) : "uncapped";
      c[6].textContent = r.limit ? bytes(r.headroom) : "–";
      c[7].textContent = r.state.replace(/_/g, " ");
      c[7].dataset.state = r.state;
      c[7].title = r.reason || "cap verified";
    }
  );

  let view = null;
  let updates = 0;
  const filters = { namespace: "", node: "", sort: "used" };

  function rows() {
    const cols = view.columns;
    const ix = (name) => cols.indexOf(name);
    const [iNs, iPod, iCt, iNode, iGpu, iUsed, iLimit, iStale, iState, iReason, iNear, iHeadroom, iShares] =
      ["namespace", "pod", "container", "node", "gpu", "used", "limit", "stale", "state", "reason", "nearCap", "headroom", "draShares"].map(ix);
    const capacity = new Map();
    for (const n of view.nodes) for (const g of n.gpus) capacity.set(n.node + "/" + g.uuid, g.capacity);
    const escaped = new Map();
    for (const e of view.escaped) {
      if (!e.pod) continue;
      const k = e.namespace + "/" + e.pod + "/" + (e.container || "");
      escaped.set(k, (escaped.get(k) || 0) + 1);
    }
    return view.containers.map((c) => {
      const used = c[iUsed], limit = c[iLimit], stale = c[iStale];
      const base = c[iNs] + "/" + c[iPod] + "/";
      return {
        key: base + c[iCt] + "/" + c[iGpu],
        namespace: c[iNs], pod: c[iPod], container: c[iCt], node: c[iNode], gpu: c[iGpu],
        used, limit, stale, state: c[iState], reason: c[iReason], nearCap: c[iNear],
        // The agent's figure (limit − used − stale); uncapped sorts last.
        headroom: limit > 0 ? c[iHeadroom] : Infinity,
        percent: limit > 0 ? used / limit : Infinity,
        gpuCapacity: capacity.get(c[iNode] + "/" + c[iGpu]) || 0,
        escaped: (escaped.get(base + c[iCt]) || 0) + (escaped.get(base) || 0),
        // The DRA shares on this row; none from a model without the column.
        shares: (iShares >= 0 && Array.isArray(c[iShares]) && c[iShares]) || [],
      };
    });
  }

  let all = [];
  function matches(value, filter) {
    return !filter || value === filter || value.includes(filter);
  }
  function byKey(a, b) {
    return a.key < b.key ? -1 : a.key > b.key ? 1 : 0;
  }
  const sorts = {
    used: (a, b) => b.used - a.used || byKey(a, b),
    percent: (a, b) => (b.percent === a.percent ? byKey(a, b) : b.percent > a.percent ? 1 : -1),
    headroom: (a, b) => (a.headroom === b.headroom ? byKey(a, b) : a.headroom < b.headroom ? -1 : 1),
    name: byKey,
  };

  function draw() {
    if (!view) return;
    const shown = all
      .filter((r) => matches(r.namespace, filters.namespace) && matches(r.node, filters.node))
      .sort(sorts[filters.sort] || sorts.used);
    $("container-count").textContent = shown.length === all.length ? all.length : shown.length + " of " + all.length;
    containerList.setItems(shown, "no containers match");

    const gpus = [];
    for (const n of view.nodes) {
      if (!matches(n.node, filters.node)) continue;
      for (const g of n.gpus) gpus.push(Object.assign({ node: n.node, nodeState: n.state, key: n.node + "/" + g.uuid }, g));
    }
    gpus.sort(
      filters.sort === "headroom"
        ? (a, b) => a.headroom - b.headroom || byKey(a, b)
        : filters.sort === "name"
          ? byKey
          : (a, b) => b.used - a.used || byKey(a, b)
    );
    $("gpu-count").textContent = gpus.length;
    gpuList.setItems(gpus, "no GPUs reported");
  }

  function setOptions(list, values) {
    const el = $(list);
    const joined = values.join("\n");
    if (el.dataset.values === joined) return;
    el.dataset.values = joined;
    el.replaceChildren(...values.map((v) => Object.assign(document.createElement("option"), { value: v })));
  }

  function drawEscaped() {
    const box = $("escaped");
    $("escaped-count").textContent = view.escaped.length;
    if (!view.escaped.length) {
      box.innerHTML = '<div class="empty">none</div>';
      return;
    }
    const table = document.createElement("table");
    table.innerHTML = "<tr><th>node</th><th>GPU</th><th>PID</th><th>memory</th><th>pod</th><th>why</th></tr>";
    for (const e of view.escaped.slice(0, 200)) {
      const tr = table.insertRow();
      for (const v of [e.node, shortUuid(e.gpu), e.pid, e.used ? bytes(e.used) : "?", e.pod ? e.namespace + "/" + e.pod + (e.container ? "/" + e.container : "") : "unknown", e.reason]) {
        tr.insertCell().textContent = v;
      }
    }
    box.replaceChildren(table);
    if (view.escaped.length > 200) box.insertAdjacentText("beforeend", "… and " + (view.escaped.length - 200) + " more");
  }

  function apply(v) {
    view = v;
    all = rows();
    updates += 1;
    const states = {};
    for (const r of all) states[r.state] = (states[r.state] || 0) + 1;
    const connected = v.nodes.filter((n) => n.state === "connected").length;
    $("summary").innerHTML = "";
    const add = (text, cls) => $("summary").appendChild(Object.assign(document.createElement("span"), { textContent: text, className: cls || "" }));
    add(connected + "/" + v.nodes.length + " nodes connected");
    add(all.length + " container GPUs");
    for (const s of Object.keys(states).sort()) add(states[s] + " " + s.replace(/_/g, " "), "st-" + s);
    if (v.escaped.length) add(v.escaped.length + " escaped");
    setOptions("namespaces", [...new Set(all.map((r) => r.namespace))].sort());
    setOptions("nodes", v.nodes.map((n) => n.node).sort());
    drawEscaped();
    draw();
    document.body.dataset.updates = updates;
    document.body.dataset.revision = v.revision;
  }

  // Forgets the model: on sign-out, and when the server refuses this tab
  // (what it drew belongs to a token that could see it).
  function clearView() {
    view = null;
    all = [];
    $("summary").replaceChildren();
    for (const id of ["gpu-count", "container-count", "escaped-count"]) $(id).textContent = "";
    $("escaped").replaceChildren();
    setOptions("namespaces", []);
    setOptions("nodes", []);
    containerList.setItems([], "");
    gpuList.setItems([], "");
    delete document.body.dataset.revision;
  }

  function setStatus(state, text) {
    const s = $("status");
    s.dataset.live = state;
    s.textContent = text;
  }

  // --- Access ----------------------------------------------------------------
  // The token lives in sessionStorage (this tab, until it closes or signs
  // out): never localStorage, a cookie or the URL. It goes in
  // X-Kai-Authorization, not Authorization: the API server's service proxy
  // (reached directly or through kubectl proxy) authenticates the request
  // itself and strips Authorization before passing it on, but keeps this.
  const TOKEN_KEY = "kai-aggregator.token";
  let bearer = "";
  try { bearer = sessionStorage.getItem(TOKEN_KEY) || ""; } catch (e) { /* storage off: memory only */ }
  function setToken(t) {
    bearer = t;
    try {
      if (t) sessionStorage.setItem(TOKEN_KEY, t);
      else sessionStorage.removeItem(TOKEN_KEY);
    } catch (e) { /* storage off: memory only */ }
  }
  function apiInit(signal) {
    const init = { cache: "no-store", headers: {} };
    if (bearer) init.headers["X-Kai-Authorization"] = "Bearer " + bearer;
    if (signal) init.signal = signal;
    return init;
  }

  class ApiError extends Error {
    constructor(status, message, retryAfter) {
      super(message);
      this.status = status;
      this.retryAfter = retryAfter;
    }
  }
  // A refusal's message: {"error": …} from the aggregator, a Status
  // {"message": …} from an API server in front of it, else the text.
  async function refusal(r) {
    let text = "";
    try { text = await r.text(); } catch (e) { /* no body */ }
    let message = "";
    try {
      const body = JSON.parse(text);
      message = String(body.error || body.message || "");
    } catch (e) { /* not JSON */ }
    if (!message) message = text.trim().slice(0, 300) || "HTTP " + r.status + (r.statusText ? " " + r.statusText : "");
    const after = Number(r.headers.get("Retry-After"));
    return new ApiError(r.status, message, after > 0 ? after : 0);
  }

  // Each sign-in and sign-out starts a new epoch: answers to calls of an
  // older one are dropped (a 401 to the call before sign-in must not undo it).
  let epoch = 0;
  let locked = false; // the prompt waits for a token: no API calls
  const signin = $("signin");

  function showPrompt(message, state) {
    locked = true;
    signin.hidden = false;
    signin.dataset.state = state;
    $("signin-message").textContent = message || "";
    $("signout").hidden = true;
    document.body.dataset.auth = "signin";
    setStatus("error", "sign in required");
    $("token").focus();
  }
  // An API call answered 2xx (or 403: the token is good, the caller not
  // allowed): whoever asked is signed in.
  function accepted() {
    signin.hidden = true;
    signin.dataset.state = "";
    $("signin-message").textContent = "";
    $("signout").hidden = !bearer;
    document.body.dataset.auth = bearer ? "token" : "open";
  }
  function showNotice(kind, text) {
    const n = $("notice");
    n.hidden = false;
    n.dataset.kind = kind;
    n.textContent = text;
    // Signing in and the server cannot tell yet: say so in the prompt too.
    if (!signin.hidden && !locked) $("signin-message").textContent = text;
  }
  function hideNotice() {
    const n = $("notice");
    n.hidden = true;
    n.textContent = "";
    delete n.dataset.kind;
  }

  // A 401 anywhere: stop, forget the token (the server rejected it) and
  // what it showed, and ask for a token with the server's reason.
  function requireSignIn(message) {
    const rejected = !!bearer;
    epoch += 1;
    stop();
    setToken("");
    clearView();
    hideNotice();
    showPrompt(message, rejected ? "error" : "idle");
  }

  $("signin-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const input = $("token");
    // Pasted with its scheme or wrapped over lines: the token alone.
    const t = input.value.trim().replace(/^bearer\s+/i, "").replace(/\s+/g, "");
    input.value = "";
    if (!t) {
      showPrompt("Paste a token first.", "error");
      return;
    }
    setToken(t);
    epoch += 1;
    stop();
    locked = false;
    signin.dataset.state = "busy";
    $("signin-message").textContent = "Signing in…";
    setStatus("connecting", "signing in…");
    listen();
  });
  $("signout").addEventListener("click", () => {
    epoch += 1;
    stop();
    setToken("");
    clearView();
    hideNotice();
    showPrompt("Signed out: the token is gone from this tab.", "idle");
  });

  // --- The model and its change stream ----------------------------------------

  let inflight = false;
  let again = false;
  let retry = null; // a timer: the next try after a 503
  let retryDelay = 0; // seconds
  function refresh() {
    if (locked) return;
    if (inflight) { again = true; return; }
    inflight = true;
    const my = epoch;
    clearTimeout(retry);
    retry = null;
    fetch("api/v1/view", apiInit())
      .then(async (r) => { if (!r.ok) throw await refusal(r); return r.json(); })
      .then((v) => {
        if (my !== epoch) return;
        retryDelay = 0;
        accepted();
        hideNotice();
        apply(v);
        // Past a refusal, the status says how changes arrive again.
        if (stream && streamOpen) setStatus("live", "live · revision " + v.revision);
        else if (streamLost) setStatus("error", streamLost);
      })
      .catch((e) => { if (my === epoch) failed(e); })
      .finally(() => { inflight = false; if (again) { again = false; refresh(); } });
  }

  function failed(e) {
    if (e.status === 401) {
      requireSignIn(e.message);
    } else if (e.status === 403) {
      // Signed in, but this caller may not see the view.
      accepted();
      clearView();
      showNotice("forbidden", "Signed in, but not allowed: " + e.message);
      setStatus("error", "not allowed");
    } else if (e.status === 503) {
      // The API server that checks tokens (or the aggregator behind a
      // proxy) is unreachable: try again, less often each time.
      retryDelay = Math.min(60, Math.max(e.retryAfter || 0, retryDelay ? retryDelay * 2 : 2));
      showNotice("unavailable", e.message + " (trying again in " + retryDelay + " s)");
      setStatus("error", "unavailable; trying again in " + retryDelay + " s");
      retry = setTimeout(() => { retry = null; refresh(); }, retryDelay * 1000);
    } else {
      setStatus("error", "cannot load the view: " + e.message);
      if (!signin.hidden && !locked) $("signin-message").textContent = "cannot load the view: " + e.message;
    }
  }

  let poll = null;
  let missed = false;
  function startPolling() {
    // A pending retry after a 503 sets the pace instead.
    if (!poll) poll = setInterval(() => { if (!retry) refresh(); }, 5000);
  }
  function stopPolling() {
    if (poll) { clearInterval(poll); poll = null; }
  }
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden && missed) { missed = false; refresh(); }
  });

  // The change stream is read with fetch rather than EventSource, which
  // cannot send the token's header; without a token it is the same path.
  const STREAM_SILENCE_MS = 45000; // the server sends a keep-alive every 15 s
  const canStream = !!(window.fetch && window.AbortController && window.TextDecoder && window.ReadableStream);
  let stream = null; // the open stream's AbortController
  let streamOpen = false; // it answered 200
  let streamLost = ""; // why the page polls instead, if it does
  let reconnect = null; // a timer
  let reconnectDelay = 0; // seconds

  // A text/event-stream body, by the WHATWG rules: field lines up to a
  // blank line make an event; lines that start with ":" are comments (the
  // server's keep-alives). `alive` is called on every chunk.
  async function readEvents(reader, alive, dispatch) {
    const decoder = new TextDecoder();
    let buf = "";
    let name = "";
    let data = [];
    const line = (l) => {
      if (l === "") {
        if (data.length) dispatch(name || "message", data.join("\n"));
        name = "";
        data = [];
        return;
      }
      if (l[0] === ":") return;
      const colon = l.indexOf(":");
      const field = colon < 0 ? l : l.slice(0, colon);
      let value = colon < 0 ? "" : l.slice(colon + 1);
      if (value[0] === " ") value = value.slice(1);
      if (field === "event") name = value;
      else if (field === "data") data.push(value);
      // "id" and "retry": the page reconnects on its own terms.
    };
    let cr = false; // the last chunk ended in "\r": a "\n" next belongs to it
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      alive();
      buf += decoder.decode(value, { stream: true });
      if (cr && buf[0] === "\n") buf = buf.slice(1);
      cr = false;
      const eol = /\r\n|\r|\n/g;
      let start = 0;
      let m;
      while ((m = eol.exec(buf))) {
        line(buf.slice(start, m.index));
        start = eol.lastIndex;
        cr = m[0] === "\r" && start === buf.length;
      }
      buf = buf.slice(start);
    }
  }

  function onChange(revision) {
    setStatus("live", "live · revision " + revision);
    // A hidden tab does not fetch (a large cluster's model is megabytes);
    // it catches up when shown.
    if (document.hidden) missed = true;
    else refresh();
  }

  function listen() {
    reconnect = null;
    if (locked) return;
    if (!canStream) {
      streamLost = "polling every 5 s";
      startPolling();
      refresh();
      return;
    }
    const my = epoch;
    const ctl = new AbortController();
    stream = ctl;
    let silence = null;
    const alive = () => {
      clearTimeout(silence);
      silence = setTimeout(() => { ctl.why = "silent for " + STREAM_SILENCE_MS / 1000 + " s"; ctl.abort(); }, STREAM_SILENCE_MS);
    };
    alive();
    let opened = 0;
    streamOpen = false;
    fetch("api/v1/view/events", apiInit(ctl.signal))
      .then(async (r) => {
        if (!r.ok) throw await refusal(r);
        if (!r.body) throw new Error("the browser cannot read a stream");
        opened = Date.now();
        streamOpen = true;
        streamLost = "";
        accepted();
        stopPolling();
        await readEvents(r.body.getReader(), alive, (name, data) => {
          if (name === "change" && my === epoch) onChange(data);
        });
        throw new Error("closed by the server");
      })
      .catch((e) => {
        clearTimeout(silence);
        if (my !== epoch || stream !== ctl) return; // signed out, or a newer stream
        stream = null;
        streamOpen = false;
        if (e.status === 401) { requireSignIn(e.message); return; }
        // A proxy that will not hold the stream, a server at its limit of
        // streams (503), a restart: poll until the stream is back.
        if (opened && Date.now() - opened > 30000) reconnectDelay = 0;
        reconnectDelay = Math.min(60, Math.max(e.retryAfter || 0, reconnectDelay ? reconnectDelay * 2 : 2));
        streamLost = "event stream lost (" + (ctl.why || e.message) + "); polling every 5 s";
        setStatus("error", streamLost);
        startPolling();
        if (!view) refresh();
        reconnect = setTimeout(listen, reconnectDelay * 1000);
      });
  }

  function stop() {
    if (stream) { const s = stream; stream = null; s.abort(); }
    streamOpen = false;
    streamLost = "";
    clearTimeout(reconnect);
    reconnect = null;
    reconnectDelay = 0;
    clearTimeout(retry);
    retry = null;
    retryDelay = 0;
    stopPolling();
    again = false;
    missed = false;
  }

  for (const [id, key] of [["f-namespace", "namespace"], ["f-node", "node"], ["sort", "sort"]]) {
    $(id).addEventListener("input", (e) => { filters[key] = e.target.value.trim(); draw(); });
  }
  window.addEventListener("resize", () => { gpuList.render(); containerList.render(); });
  listen();
})();
