// Every error class: from the server's real answers where it can be made to give them (auth on for
// 401 and 403, a poll cap for 429), from a stubbed fetch for statuses a healthy local server does
// not produce (500, 501, 503), and for an unreachable server.

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { createServer } from "node:net";
import { after, before, test } from "node:test";

import {
  AlreadyRunning,
  ApiError,
  Conflict,
  ConnectionFailed,
  DuplicateKey,
  Forbidden,
  InternalError,
  Invalid,
  Malformed,
  MethodNotAllowed,
  NotFound,
  RateLimited,
  ShuttingDown,
  StaleExecution,
  SundialClient,
  SundialError,
  TooLarge,
  Unauthorized,
  Unavailable,
  Unsupported,
  WrongState,
} from "../index.js";
import { isRetryable } from "../errors.js";
import { Server, binary, uniqueQueue, waitFor } from "./server.js";

let server: Server;
let c: SundialClient;
before(async () => {
  server = await new Server().start();
  c = server.client();
});
after(() => server.dispose());

async function rejectsWith<T extends ApiError>(p: Promise<unknown>, cls: new (...a: never[]) => T): Promise<T> {
  try {
    await p;
  } catch (e) {
    assert.ok(e instanceof cls, `expected ${cls.name}, got ${String(e)}`);
    return e as T;
  }
  assert.fail(`expected ${cls.name}, nothing was thrown`);
}

test("malformed", async () => {
  const e = await rejectsWith(c.request("POST", "/v1/tasks", undefined, "{not json"), Malformed);
  assert.equal(e.status, 400);
  assert.equal(e.code, "malformed");
});

test("invalid names the field", async () => {
  const e = await rejectsWith(c.createTask("k", { delay: "soon" }), Invalid);
  assert.equal(e.status, 422);
  assert.equal(e.field, "delay");
});

test("an invalid batch item names its index and stores nothing", async () => {
  const queue = uniqueQueue();
  const e = await rejectsWith(c.createTasks([{ kind: "ok", queue }, { kind: "", queue }]), Invalid);
  assert.equal(e.index, 1);
  assert.ok(e.field?.startsWith("tasks[1]"));
  assert.deepEqual(await c.listTasks({ queue }), []);
});

test("not found", async () => {
  const e = await rejectsWith(c.getTask("0190d2f4-0000-7000-8000-000000000000"), NotFound);
  assert.equal(e.code, "not_found");
  await rejectsWith(c.getWorkflow("no-such-workflow"), NotFound);
});

test("method not allowed", async () => {
  const e = await rejectsWith(c.request("DELETE", "/v1/tasks"), MethodNotAllowed);
  assert.equal(e.status, 405);
});

test("duplicate key carries the existing id", async () => {
  const queue = uniqueQueue();
  const first = await c.createTask("k", { queue, key: "same" });
  const e = await rejectsWith(c.createTask("k", { queue, key: "same" }), DuplicateKey);
  assert.ok(e instanceof Conflict);
  assert.equal(e.code, "already_exists");
  assert.equal(e.existingId, first.id);
});

test("wrong state carries the state", async () => {
  const t = await c.createTask("k", { queue: uniqueQueue() });
  await c.cancelTask(t.id);
  await c.cancelTask(t.id); // cancel is idempotent
  const e = await rejectsWith(c.triggerTask(t.id), WrongState);
  assert.equal(e.state, "cancelled");
});

test("stale execution", async () => {
  const queue = uniqueQueue();
  await c.createTask("k", { queue });
  const [p] = await c.poll(queue, "w", { wait: "5s" });
  const e = await rejectsWith(c.complete(p!.id, "0190d2f4-0000-7000-8000-000000000001"), StaleExecution);
  assert.equal(e.state, "running");
  await c.complete(p!.id, p!.execution_id);
});

test("a refused completion carried by a poll polls nothing", async () => {
  const queue = uniqueQueue();
  const first = await c.createTask("k", { queue });
  const [p] = await c.poll(queue, "w", { wait: "5s" });
  const second = await c.createTask("k", { queue });
  await waitFor(async () => (await c.getTask(second.id)).state === "ready");
  // A stale execution: refused as complete would refuse it.
  const e = await rejectsWith(
    c.completeAndPoll(queue, "w", p!.id, "0190d2f4-0000-7000-8000-000000000001", "late", { wait: "5s" }),
    StaleExecution,
  );
  assert.ok(e instanceof Conflict);
  assert.equal(e.status, 409);
  assert.equal(e.state, "running");
  assert.equal(e.field, "complete.task_id");
  const nf = await rejectsWith(
    c.completeAndPoll(queue, "w", "0190d2f4-0000-7000-8000-000000000000", p!.execution_id, undefined, { wait: "5s" }),
    NotFound,
  );
  assert.equal(nf.field, "complete.task_id");
  assert.equal((await c.getTask(first.id)).state, "running");
  assert.equal((await c.getTask(second.id)).state, "ready");
  const got = await c.completeAndPoll(queue, "w", p!.id, p!.execution_id, undefined, { wait: "5s" });
  assert.equal(got.completed.state, "succeeded");
  assert.deepEqual(
    got.tasks.map((t) => t.id),
    [second.id],
  );
});

test("too large", async () => {
  const e = await rejectsWith(c.createTask("k", { payload: "x".repeat(300 * 1024) }), TooLarge);
  assert.equal(e.status, 413);
});

test("already running workflow", async () => {
  const id = `wf-${Math.random().toString(16).slice(2, 10)}`;
  await c.startWorkflow("t", undefined, { id, id_reuse: "reject_duplicate" });
  const e = await rejectsWith(c.startWorkflow("t", undefined, { id }), AlreadyRunning);
  assert.equal(e.code, "already_exists");
  assert.ok(e.existingId);
});

test("unauthorized and forbidden from a server with auth on", async () => {
  // A token in the store turns auth on (loopback included); a reader may only read.
  const authed = new Server();
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("SUNDIAL_")));
  const token = execFileSync(
    binary(),
    ["token", "create", "--bootstrap", "--name", "ro", "--scope", "reader", "--data-dir", authed.dataDir],
    { env, encoding: "utf8" },
  )
    .split("\n")[0]!
    .trim();
  try {
    await authed.start();
    for (const bad of ["", `sdl_${"0".repeat(96)}`]) {
      const e = await rejectsWith(new SundialClient({ url: authed.url, token: bad }).getTask(crypto.randomUUID()), Unauthorized);
      assert.equal(e.status, 401);
      assert.equal(e.code, "unauthenticated");
      assert.equal(e.retryable, false);
    }
    const reader = new SundialClient({ url: authed.url, token });
    assert.deepEqual(await reader.listTasks(), []); // a reader reads
    const e = await rejectsWith(reader.createTask("k"), Forbidden);
    assert.equal(e.status, 403);
    assert.equal(e.code, "forbidden");
    assert.equal(e.retryable, false);
  } finally {
    await authed.dispose();
  }
});

test("rate limited by the poll cap", async () => {
  // With auth off every caller shares one cap: one long poll holds it, the next is refused.
  const capped = await new Server(["--max-polls-per-token", "1"]).start();
  try {
    const holder = capped.client();
    const held = (async () => {
      for (;;) {
        // Until this poll is the one holding the cap.
        try {
          return await holder.poll("capped", "w1", { wait: "10s" });
        } catch (e) {
          if (!(e instanceof RateLimited)) throw e;
          await new Promise((r) => setTimeout(r, 10));
        }
      }
    })();
    const c = capped.client();
    const deadline = Date.now() + 10_000;
    let refused: RateLimited | undefined;
    while (!refused) {
      try {
        await c.poll("capped", "w2", { wait: "50ms" });
      } catch (e) {
        if (!(e instanceof RateLimited)) throw e;
        refused = e;
      }
      assert.ok(Date.now() < deadline, "the second poll was never refused");
    }
    assert.equal(refused.status, 429);
    assert.equal(refused.code, "too_many_polls");
    assert.equal(refused.retryable, true);
    assert.equal(refused.retryAfterSeconds, 1);
    await c.createTask("k", { queue: "capped" }); // answers the held poll
    assert.deepEqual((await held).map((t) => t.kind), ["k"]);
  } finally {
    await capped.dispose();
  }
});

const stub = (status: number, body: unknown): typeof fetch =>
  (async () =>
    new Response(typeof body === "string" ? body : JSON.stringify(body), { status })) as unknown as typeof fetch;

for (const [status, code, cls, retryable] of [
  [401, "unauthenticated", Unauthorized, false],
  [403, "forbidden", Forbidden, false],
  [429, "too_many_polls", RateLimited, true],
  [429, "quota", RateLimited, true],
  [500, "internal", InternalError, false],
  [501, "unsupported", Unsupported, false],
  [503, "shutting_down", ShuttingDown, true],
  [503, "unavailable", Unavailable, true],
  [502, null, Unavailable, true],
  [418, "teapot", ApiError, false],
] as const) {
  test(`status ${status} ${code ?? "(no body)"} is ${cls.name}`, async () => {
    const body = code ? { error: { code, message: "m" } } : "Bad Gateway";
    const sc = new SundialClient({ url: "http://stub", fetch: stub(status, body) });
    const e = await rejectsWith(sc.getTask("x"), cls as new (...a: never[]) => ApiError);
    assert.equal(e.constructor, cls);
    assert.equal(e.status, status);
    assert.equal(e.retryable, retryable);
    assert.equal(e.code, code ?? `http_${status}`);
  });
}

test("the token is sent as a bearer token", async () => {
  let auth: string | null = null;
  const f = (async (_url: URL, init: RequestInit) => {
    auth = new Headers(init.headers).get("authorization");
    return new Response(JSON.stringify({ status: "ok" }), { status: 200 });
  }) as unknown as typeof fetch;
  await new SundialClient({ url: "http://stub", token: "s3cret", fetch: f }).health();
  assert.equal(auth, "Bearer s3cret");
});

test("an unreachable server is ConnectionFailed", async () => {
  const port = await new Promise<number>((resolve) => {
    const s = createServer();
    s.listen(0, "127.0.0.1", () => {
      const p = (s.address() as { port: number }).port;
      s.close(() => resolve(p));
    });
  });
  try {
    await new SundialClient({ url: `http://127.0.0.1:${port}` }).health();
    assert.fail("expected ConnectionFailed");
  } catch (e) {
    assert.ok(e instanceof ConnectionFailed, String(e));
    assert.ok(e instanceof SundialError);
  }
});

test("a body cut off after the headers is ConnectionFailed (a worker retries it)", async () => {
  // The server sent its status and headers, then died: the body's stream ends with an error.
  const f = (async () =>
    new Response(
      new ReadableStream({
        start(controller) {
          controller.enqueue(new TextEncoder().encode('{"tasks": ['));
          controller.error(new TypeError("terminated"));
        },
      }),
      { status: 200, headers: { "content-type": "application/json" } },
    )) as unknown as typeof fetch;
  try {
    await new SundialClient({ url: "http://stub", fetch: f }).health();
    assert.fail("expected ConnectionFailed");
  } catch (e) {
    assert.ok(e instanceof ConnectionFailed, String(e));
    assert.ok(isRetryable(e));
  }
});
