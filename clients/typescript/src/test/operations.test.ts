// Tags and search, attempts, retrying, bulk actions, queues (pause and resume, settings with a
// default push target) and the push signing secrets.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { Invalid, NotFound, type PolledTask, SundialClient, Unavailable } from "../index.js";
import { Server, uniqueQueue } from "./server.js";

let server: Server;
let c: SundialClient;
before(async () => {
  server = await new Server().start();
  c = server.client();
});
after(() => server.dispose());

test("tags are stored and searched", async () => {
  const queue = uniqueQueue();
  const tagged = await c.createTask("k", { queue, tags: { customer: "c7", tier: "gold" }, delay: "1h" });
  await c.createTask("k", { queue, tags: { customer: "c8" }, delay: "1h" });
  assert.deepEqual(tagged.tags, { customer: "c7", tier: "gold" });
  assert.deepEqual(
    (await c.listTasks({ queue, tag: { customer: "c7" } })).map((t) => t.id),
    [tagged.id],
  );
  assert.deepEqual(
    (await c.listTasks({ queue, tag: ["customer:c7", "tier:gold"] })).map((t) => t.id),
    [tagged.id],
  );
  assert.equal((await c.listTasks({ queue, due_before: new Date(Date.now() + 7_200_000) })).length, 2);
});

test("attempts and retry", async () => {
  const queue = uniqueQueue();
  const t = await c.createTask("k", { queue, max_attempts: 1 });
  const [p] = await c.poll(queue, "w", { wait: "5s" });
  assert.equal((await c.fail(p!.id, p!.execution_id, "boom")).state, "dead");
  const { attempts, total } = await c.listAttempts(t.id);
  assert.equal(total, 1);
  assert.equal(attempts[0]!.outcome, "failed");
  assert.equal(attempts[0]!.error, "boom");
  assert.ok(["scheduled", "ready"].includes((await c.retryTask(t.id)).state));
});

test("bulk cancel and retry", async () => {
  const queue = uniqueQueue();
  for (let i = 0; i < 3; i++) await c.createTask("bulk", { queue, delay: "1h" });
  const counted = await c.cancelTasks({ queue, dry_run: true });
  assert.equal(counted.matched, 3);
  assert.equal(counted.changed, 0);
  assert.equal((await c.cancelTasks({ queue })).changed, 3);
  assert.equal((await c.retryTasks({ queue, state: "cancelled" })).changed, 3);
});

test("queues pause and resume", async () => {
  const queue = uniqueQueue();
  await c.createTask("k", { queue, delay: "1h" });
  assert.equal((await c.pauseQueue(queue)).paused, true);
  assert.equal((await c.getQueue(queue)).paused, true);
  assert.ok((await c.listQueues()).some((q) => q.queue === queue));
  const resumed = await c.resumeQueue(queue);
  assert.equal(resumed.paused, false);
  assert.equal(resumed.counts.scheduled, 1);
});

test("a queue's default push target is set and cleared", async () => {
  const queue = uniqueQueue();
  const target = { url: "https://hooks.example.com/q", headers: { "x-tenant": "acme" }, timeout: "5s" };
  const q = await c.setQueueSettings(queue, { target });
  assert.equal(q.queue, queue);
  assert.equal(q.settings.target?.url, target.url);
  assert.deepEqual(q.settings.target?.headers, { "x-tenant": "acme" });
  assert.equal((await c.getQueue(queue)).settings.target?.url, target.url);
  // The whole settings object is replaced: no target clears it.
  const cleared = await c.setQueueSettings(queue, { retention: { succeeded: "1h" } });
  assert.equal(cleared.settings.target ?? null, null);
  assert.equal(cleared.settings.retention?.succeeded, "1h");
  await assert.rejects(c.setQueueSettings(queue, { target: { url: "ftp://example.com/x" } }), Invalid);
});

test("a queue's concurrency limit caps what polls take", async () => {
  const queue = uniqueQueue();
  const q = await c.setQueueSettings(queue, { concurrency: 2 });
  assert.equal(q.settings.concurrency, 2);
  for (let i = 0; i < 3; i++) await c.createTask("k", { queue });
  const taken: PolledTask[] = [];
  for (let i = 0; i < 50 && taken.length < 2; i++) {
    taken.push(...(await c.poll(queue, "w", { max: 5, wait: "100ms" })));
  }
  assert.equal(taken.length, 2, "a poll takes no more than the free places");
  assert.deepEqual(await c.poll(queue, "w", { max: 5, wait: "100ms" }), []);
  const first = taken[0]!;
  await c.complete(first.id, first.execution_id);
  assert.equal((await c.poll(queue, "w", { max: 5, wait: "2s" })).length, 1);
  await assert.rejects(c.setQueueSettings(queue, { concurrency: 0 }), Invalid);
  assert.equal((await c.setQueueSettings(queue, {})).settings.concurrency ?? null, null);
});

test("push secrets are added, listed, rotated and revoked", async () => {
  // A server of its own: the secrets are the whole server's.
  const own = await new Server().start();
  try {
    const oc = own.client();
    const added = await oc.addPushSecret();
    assert.ok(added.secret.startsWith("whsec_") && !added.secret.endsWith("…") && added.active);
    const listed = await oc.listPushSecrets();
    assert.deepEqual(
      listed.map((s) => s.id),
      [added.id],
    );
    assert.ok(listed[0]?.secret.endsWith("…") && listed[0]?.active);
    const rotated = await oc.rotatePushSecret({ overlap: 0 });
    assert.notEqual(rotated.id, added.id);
    const byId = new Map((await oc.listPushSecrets()).map((s) => [s.id, s]));
    assert.equal(byId.get(rotated.id)?.active, true);
    assert.equal(byId.get(added.id)?.active, false);
    const mine = "whsec_" + Buffer.from("k".repeat(32)).toString("base64");
    assert.equal((await oc.addPushSecret(mine)).secret, mine);
    await assert.rejects(oc.addPushSecret("not-a-secret"), Invalid);
    const after = await oc.revokePushSecret(rotated.id);
    assert.equal(after.find((s) => s.id === rotated.id)?.active, false);
    await assert.rejects(oc.revokePushSecret("ps_missing"), NotFound);
  } finally {
    await own.dispose();
  }
});

test("Retry-After is kept on the error", async () => {
  const f = (async () =>
    new Response(JSON.stringify({ error: { code: "unavailable", message: "restarting" } }), {
      status: 503,
      headers: { "retry-after": "2" },
    })) as unknown as typeof fetch;
  try {
    await new SundialClient({ url: "http://stub", fetch: f }).health();
    assert.fail("expected Unavailable");
  } catch (e) {
    assert.ok(e instanceof Unavailable);
    assert.equal(e.retryAfterSeconds, 2);
  }
});
