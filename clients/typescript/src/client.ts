/**
 * The producer client over the platform's `fetch`: tasks, batches, schedules, workflows, the
 * worker protocol by hand, health and metrics. Listings come as a page (`list*Page`) or as an
 * async iterator that fetches the next page when the current one runs out (`iter*`).
 *
 * Every error answer throws an {@link ApiError} subclass carrying the server's `code` and fields;
 * a server that cannot be reached throws {@link ConnectionFailed}.
 */

import { ConnectionFailed, errorFromResponse } from "./errors.js";
import type { components } from "./openapi.js";
import type {
  Attempt,
  BackfillResult,
  BulkFilter,
  BulkResult,
  PushSecret,
  Queue,
  QueueSettings,
  BatchResult,
  CompleteAndPoll,
  CreateTaskBody,
  Duration,
  Fire,
  Health,
  Page,
  PollOptions,
  PolledTask,
  PreviewFields,
  Schedule,
  ScheduleFields,
  StartWorkflowOptions,
  Task,
  TaskFilter,
  TaskOptions,
  Time,
  TraceHeaders,
  Workflow,
  WorkflowFilter,
  WorkflowStarted,
} from "./types.js";

type S = components["schemas"];

/** Where the client connects when given no URL and `SUNDIAL_URL` is not set. */
export const DEFAULT_URL = "http://127.0.0.1:7373";
export const VERSION = "0.1.0";

export type ClientOptions = {
  /** Base URL (default `$SUNDIAL_URL`, else `http://127.0.0.1:7373`). */
  url?: string;
  /** Sent as `Authorization: Bearer` (default `$SUNDIAL_TOKEN`). */
  token?: string;
  /** Per-request time limit in ms (default 30 s); polls add their wait. */
  timeoutMs?: number;
  headers?: Record<string, string>;
  /** A `fetch` to use instead of the global one (tests, proxies). */
  fetch?: typeof fetch;
  /** The namespace to act in (default `$SUNDIAL_NAMESPACE`, else `default`): requests go under
   * `/v1/namespaces/{ns}/`, but for the routes all namespaces share (see {@link inNamespace}). */
  namespace?: string;
};

function env(name: string): string | undefined {
  return typeof process !== "undefined" ? process.env[name] : undefined;
}

/** The namespace of requests without a `/v1/namespaces/{ns}/` prefix. */
export const DEFAULT_NAMESPACE = "default";

/** Routes every namespace shares (tokens, namespaces, the audit log): never under a namespace. */
const SHARED_ROUTES = ["/v1/tokens", "/v1/namespaces", "/v1/audit"];

/**
 * The path of an API route in `namespace`: `/v1/tasks` in `acme` is `/v1/namespaces/acme/tasks`.
 * The default namespace (or none), the routes all namespaces share (`/v1/tokens`,
 * `/v1/namespaces`, `/v1/audit`) and paths outside `/v1/` (`/healthz`, `/metrics`) keep their path.
 */
export function inNamespace(namespace: string | undefined, path: string): string {
  if (!namespace || namespace === DEFAULT_NAMESPACE || !path.startsWith("/v1/")) return path;
  const shared = SHARED_ROUTES.some((r) => path === r || ["/", "?", ":"].some((c) => path.startsWith(r + c)));
  return shared ? path : `/v1/namespaces/${encodeURIComponent(namespace)}/${path.slice("/v1/".length)}`;
}

/** A duration for the wire: strings pass, numbers are milliseconds. */
export function formatDuration(d: Duration): string {
  if (typeof d === "string") return d;
  if (!Number.isFinite(d) || d < 0) throw new RangeError(`not a duration: ${d}`);
  const ms = Math.round(d);
  return ms % 1000 === 0 ? `${ms / 1000}s` : `${ms}ms`;
}

const UNITS: Record<string, number> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 };

/** A wire duration (`"1h30m"`) in milliseconds. */
export function parseDuration(text: string): number {
  const re = /(\d+(?:\.\d+)?)([a-z]+)/gy;
  let total = 0;
  let end = 0;
  for (let m = re.exec(text); m; m = re.exec(text)) {
    const unit = UNITS[m[2]!];
    if (unit === undefined) throw new RangeError(`unknown unit in duration ${JSON.stringify(text)}`);
    total += Number(m[1]) * unit;
    end = re.lastIndex;
  }
  if (end === 0 || end !== text.length) throw new RangeError(`not a duration: ${JSON.stringify(text)}`);
  return total;
}

/** A time for the wire (the server keeps milliseconds). */
export function formatTime(t: Time): string {
  return typeof t === "string" ? t : t.toISOString();
}

function seg(s: string): string {
  return encodeURIComponent(s);
}

function dropUndefined<T extends Record<string, unknown>>(o: T): T {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as T;
}

/** The wire body of a task, from the friendlier options. */
export function taskBody(kind: string, options: TaskOptions = {}): CreateTaskBody {
  const { delay, timeout, run_at, backoff, exclusive, ...rest } = options;
  const body: CreateTaskBody = { ...rest, kind };
  if (delay !== undefined) body.delay = formatDuration(delay);
  if (timeout !== undefined) body.timeout = formatDuration(timeout);
  if (run_at !== undefined) body.run_at = formatTime(run_at);
  if (backoff !== undefined) {
    const { initial, max, ...b } = backoff;
    body.backoff = dropUndefined({
      ...b,
      initial: initial === undefined ? undefined : formatDuration(initial),
      max: max === undefined ? undefined : formatDuration(max),
    });
  }
  if (exclusive !== undefined) body.exclusive = typeof exclusive === "string" ? { key: exclusive } : exclusive;
  return body;
}

function scheduleBody(fields: ScheduleFields): S["ScheduleRequest"] {
  const { every, jitter, catchup_window, task, ...rest } = fields;
  const body: S["ScheduleRequest"] = { ...rest };
  if (every != null) body.every = formatDuration(every);
  if (jitter != null) body.jitter = formatDuration(jitter);
  if (catchup_window != null) body.catchup_window = formatDuration(catchup_window);
  if (task != null) {
    const { kind, ...opts } = task;
    body.task = taskBody(kind, opts) as NonNullable<S["ScheduleRequest"]["task"]>;
  }
  return body;
}

/** Filters for the wire: times formatted, `tag` as `k:v` strings. */
function filters(f: Record<string, unknown>): Record<string, string | number | boolean | string[] | undefined> {
  const out: Record<string, string | number | boolean | string[] | undefined> = {};
  for (const [k, v] of Object.entries(f)) {
    if (v === undefined || v === null) continue;
    if (v instanceof Date) out[k] = formatTime(v);
    else if (k === "tag") out[k] = Array.isArray(v) ? v.map(String) : Object.entries(v as object).map(([a, b]) => `${a}:${b}`);
    else out[k] = v as string | number | boolean;
  }
  return out;
}

function pollBody(worker: string, options: PollOptions): S["PollRequest"] {
  return dropUndefined({
    worker,
    max: options.max,
    wait: options.wait === undefined ? undefined : formatDuration(options.wait),
    kinds: options.kinds,
  });
}

type Request = {
  method: string;
  path: string;
  query?: Record<string, string | number | boolean | string[] | undefined>;
  body?: unknown;
  /** Raw body instead of JSON (for testing the server's refusals). */
  rawBody?: string;
  text?: boolean;
  extraTimeoutMs?: number;
  /** Headers of this request only. */
  headers?: Record<string, string>;
};

/** The trace headers to send (none without a `traceparent`). */
function traceHeaders(trace?: TraceHeaders): Record<string, string> | undefined {
  if (!trace?.traceparent) return undefined;
  return trace.tracestate
    ? { traceparent: trace.traceparent, tracestate: trace.tracestate }
    : { traceparent: trace.traceparent };
}

/** Sundial's HTTP API. */
export class SundialClient {
  readonly url: string;
  /** The namespace this client acts in (`undefined`: the default one). */
  readonly namespace: string | undefined;
  private readonly headers: Record<string, string>;
  private readonly timeoutMs: number;
  private readonly fetchImpl: typeof fetch;

  constructor(options: ClientOptions | string = {}) {
    const o = typeof options === "string" ? { url: options } : options;
    this.url = (o.url ?? env("SUNDIAL_URL") ?? DEFAULT_URL).replace(/\/+$/, "");
    const ns = o.namespace ?? env("SUNDIAL_NAMESPACE");
    this.namespace = ns && ns !== DEFAULT_NAMESPACE ? ns : undefined;
    this.timeoutMs = o.timeoutMs ?? 30_000;
    this.fetchImpl = o.fetch ?? globalThis.fetch;
    const token = o.token ?? env("SUNDIAL_TOKEN");
    this.headers = {
      accept: "application/json",
      "user-agent": `sundial-client-typescript/${VERSION}`,
      ...(token ? { authorization: `Bearer ${token}` } : {}),
      ...o.headers,
    };
  }

  /** Any request, answered with parsed JSON (or throwing the matching error): for routes this
   * client has no method for yet. */
  async request<T = unknown>(method: string, path: string, body?: unknown, rawBody?: string): Promise<T> {
    return (await this.send({ method, path, body, rawBody })) as T;
  }

  private async send(r: Request): Promise<unknown> {
    const url = new URL(this.url + inNamespace(this.namespace, r.path));
    for (const [k, v] of Object.entries(r.query ?? {})) {
      if (Array.isArray(v)) for (const item of v) url.searchParams.append(k, item);
      else if (v !== undefined) url.searchParams.set(k, String(v));
    }
    const headers: Record<string, string> = { ...this.headers, ...r.headers };
    let body: string | undefined;
    if (r.rawBody !== undefined) {
      body = r.rawBody;
      headers["content-type"] = "application/json";
    } else if (r.body !== undefined) {
      body = JSON.stringify(r.body);
      headers["content-type"] = "application/json";
    } else if (r.method !== "GET") {
      // A bodiless write still says it speaks JSON: the server refuses writes a browser could
      // send cross-site with 415 (README, Security).
      headers["content-type"] = "application/json";
    }
    let resp: Response;
    let text: string;
    try {
      resp = await this.fetchImpl(url, {
        method: r.method,
        headers,
        body,
        signal: AbortSignal.timeout(this.timeoutMs + (r.extraTimeoutMs ?? 0)),
      });
      // Inside the try: a server that dies (or a timeout that fires) after the headers ends the
      // body's stream with an error, which is a connection failure like any other.
      text = await resp.text();
    } catch (e) {
      const cause = e instanceof Error && e.cause instanceof Error ? `: ${e.cause.message}` : "";
      throw new ConnectionFailed(`${r.method} ${r.path}: ${e instanceof Error ? e.message : String(e)}${cause}`, {
        cause: e,
      });
    }
    if (resp.status >= 400) {
      let parsed: unknown = text;
      try {
        parsed = JSON.parse(text);
      } catch {
        /* not JSON: keep the text */
      }
      const err = errorFromResponse(resp.status, parsed);
      const retryAfter = resp.headers.get("retry-after");
      if (retryAfter && /^\d+$/.test(retryAfter.trim())) err.retryAfterSeconds = Number(retryAfter.trim());
      throw err;
    }
    if (r.text) return text;
    return text ? JSON.parse(text) : undefined;
  }

  // tasks

  /** Create a task (`POST /v1/tasks`). Durations are strings or milliseconds. `trace`: the
   * caller's W3C trace context, which the task carries to every step that runs it. */
  async createTask(kind: string, options: TaskOptions = {}, trace?: TraceHeaders): Promise<Task> {
    return (await this.send({
      method: "POST",
      path: "/v1/tasks",
      body: taskBody(kind, options),
      headers: traceHeaders(trace),
    })) as Task;
  }

  /** Create many tasks in one transaction (`POST /v1/tasks:batch`): one result per item, in order
   * (`{status: "created", id, state, run_at}` or `{status: "duplicate", existing_id}`). */
  async createTasks(tasks: Array<{ kind: string } & TaskOptions>, trace?: TraceHeaders): Promise<BatchResult[]> {
    const body: S["CreateBatch"] = { tasks: tasks.map(({ kind, ...o }) => taskBody(kind, o) as S["CreateBatch"]["tasks"][number]) };
    const r = (await this.send({
      method: "POST",
      path: "/v1/tasks:batch",
      body,
      headers: traceHeaders(trace),
    })) as S["BatchResponse"];
    return r.results;
  }

  async getTask(id: string): Promise<Task> {
    return (await this.send({ method: "GET", path: `/v1/tasks/${seg(id)}` })) as Task;
  }

  /** One page of tasks, newest first. */
  async listTasksPage(filter: TaskFilter = {}, cursor?: string | null): Promise<Page<Task>> {
    const r = (await this.send({
      method: "GET",
      path: "/v1/tasks",
      query: { ...filters(filter), cursor: cursor ?? undefined },
    })) as S["TaskList"];
    return { items: r.tasks as Task[], nextCursor: r.next_cursor ?? null };
  }

  /** Every matching task, newest first, page by page. */
  iterTasks(filter: TaskFilter = {}): AsyncGenerator<Task> {
    return paged((c) => this.listTasksPage(filter, c));
  }

  /** Every matching task (all pages). */
  async listTasks(filter: TaskFilter = {}): Promise<Task[]> {
    return collect(this.iterTasks(filter));
  }

  async cancelTask(id: string): Promise<Task> {
    return (await this.send({ method: "POST", path: `/v1/tasks/${seg(id)}/cancel` })) as Task;
  }

  async triggerTask(id: string): Promise<Task> {
    return (await this.send({ method: "POST", path: `/v1/tasks/${seg(id)}/trigger` })) as Task;
  }

  /** Run a dead or cancelled task again (now, or at `runAt`). */
  async retryTask(id: string, runAt?: Time): Promise<Task> {
    const body: S["RetryRequest"] = runAt === undefined ? {} : { run_at: formatTime(runAt) };
    return (await this.send({ method: "POST", path: `/v1/tasks/${seg(id)}/retry`, body })) as Task;
  }

  /** The task's kept attempts, oldest first, and how many it had in all. */
  async listAttempts(id: string): Promise<{ attempts: Attempt[]; total: number }> {
    return (await this.send({ method: "GET", path: `/v1/tasks/${seg(id)}/attempts` })) as S["AttemptList"];
  }

  /** Cancel every live task matching the filter (`dry_run: true` only counts). */
  async cancelTasks(filter: BulkFilter): Promise<BulkResult> {
    const body = filters(filter) as S["BulkRequest"];
    return (await this.send({ method: "POST", path: "/v1/tasks:cancel", body })) as BulkResult;
  }

  /** Run again every dead or cancelled task matching the filter. */
  async retryTasks(filter: BulkFilter): Promise<BulkResult> {
    const body = filters(filter) as S["BulkRequest"];
    return (await this.send({ method: "POST", path: "/v1/tasks:retry", body })) as BulkResult;
  }

  // queues

  async listQueues(): Promise<Queue[]> {
    return ((await this.send({ method: "GET", path: "/v1/queues" })) as S["QueueList"]).queues;
  }

  async getQueue(queue: string): Promise<Queue> {
    return (await this.send({ method: "GET", path: `/v1/queues/${seg(queue)}` })) as Queue;
  }

  /** While paused nothing of the queue starts; creates are still accepted. */
  async pauseQueue(queue: string): Promise<Queue> {
    return (await this.send({ method: "POST", path: `/v1/queues/${seg(queue)}/pause` })) as Queue;
  }

  async resumeQueue(queue: string): Promise<Queue> {
    return (await this.send({ method: "POST", path: `/v1/queues/${seg(queue)}/resume` })) as Queue;
  }

  /**
   * Replace a queue's settings: its default push `target` (tasks of the queue created without a
   * target are delivered to it), its `retention` overrides and its `concurrency` limit (at most
   * that many of the queue's tasks run at once, on every node: handlers, push calls and workers
   * alike). The whole settings object is replaced: a field left out is cleared (no `target`
   * removes the default target, no `concurrency` the limit).
   */
  async setQueueSettings(queue: string, settings: QueueSettings): Promise<Queue> {
    return (await this.send({ method: "PUT", path: `/v1/queues/${seg(queue)}`, body: settings })) as Queue;
  }

  // push signing secrets (admin)

  /** Every signing secret, oldest first, masked, with whether it signs now. */
  async listPushSecrets(): Promise<PushSecret[]> {
    return ((await this.send({ method: "GET", path: "/v1/push/secrets" })) as S["SecretList"]).secrets;
  }

  /** Add a signing secret (`whsec_…`; generated when not given): in full in the answer, this once. */
  async addPushSecret(secret?: string): Promise<PushSecret> {
    const body = secret === undefined ? {} : { secret };
    return (await this.send({ method: "POST", path: "/v1/push/secrets", body })) as PushSecret;
  }

  /**
   * Add a secret; the other active ones stop signing after `overlap` (server default `"24h"`; 0
   * stops them at once). Both signatures are sent meanwhile.
   */
  async rotatePushSecret(options: { secret?: string; overlap?: Duration } = {}): Promise<PushSecret> {
    const body: S["RotateSecret"] = {};
    if (options.secret !== undefined) body.secret = options.secret;
    if (options.overlap !== undefined) body.overlap = formatDuration(options.overlap);
    return (await this.send({ method: "POST", path: "/v1/push/secrets:rotate", body })) as PushSecret;
  }

  /** Stop a secret signing now; answers the secrets as {@link listPushSecrets} does. */
  async revokePushSecret(id: string): Promise<PushSecret[]> {
    return ((await this.send({ method: "DELETE", path: `/v1/push/secrets/${seg(id)}` })) as S["SecretList"])
      .secrets;
  }

  // the worker protocol (the Worker uses these)

  /** Long-poll `queue`: the tasks now running for `worker` (maybe none). */
  async poll(queue: string, worker: string, options: PollOptions = {}): Promise<PolledTask[]> {
    return (await this.sendPoll(queue, pollBody(worker, options), options)).tasks as PolledTask[];
  }

  /**
   * Record success of `id` (as {@link complete}) and long-poll `queue` (as {@link poll}) in one
   * request: the `completed` task and the `tasks` now running for `worker` (maybe none); the
   * first one's claim commits with the result. A refused completion throws as `complete` would
   * (`NotFound` or `StaleExecution` with `field` `complete.task_id`, `TooLarge` with
   * `complete.result`) and polls nothing. Sending the same completion again (after a lost answer)
   * counts as recorded.
   */
  async completeAndPoll(
    queue: string,
    worker: string,
    id: string,
    executionId: string,
    result?: unknown,
    options: PollOptions = {},
  ): Promise<CompleteAndPoll> {
    const complete = dropUndefined({ task_id: id, execution_id: executionId, result }) as S["PollCompletion"];
    const r = await this.sendPoll(queue, { ...pollBody(worker, options), complete }, options);
    return { completed: r.completed as Task, tasks: r.tasks as PolledTask[] };
  }

  private async sendPoll(queue: string, body: S["PollRequest"], options: PollOptions): Promise<S["PollResponse"]> {
    const waitMs = options.wait === undefined ? 60_000 : parseDuration(formatDuration(options.wait));
    return (await this.send({
      method: "POST",
      path: `/v1/queues/${seg(queue)}/poll`,
      body,
      extraTimeoutMs: waitMs,
    })) as S["PollResponse"];
  }

  async heartbeat(id: string, executionId: string): Promise<Task> {
    const body: S["HeartbeatRequest"] = { execution_id: executionId };
    return (await this.send({ method: "POST", path: `/v1/tasks/${seg(id)}/heartbeat`, body })) as Task;
  }

  /** Record success; `trace`: the W3C context of the run, continued by the server. */
  async complete(id: string, executionId: string, result?: unknown, trace?: TraceHeaders): Promise<Task> {
    const body = dropUndefined({ execution_id: executionId, result }) as S["CompleteRequest"];
    return (await this.send({
      method: "POST",
      path: `/v1/tasks/${seg(id)}/complete`,
      body,
      headers: traceHeaders(trace),
    })) as Task;
  }

  async fail(
    id: string,
    executionId: string,
    error?: string,
    options: { retryable?: boolean; traceparent?: string | null } = {},
  ): Promise<Task> {
    const body: S["FailRequest"] = dropUndefined({ execution_id: executionId, error, retryable: options.retryable });
    return (await this.send({
      method: "POST",
      path: `/v1/tasks/${seg(id)}/fail`,
      body,
      headers: traceHeaders({ traceparent: options.traceparent }),
    })) as Task;
  }

  // schedules

  async createSchedule(fields: ScheduleFields): Promise<Schedule> {
    return (await this.send({ method: "POST", path: "/v1/schedules", body: scheduleBody(fields) })) as Schedule;
  }

  async updateSchedule(id: string, fields: ScheduleFields): Promise<Schedule> {
    return (await this.send({ method: "PATCH", path: `/v1/schedules/${seg(id)}`, body: scheduleBody(fields) })) as Schedule;
  }

  async getSchedule(id: string): Promise<Schedule> {
    return (await this.send({ method: "GET", path: `/v1/schedules/${seg(id)}` })) as Schedule;
  }

  async deleteSchedule(id: string): Promise<void> {
    await this.send({ method: "DELETE", path: `/v1/schedules/${seg(id)}` });
  }

  async listSchedulesPage(options: { limit?: number } = {}, cursor?: string | null): Promise<Page<Schedule>> {
    const r = (await this.send({
      method: "GET",
      path: "/v1/schedules",
      query: { limit: options.limit, cursor: cursor ?? undefined },
    })) as S["ScheduleList"];
    return { items: r.schedules as Schedule[], nextCursor: r.next_cursor ?? null };
  }

  iterSchedules(options: { limit?: number } = {}): AsyncGenerator<Schedule> {
    return paged((c) => this.listSchedulesPage(options, c));
  }

  async listSchedules(options: { limit?: number } = {}): Promise<Schedule[]> {
    return collect(this.iterSchedules(options));
  }

  async pauseSchedule(id: string, note?: string): Promise<Schedule> {
    const body: S["NoteRequest"] = dropUndefined({ note });
    return (await this.send({ method: "POST", path: `/v1/schedules/${seg(id)}/pause`, body })) as Schedule;
  }

  async unpauseSchedule(id: string, note?: string): Promise<Schedule> {
    const body: S["NoteRequest"] = dropUndefined({ note });
    return (await this.send({ method: "POST", path: `/v1/schedules/${seg(id)}/unpause`, body })) as Schedule;
  }

  /** Fire the schedule now. */
  async triggerSchedule(id: string): Promise<Fire> {
    return (await this.send({ method: "POST", path: `/v1/schedules/${seg(id)}/trigger` })) as Fire;
  }

  /** Fire every time in `[from, to]` not fired before. */
  async backfillSchedule(id: string, from: Time, to: Time, options: { overlap?: S["BackfillRequest"]["overlap"] } = {}): Promise<BackfillResult> {
    const body: S["BackfillRequest"] = dropUndefined({ from: formatTime(from), to: formatTime(to), overlap: options.overlap });
    return (await this.send({ method: "POST", path: `/v1/schedules/${seg(id)}/backfill`, body })) as S["BackfillResponse"];
  }

  async listFiresPage(id: string, options: { limit?: number } = {}, before?: string | null): Promise<Page<Fire>> {
    const r = (await this.send({
      method: "GET",
      path: `/v1/schedules/${seg(id)}/fires`,
      query: { limit: options.limit, before: before ?? undefined },
    })) as S["FireList"];
    return { items: r.fires, nextCursor: r.next_cursor ?? null };
  }

  iterFires(id: string, options: { limit?: number } = {}): AsyncGenerator<Fire> {
    return paged((c) => this.listFiresPage(id, options, c));
  }

  /** The fire times a schedule would have from `from`. */
  async previewSchedule(from: Time, fields: PreviewFields = {}): Promise<string[]> {
    const { every, ...rest } = fields;
    const body: S["PreviewRequest"] = { ...rest, from: formatTime(from) };
    if (every != null) body.every = formatDuration(every);
    const r = (await this.send({ method: "POST", path: "/v1/schedules:preview", body })) as S["PreviewResponse"];
    return r.fires;
  }

  // workflows

  async startWorkflow(type: string, input?: unknown, options: StartWorkflowOptions = {}): Promise<WorkflowStarted> {
    const body = dropUndefined({ type, input, id: options.id, id_reuse: options.id_reuse }) as S["StartRequest"];
    return (await this.send({ method: "POST", path: "/v1/workflows", body })) as WorkflowStarted;
  }

  async signalWorkflow(id: string, name: string, input?: unknown): Promise<void> {
    const body = dropUndefined({ input }) as S["SignalRequest"];
    await this.send({ method: "POST", path: `/v1/workflows/${seg(id)}/signals/${seg(name)}`, body });
  }

  async getWorkflow(id: string): Promise<Workflow> {
    return (await this.send({ method: "GET", path: `/v1/workflows/${seg(id)}` })) as Workflow;
  }

  async listWorkflowsPage(filter: WorkflowFilter = {}, cursor?: string | null): Promise<Page<Workflow>> {
    const r = (await this.send({
      method: "GET",
      path: "/v1/workflows",
      query: { ...filter, cursor: cursor ?? undefined },
    })) as S["WorkflowList"];
    return { items: r.workflows as Workflow[], nextCursor: r.next_cursor ?? null };
  }

  iterWorkflows(filter: WorkflowFilter = {}): AsyncGenerator<Workflow> {
    return paged((c) => this.listWorkflowsPage(filter, c));
  }

  async listWorkflows(filter: WorkflowFilter = {}): Promise<Workflow[]> {
    return collect(this.iterWorkflows(filter));
  }

  async cancelWorkflow(id: string, reason?: string): Promise<void> {
    const body: S["ReasonRequest"] = dropUndefined({ reason });
    await this.send({ method: "POST", path: `/v1/workflows/${seg(id)}/cancel`, body });
  }

  async terminateWorkflow(id: string, reason?: string): Promise<Workflow> {
    const body: S["ReasonRequest"] = dropUndefined({ reason });
    return (await this.send({ method: "POST", path: `/v1/workflows/${seg(id)}/terminate`, body })) as Workflow;
  }

  async workflowHistory(id: string): Promise<Record<string, unknown>> {
    return (await this.send({ method: "GET", path: `/v1/workflows/${seg(id)}/history` })) as Record<string, unknown>;
  }

  // service

  async health(): Promise<Health> {
    return (await this.send({ method: "GET", path: "/healthz" })) as Health;
  }

  /** The Prometheus text of `/metrics`. */
  async metrics(): Promise<string> {
    return (await this.send({ method: "GET", path: "/metrics", text: true })) as string;
  }
}

async function* paged<T>(fetchPage: (cursor: string | null) => Promise<Page<T>>): AsyncGenerator<T> {
  let cursor: string | null = null;
  for (;;) {
    const page: Page<T> = await fetchPage(cursor);
    yield* page.items;
    // A page may be short, even empty, and still have a cursor: the server bounds the tasks
    // one page visits. Only the end of the cursors ends the iteration.
    if (!page.nextCursor) return;
    cursor = page.nextCursor;
  }
}

async function collect<T>(it: AsyncIterable<T>): Promise<T[]> {
  const out: T[] = [];
  for await (const x of it) out.push(x);
  return out;
}
