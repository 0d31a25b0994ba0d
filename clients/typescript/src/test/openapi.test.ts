// The client stays in step with the server. Its types come from `openapi-typescript` run on the
// repository's openapi.json at every build (so a field the client uses that the server dropped
// fails the type check); this test checks at run time what types cannot: every request the
// client makes goes to a route and method the document has, with query parameters it declares
// and only body fields its schema names (the server refuses unknown fields).

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";

import { SundialClient } from "../index.js";
import { REPO } from "./server.js";

type Schema = { $ref?: string; properties?: Record<string, Schema>; oneOf?: Schema[]; required?: string[]; type?: unknown; items?: Schema };
type Operation = { parameters?: { name: string; in: string }[]; requestBody?: { content: Record<string, { schema: Schema }> } };
const doc = JSON.parse(readFileSync(join(REPO, "openapi.json"), "utf8")) as {
  paths: Record<string, Record<string, Operation>>;
  components: { schemas: Record<string, Schema> };
};

function resolve(s: Schema): Schema {
  return s.$ref ? doc.components.schemas[s.$ref.split("/").at(-1)!]! : s;
}

/** Checks that `value` only holds fields `schema` names, recursively through objects and refs. */
function checkFields(value: unknown, schema: Schema, where: string): void {
  if (value === null || typeof value !== "object" || Array.isArray(value)) {
    if (Array.isArray(value) && resolve(schema).items) value.forEach((v, i) => checkFields(v, resolve(schema).items!, `${where}[${i}]`));
    return;
  }
  const s = resolve(schema);
  const variants = s.oneOf ? s.oneOf.map(resolve).filter((v) => v.properties) : [s];
  if (variants.length === 0 || !variants.some((v) => v.properties)) return; // an open object (payload)
  const v = variants[0]!;
  for (const [k, sub] of Object.entries(value)) {
    assert.ok(v.properties && k in v.properties, `${where}.${k} is not in the server's schema`);
    checkFields(sub, v.properties![k]!, `${where}.${k}`);
  }
}

function matchRoute(method: string, path: string): [string, Operation] | undefined {
  const parts = path.split("/");
  for (const [template, item] of Object.entries(doc.paths)) {
    const t = template.split("/");
    if (t.length !== parts.length) continue;
    if (!t.every((seg, i) => seg === parts[i] || (seg.startsWith("{") && seg.endsWith("}")))) continue;
    const op = item[method.toLowerCase()];
    if (op) return [template, op];
  }
  return undefined;
}

test("every request the client makes is in openapi.json", async () => {
  const seen: string[] = [];
  const problems: string[] = [];
  const recorder = (async (url: URL, init: RequestInit) => {
    try {
      check(new URL(url), init);
    } catch (e) {
      problems.push((e as Error).message); // the client would wrap a throw as ConnectionFailed
    }
    return new Response("{}", { status: 599 });
  }) as unknown as typeof fetch;
  const check = (u: URL, init: RequestInit) => {
    const route = matchRoute(init.method!, u.pathname);
    assert.ok(route, `${init.method} ${u.pathname} is not in openapi.json`);
    const [template, op] = route;
    seen.push(`${init.method} ${template}`);
    const declared = new Set((op.parameters ?? []).filter((p) => p.in === "query").map((p) => p.name));
    for (const k of u.searchParams.keys()) assert.ok(declared.has(k), `${template} has no query parameter ${k}`);
    if (init.body) {
      const schema = op.requestBody?.content["application/json"]?.schema;
      assert.ok(schema, `${template} takes no body`);
      checkFields(JSON.parse(String(init.body)), schema, `${init.method} ${template}`);
    }
  };
  const c = new SundialClient({ url: "http://stub", fetch: recorder });
  const all: Array<Promise<unknown>> = [
    c.createTask("k", {
      queue: "q",
      key: "k",
      payload: { a: 1 },
      delay: 1000,
      max_attempts: 2,
      backoff: { initial: 10, factor: 2, max: "1m", jitter: 0 },
      timeout: "1m",
      exclusive: { key: "x", mode: "wait" },
    }),
    c.createTask("k", { run_at: new Date(0), exclusive: "x" }),
    c.createTasks([{ kind: "a", delay: "1s" }]),
    c.getTask("id"),
    c.listTasksPage(
      {
        queue: "q",
        kind: "k",
        state: "dead",
        key: "k",
        key_prefix: "k",
        tag: { a: "b" },
        error_group: "boom",
        due_after: new Date(0),
        due_before: "2030-01-01T00:00:00Z",
        created_after: new Date(0),
        created_before: new Date(0),
        limit: 5,
      },
      "cursor",
    ),
    c.createTask("k", { tags: { a: "b" } }),
    c.retryTask("id", new Date(0)),
    c.listAttempts("id"),
    c.cancelTasks({ queue: "q", tag: ["a:b"], dry_run: true }),
    c.retryTasks({ queue: "q", state: "dead", error_group: "boom", run_at: new Date(0) }),
    c.listQueues(),
    c.getQueue("q"),
    c.pauseQueue("q"),
    c.resumeQueue("q"),
    c.cancelTask("id"),
    c.triggerTask("id"),
    c.poll("q", "w", { max: 2, wait: 1000, kinds: ["k"] }),
    c.completeAndPoll("q", "w", "id", "e", { r: 1 }, { max: 2, wait: 1000, kinds: ["k"] }),
    c.heartbeat("id", "e"),
    c.complete("id", "e", { r: 1 }),
    c.fail("id", "e", "boom", { retryable: false }),
    c.createSchedule({
      id: "s",
      cron: "* * * * *",
      timezone: "UTC",
      dst: { skipped: "shift", repeated: "first" },
      overlap: "skip",
      catchup_window: 60_000,
      jitter: "1s",
      start_at: "2030-01-01T00:00:00Z",
      end_at: "2031-01-01T00:00:00Z",
      paused: false,
      note: "n",
      task: { kind: "k", queue: "q", payload: 1, max_attempts: 1, timeout: 1000 },
    }),
    c.updateSchedule("s", { every: 3_600_000, anchor: "2030-01-01T00:00:00Z" }),
    c.getSchedule("s"),
    c.deleteSchedule("s"),
    c.listSchedulesPage({ limit: 2 }, "cursor"),
    c.pauseSchedule("s", "n"),
    c.unpauseSchedule("s"),
    c.triggerSchedule("s"),
    c.backfillSchedule("s", new Date(0), "2030-01-01T00:00:00Z", { overlap: "allow_all" }),
    c.listFiresPage("s", { limit: 2 }, "before"),
    c.previewSchedule(new Date(0), { cron: "* * * * *", timezone: "UTC", count: 2 }),
    c.startWorkflow("t", { a: 1 }, { id: "w", id_reuse: "allow_duplicate" }),
    c.signalWorkflow("w", "go", { b: 2 }),
    c.getWorkflow("w"),
    c.listWorkflowsPage({ type: "t", status: "running", limit: 2 }, "cursor"),
    c.cancelWorkflow("w", "r"),
    c.terminateWorkflow("w", "r"),
    c.workflowHistory("w"),
    c.health(),
    c.metrics(),
  ];
  await Promise.allSettled(all);
  assert.deepEqual(problems, []);
  assert.equal(seen.length, all.length);
});
