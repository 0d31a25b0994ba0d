/**
 * The request and response types, taken from the types `openapi-typescript` generates from the
 * repository's `openapi.json` (`npm run generate`, run by every build). Only JSON values the
 * schema leaves open (`payload`, `result`, `input`) are widened to `unknown`; everything else is the
 * server's own description, so a server change that breaks this client fails its type check.
 */

import type { components } from "./openapi.js";

type S = components["schemas"];
type Json<T, K extends keyof T> = Omit<T, K> & { [P in K]: unknown };

/** A duration: a wire string (`"1500ms"`, `"30s"`, `"1h30m"`) or a number of milliseconds. */
export type Duration = string | number;
/** A time: an RFC 3339 string or a `Date`. */
export type Time = string | Date;

/** A task as stored (times are RFC 3339 strings). */
export type Task = Omit<S["TaskView"], "payload" | "result"> & { payload: unknown; result?: unknown };
export type TaskState = S["StateView"];
export type PolledTask = Json<S["PolledTask"], "payload">;
export type BatchResult = S["BatchItem"];
export type Schedule = Omit<S["ScheduleView"], "task" | "last_fires"> & {
  task: Json<S["TaskTemplateView"], "payload">;
  last_fires?: Fire[] | null;
};
export type Fire = S["FireView"];
export type Workflow = Json<S["WorkflowView"], "result">;
export type WorkflowStarted = S["StartResponse"];
export type Health = S["Health"];

/** The wire body of a task to create. */
export type CreateTaskBody = Omit<S["CreateTask"], "payload"> & { payload?: unknown };

/** What {@link SundialClient.createTask} takes: the wire fields, with durations and times also
 * as numbers (ms) and `Date`s, and `exclusive` also as a bare key. */
export type TaskOptions = Omit<CreateTaskBody, "kind" | "delay" | "timeout" | "run_at" | "backoff" | "exclusive"> & {
  delay?: Duration;
  timeout?: Duration;
  run_at?: Time;
  backoff?: Omit<NonNullable<S["CreateTask"]["backoff"]>, "initial" | "max"> & { initial?: Duration; max?: Duration };
  exclusive?: string | NonNullable<S["CreateTask"]["exclusive"]>;
};

export type TaskFilter = {
  queue?: string;
  kind?: string;
  state?: TaskState;
  key?: string;
  key_prefix?: string;
  /** `{k: v}` or `"k:v"` strings; every one must match. */
  tag?: Record<string, string> | string[];
  /** The first line of the task's last error (at most 200 characters), as the dead letters
   * group dead tasks: with `state: "dead"` and a `queue`, one dead-letter group. */
  error_group?: string;
  due_after?: Time;
  due_before?: Time;
  created_after?: Time;
  created_before?: Time;
  /** Page size, 1 to 1000 (default 50). */
  limit?: number;
};

/** Which tasks a bulk cancel or retry applies to (at least one filter), `dry_run` to count only. */
export type BulkFilter = Omit<TaskFilter, "key" | "limit"> & { dry_run?: boolean; run_at?: Time };

export type Attempt = S["AttemptView"];
export type Queue = S["QueueView"];
/** A queue's settings: its default push target, retention overrides and concurrency limit. */
export type QueueSettings = S["QueueSettingsView"];
/** A push signing secret (`whsec_…`): in full only in the answer that created it. */
export type PushSecret = S["SecretView"];
export type BulkResult = S["BulkResponse"];

/** W3C trace context headers: a create's task joins the caller's trace; a worker's complete or
 * fail is recorded as a child of its run. */
export type TraceHeaders = { traceparent?: string | null; tracestate?: string | null };

export type PollOptions = { max?: number; wait?: Duration; kinds?: string[] };

/** The answer to {@link SundialClient.completeAndPoll}: the task its completion recorded as
 * succeeded (with its result), and the tasks now running for the worker (maybe none). */
export type CompleteAndPoll = { completed: Task; tasks: PolledTask[] };

/** A schedule to create or the fields to change (`PATCH`); the task template as for tasks. */
export type ScheduleFields = Omit<S["ScheduleRequest"], "task" | "every" | "jitter" | "catchup_window"> & {
  every?: Duration | null;
  jitter?: Duration | null;
  catchup_window?: Duration | null;
  task?: ({ kind: string } & TaskOptions) | null;
};

export type PreviewFields = Omit<S["PreviewRequest"], "from" | "every"> & { every?: Duration | null };

export type StartWorkflowOptions = { id?: string; id_reuse?: string };
export type WorkflowFilter = { type?: string; status?: string; limit?: number };

/** One page of a list and the cursor of the next (`null` on the last page). */
export type Page<T> = { items: T[]; nextCursor: string | null };

export type BackfillResult = { fires: Fire[]; already_recorded: string[] };
