// The Worker against the real server: completing and failing, concurrency, heartbeats keeping a
// long task's lease, a 409 taking the attempt back, surviving a server restart, backing off on
// 503, and a graceful stop on SIGTERM.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { createInterface } from "node:readline";

import { Permanent, SundialClient, Worker, type Job } from "../index.js";
import { Server, finished, uniqueQueue, waitFor } from "./server.js";

let server: Server;
let c: SundialClient;
before(async () => {
  server = await new Server().start();
  c = server.client();
});
after(() => server.dispose());

const quiet = { log: () => {}, handleSignals: false };
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

test("completes, fails with retries, fails for good", async () => {
  const queue = uniqueQueue();
  const worker = new Worker(
    queue,
    (job: Job) => {
      if (job.kind === "bad") throw new Error("handler exploded");
      if (job.kind === "fatal") throw new Permanent("no point retrying");
      return { doubled: (job.payload as number) * 2 };
    },
    { url: server.url, concurrency: 4, pollWaitMs: 1000, ...quiet },
  );
  const running = worker.run();
  try {
    const ok = await c.createTask("double", { queue, payload: 21 });
    const bad = await c.createTask("bad", { queue, max_attempts: 2, backoff: { initial: "50ms", jitter: 0 } });
    const fatal = await c.createTask("fatal", { queue });
    const done = await waitFor(async () => ((t) => finished(t.state) && t)(await c.getTask(ok.id)));
    assert.equal(done.state, "succeeded");
    assert.deepEqual(done.result, { doubled: 42 });
    const dead = await waitFor(async () => ((t) => finished(t.state) && t)(await c.getTask(bad.id)));
    assert.equal(dead.state, "dead");
    assert.equal(dead.attempt, 2);
    assert.ok(dead.last_error?.includes("handler exploded"));
    const perm = await waitFor(async () => ((t) => finished(t.state) && t)(await c.getTask(fatal.id)));
    assert.equal(perm.state, "dead");
    assert.equal(perm.attempt, 1);
    assert.equal(perm.last_error, "no point retrying");
  } finally {
    worker.stop();
    await running;
  }
  assert.deepEqual(worker.stats, { completed: 1, failed: 3, lost: 0 });
});

test("runs up to `concurrency` at once", async () => {
  const queue = uniqueQueue();
  let active = 0;
  let peak = 0;
  const worker = new Worker(
    queue,
    async (job) => {
      peak = Math.max(peak, ++active);
      await sleep(300);
      active--;
      return job.payload;
    },
    { url: server.url, concurrency: 3, pollWaitMs: 1000, ...quiet },
  );
  const running = worker.run();
  try {
    const ids: string[] = [];
    for (let i = 0; i < 9; i++) ids.push((await c.createTask("k", { queue, payload: i })).id);
    await waitFor(async () => {
      for (const id of ids) if ((await c.getTask(id)).state !== "succeeded") return false;
      return true;
    }, 20_000);
  } finally {
    worker.stop();
    await running;
  }
  assert.equal(peak, 3);
});

test("heartbeats keep a task past its timeout", async () => {
  const queue = uniqueQueue();
  const worker = new Worker(
    queue,
    async () => {
      await sleep(2500); // well past the 1 s timeout: only heartbeats keep the lease
      return "slow but fine";
    },
    { url: server.url, pollWaitMs: 1000, ...quiet },
  );
  const running = worker.run();
  try {
    const t = await c.createTask("slow", { queue, timeout: "1s", max_attempts: 1 });
    const done = await waitFor(async () => ((x) => finished(x.state) && x)(await c.getTask(t.id)), 20_000);
    assert.equal(done.state, "succeeded");
    assert.equal(done.attempt, 1);
    assert.equal(done.result, "slow but fine");
  } finally {
    worker.stop();
    await running;
  }
});

test("a 409 on a heartbeat takes the attempt back", async () => {
  const queue = uniqueQueue();
  let sawLost = false;
  const worker = new Worker(
    queue,
    async (job) => {
      await new Promise<void>((resolve) => {
        job.signal.addEventListener("abort", () => resolve(), { once: true });
        setTimeout(resolve, 10_000);
      });
      sawLost = job.lost;
      return "too late";
    },
    { url: server.url, pollWaitMs: 1000, heartbeatIntervalMs: 100, ...quiet },
  );
  const running = worker.run();
  try {
    const t = await c.createTask("k", { queue });
    await waitFor(async () => (await c.getTask(t.id)).state === "running");
    await c.cancelTask(t.id);
    await waitFor(async () => worker.stats.lost === 1);
    assert.ok(sawLost);
    assert.equal((await c.getTask(t.id)).state, "cancelled");
  } finally {
    worker.stop();
    await running;
  }
  assert.equal(worker.stats.completed, 0);
});

test("survives a server restart", async () => {
  const workerLog: string[] = [];
  const own = await new Server().start();
  const oc = own.client();
  let release: () => void = () => {};
  const held = new Promise<void>((r) => (release = r));
  let holding: () => void = () => {};
  const inHandler = new Promise<void>((r) => (holding = r));
  const worker = new Worker(
    "restart",
    async (job) => {
      if (job.kind === "hold") {
        holding();
        await held;
      }
      return job.kind;
    },
    // The worker's log is kept and shown if the test fails.
    { url: own.url, concurrency: 2, pollWaitMs: 1000, maxBackoffMs: 500, ...quiet, log: (m: string) => workerLog.push(`${Date.now()} ${m}`) },
  );
  const running = worker.run();
  try {
    const first = await oc.createTask("first", { queue: "restart" });
    await waitFor(async () => (await oc.getTask(first.id)).state === "succeeded");
    const hold = await oc.createTask("hold", { queue: "restart", timeout: "1m" });
    await waitFor(async () => (await oc.getTask(hold.id)).state === "running");
    // The worker has the task, not only the store: `running` is committed before the poll's
    // answer is sent, so a kill right after it may leave the worker without the task (it is then
    // offered again after its lease, a minute here, which this test does not wait for).
    await inHandler;
    await own.restart("SIGKILL"); // same port and data directory
    release();
    const afterRestart = await oc.createTask("after", { queue: "restart" });
    await waitFor(async () => (await oc.getTask(afterRestart.id)).state === "succeeded", 30_000);
    const done = await waitFor(async () => ((t) => finished(t.state) && t)(await oc.getTask(hold.id)), 30_000);
    assert.equal(done.state, "succeeded");
    assert.equal(done.result, "hold");
    assert.equal(done.attempt, 1);
  } catch (e) {
    console.error(`worker log:\n${workerLog.join("\n")}\nserver log:\n${own.log.slice(-40).join("\n")}`);
    throw e;
  } finally {
    worker.stop();
    await running;
    await own.dispose();
  }
});

test("backs off on 503, then polls again; retries a refused completion", async () => {
  let polls = 0;
  let completes = 0;
  const times: number[] = [];
  const fake = (async (url: URL) => {
    const path = new URL(url).pathname;
    const json = (status: number, body: unknown) => new Response(JSON.stringify(body), { status });
    if (path.endsWith("/poll")) {
      polls++;
      times.push(Date.now());
      if (polls <= 3) return json(503, { error: { code: "unavailable", message: "shard moving" } });
      if (polls === 4) {
        return json(200, {
          tasks: [
            {
              id: "00000000-0000-0000-0000-000000000001",
              queue: "q",
              kind: "k",
              key: null,
              payload: null,
              attempt: 1,
              max_attempts: 5,
              execution_id: "00000000-0000-0000-0000-0000000000e1",
              lease_expires_at: "2030-01-01T00:00:00Z",
              run_at: "2030-01-01T00:00:00Z",
              timeout: "5m",
            },
          ],
        });
      }
      await sleep(50);
      return json(200, { tasks: [] });
    }
    if (path.endsWith("/complete")) {
      completes++;
      if (completes === 1) return json(503, { error: { code: "shutting_down", message: "bye" } });
      return json(200, {});
    }
    return json(404, { error: { code: "not_found", message: "?" } });
  }) as unknown as typeof fetch;
  const worker = new Worker("q", () => "ok", {
    client: new SundialClient({ url: "http://stub", fetch: fake }),
    pollWaitMs: 100,
    maxBackoffMs: 400,
    ...quiet,
  });
  const running = worker.run();
  await waitFor(async () => worker.stats.completed === 1, 10_000);
  worker.stop();
  await running;
  assert.equal(completes, 2);
  for (let i = 1; i < 4; i++) assert.ok(times[i]! - times[i - 1]! >= 40, `gap ${times[i]! - times[i - 1]!} ms`);
});

test("SIGTERM lets running tasks finish", async (t) => {
  const dir = server.dataDir;
  const script = join(dir, "worker.mjs");
  const index = new URL("../index.js", import.meta.url).href;
  writeFileSync(
    script,
    `import { Worker } from ${JSON.stringify(index)};
const w = new Worker("graceful-ts", async (job) => {
  console.log("started " + job.id);
  await new Promise((r) => setTimeout(r, 1000));
  return "finished after SIGTERM";
}, { url: ${JSON.stringify(server.url)}, pollWaitMs: 1000, log: () => {} });
await w.run();
console.log("stopped");
`,
  );
  const proc = spawn(process.execPath, [script], { stdio: ["ignore", "pipe", "inherit"] });
  t.after(() => proc.kill("SIGKILL"));
  const lines = createInterface({ input: proc.stdout! });
  const out: string[] = [];
  const started = new Promise<void>((resolve) =>
    lines.on("line", (l) => {
      out.push(l);
      if (l.startsWith("started")) resolve();
    }),
  );
  const task = await c.createTask("k", { queue: "graceful-ts" });
  await started;
  proc.kill("SIGTERM");
  const code = await new Promise<number | null>((r) => proc.on("exit", (c) => r(c)));
  assert.equal(code, 0);
  assert.ok(out.includes("stopped"), out.join("\n"));
  const done = await c.getTask(task.id);
  assert.equal(done.state, "succeeded");
  assert.equal(done.result, "finished after SIGTERM");
});

test("runs the handler in the task's trace and reports from the hook's span", async () => {
  // The server exports nothing here: the polled context is the caller's, unchanged.
  const queue = uniqueQueue();
  const caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
  const handlerSpan = "00-4bf92f3577b34da6a3ce929d0e0e4736-1111222233334444-01";
  const seen: Record<string, unknown> = {};
  const sent: Array<string | null> = [];
  const recording: typeof fetch = async (input, init) => {
    if (String(input).endsWith("/complete")) {
      sent.push(new Headers(init?.headers).get("traceparent"));
    }
    return fetch(input, init);
  };
  const worker = new Worker(
    queue,
    (job: Job) => {
      seen.handler = job.traceparent;
      return "ok";
    },
    {
      url: server.url,
      fetch: recording,
      pollWaitMs: 1000,
      ...quiet,
      traceHook: async (job, run) => {
        seen.hook = [job.traceparent, job.tracestate];
        job.traceparent = handlerSpan;
        return run();
      },
    },
  );
  const running = worker.run();
  try {
    const t = await c.createTask("traced", { queue }, { traceparent: caller, tracestate: "congo=t61rcWkgMzE" });
    assert.equal(t.traceparent, caller);
    assert.equal(t.tracestate, "congo=t61rcWkgMzE");
    const done = await waitFor(async () => ((x) => finished(x.state) && x)(await c.getTask(t.id)));
    assert.equal(done.state, "succeeded");
  } finally {
    worker.stop();
    await running;
  }
  assert.deepEqual(seen.hook, [caller, "congo=t61rcWkgMzE"]);
  assert.equal(seen.handler, handlerSpan, "the handler runs inside the hook");
  assert.deepEqual(sent, [handlerSpan], "the result is reported from the hook's span");
});

test("a malformed traceparent is ignored", async () => {
  const queue = uniqueQueue();
  const t = await c.createTask("k", { queue }, { traceparent: "not-a-traceparent" });
  assert.equal(t.traceparent, undefined);
});
