// Listing pages through every result automatically.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { Server, uniqueQueue } from "./server.js";

let server: Server;
before(async () => {
  server = await new Server().start();
});
after(() => server.dispose());

test("tasks page by cursor, newest first, each once", async () => {
  const c = server.client();
  const queue = uniqueQueue();
  const ids: string[] = [];
  for (let i = 0; i < 23; i++) ids.push((await c.createTask("page", { queue, delay: "1h" })).id);
  const first = await c.listTasksPage({ queue, limit: 5 });
  assert.equal(first.items.length, 5);
  assert.ok(first.nextCursor);
  const seen: string[] = [];
  for await (const t of c.iterTasks({ queue, limit: 5 })) seen.push(t.id);
  assert.deepEqual(seen, [...ids].reverse());
  assert.deepEqual(await c.listTasks({ queue, kind: "none" }), []);
});

test("schedules and workflows page", async () => {
  const c = server.client();
  const ids = Array.from({ length: 5 }, (_, i) => `s${i}-${Math.random().toString(16).slice(2, 8)}`).sort();
  for (const id of ids) await c.createSchedule({ id, every: "1h", task: { kind: "k" } });
  assert.ok((await c.listSchedulesPage({ limit: 2 })).nextCursor);
  const got: string[] = [];
  for await (const s of c.iterSchedules({ limit: 2 })) got.push(s.id);
  assert.deepEqual(got.filter((id) => ids.includes(id)).sort(), ids);
  const wids: string[] = [];
  for (let i = 0; i < 5; i++) wids.push((await c.startWorkflow("paged-ts", undefined, { id: `pw${i}` })).id);
  const listed = (await c.listWorkflows({ type: "paged-ts", limit: 2 })).map((w) => w.id).sort();
  assert.deepEqual(listed, wids.sort());
});
