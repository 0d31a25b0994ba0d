// End-to-end tests of the web UI: the real `sundial` binary (SUNDIAL_BIN) on a free loopback
// port with a fresh data directory, driven in Debian's chromium through playwright-core (no
// browser download). Without the binary or the browser the suite says it skipped; under CI=true
// that is a failure. The tests take the screenshots in docs/screenshots/.

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn, execFileSync } from "node:child_process";
import { existsSync, mkdtempSync, mkdirSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { randomUUID } from "node:crypto";

const here = dirname(fileURLToPath(import.meta.url));
const shots = resolve(here, "../../docs/screenshots");
const CHROMIUM = process.env.SUNDIAL_CHROMIUM || "/usr/bin/chromium";
const BIN = process.env.SUNDIAL_BIN;
const CI = process.env.CI === "true";

const missing = [];
if (!BIN || !existsSync(BIN)) missing.push(`the sundial binary (SUNDIAL_BIN=${BIN ?? ""})`);
if (!existsSync(CHROMIUM)) missing.push(`chromium at ${CHROMIUM}`);
let playwright = null;
try {
  playwright = await import("playwright-core");
} catch {
  missing.push("playwright-core (npm ci in tests/ui)");
}
if (missing.length > 0) {
  if (CI) {
    test("the browser suite can run", () => {
      assert.fail(`missing under CI: ${missing.join(", ")}`);
    });
  } else {
    test("web UI in a browser", { skip: `skipped: no ${missing.join(", no ")}` }, () => {});
  }
}
const run = missing.length === 0 ? test : test.skip;

let server = null;
let base = "";
let admin = "";
let dataDir = "";
let profileDir = "";
let context = null;
let page = null;

async function freePort() {
  return await new Promise((ok, fail) => {
    const s = createServer();
    s.on("error", fail);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => ok(port));
    });
  });
}

async function api(method, path, body, token = admin) {
  const headers = { "content-type": "application/json" };
  if (token) headers.authorization = `Bearer ${token}`;
  const r = await fetch(base + path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await r.text();
  let json = null;
  try {
    json = JSON.parse(text);
  } catch {
    json = text;
  }
  return { status: r.status, body: json };
}

async function ok(method, path, body, token) {
  const r = await api(method, path, body, token);
  assert.ok(r.status >= 200 && r.status < 300, `${method} ${path}: ${r.status} ${JSON.stringify(r.body)}`);
  return r.body;
}

async function eventually(what, fn, timeoutMs = 10_000) {
  const start = Date.now();
  let last;
  while (Date.now() - start < timeoutMs) {
    last = await fn();
    if (last) return last;
    await new Promise((r) => setTimeout(r, 100));
  }
  assert.fail(`${what}: not within ${timeoutMs} ms (last: ${JSON.stringify(last)})`);
}

async function shot(name) {
  mkdirSync(shots, { recursive: true });
  await page.screenshot({ path: join(shots, `${name}.png`), fullPage: true });
}

async function login(token) {
  await page.goto(base + "/ui");
  await page.getByLabel("Token").fill(token);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.waitForURL(/\/ui$/);
}

before(async () => {
  if (missing.length > 0) return;
  dataDir = mkdtempSync(join(tmpdir(), "sundial-ui-data-"));
  profileDir = mkdtempSync(join(tmpdir(), "sundial-ui-chromium-"));
  const out = execFileSync(
    BIN,
    ["token", "create", "--bootstrap", "--data-dir", dataDir, "--name", "root", "--scope", "admin"],
    { encoding: "utf8" },
  );
  admin = out.match(/sdl_[0-9a-f]{96}/)?.[0];
  assert.ok(admin, `a bootstrap token in: ${out}`);
  const port = await freePort();
  base = `http://127.0.0.1:${port}`;
  server = spawn(
    BIN,
    ["server", "--data-dir", dataDir, "--listen", `127.0.0.1:${port}`, "--shutdown-grace", "1s"],
    { stdio: ["ignore", "ignore", "inherit"], env: { ...process.env, RUST_LOG: "warn" } },
  );
  await eventually("the server answers /healthz", async () => {
    try {
      return (await fetch(base + "/healthz")).ok;
    } catch {
      return false;
    }
  });
  context = await playwright.chromium.launchPersistentContext(profileDir, {
    executablePath: CHROMIUM,
    headless: true,
    args: [
      "--headless",
      "--no-sandbox",
      "--disable-gpu",
      "--disable-background-networking",
      "--disable-component-update",
      "--no-first-run",
    ],
    viewport: { width: 1280, height: 800 },
  });
  page = context.pages()[0] ?? (await context.newPage());
});

after(async () => {
  if (context) await context.close();
  if (server) {
    server.kill("SIGTERM");
    await new Promise((r) => server.once("exit", r));
  }
  for (const d of [dataDir, profileDir]) if (d) rmSync(d, { recursive: true, force: true });
});

run("log in with a token", async () => {
  await page.goto(base + "/ui");
  await page.waitForURL(/\/ui\/login/);
  await shot("login");
  await page.getByLabel("Token").fill("sdl_" + "0".repeat(96));
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.getByText("cannot sign in: unknown token").waitFor();
  await page.getByLabel("Token").fill(admin);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.waitForURL(/\/ui$/);
  await page.getByRole("heading", { name: "Overview" }).waitFor();
  await page.getByText("root").first().waitFor();
});

let tagged = "";
run("create tasks through the API and find one by tag", async () => {
  const items = [];
  for (let i = 0; i < 30; i++) {
    items.push({
      kind: i % 2 ? "send-email" : "resize-image",
      queue: i % 2 ? "emails" : "images",
      delay: `${i + 1}h`,
      tags: { customer: `c${i % 5}`, order: `o-${1000 + i}` },
      payload: { n: i },
    });
  }
  const b = await ok("POST", "/v1/tasks:batch", { tasks: items });
  assert.equal(b.results.length, 30);
  tagged = b.results[7].id;
  await page.goto(base + "/ui/tasks");
  await page.getByLabel("Tags").fill("order:o-1007");
  await page.getByRole("button", { name: "Filter" }).click();
  await page.waitForURL(/tag=order%3Ao-1007/);
  const rows = page.locator("#results tbody tr");
  assert.equal(await rows.count(), 1);
  assert.ok((await rows.first().innerText()).includes("send-email"));
  await page.goto(base + "/ui/tasks?queue=emails");
  await shot("tasks");
});

run("cancel a task in the UI and the API agrees", async () => {
  await page.goto(base + `/ui/tasks/${tagged}`);
  await page.getByRole("button", { name: "Cancel" }).click();
  await page.getByText("Cancelled.").waitFor();
  const t = await ok("GET", `/v1/tasks/${tagged}`);
  assert.equal(t.state, "cancelled");
  const audit = await ok("GET", `/v1/audit?target=${tagged}`);
  assert.ok(
    audit.records.some((r) => r.action === "POST /ui/tasks/{id}/cancel" && r.actor === "root"),
    JSON.stringify(audit.records),
  );
});

run("retry a dead task", async () => {
  const t = await ok("POST", "/v1/tasks", { kind: "charge-card", queue: "payments", max_attempts: 1 });
  const polled = await ok("POST", "/v1/queues/payments/poll", { worker: "w1", wait: "5s" });
  assert.equal(polled.tasks.length, 1);
  await ok("POST", `/v1/tasks/${t.id}/fail`, {
    execution_id: polled.tasks[0].execution_id,
    error: "card declined: insufficient funds",
    retryable: false,
  });
  assert.equal((await ok("GET", `/v1/tasks/${t.id}`)).state, "dead");
  await page.goto(base + "/ui/dead");
  await page.getByText("card declined: insufficient funds").first().waitFor();
  await shot("dead-letters");
  await page.goto(base + `/ui/tasks/${t.id}`);
  await page.getByText("card declined").first().waitFor();
  await shot("task");
  await page.getByRole("button", { name: "Retry" }).click();
  await page.getByText("Scheduled again.").waitFor();
  const again = await ok("GET", `/v1/tasks/${t.id}`);
  assert.ok(["scheduled", "ready"].includes(again.state), again.state);
});

run("the overview shows a worker that polled", async () => {
  await ok("POST", "/v1/queues/inbox/poll", { worker: "ui-test-worker-9", wait: "0s" });
  await page.goto(base + "/ui");
  const workers = page.getByRole("table", { name: "Workers seen recently" });
  await workers.getByRole("rowheader", { name: "ui-test-worker-9" }).waitFor();
  const row = workers.getByRole("row").filter({ hasText: "ui-test-worker-9" });
  assert.match(await row.innerText(), /inbox/);
  const seen = await ok("GET", "/v1/workers");
  assert.ok(
    seen.workers.some((w) => w.worker === "ui-test-worker-9" && w.queue === "inbox"),
    JSON.stringify(seen),
  );
});

run("dead letters are grouped by queue and error", async () => {
  const ids = [];
  for (let i = 0; i < 3; i++) {
    ids.push((await ok("POST", "/v1/tasks", { kind: "settle", queue: "billing", max_attempts: 1 })).id);
  }
  const polled = [];
  await eventually("the three billing tasks are polled", async () => {
    const r = await ok("POST", "/v1/queues/billing/poll", { worker: "w3", max: 3, wait: "1s" });
    polled.push(...r.tasks);
    return polled.length >= 3;
  });
  const errors = ["gateway timeout\nrequest 1", "gateway timeout\nrequest 2", "bad card"];
  for (const [i, t] of polled.entries()) {
    await ok("POST", `/v1/tasks/${t.id}/fail`, {
      execution_id: t.execution_id,
      error: errors[i],
      retryable: false,
    });
  }
  await page.goto(base + "/ui/dead");
  const groups = page.locator("table.dead-groups");
  const timeout = groups.getByRole("row").filter({ hasText: "gateway timeout" });
  await timeout.waitFor();
  assert.match(await timeout.innerText(), /billing\s+gateway timeout\s+2\b/);
  const bad = groups.getByRole("row").filter({ hasText: "bad card" });
  assert.match(await bad.innerText(), /billing\s+bad card\s+1\b/);
  // The group's error links to exactly its tasks, a filtered list to share.
  await timeout.getByRole("link", { name: "gateway timeout" }).click();
  await page.getByRole("search", { name: "Filter tasks" }).waitFor();
  assert.equal(await page.locator('input[name="error_group"]').inputValue(), "gateway timeout");
  const listed = page.locator("#results tbody tr");
  assert.equal(await listed.count(), 2);
  for (const text of await listed.allInnerTexts()) assert.match(text, /billing[\s\S]*dead[\s\S]*gateway timeout/);
  // The group's retry counts the group (not its whole queue) before confirming, and retries it.
  await page.goto(base + "/ui/dead");
  await page.getByRole("link", { name: "Retry the 2 dead tasks of billing with this error" }).click();
  await page.locator("#matched").waitFor();
  assert.equal(await page.locator("#matched").innerText(), "2");
  await page.getByRole("button", { name: "Retry 2 tasks" }).click();
  await page.getByText("Retried 2 of 2 matching tasks.").waitFor();
  for (const [i, t] of polled.entries()) {
    const state = (await ok("GET", `/v1/tasks/${t.id}`)).state;
    if (errors[i] === "bad card") assert.equal(state, "dead");
    else assert.ok(["scheduled", "ready"].includes(state), state);
  }
  await page.goto(base + "/ui/dead");
  await groups.getByRole("row").filter({ hasText: "bad card" }).waitFor();
  assert.equal(await groups.getByRole("row").filter({ hasText: "gateway timeout" }).count(), 0);
});

run("pause a queue: a due task waits; resume: it runs", async () => {
  await ok("POST", "/v1/tasks", { kind: "warmup", queue: "reports" });
  await page.goto(base + "/ui");
  await page.getByRole("button", { name: "Pause queue reports" }).click();
  await page.getByText("Queue reports paused").waitFor();
  const t = await ok("POST", "/v1/tasks", { kind: "build-report", queue: "reports" });
  const empty = await ok("POST", "/v1/queues/reports/poll", { worker: "w2", wait: "1s", kinds: ["build-report"] });
  assert.equal(empty.tasks.length, 0, "nothing of a paused queue starts");
  assert.equal((await ok("GET", `/v1/tasks/${t.id}`)).state, "scheduled");
  await page.goto(base + "/ui");
  const row = page.locator("tr", { hasText: "reports" }).first();
  assert.ok((await row.innerText()).includes("paused"));
  await shot("overview");
  await page.getByRole("button", { name: "Resume queue reports" }).click();
  await page.getByText("Queue reports resumed").waitFor();
  const got = await ok("POST", "/v1/queues/reports/poll", { worker: "w2", wait: "5s", kinds: ["build-report"] });
  assert.equal(got.tasks.length, 1);
  assert.equal(got.tasks[0].id, t.id);
  await ok("POST", `/v1/tasks/${t.id}/complete`, { execution_id: got.tasks[0].execution_id, result: { pages: 3 } });
  assert.equal((await ok("GET", `/v1/tasks/${t.id}`)).state, "succeeded");
});

run("find a schedule among 1,000 by typing part of its id", async () => {
  const mk = (id) => ({ id, cron: "0 * * * *", timezone: "UTC", task: { kind: "tick", queue: "hourly" } });
  const ids = [];
  for (let i = 0; i < 999; i++) ids.push(`tenant-${String(i).padStart(4, "0")}-sync`);
  for (let i = 0; i < ids.length; i += 50) {
    await Promise.all(ids.slice(i, i + 50).map((id) => ok("POST", "/v1/schedules", mk(id))));
  }
  await ok("POST", "/v1/schedules", { ...mk("nightly-invoice-export"), cron: "30 2 * * *", timezone: "Europe/Berlin" });
  await page.goto(base + "/ui/schedules");
  assert.equal(await page.locator("#results tbody tr").count(), 50, "a page of 50");
  await page.getByLabel("Id contains").pressSequentially("invoice", { delay: 30 });
  await eventually("the list narrows to one", async () => (await page.locator("#results tbody tr").count()) === 1);
  assert.ok((await page.locator("#results tbody tr").first().innerText()).includes("nightly-invoice-export"));
  assert.match(page.url(), /q=invoice/, "the URL follows the search");
  await page.getByLabel("Id contains").fill("tenant-007");
  await eventually("ten tenants", async () => (await page.locator("#results tbody tr").count()) === 10);
  await shot("schedules");
});

run("see a skipped fire with its reason, and the next fires with the DST change marked", async () => {
  await ok("POST", "/v1/schedules", {
    id: "every-second-paused",
    every: "1s",
    paused: true,
    note: "maintenance window",
    task: { kind: "tick", queue: "fast" },
  });
  await eventually("a skipped fire", async () => {
    const f = await ok("GET", "/v1/schedules/every-second-paused/fires");
    return f.fires.some((x) => x.outcome === "skipped");
  });
  await page.goto(base + "/ui/schedule?id=every-second-paused");
  const skipped = page.locator("tr.f-skipped").first();
  await skipped.waitFor();
  assert.match(await skipped.innerText(), /skipped\s+paused/);
  await shot("schedule-fires");
  await ok("POST", "/v1/schedules", {
    id: "monthly-close-berlin",
    cron: "0 3 1 * *",
    timezone: "Europe/Berlin",
    task: { kind: "close-books", queue: "finance" },
  });
  await page.goto(base + "/ui/schedule?id=monthly-close-berlin");
  await page.locator(".dst").first().waitFor();
  assert.match(await page.locator(".dst").first().innerText(), /offset changes \+01:00 → \+02:00/);
  await shot("schedule");
});

run("follow a workflow's history to completion", async () => {
  const started = await ok("POST", "/v1/workflows", { type: "onboard", id: "onboard-acme", input: { customer: "acme" } });
  assert.equal(started.status, "running");
  let done = false;
  // A remote workflow worker in a few lines: start a 2 s timer, then complete.
  const worker = (async () => {
    while (!done) {
      const p = await ok("POST", "/v1/workflow-tasks/poll", { worker: "ui-test", types: ["onboard"], wait_ms: 500 });
      for (const t of p.tasks) {
        const types = t.history.map((e) => e.type);
        let commands = [];
        if (types.includes("timer_fired")) {
          commands = [{ type: "workflow_completed", result: { welcomed: "acme", signals: types.filter((x) => x === "signal_received").length } }];
        } else if (!types.includes("timer_started")) {
          commands = [{ type: "timer_started", cmd: 0, fire_at: t.now + 2000, task: randomUUID() }];
        }
        await ok("POST", `/v1/workflow-tasks/${t.task_id}/complete`, {
          execution_id: t.execution_id,
          expect_len: t.history.length,
          commands,
        });
        if (commands.length && commands[0].type === "workflow_completed") done = true;
      }
    }
  })();
  // The page shows the history as it was when loaded: reload until the worker's first step
  // (the timer) is in it.
  await eventually(
    "the timer is in the history",
    async () => {
      await page.goto(base + "/ui/workflow?id=onboard-acme");
      return (await page.getByText("timer 0").count()) > 0;
    },
    20_000,
  );
  await page.getByLabel("Signal").fill("approved");
  await page.getByLabel("Input (JSON)").fill('{"by": "ops"}');
  await page.getByRole("button", { name: "Send signal" }).click();
  await page.getByText("Signal approved sent.").waitFor();
  await eventually(
    "the run completes",
    async () => {
      await page.reload();
      return (await page.locator("#wf-status").innerText()) === "completed";
    },
    15_000,
  );
  done = true;
  await worker;
  const result = await page.locator("#wf-result").innerText();
  assert.match(result, /"welcomed": "acme"/);
  const history = await page.locator("#history").innerText();
  for (const kind of ["workflow_started", "timer_started", "signal_received", "timer_fired", "workflow_completed"]) {
    assert.ok(history.includes(kind), `${kind} in the history`);
  }
  await shot("workflow");
  await page.goto(base + "/ui/workflows");
  await page.getByText("onboard-acme").waitFor();
});

run("the audit log shows who did what", async () => {
  await page.goto(base + "/ui/audit?action=" + encodeURIComponent("POST /ui/tasks/{id}/cancel"));
  await page.locator("#results tbody tr", { hasText: "root" }).first().waitFor();
  await shot("audit");
});

run("a phone-width overview", async () => {
  await page.setViewportSize({ width: 390, height: 844 });
  await page.goto(base + "/ui");
  await page.getByRole("heading", { name: "Overview" }).waitFor();
  await shot("overview-phone");
  await page.setViewportSize({ width: 1280, height: 800 });
});

run("a reader sees no action buttons, and a forged post without the CSRF token is refused", async () => {
  const reader = (await ok("POST", "/v1/tokens", { name: "auditor", scope: "reader" })).token;
  const producer = (await ok("POST", "/v1/tokens", { name: "ops", scope: "producer" })).token;
  const t = await ok("POST", "/v1/tasks", { kind: "k", queue: "emails", delay: "2h" });
  await context.clearCookies();
  await login(reader);
  await page.getByText("auditor").first().waitFor();
  assert.equal(await page.getByRole("button", { name: /Pause queue/ }).count(), 0);
  await page.goto(base + `/ui/tasks/${t.id}`);
  await page.getByText("send-email").or(page.getByText(t.id)).first().waitFor();
  for (const name of ["Cancel", "Trigger now", "Retry"]) {
    assert.equal(await page.getByRole("button", { name }).count(), 0, `no ${name} button for a reader`);
  }
  await page.goto(base + "/ui/tasks?queue=emails");
  assert.equal(await page.getByText("Cancel matching").count(), 0);
  // The reader's own session cannot act even with its CSRF token.
  const csrf = await page.locator('input[name="csrf"]').first().getAttribute("value");
  const asReader = await page.request.post(base + `/ui/tasks/${t.id}/cancel`, { form: { csrf } });
  assert.equal(asReader.status(), 403);
  // A producer's session: a post without the CSRF token (what another site's form would send)
  // is refused, and so is one with a made-up token; the task is untouched.
  await context.clearCookies();
  await login(producer);
  const forged = await page.request.post(base + `/ui/tasks/${t.id}/cancel`, { form: { note: "x" } });
  assert.equal(forged.status(), 403);
  const wrong = await page.request.post(base + `/ui/tasks/${t.id}/cancel`, { form: { csrf: "f".repeat(64) } });
  assert.equal(wrong.status(), 403);
  assert.equal((await ok("GET", `/v1/tasks/${t.id}`)).state, "scheduled");
  // With its token the same post works.
  await page.goto(base + `/ui/tasks/${t.id}`);
  await page.getByRole("button", { name: "Cancel" }).click();
  await page.getByText("Cancelled.").waitFor();
  assert.equal((await ok("GET", `/v1/tasks/${t.id}`)).state, "cancelled");
});
