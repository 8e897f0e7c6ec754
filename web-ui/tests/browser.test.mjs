// The web UI in a real browser: Debian's Chromium driven by playwright-core, against a real `sluice run`.
// Run by ctest (web_ui_browser_test, tests/CMakeLists.txt) with:
//   SLUICE_BINARY      the sluice executable
//   SLUICE_WEB_UI_DIR  the built UI (share/sluice/web-ui of the build folder)
//   CHROMIUM           the browser (default /usr/bin/chromium; scripts/setup installs Debian's chromium)
//   SLUICE_TEST_ARTIFACTS  where screenshots go (default: the test's temp folder)
// Every wait is a condition with a deadline (Playwright's waitFor*, or poll()), generous for a loaded machine.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { chromium } from "playwright-core";

const SLUICE = process.env.SLUICE_BINARY;
const UI_DIR = process.env.SLUICE_WEB_UI_DIR;
const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";
const dir = fs.mkdtempSync(path.join(os.tmpdir(), "sluice-web-ui-"));
const ARTIFACTS = process.env.SLUICE_TEST_ARTIFACTS || path.join(dir, "artifacts");
fs.mkdirSync(ARTIFACTS, { recursive: true });

const children = [];
let browser;

/// Polls `fn` until it returns a truthy value or `ms` pass (then throws naming `what`).
async function poll(what, fn, ms, every = 100) {
  const deadline = Date.now() + ms;
  let last;
  while (Date.now() < deadline) {
    try {
      last = await fn();
      if (last) return last;
    } catch (e) {
      if (e.fatal) throw e;  // no use waiting (a process exited)
      last = e;
    }
    await new Promise((r) => setTimeout(r, every));
  }
  throw new Error(`timed out after ${ms} ms waiting for ${what} (last: ${last})`);
}

/// Starts `sluice <args>` with its output in `name`.log; resolves to { child, match, log() } once a line of the log
/// matches `line` (match: its groups).
async function startSluice(name, args, line, env = {}) {
  const logFile = path.join(dir, `${name}.log`);
  const out = fs.openSync(logFile, "w");
  const child = spawn(SLUICE, args, { stdio: ["ignore", out, out], env: { ...process.env, ...env } });
  children.push(child);
  const log = () => fs.readFileSync(logFile, "utf8");
  const match = await poll(
    `${name}: a line matching ${line} in its log`,
    () => {
      if (child.exitCode !== null) {
        throw Object.assign(new Error(`sluice ${args[0]} exited with ${child.exitCode}:\n${log()}`), { fatal: true });
      }
      return line.exec(log());
    },
    60_000,
  );
  return { child, match, log };
}

/// Starts `sluice run` of `yaml`; resolves to { child, url, log() }.
async function runSluice(name, yaml, env = {}) {
  const file = path.join(dir, `${name}.yaml`);
  fs.writeFileSync(file, yaml);
  const { child, match, log } = await startSluice(
    name,
    ["run", file],
    /REST API, \/metrics and \/health at (http:\/\/[0-9.]+:[0-9]+)/,
    env,
  );
  return { child, url: match[1], log };
}

async function stop(child) {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise((r) => child.once("exit", r));
  child.kill("SIGTERM");
  const t = setTimeout(() => child.kill("SIGKILL"), 30_000);
  await exited;
  clearTimeout(t);
}

before(async () => {
  assert.ok(SLUICE && fs.existsSync(SLUICE), `SLUICE_BINARY must name the sluice executable (got '${SLUICE}')`);
  assert.ok(fs.existsSync(CHROMIUM), `no browser at ${CHROMIUM}: install Debian's chromium (scripts/setup)`);
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
  });
});

after(async () => {
  if (browser) await browser.close();
  for (const c of children) await stop(c);
  if (process.env.SLUICE_KEEP_TEST_DIR) console.log(`kept ${dir}`);
  else fs.rmSync(dir, { recursive: true, force: true });
  console.log(`screenshots in ${ARTIFACTS}`);
});

test("the UI shows a running pipeline: graph, backpressure, checkpoints, savepoint, exceptions, stop", async () => {
  assert.ok(UI_DIR && fs.existsSync(path.join(UI_DIR, "index.html")), `SLUICE_WEB_UI_DIR has no index.html: ${UI_DIR}`);
  const trigger = path.join(dir, "fail-now");
  // A function that fails the job on demand: the test creates `trigger` to make the next record throw (once: the
  // worker removes it, so the restarted job runs on).
  fs.writeFileSync(
    path.join(dir, "fail.mjs"),
    `import fs from "node:fs";
export function maybeFail(change) {
  if (fs.existsSync(${JSON.stringify(trigger)})) {
    fs.unlinkSync(${JSON.stringify(trigger)});
    throw new Error("web-ui test: injected failure");
  }
  return change.after;
}
`,
  );
  const name = `web-ui-${process.pid}`;
  const { child, url, log } = await runSluice(
    "pipeline",
    `pipeline:
  name: ${name}
  parallelism: 1
  # Keeps the key_by in front of the sink (its counts are keyed state): at parallelism 1 without it the sink is
  # chained to the transform, one vertex, and there is no vertex in front of the sink to show backpressure.
  entity-version: true
  checkpoint: { interval: 1s, storage: "${dir}/checkpoints" }
  delivery: at-least-once
  restart: { strategy: fixed-delay, attempts: 3, delay: 500ms }
  http: { port: 0 }
source:
  type: datagen
  count: 0
  rate: 2000
transform:
  - match: "**"
    function: { module: ./fail.mjs, export: maybeFail }
sink:
  slow: { type: files, path: "${dir}/out", throttle: 2ms }
`,
    { SLUICE_WEB_UI_DIR: UI_DIR },
  );
  const api = async (p) => (await fetch(url + p)).json();
  const jobs = (await api("/jobs")).jobs;
  assert.equal(jobs.length, 1);
  const jobId = jobs[0].id;
  const details = await api(`/jobs/${jobId}`);
  const nodes = details.plan.nodes;
  assert.ok(nodes.length >= 2, `the plan has the source and the sink vertices: ${JSON.stringify(details.plan)}`);

  const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
  const shot = (n) => page.screenshot({ path: path.join(ARTIFACTS, `${n}.png`), fullPage: true });
  try {
    // The UI loads at / and lists the job; its link opens the job page.
    await page.goto(url + "/");
    await page.locator(`#jobs-table tr[data-job-id="${jobId}"]`).waitFor({ timeout: 30_000 });
    assert.match(await page.locator(`#jobs-table tr[data-job-id="${jobId}"] .status`).innerText(), /RUNNING/);
    await shot("01-overview");
    await page.locator(`#jobs-table a:has-text("${name}")`).click();
    await page.locator("#graph g.vertex").first().waitFor({ timeout: 30_000 });

    // Every vertex of the plan is drawn, with its name.
    assert.equal(await page.locator("#graph g.vertex").count(), nodes.length);
    for (const n of nodes) {
      const v = page.locator(`#graph g.vertex[data-vertex-id="${n.id}"]`);
      assert.equal(await v.getAttribute("data-name"), n.description);
    }

    // The throttled sink (2 ms per record, ~500/s against 2000/s generated) backpressures the vertex before it.
    const sink = nodes.find((n) => n.description.includes("Sink: slow"));
    assert.ok(sink, `a vertex for the sink 'slow': ${nodes.map((n) => n.description).join(", ")}`);
    assert.equal(sink.inputs.length, 1);
    const upstream = sink.inputs[0].id;
    const started = Date.now();
    await page.waitForFunction(
      (id) => document.querySelector(`#graph g.vertex[data-vertex-id="${id}"]`)?.dataset.state === "backpressured",
      upstream,
      { timeout: 60_000, polling: 200 },
    );
    console.log(`upstream vertex ${upstream} shown backpressured ${Date.now() - started} ms after the page showed the graph`);
    const fill = await page.locator(`#graph g.vertex[data-vertex-id="${upstream}"] rect`).getAttribute("fill");
    assert.equal(fill, "#2b2b2b", "the backpressured colour");
    // The sink itself is busy, not backpressured; records/s are shown.
    assert.notEqual(await page.locator(`#graph g.vertex[data-vertex-id="${sink.id}"]`).getAttribute("data-state"), "backpressured");
    assert.match(await page.locator(`#graph g.vertex[data-vertex-id="${sink.id}"] .l2`).textContent(), /in [0-9][0-9,.]* rec\/s/);

    // Per-subtask detail of the sink.
    await page.locator(`#graph g.vertex[data-vertex-id="${sink.id}"]`).click();
    await page.locator("#subtasks-table tr >> nth=1").waitFor({ timeout: 10_000 });
    assert.equal(await page.locator("#subtasks-table tr").count(), 1 + sink.parallelism);

    // A completed checkpoint appears in the history, with a bar in the chart.
    await page.locator("#cp-table tr.cp-row.COMPLETED").first().waitFor({ timeout: 90_000 });
    await page.locator("#cp-chart rect.cp-bar").first().waitFor({ timeout: 10_000 });
    await shot("02-job-backpressure-checkpoints");

    // The savepoint button: a savepoint directory with its metadata appears.
    const savepoints = path.join(dir, "savepoints");
    await page.fill("#savepoint-dir", savepoints);
    await page.click("#btn-savepoint");
    const location = await page.locator("#savepoint-location").textContent({ timeout: 120_000 });
    assert.ok(location.includes(savepoints), `savepoint at ${location}`);
    const sp = location.replace(/^file:\/\//, "");
    assert.ok(fs.existsSync(sp) && fs.statSync(sp).isDirectory(), `savepoint directory ${sp}`);
    assert.ok(fs.readdirSync(savepoints).some((d) => d.startsWith("savepoint-")), fs.readdirSync(savepoints).join(","));
    await shot("03-savepoint");

    // A failure shows in the exceptions, and the restart in the count; the job runs again.
    assert.equal(await page.locator("#exceptions-table").count(), 0, "no exception before the failure");
    fs.writeFileSync(trigger, "");
    const row = page.locator("#exceptions-table tr.exception", { hasText: "injected failure" }).first();
    await row.waitFor({ timeout: 60_000 });
    assert.equal((await row.locator("td").nth(3).textContent()).trim(), "yes", "restarted after the failure");
    await page.locator("#restarts", { hasText: "1" }).waitFor({ timeout: 60_000 });
    await page.locator("#job-status", { hasText: "RUNNING" }).waitFor({ timeout: 60_000 });
    await shot("04-exceptions");

    // Stop with savepoint: the page shows where the savepoint went; the job ends and `sluice run` exits.
    await page.click("#btn-stop");
    await page.locator("#op-result", { hasText: "stop completed" }).waitFor({ timeout: 120_000 });
    const stopped = (await page.locator("#savepoint-location").textContent()).replace(/^file:\/\//, "");
    assert.ok(stopped.startsWith(savepoints) && stopped !== sp, `stop's savepoint at ${stopped}`);
    assert.ok(fs.statSync(stopped).isDirectory(), `savepoint directory ${stopped}`);
    await poll("sluice run to exit after the stop", () => child.exitCode !== null, 60_000);
    assert.equal(child.exitCode, 0, "sluice run exits 0 after a stop with savepoint");
  } catch (e) {
    await shot("failure").catch(() => {});
    e.message += `\n--- sluice log (tail) ---\n${log().slice(-4000)}`;
    throw e;
  } finally {
    await page.close();
  }
});

test("a FINISHED job: its duration stands still and no button acts on it", async () => {
  // A bounded pipeline that ends at once; --linger keeps its REST API (and the UI) up afterwards.
  const file = path.join(dir, "finished.yaml");
  fs.writeFileSync(
    file,
    `pipeline:
  name: finished-${process.pid}
  checkpoint: { interval: 200ms, storage: "${dir}/finished-checkpoints" }
  http: { port: 0 }
source: { type: datagen, count: 2000 }
sink:
  out: { type: files, path: "${dir}/finished-out" }
`,
  );
  const { log } = await startSluice("finished", ["run", file, "--linger", "2min"], /FINISHED after/, { SLUICE_WEB_UI_DIR: UI_DIR });
  const url = /REST API, \/metrics and \/health at (http:\/\/[0-9.]+:[0-9]+)/.exec(log())[1];
  const jobId = (await (await fetch(url + "/jobs")).json()).jobs[0].id;
  const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
  try {
    await page.goto(`${url}/?poll=200#/jobs/${jobId}`);
    await page.locator("#job-status", { hasText: "FINISHED" }).waitFor({ timeout: 30_000 });
    for (const b of ["#btn-savepoint", "#btn-stop", "#btn-cancel"]) {
      assert.equal(await page.locator(b).isDisabled(), true, `${b} is disabled on a FINISHED job`);
    }
    // ... and looks it: the disabled Cancel button is grey, not the red of an active one.
    const cancelColour = await page.locator("#btn-cancel").evaluate((e) => getComputedStyle(e).color);
    assert.notEqual(cancelColour, "rgb(198, 40, 40)", `the disabled Cancel button is drawn red: ${cancelColour}`);
    const summary = page.locator("#job-summary");
    const first = await summary.textContent();
    assert.match(first, /ran for /, first);
    assert.doesNotMatch(first, /running for/, first);
    assert.match(first, /ended /, first);
    // Several refreshes later (poll=200 ms) the text is the same: nothing ticks.
    const updated = await page.locator("#live").textContent();
    await page.waitForFunction((u) => document.getElementById("live").textContent !== u, updated, { timeout: 10_000 });
    await page.waitForFunction(
      (u) => document.getElementById("live").textContent !== u,
      await page.locator("#live").textContent(),
      { timeout: 10_000 },
    );
    assert.equal(await summary.textContent(), first);
    await page.screenshot({ path: path.join(ARTIFACTS, "06-finished.png"), fullPage: true });
  } finally {
    await page.close();
  }
});

test("without the UI's files, / says how to get them and the REST API still works", async () => {
  const { url } = await runSluice(
    "no-ui",
    `pipeline:
  name: no-ui-${process.pid}
  http: { port: 0 }
source: { type: datagen, count: 0, rate: 10 }
sink:
  out: { type: files, path: "${dir}/no-ui-out" }
`,
    { SLUICE_WEB_UI_DIR: path.join(dir, "no-such-folder") },
  );
  const page = await browser.newPage();
  try {
    const res = await page.goto(url + "/");
    assert.equal(res.status(), 404);
    await page.locator("h1", { hasText: "the web UI is not installed" }).waitFor({ timeout: 10_000 });
    assert.match(await page.content(), /SLUICE_WEB_UI_DIR/);
    const jobs = await (await fetch(url + "/jobs")).json();
    assert.equal(jobs.jobs.length, 1);
  } finally {
    await page.close();
  }
});

test("a cluster's JobManager: the TaskManagers with their slots, and the job's graph", async () => {
  const file = path.join(dir, "cluster.yaml");
  fs.writeFileSync(
    file,
    `pipeline:
  name: web-ui-cluster-${process.pid}
  parallelism: 2
  checkpoint: { interval: 0 }
  delivery: at-least-once
source: { type: datagen, count: 0, rate: 200 }
sink:
  out: { type: files, path: "${dir}/cluster-out" }
`,
  );
  const jm = await startSluice(
    "jobmanager",
    ["jobmanager", file, "--rpc-port", "0", "--rest-port", "0"],
    /JobManager REST API at (http:\/\/[0-9.]+:[0-9]+), job id ([0-9a-f]+)/,
    { SLUICE_WEB_UI_DIR: UI_DIR },
  );
  const rpc = await poll("the JobManager's RPC address", () => /RPC at ([0-9.]+:[0-9]+)/.exec(jm.log()), 30_000);
  await startSluice("taskmanager", ["taskmanager", file, "--jobmanager", rpc[1], "--slots", "2"], /./);
  const [url, jobId] = [jm.match[1], jm.match[2]];
  const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
  try {
    await page.goto(url + "/");
    await page.locator("#taskmanagers-table tr >> nth=1").waitFor({ timeout: 60_000 });
    assert.equal(await page.locator("#taskmanagers-table tr").count(), 2, "one TaskManager");
    const cells = page.locator("#taskmanagers-table tr >> nth=1").locator("td");
    assert.equal((await cells.nth(4).textContent()).trim(), "2", "its slots");
    await page.locator(`#jobs-table tr[data-job-id="${jobId}"]`).waitFor({ timeout: 30_000 });
    await page.screenshot({ path: path.join(ARTIFACTS, "05-cluster-overview.png"), fullPage: true });
    const plan = (await (await fetch(`${url}/jobs/${jobId}`)).json()).plan;
    assert.ok(plan.nodes.length >= 2, JSON.stringify(plan));
    await page.goto(`${url}/#/jobs/${jobId}`);
    await page.locator("#graph g.vertex").first().waitFor({ timeout: 30_000 });
    assert.equal(await page.locator("#graph g.vertex").count(), plan.nodes.length);
  } catch (e) {
    await page.screenshot({ path: path.join(ARTIFACTS, "failure-cluster.png"), fullPage: true }).catch(() => {});
    e.message += `\n--- jobmanager log (tail) ---\n${jm.log().slice(-3000)}`;
    throw e;
  } finally {
    await page.close();
  }
});

test("with tokens and HTTPS the UI asks for a token: the read token shows the job, the admin token cancels it", async () => {
  // A CA and a certificate for 127.0.0.1 made here by the openssl command (nothing private is committed); the
  // browser context trusts nothing, so it ignores certificate errors (the CLI's verification is tested in C++).
  const tls = path.join(dir, "tls");
  fs.mkdirSync(tls);
  const openssl = (...args) => execFileSync("openssl", args, { cwd: tls, stdio: "pipe" });
  openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=UI test CA");
  openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1");
  fs.writeFileSync(path.join(tls, "ext.cnf"), "subjectAltName=IP:127.0.0.1\n");
  openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out", "server.pem", "-days", "1", "-extfile", "ext.cnf");
  const admin = `admin-${process.pid}-0f3c9a7e5d1b`;
  const reader = `reader-${process.pid}-8b2e4f6a0c9d`;
  fs.writeFileSync(path.join(tls, "admin.token"), admin + "\n", { mode: 0o600 });
  const name = `web-ui-auth-${process.pid}`;
  const file = path.join(dir, "auth.yaml");
  fs.writeFileSync(
    file,
    `pipeline:
  name: ${name}
  checkpoint: { interval: 1s, storage: "${dir}/auth-checkpoints" }
  http: { port: 0 }
  config:
    rest.auth.admin-token-file: "${tls}/admin.token"
    rest.auth.read-token-env: SLUICE_UI_READ_TOKEN
    security.ssl.rest.enabled: true
    security.ssl.rest.certificate: "${tls}/server.pem"
    security.ssl.rest.key: "${tls}/server.key"
source: { type: datagen, count: 0, rate: 50 }
sink:
  out: { type: files, path: "${dir}/auth-out" }
`,
  );
  const { child, match, log } = await startSluice(
    "auth",
    ["run", file, "--linger", "60s"], // serves on after the cancel, so the page can show CANCELED
    /REST API, \/metrics and \/health at (https:\/\/[0-9.]+:[0-9]+), job id ([0-9a-f]+)/,
    { SLUICE_WEB_UI_DIR: UI_DIR, SLUICE_UI_READ_TOKEN: reader },
  );
  const [url, jobId] = [match[1], match[2]];
  const context = await browser.newContext({ ignoreHTTPSErrors: true, viewport: { width: 1200, height: 800 } });
  const page = await context.newPage();
  page.on("dialog", (d) => d.accept()); // the cancel button's confirm()
  try {
    // Without a token: the page loads and shows the sign-in form instead of the jobs.
    await page.goto(url + "/");
    await page.locator("#login-form").waitFor({ timeout: 30_000 });
    assert.equal(await page.locator("#jobs-table").count(), 0);
    await page.screenshot({ path: path.join(ARTIFACTS, "06-sign-in.png"), fullPage: true });
    // A wrong token is refused with the server's reason.
    await page.fill("#token-input", "not-the-token-0000000000");
    await page.click("#btn-login");
    await page.locator("#login-message", { hasText: "not valid" }).waitFor({ timeout: 30_000 });
    // The read token: the job is listed and its page drawn; cancelling it is refused (403) on the page.
    await page.fill("#token-input", reader);
    await page.click("#btn-login");
    await page.locator(`#jobs-table tr[data-job-id="${jobId}"]`).waitFor({ timeout: 30_000 });
    await page.goto(`${url}/#/jobs/${jobId}`);
    await page.locator("#graph g.vertex").first().waitFor({ timeout: 30_000 });
    await page.locator("#job-status", { hasText: "RUNNING" }).waitFor({ timeout: 30_000 });
    await page.click("#btn-cancel");
    await page.locator("#op-result .error", { hasText: "read-only token" }).waitFor({ timeout: 30_000 });
    // Sign out, then in with the admin token: cancel works and the job ends CANCELED.
    await page.click("#sign-out");
    await page.locator("#login-form").waitFor({ timeout: 10_000 });
    await page.fill("#token-input", admin);
    await page.click("#btn-login");
    await page.goto(`${url}/#/jobs/${jobId}`);
    await page.locator("#job-status", { hasText: "RUNNING" }).waitFor({ timeout: 30_000 });
    await page.click("#btn-cancel");
    await page.locator("#op-result", { hasText: "cancel requested" }).waitFor({ timeout: 30_000 });
    await page.locator("#job-status", { hasText: "CANCELED" }).waitFor({ timeout: 60_000 });
    await page.screenshot({ path: path.join(ARTIFACTS, "07-admin-cancelled.png"), fullPage: true });
    assert.ok(!(await page.content()).includes(admin), "the token is not shown on the page");
  } catch (e) {
    await page.screenshot({ path: path.join(ARTIFACTS, "failure-auth.png"), fullPage: true }).catch(() => {});
    e.message += `\n--- sluice log (tail) ---\n${log().slice(-3000)}`;
    throw e;
  } finally {
    await context.close();
    await stop(child);
  }
});
