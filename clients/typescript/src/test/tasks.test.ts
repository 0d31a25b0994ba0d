// The producer client against the real server: tasks, batches, the worker protocol by hand,
// schedules and workflows.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import type { SundialClient } from "../index.js";
import { Server, uniqueQueue } from "./server.js";

let server: Server;
let c: SundialClient;
before(async () => {
  server = await new Server().start();
  c = server.client();
});
after(() => server.dispose());

test("create, poll, heartbeat, complete", async () => {
  const queue = uniqueQueue();
  const task = await c.createTask("email.send", { queue, payload: { to: "a@example.com" }, timeout: 30_000 });
  assert.ok(["scheduled", "ready"].includes(task.state));
  assert.equal(task.kind, "email.send");
  assert.deepEqual(task.payload, { to: "a@example.com" });
  assert.equal(task.timeout, "30s");
  const polled = await c.poll(queue, "w1", { wait: "5s" });
  assert.deepEqual(
    polled.map((p) => p.id),
    [task.id],
  );
  const p = polled[0]!;
  assert.equal(p.attempt, 1);
  const beat = await c.heartbeat(p.id, p.execution_id);
  assert.equal(beat.state, "running");
  assert.equal(beat.worker, "w1");
  const done = await c.complete(p.id, p.execution_id, { sent: true });
  assert.equal(done.state, "succeeded");
  assert.deepEqual(done.result, { sent: true });
  assert.deepEqual(await c.getTask(task.id), done);
});

test("complete and poll in one request", async () => {
  const queue = uniqueQueue();
  const first = await c.createTask("k", { queue });
  const [p] = await c.poll(queue, "w1", { wait: "5s" });
  assert.equal(p!.id, first.id);
  const second = await c.createTask("k", { queue, payload: { n: 2 } });

  // The completion is recorded and the next task handed out in the same answer.
  const got = await c.completeAndPoll(queue, "w1", p!.id, p!.execution_id, { sent: true }, { wait: "5s" });
  assert.equal(got.completed.id, first.id);
  assert.equal(got.completed.state, "succeeded");
  assert.deepEqual(got.completed.result, { sent: true });
  assert.deepEqual(await c.getTask(first.id), got.completed);
  assert.equal(got.tasks.length, 1);
  const p2 = got.tasks[0]!;
  assert.equal(p2.id, second.id);
  assert.deepEqual(p2.payload, { n: 2 });
  assert.equal(p2.attempt, 1);
  assert.equal((await c.getTask(second.id)).state, "running");

  // Sent again (its answer lost): counted as recorded, the first result kept; the poll goes on
  // and finds nothing left.
  const again = await c.completeAndPoll(queue, "w1", p!.id, p!.execution_id, undefined, { wait: 200 });
  assert.equal(again.completed.state, "succeeded");
  assert.deepEqual(again.completed.result, { sent: true });
  assert.deepEqual(again.tasks, []);
  const last = await c.completeAndPoll(queue, "w1", p2.id, p2.execution_id, undefined, { max: 5, wait: 200, kinds: ["k"] });
  assert.equal(last.completed.id, second.id);
  assert.equal(last.completed.state, "succeeded");
  assert.deepEqual(last.tasks, []);
});

test("fail retries, then dead", async () => {
  const queue = uniqueQueue();
  const task = await c.createTask("k", { queue, max_attempts: 2, backoff: { initial: 50, jitter: 0 } });
  const [p] = await c.poll(queue, "w", { wait: 5000 });
  const again = await c.fail(p!.id, p!.execution_id, "boom");
  assert.equal(again.state, "scheduled");
  assert.equal(again.last_error, "boom");
  const [p2] = await c.poll(queue, "w", { wait: 5000 });
  assert.equal(p2!.id, task.id);
  assert.equal(p2!.attempt, 2);
  const dead = await c.fail(p2!.id, p2!.execution_id, "again", { retryable: false });
  assert.equal(dead.state, "dead");
});

test("options reach the server", async () => {
  const queue = uniqueQueue();
  const runAt = new Date(Date.now() + 3_600_000);
  const t = await c.createTask("k", {
    queue,
    key: "order-1",
    run_at: runAt,
    max_attempts: 3,
    backoff: { initial: "2s", factor: 3, max: 60_000, jitter: 0.1 },
    timeout: 120_000,
    exclusive: { key: "customer-7", mode: "skip" },
  });
  assert.equal(t.state, "scheduled");
  assert.equal(new Date(t.run_at).getTime(), runAt.getTime());
  assert.equal(t.key, "order-1");
  assert.equal(t.backoff.initial, "2s");
  assert.equal(t.backoff.max, "1m");
  assert.equal(t.timeout, "2m");
  assert.deepEqual(t.exclusive, { key: "customer-7", mode: "skip" });
  const later = await c.createTask("k", { queue, delay: "1h" });
  const triggered = await c.triggerTask(later.id);
  assert.ok(new Date(triggered.run_at).getTime() <= Date.now() + 1000);
  assert.equal((await c.cancelTask(t.id)).state, "cancelled");
});

test("a batch reports created and duplicate items", async () => {
  const queue = uniqueQueue();
  const results = await c.createTasks([
    { kind: "a", queue, key: "k1" },
    { kind: "b", queue, key: "k1" },
    { kind: "c", queue, delay: 60_000 },
  ]);
  const [a, b, d] = results;
  assert.equal(a!.status, "created");
  assert.equal(b!.status, "duplicate");
  if (a!.status === "created" && b!.status === "duplicate") assert.equal(b!.existing_id, a!.id);
  assert.equal(d!.status, "created");
});

test("schedules", async () => {
  const id = `s-${Math.random().toString(16).slice(2, 10)}`;
  const s = await c.createSchedule({ id, every: 3_600_000, task: { kind: "report", queue: "sched-q", payload: { x: 1 } } });
  assert.equal(s.id, id);
  assert.equal(s.every, "1h");
  assert.equal(s.task.kind, "report");
  assert.ok(s.next_fires.length > 0);
  assert.equal((await c.pauseSchedule(id, "maintenance")).paused, true);
  assert.equal((await c.unpauseSchedule(id)).paused, false);
  const fire = await c.triggerSchedule(id);
  assert.equal(fire.outcome, "fired");
  const fires = [];
  for await (const f of c.iterFires(id)) fires.push(f);
  assert.ok(fires.some((f) => f.task_id === fire.task_id));
  assert.equal((await c.updateSchedule(id, { every: "2h" })).every, "2h");
  assert.ok((await c.getSchedule(id)).last_fires);
  const preview = await c.previewSchedule("2030-01-01T00:00:00Z", { cron: "0 9 * * *", timezone: "Europe/Paris", count: 3 });
  assert.equal(preview.length, 3);
  assert.ok(preview[0]!.startsWith("2030-01-01T08:00:00"));
  await c.deleteSchedule(id);
});

test("workflows: start, signal, get, terminate", async () => {
  const type = `wf-${Math.random().toString(16).slice(2, 10)}`;
  const started = await c.startWorkflow(type, { n: 1 }, { id: `${type}-1` });
  assert.equal(started.id, `${type}-1`);
  assert.equal(started.status, "running");
  await c.signalWorkflow(started.id, "go", { fast: true });
  const wf = await c.getWorkflow(started.id);
  assert.equal(wf.type, type);
  assert.equal(wf.status, "running");
  const history = await c.workflowHistory(started.id);
  assert.ok(Array.isArray(history.events) && history.events.length > 0);
  assert.equal((await c.terminateWorkflow(started.id, "test over")).status, "terminated");
  assert.deepEqual(await c.health(), { status: "ok" });
});
