// Namespaces: a client (and a worker) with `namespace` sends its requests under
// `/v1/namespaces/{ns}/` but the shared admin routes as they are; against the real server, a task
// created in a namespace is listed, polled and completed there and is absent from the default
// one; a create over the namespace's quota is RateLimited with code `quota`.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { NotFound, RateLimited, SundialClient, Worker, inNamespace, type Job } from "../index.js";
import { Server, finished, waitFor } from "./server.js";

let server: Server;
let admin: SundialClient;
before(async () => {
  server = await new Server().start();
  admin = server.client();
});
after(() => server.dispose());

const quiet = { log: () => {}, handleSignals: false };

function recording(seen: string[], namespace?: string): SundialClient {
  const recorder = (async (url: URL) => {
    const u = new URL(url);
    seen.push(u.pathname + u.search);
    return new Response(u.pathname.endsWith("/poll") ? '{"tasks":[]}' : "{}", { status: 200 });
  }) as unknown as typeof fetch;
  return new SundialClient({ url: "http://stub", fetch: recorder, namespace });
}

test("a namespaced client prefixes its routes but not the shared ones", async () => {
  const seen: string[] = [];
  const c = recording(seen, "acme");
  await c.poll("q", "w", { wait: 0 });
  await c.listTasksPage({ queue: "q" });
  await c.request("POST", "/v1/tasks:batch", { tasks: [] });
  await c.request("GET", "/v1/tokens");
  await c.request("POST", "/v1/namespaces", { name: "x" });
  await c.request("GET", "/v1/namespaces");
  await c.request("GET", "/v1/audit?limit=1");
  await c.health();
  assert.deepEqual(seen, [
    "/v1/namespaces/acme/queues/q/poll",
    "/v1/namespaces/acme/tasks?queue=q",
    "/v1/namespaces/acme/tasks:batch",
    "/v1/tokens",
    "/v1/namespaces",
    "/v1/namespaces",
    "/v1/audit?limit=1",
    "/healthz",
  ]);
  assert.equal(inNamespace("default", "/v1/tasks"), "/v1/tasks");
  assert.equal(inNamespace(undefined, "/v1/tasks"), "/v1/tasks");
  assert.equal(inNamespace("acme", "/v1/tokensmith"), "/v1/namespaces/acme/tokensmith");
});

test("the namespace defaults to SUNDIAL_NAMESPACE; the option wins", async () => {
  const before = process.env.SUNDIAL_NAMESPACE;
  process.env.SUNDIAL_NAMESPACE = "acme";
  try {
    const seen: string[] = [];
    const fromEnv = recording(seen);
    assert.equal(fromEnv.namespace, "acme");
    await fromEnv.listQueues();
    const given = recording(seen, "default");
    assert.equal(given.namespace, undefined);
    await given.listQueues();
    assert.deepEqual(seen, ["/v1/namespaces/acme/queues", "/v1/queues"]);
  } finally {
    if (before === undefined) delete process.env.SUNDIAL_NAMESPACE;
    else process.env.SUNDIAL_NAMESPACE = before;
  }
});

test("a worker takes a namespace or a client, not both", () => {
  assert.throws(() => new Worker("q", () => null, { client: admin, namespace: "acme" }), RangeError);
});

test("a task lives in its namespace: listed, polled and completed there, absent from default", async () => {
  const made = await admin.request<{ name: string }>("POST", "/v1/namespaces", { name: "acme" });
  assert.equal(made.name, "acme");
  const acme = new SundialClient({ url: server.url, namespace: "acme" });
  const queue = "jobs";
  const task = await acme.createTask("double", { queue, payload: 21 });
  assert.deepEqual((await acme.listTasks({ queue })).map((t) => t.id), [task.id]);
  assert.equal((await acme.getTask(task.id)).queue, queue);
  assert.deepEqual(await admin.listTasks({ queue }), []);
  await assert.rejects(admin.getTask(task.id), NotFound);
  // The shared routes keep their paths from a namespaced client.
  const listed = await acme.request<{ namespaces: { name: string }[] }>("GET", "/v1/namespaces");
  assert.ok(listed.namespaces.some((n) => n.name === "acme"));

  const worker = new Worker(queue, (job: Job) => ({ doubled: (job.payload as number) * 2 }), {
    url: server.url,
    namespace: "acme",
    pollWaitMs: 1000,
    ...quiet,
  });
  const running = worker.run();
  let done;
  try {
    done = await waitFor(async () => ((t) => finished(t.state) && t)(await acme.getTask(task.id)));
  } finally {
    worker.stop();
    await running;
  }
  assert.equal(done.state, "succeeded");
  assert.deepEqual(done.result, { doubled: 42 });
  assert.equal(worker.stats.completed, 1);
  assert.deepEqual(await admin.listTasks({ queue }), []);
});

test("a namespace that does not exist is NotFound", async () => {
  const nowhere = new SundialClient({ url: server.url, namespace: "nowhere" });
  await assert.rejects(nowhere.listTasks(), NotFound);
});

test("a create over the namespace's quota is RateLimited with code quota", async () => {
  await admin.request("POST", "/v1/namespaces", { name: "tight", max_live_tasks: 1 });
  const tight = new SundialClient({ url: server.url, namespace: "tight" });
  await tight.createTask("k", { queue: "q" });
  const refused = await tight.createTask("k", { queue: "q" }).then(
    () => assert.fail("the second create was accepted"),
    (e: unknown) => e,
  );
  assert.ok(refused instanceof RateLimited);
  assert.equal(refused.status, 429);
  assert.equal(refused.code, "quota");
  assert.equal(refused.retryable, true);
  assert.ok((refused.retryAfterSeconds ?? 0) >= 1);
  await assert.rejects(tight.createTasks([{ kind: "k", queue: "q" }]), (e: unknown) => e instanceof RateLimited && e.code === "quota");
  assert.equal((await tight.listTasks({ queue: "q" })).length, 1); // nothing more stored
});
