// Sluice's web UI: a single page over the REST API of the process that serves it (docs/operations.md).
// Routes (in the URL's hash, so the server serves one index.html): #/ the jobs; #/jobs/<id> one job.
// Live: every view polls the API (default every 1000 ms, ?poll=<ms> to change) and redraws in place.
import dagre from "@dagrejs/dagre";

const POLL_MS = Number(new URLSearchParams(location.search).get("poll")) || 1000;
const app = document.getElementById("app");
const live = document.getElementById("live");

// ---------------------------------------------------------------- helpers

const esc = (s) =>
  String(s ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);

// ---------------------------------------------------------------- authentication
// A server with rest.auth.* answers 401 without a bearer token (docs/operations.md, "Security"): the page then asks
// for one, keeps it for this tab only (sessionStorage) and sends it with every request. 403 (the read-only token
// and an action) is shown where the action was tried.
const TOKEN_KEY = "sluice-token";
let token = sessionStorage.getItem(TOKEN_KEY) || "";

class AuthError extends Error {}
let loginShownFor = null; // the token the sign-in form is shown for; null while it is not shown

async function api(path, init = {}) {
  const headers = { ...(init.headers || {}) };
  const sent = token;
  if (sent) headers.Authorization = `Bearer ${sent}`;
  const r = await fetch(path, { ...init, headers });
  if (r.status === 401) {
    // A view polls several paths at once: only the first 401 for a token draws the form. A later one would wipe what
    // the user is typing, and one for a token replaced while it was in flight would take the new token's page away.
    if (sent !== token || loginShownFor === sent) throw new AuthError("this server needs a token");
    const body = await r.json().catch(() => ({}));
    showLogin(token ? "The token was refused: " + ((body.errors && body.errors.join("; ")) || "HTTP 401") : "");
    throw new AuthError("this server needs a token");
  }
  return r;
}

function showLogin(message) {
  ++generation; // stops the current view's poll
  clearTimeout(timer);
  loginShownFor = token;
  live.textContent = "";
  app.innerHTML = `<h1>Sign in</h1>
    <form id="login-form" class="card">
      <p>This server needs a bearer token (its <code>rest.auth.admin-token-*</code> or <code>rest.auth.read-token-*</code>).
      The read-only token shows everything; savepoint, stop and cancel need the admin token.</p>
      <input id="token-input" type="password" autocomplete="current-password" placeholder="token" size="48">
      <button id="btn-login" type="submit">Sign in</button>
      <p id="login-message" class="error">${esc(message || "")}</p>
    </form>`;
  document.getElementById("login-form").onsubmit = (e) => {
    e.preventDefault();
    token = document.getElementById("token-input").value.trim();
    loginShownFor = null;
    sessionStorage.setItem(TOKEN_KEY, token);
    drawSignOut();
    route();
  };
  document.getElementById("token-input").focus();
}

function drawSignOut() {
  let a = document.getElementById("sign-out");
  if (!token) { if (a) a.remove(); return; }
  if (!a) {
    a = document.createElement("a");
    a.id = "sign-out";
    a.href = "#/";
    a.textContent = "Sign out";
    a.onclick = (e) => {
      e.preventDefault();
      token = "";
      sessionStorage.removeItem(TOKEN_KEY);
      drawSignOut();
      showLogin("");
    };
    document.querySelector("header").appendChild(a);
  }
}

async function getJson(path) {
  const r = await api(path, { headers: { Accept: "application/json" } });
  const body = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error((body.errors && body.errors.join("; ")) || `HTTP ${r.status} for ${path}`);
  return body;
}

async function send(method, path, body) {
  const init = { method, headers: { "Content-Type": "application/json" } };
  init.body = JSON.stringify(body ?? {});
  const r = await api(path, init);
  const answer = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error((answer.errors && answer.errors.join("; ")) || `HTTP ${r.status}`);
  return answer;
}

const fmtTime = (ms) => (ms > 0 ? new Date(ms).toLocaleString() : "–");
function fmtDuration(ms) {
  if (ms == null || ms < 0) return "–";
  if (ms < 1000) return `${ms} ms`;
  const s = Math.floor(ms / 1000);
  if (s < 60) return `${(ms / 1000).toFixed(1)} s`;
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60);
  return h > 0 ? `${h}h ${m}m` : `${m}m ${s % 60}s`;
}
function fmtBytes(b) {
  if (b == null) return "–";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (b >= 1024 && i < u.length - 1) { b /= 1024; i++; }
  return `${i ? b.toFixed(1) : b} ${u[i]}`;
}
const short = (s, n = 180) => (s && s.length > n ? `${s.slice(0, n - 1)}…` : s);
const fmtRate = (r) => (r == null ? "–" : r >= 100 ? Math.round(r).toLocaleString() : r.toFixed(1));
// A watermark below -2^62 is "none yet" (Long.MIN_VALUE in Flink's and Sluice's metrics).
const fmtWatermark = (w) => (w == null || w < -4e18 ? "none" : new Date(w).toISOString().replace("T", " ").replace("Z", ""));

// ---------------------------------------------------------------- metrics (Prometheus text of /metrics)

// Parses the Flink-named task and operator series of /metrics into
// { tasks: Map<"task|subtask", {...}>, operators: Map<"task|subtask|operator_id", {...}> } for one job.
export function parseMetrics(text, jobId) {
  const tasks = new Map();
  const operators = new Map();
  const line = /^flink_taskmanager_job_task_(operator_)?([A-Za-z]+)\{(.*)\}\s+(\S+)/;
  const label = /(\w+)="((?:[^"\\]|\\.)*)"/g;
  for (const l of text.split("\n")) {
    const m = line.exec(l);
    if (!m) continue;
    const labels = {};
    for (const lm of m[3].matchAll(label)) labels[lm[1]] = lm[2].replace(/\\(.)/g, (_, c) => (c === "n" ? "\n" : c));
    if (jobId && labels.job_id && labels.job_id !== jobId) continue;
    const value = Number(m[4]);
    const tkey = `${labels.task_name}|${labels.subtask_index}`;
    if (m[1]) {
      const key = `${tkey}|${labels.operator_id ?? labels.operator_name}`;
      if (!operators.has(key)) operators.set(key, { name: labels.operator_name, id: labels.operator_id });
      operators.get(key)[m[2]] = value;
    } else {
      if (!tasks.has(tkey)) tasks.set(tkey, { task: labels.task_name, subtask: Number(labels.subtask_index) });
      tasks.get(tkey)[m[2]] = value;
    }
  }
  return { tasks, operators };
}

// Per vertex of the plan: its subtasks' metrics and the vertex's aggregate (busy and backpressured: the highest
// subtask's, as Flink's UI; rates: the sum; watermark: the lowest subtask's output watermark of the chain's tail).
// `uids`: the chain's operator uids, head first (the plan node's operator_uids, else the job vertex's operators).
function vertexMetrics(node, metrics, uids) {
  const subtasks = [];
  for (let i = 0; i < node.parallelism; i++) {
    const t = metrics.tasks.get(`${node.description}|${i}`) || { subtask: i };
    const head = metrics.operators.get(`${node.description}|${i}|${uids[0]}`) || {};
    const tail = metrics.operators.get(`${node.description}|${i}|${uids[uids.length - 1]}`) || {};
    subtasks.push({ ...t, subtask: i, inputWatermark: head.currentInputWatermark, outputWatermark: tail.currentOutputWatermark });
  }
  const seen = subtasks.filter((s) => s.busyTimeMsPerSecond != null);
  const max = (k) => (seen.length ? Math.max(...seen.map((s) => s[k] ?? 0)) : null);
  const sum = (k) => (seen.length ? seen.reduce((a, s) => a + (s[k] ?? 0), 0) : null);
  const wms = subtasks.map((s) => s.outputWatermark).filter((w) => w != null);
  return {
    subtasks,
    busy: max("busyTimeMsPerSecond"),
    backpressured: max("backPressuredTimeMsPerSecond"),
    idle: max("idleTimeMsPerSecond"),
    inRate: sum("numRecordsInPerSecond"),
    outRate: sum("numRecordsOutPerSecond"),
    recordsIn: sum("numRecordsIn"),
    recordsOut: sum("numRecordsOut"),
    watermark: wms.length ? Math.min(...wms) : null,
  };
}

// Flink's colouring: backpressured (>= 50 % of the time blocked on output) is dark; otherwise from blue (idle)
// to red (busy all the time).
const BACKPRESSURED = "#2b2b2b";
const TERMINAL = new Set(["FINISHED", "FAILED", "CANCELED", "SUSPENDED"]); // Flink's globally terminal states (and suspended)
function vertexState(vm) {
  if (vm.busy == null) return { state: "unknown", fill: "#dfe5ec" };
  if (vm.backpressured >= 500) return { state: "backpressured", fill: BACKPRESSURED };
  const b = Math.min(1, vm.busy / 1000);
  const hue = 210 - 210 * b; // 210 (blue) -> 0 (red)
  return { state: b >= 0.5 ? "busy" : "ok", fill: `hsl(${hue}, 70%, ${88 - 28 * b}%)` };
}

// ---------------------------------------------------------------- views

let timer = null;
let generation = 0; // a view's poll stops when another view starts

function schedule(fn) {
  const g = ++generation;
  clearTimeout(timer);
  const tick = async () => {
    if (g !== generation) return;
    try {
      await fn();
      live.textContent = `updated ${new Date().toLocaleTimeString()}`;
      live.classList.remove("error");
    } catch (e) {
      if (e instanceof AuthError) return; // the sign-in form is shown; polling resumes after it
      live.textContent = `refresh failed: ${e.message}`;
      live.classList.add("error");
    }
    if (g === generation) timer = setTimeout(tick, POLL_MS);
  };
  tick();
}

function overview() {
  app.innerHTML = `<h1>Jobs</h1><div id="jobs" class="card">Loading…</div><div id="taskmanagers"></div>`;
  schedule(async () => {
    const [{ jobs }, tms] = await Promise.all([
      getJson("/jobs"),
      // A cluster's JobManager only: 404 in local mode, where the section stays empty.
      api("/taskmanagers").then((r) => (r.ok ? r.json() : null)).catch((e) => { if (e instanceof AuthError) throw e; return null; }),
    ]);
    const tmEl = document.getElementById("taskmanagers");
    if (tmEl && tms) {
      const list = tms.taskmanagers || [];
      tmEl.innerHTML = `<h2>TaskManagers and slots</h2><div class="card">${list.length
        ? `<table id="taskmanagers-table"><tr><th>Id</th><th>Address</th><th>Host</th><th class="num">PID</th>
            <th class="num">Slots</th><th class="num">Free slots</th><th class="num">Last heartbeat</th></tr>
            ${list.map((t) => `<tr><td>${esc(t.id)}</td><td>${esc(t.path)}</td><td>${esc(t.hostname)}</td>
              <td class="num">${t.pid}</td><td class="num">${t.slotsNumber}</td><td class="num">${t.freeSlots}</td>
              <td class="num">${fmtDuration(t["ms-since-last-heartbeat"])} ago</td></tr>`).join("")}</table>`
        : `<p class="muted">No TaskManager has registered.</p>`}</div>`;
    }
    const rows = await Promise.all(jobs.map((j) => getJson(`/jobs/${encodeURIComponent(j.id)}`).catch(() => null)));
    const el = document.getElementById("jobs");
    if (!el) return;
    if (!jobs.length) { el.innerHTML = `<p class="muted">No job is registered in this process.</p>`; return; }
    el.innerHTML = `<table id="jobs-table"><tr><th>Name</th><th>Status</th><th>Started</th><th class="num">Duration</th>
      <th class="num">Restarts</th><th>Last failure</th><th>Id</th></tr>
      ${jobs.map((j, i) => {
        const d = rows[i] || {};
        const f = d["last-failure"];
        return `<tr data-job-id="${esc(j.id)}"><td><a href="#/jobs/${encodeURIComponent(j.id)}">${esc(j.name)}</a></td>
          <td class="status ${esc(j.status)}">${esc(j.status)}</td><td>${fmtTime(j["start-time"])}</td>
          <td class="num">${fmtDuration(d.duration)}</td><td class="num">${d.restarts ?? "–"}</td>
          <td>${f ? esc(`${f.exceptionName}: ${f.message}`).slice(0, 160) : "–"}</td><td class="muted">${esc(j.id)}</td></tr>`;
      }).join("")}</table>`;
  });
}

function jobView(jobId) {
  const id = encodeURIComponent(jobId);
  app.innerHTML = `
    <h1><span id="job-name">Job</span> <span id="job-status" class="status"></span></h1>
    <div class="card">
      <div id="job-summary" class="muted"></div>
      <div class="actions" style="margin-top:.6em">
        <input id="savepoint-dir" placeholder="savepoint directory (empty: execution.checkpointing.savepoint-dir)">
        <button id="btn-savepoint" disabled>Trigger savepoint</button>
        <button id="btn-stop" disabled>Stop with savepoint</button>
        <button id="btn-cancel" class="danger" disabled>Cancel job</button>
      </div>
      <div id="op-result"></div>
    </div>
    <h2>Job graph</h2>
    <div class="legend"><span style="--c:hsl(210,70%,88%)">idle</span><span style="--c:hsl(105,70%,74%)">busy 50 %</span>
      <span style="--c:hsl(0,70%,60%)">busy 100 %</span><span style="--c:${BACKPRESSURED}">backpressured ≥ 50 %</span><span style="--c:#dfe5ec">no task metrics (yet)</span>
      <span class="muted" style="--c:transparent">click a vertex for its subtasks</span></div>
    <svg id="graph" class="graph"></svg>
    <div id="subtasks"></div>
    <h2>Checkpoints</h2><div id="checkpoints" class="card">Loading…</div>
    <h2>Exceptions and restarts</h2><div id="exceptions" class="card">Loading…</div>`;

  let selected = null;
  let planKey = "";
  let layout = null;
  let lastVertexMetrics = new Map();

  const opResult = document.getElementById("op-result");
  async function operation(kind) {
    const dir = document.getElementById("savepoint-dir").value.trim();
    try {
      let answer;
      if (kind === "cancel") {
        if (!confirm("Cancel the job?")) return;
        await send("PATCH", `/jobs/${id}?mode=cancel`);
        opResult.textContent = "cancel requested";
        return;
      }
      if (kind === "savepoint") answer = await send("POST", `/jobs/${id}/savepoints`, dir ? { "target-directory": dir, "cancel-job": false } : { "cancel-job": false });
      else answer = await send("POST", `/jobs/${id}/stop`, dir ? { targetDirectory: dir, drain: false } : { drain: false });
      const rid = answer["request-id"];
      opResult.textContent = `${kind} ${rid}: IN_PROGRESS`;
      const deadline = Date.now() + 10 * 60 * 1000;
      while (Date.now() < deadline) {
        const s = await getJson(`/jobs/${id}/savepoints/${rid}`);
        if (s.status.id === "COMPLETED") {
          const op = s.operation || {};
          if (op.location) {
            opResult.innerHTML = `<span class="savepoint-done">${esc(kind)} completed: <code id="savepoint-location">${esc(op.location)}</code></span>`;
          } else {
            opResult.innerHTML = `<span class="error">${esc(kind)} failed: ${esc(op["failure-cause"]?.message)}</span>`;
          }
          return;
        }
        await new Promise((r) => setTimeout(r, 250)); // the operation's own poll, as Flink's UI does
      }
    } catch (e) {
      opResult.innerHTML = `<span class="error">${esc(kind)}: ${esc(e.message)}</span>`;
    }
  }
  document.getElementById("btn-savepoint").onclick = () => operation("savepoint");
  document.getElementById("btn-stop").onclick = () => operation("stop");
  document.getElementById("btn-cancel").onclick = () => operation("cancel");

  const NODE_W = 290, NODE_H = 92;
  function drawGraph(plan) {
    const g = new dagre.graphlib.Graph();
    g.setGraph({ rankdir: "LR", nodesep: 30, ranksep: 70, marginx: 20, marginy: 20 });
    g.setDefaultEdgeLabel(() => ({}));
    for (const n of plan.nodes) g.setNode(n.id, { width: NODE_W, height: NODE_H });
    for (const n of plan.nodes) for (const i of n.inputs || []) g.setEdge(i.id, n.id, { label: i.ship_strategy });
    dagre.layout(g);
    const svg = document.getElementById("graph");
    const { width, height } = g.graph();
    svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
    svg.style.height = `${Math.max(120, height)}px`;
    svg.style.maxWidth = `${width}px`;
    const edges = g.edges().map((e) => {
      const pts = g.edge(e).points;
      const d = pts.map((p, k) => `${k ? "L" : "M"}${p.x},${p.y}`).join(" ");
      const mid = pts[Math.floor(pts.length / 2)];
      return `<path class="edge" d="${d}" marker-end="url(#arrow)"></path>
        <text class="edge-label" x="${mid.x}" y="${mid.y - 4}" text-anchor="middle">${esc(g.edge(e).label)}</text>`;
    });
    const nodes = plan.nodes.map((n) => {
      const p = g.node(n.id);
      const name = n.description.length > 44 ? `${n.description.slice(0, 43)}…` : n.description;
      return `<g class="vertex" data-vertex-id="${esc(n.id)}" data-name="${esc(n.description)}" transform="translate(${p.x - NODE_W / 2},${p.y - NODE_H / 2})">
        <title>${esc(n.description)}</title>
        <rect width="${NODE_W}" height="${NODE_H}" rx="6"></rect>
        <text x="8" y="16" font-weight="600">${esc(name)}</text>
        <text x="8" y="32" class="l1"></text><text x="8" y="48" class="l2"></text>
        <text x="8" y="64" class="l3"></text><text x="8" y="80" class="l4"></text></g>`;
    });
    svg.innerHTML = `<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7"
      orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#7b8794"></path></marker></defs>${edges.join("")}${nodes.join("")}`;
    for (const el of svg.querySelectorAll("g.vertex")) {
      el.addEventListener("click", () => { selected = el.dataset.vertexId; paintGraph(plan); drawSubtasks(plan); });
    }
  }

  function paintGraph(plan) {
    for (const n of plan.nodes) {
      const el = document.querySelector(`#graph g.vertex[data-vertex-id="${CSS.escape(n.id)}"]`);
      if (!el) continue;
      const vm = lastVertexMetrics.get(n.id) || { subtasks: [] };
      const { state, fill } = vertexState(vm);
      el.dataset.state = state;
      el.dataset.busy = vm.busy ?? "";
      el.dataset.backpressured = vm.backpressured ?? "";
      el.classList.toggle("selected", selected === n.id);
      el.querySelector("rect").setAttribute("fill", fill);
      const pct = (v) => (v == null ? "–" : `${Math.round(v / 10)} %`);
      el.querySelector(".l1").textContent = `p=${n.parallelism} · busy ${pct(vm.busy)} · backpressured ${pct(vm.backpressured)}`;
      el.querySelector(".l2").textContent = `in ${fmtRate(vm.inRate)} rec/s · out ${fmtRate(vm.outRate)} rec/s`;
      el.querySelector(".l3").textContent = `records in ${vm.recordsIn ?? "–"} · out ${vm.recordsOut ?? "–"}`;
      el.querySelector(".l4").textContent = `watermark ${fmtWatermark(vm.watermark)}`;
    }
  }

  function drawSubtasks(plan) {
    const el = document.getElementById("subtasks");
    const n = plan.nodes.find((x) => x.id === selected);
    if (!n) { el.innerHTML = ""; return; }
    const vm = lastVertexMetrics.get(n.id) || { subtasks: [] };
    const num = (v) => (v == null ? "–" : Math.round(v).toLocaleString());
    el.innerHTML = `<h2>Subtasks of <span id="subtasks-of">${esc(n.description)}</span></h2>
      <table id="subtasks-table"><tr><th class="num">#</th><th class="num">Records in</th><th class="num">Records out</th>
      <th class="num">In/s</th><th class="num">Out/s</th><th class="num">Bytes in</th><th class="num">Bytes out</th>
      <th class="num">Busy ms/s</th><th class="num">Backpressured ms/s</th><th class="num">Idle ms/s</th>
      <th>Input watermark</th><th>Output watermark</th></tr>
      ${vm.subtasks.map((s) => `<tr><td class="num">${s.subtask}</td><td class="num">${num(s.numRecordsIn)}</td>
        <td class="num">${num(s.numRecordsOut)}</td><td class="num">${fmtRate(s.numRecordsInPerSecond)}</td>
        <td class="num">${fmtRate(s.numRecordsOutPerSecond)}</td><td class="num">${fmtBytes(s.numBytesIn)}</td>
        <td class="num">${fmtBytes(s.numBytesOut)}</td><td class="num">${num(s.busyTimeMsPerSecond)}</td>
        <td class="num">${num(s.backPressuredTimeMsPerSecond)}</td><td class="num">${num(s.idleTimeMsPerSecond)}</td>
        <td>${fmtWatermark(s.inputWatermark)}</td><td>${fmtWatermark(s.outputWatermark)}</td></tr>`).join("")}</table>`;
  }

  function drawCheckpoints(cp) {
    const el = document.getElementById("checkpoints");
    const hist = (cp.history || []).slice(0, 50);
    const c = cp.counts || {};
    const chrono = [...hist].reverse();
    const maxD = Math.max(1, ...chrono.map((h) => h.end_to_end_duration || 0));
    const W = 800, H = 120, bw = Math.max(4, Math.min(30, W / Math.max(1, chrono.length) - 2));
    const bars = chrono.map((h, k) => {
      const bh = Math.max(2, ((h.end_to_end_duration || 0) / maxD) * (H - 24));
      const color = h.status === "COMPLETED" ? (h.is_savepoint ? "#6f42c1" : "#2e7d32") : "#c62828";
      return `<rect class="cp-bar" data-id="${h.id}" x="${30 + k * (bw + 2)}" y="${H - 14 - bh}" width="${bw}" height="${bh}" fill="${color}">
        <title>#${h.id} ${h.checkpoint_type} ${h.status}: ${fmtDuration(h.end_to_end_duration)}, ${fmtBytes(h.state_size)}</title></rect>`;
    });
    el.innerHTML = `<div>completed <b id="cp-completed">${c.completed ?? 0}</b> · failed <b id="cp-failed">${c.failed ?? 0}</b>
        · latest: ${cp.latest?.completed ? `#${cp.latest.completed.id}, ${fmtDuration(cp.latest.completed.end_to_end_duration)}, ${fmtBytes(cp.latest.completed.state_size)}` : "none"}</div>
      <svg class="chart" id="cp-chart" viewBox="0 0 ${W} ${H}" preserveAspectRatio="xMinYMid meet">
        <text x="2" y="12" font-size="10">${fmtDuration(maxD)}</text><line x1="28" y1="${H - 14}" x2="${W}" y2="${H - 14}" stroke="#9aa7b4"></line>
        ${bars.join("")}<text x="30" y="${H - 2}" font-size="10">duration per checkpoint, oldest to newest (green: checkpoint, purple: savepoint, red: failed)</text></svg>
      <table id="cp-table"><tr><th class="num">Id</th><th>Type</th><th>Status</th><th>Triggered</th><th class="num">Duration</th>
        <th class="num">Size</th><th class="num">Max alignment</th><th>Path or failure</th></tr>
      ${hist.map((h) => {
        const align = Math.max(0, ...(h.tasks || []).map((t) => t.alignment_duration_ns || 0));
        return `<tr class="cp-row ${esc(h.status)}" data-id="${h.id}"><td class="num">${h.id}</td><td>${esc(h.checkpoint_type)}</td>
          <td class="status ${h.status === "COMPLETED" ? "RUNNING" : "FAILED"}">${esc(h.status)}</td><td>${fmtTime(h.trigger_timestamp)}</td>
          <td class="num">${fmtDuration(h.end_to_end_duration)}</td><td class="num">${fmtBytes(h.state_size)}</td>
          <td class="num">${fmtDuration(Math.round(align / 1e6))}</td>
          <td class="path ${h.failure_message ? "error" : "muted"}" title="${esc(h.failure_message || "")}">${esc(short(h.failure_message) || h.external_path || "")}</td></tr>`;
      }).join("")}</table>`;
  }

  function drawExceptions(ex, restarts) {
    const el = document.getElementById("exceptions");
    const entries = ex.exceptionHistory?.entries || [];
    el.innerHTML = `<div>restarts: <b id="restarts">${restarts ?? 0}</b></div>
      ${entries.length ? `<table id="exceptions-table"><tr><th>Time</th><th>Exception</th><th>Task</th><th>Restarted</th><th>Message</th></tr>
      ${entries.map((e, k) => `<tr class="exception"><td>${fmtTime(e.timestamp)}</td><td>${esc(e.exceptionName)}</td>
        <td>${esc(e.taskName || "–")}</td><td>${e.restarted ? "yes" : "no"}</td>
        <td><details><summary>${esc(e.message)}</summary><pre>${esc(e.stacktrace)}</pre></details></td></tr>`).join("")}</table>`
        : `<p class="muted">No failure so far.</p>`}`;
    // Keep open details open across refreshes: redrawn only when the history changed.
  }

  let exceptionsKey = "";
  schedule(async () => {
    const [job, cps, ex, metricsText] = await Promise.all([
      getJson(`/jobs/${id}`),
      getJson(`/jobs/${id}/checkpoints`),
      getJson(`/jobs/${id}/exceptions`),
      api("/metrics").then((r) => (r.ok ? r.text() : "")).catch((e) => { if (e instanceof AuthError) throw e; return ""; }),
    ]);
    document.getElementById("job-name").textContent = job.name;
    const st = document.getElementById("job-status");
    st.textContent = job.state;
    st.className = `status ${job.state}`;
    // An ended job ran for a fixed time: its duration is end - start, and nothing can be done to it any more.
    const ended = TERMINAL.has(job.state);
    const endTime = job["end-time"];
    const took = ended && endTime >= 0 ? endTime - job["start-time"] : job.duration;
    document.getElementById("job-summary").textContent =
      `${job.jid} · started ${fmtTime(job["start-time"])} · ` +
      (ended ? `ran for ${fmtDuration(took)}` + (endTime >= 0 ? ` · ended ${fmtTime(endTime)}` : "")
             : `running for ${fmtDuration(took)}`) +
      (job["status-message"] ? ` · ${job["status-message"]}` : "");
    // Savepoints and stop need running tasks; a job being created or restarting can still be cancelled.
    const running = job.state === "RUNNING";
    document.getElementById("btn-savepoint").disabled = !running;
    document.getElementById("btn-stop").disabled = !running;
    document.getElementById("btn-cancel").disabled = ended;

    const plan = job.plan && job.plan.nodes && job.plan.nodes.length ? job.plan : null;
    if (plan) {
      const metrics = parseMetrics(metricsText, job.jid);
      const uidsOf = (n) =>
        n.operator_uids ||
        ((job.vertices || []).find((v) => v.id === n.id)?.operators || []).map((o) => o.uid);
      lastVertexMetrics = new Map(plan.nodes.map((n) => [n.id, vertexMetrics(n, metrics, uidsOf(n))]));
      const key = JSON.stringify(plan.nodes.map((n) => [n.id, n.inputs]));
      if (key !== planKey) { planKey = key; drawGraph(plan); }
      paintGraph(plan);
      drawSubtasks(plan);
    } else if (planKey !== "none") {
      planKey = "none";
      document.getElementById("graph").outerHTML = `<p id="graph" class="muted">This server does not describe the job's graph.</p>`;
    }
    drawCheckpoints(cps);
    const ek = JSON.stringify((ex.exceptionHistory?.entries || []).map((e) => e.timestamp)) + job.restarts;
    if (ek !== exceptionsKey) { exceptionsKey = ek; drawExceptions(ex, job.restarts); }
  });
}

function route() {
  const m = location.hash.match(/^#\/jobs\/([^/]+)/);
  if (m) jobView(decodeURIComponent(m[1]));
  else overview();
}
window.addEventListener("hashchange", route);
drawSignOut();
route();
