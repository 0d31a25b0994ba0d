/**
 * A worker for remote task execution over the long-poll protocol.
 *
 * `new Worker(queue, handler, { concurrency: 4 }).run()` polls `queue`, runs up to `concurrency`
 * tasks at once, heartbeats each while its handler runs (every third of the task's `timeout`),
 * then completes it with the handler's return value or fails it with the thrown error's text
 * (retried by the server while attempts remain; throw {@link Permanent} to fail for good).
 *
 * - A `409` (or `404`) on a heartbeat means the attempt no longer belongs to this worker: the
 *   job's `signal` aborts, `job.lost` turns true, and the handler's outcome is dropped.
 * - `503`, `429`, `5xx` and connection errors back off exponentially (with jitter, up to
 *   `maxBackoffMs`) and retry: polls until the server is back, a finished task's outcome until
 *   its lease would have run out.
 * - SIGTERM and SIGINT (unless `handleSignals: false`) stop polling, let running handlers finish
 *   and report, then `run()` resolves. The poll in flight is awaited, not cut off (so no task the
 *   server has just handed out is dropped): stopping takes up to `pollWaitMs`.
 */

import { SundialClient, parseDuration } from "./client.js";
import type { ClientOptions } from "./client.js";
import { ApiError, Conflict, NotFound, isRetryable } from "./errors.js";
import type { PolledTask } from "./types.js";

/** Throw from a handler to fail the task for good (`dead`), without further attempts. */
export class Permanent extends Error {
  override name = "Permanent";
}

/** A task this worker runs: the polled task, and `signal`, aborted once the attempt is lost.
 * `traceparent` (and `tracestate`) is the W3C trace context the handler runs in (its delivery's,
 * for a traced task); a trace hook may set it to its own span's, which the worker sends with the
 * result. */
export type Job = PolledTask & {
  readonly signal: AbortSignal;
  readonly lost: boolean;
};

/** Runs the handler (`run`) within a trace: e.g. with OpenTelemetry, starts a span whose parent is
 * `job.traceparent`, sets `job.traceparent` to that span's, and calls `run` inside it. */
export type TraceHook = (job: Job, run: () => Promise<unknown>) => Promise<unknown>;

export type Handler = (job: Job) => unknown | Promise<unknown>;

export type WorkerOptions = ClientOptions & {
  /** Tasks run at once (default 1). */
  concurrency?: number;
  /** A client to use instead of one built from the options (it brings its own `namespace`). */
  client?: SundialClient;
  /** The worker's name, recorded on its tasks (default `node-<pid>`). */
  name?: string;
  /** Only tasks of these kinds. */
  kinds?: string[];
  /** How long one poll waits for work (default 5 s). */
  pollWaitMs?: number;
  /** Heartbeat period (default a third of each task's timeout). */
  heartbeatIntervalMs?: number;
  /** Longest pause between retries (default 10 s). */
  maxBackoffMs?: number;
  /** Stop on SIGTERM and SIGINT (default true). */
  handleSignals?: boolean;
  /** Where to say what went wrong (default `console.warn`). */
  log?: (message: string) => void;
  /** Runs each handler call within the task's trace (no tracing library is needed without it). */
  traceHook?: TraceHook;
};

const sleep = (ms: number, signal?: AbortSignal) =>
  new Promise<void>((resolve) => {
    if (signal?.aborted) return resolve();
    const t = setTimeout(done, ms);
    function done() {
      clearTimeout(t);
      signal?.removeEventListener("abort", done);
      resolve();
    }
    signal?.addEventListener("abort", done, { once: true });
  });

const jittered = (ms: number) => ms * (0.5 + Math.random() / 2);

type Outcome = { complete: true; result: unknown } | { complete: false; error: string; retryable: boolean };

/** Runs `handler` for the tasks of `queue`; see the module documentation. */
export class Worker {
  readonly client: SundialClient;
  readonly name: string;
  readonly concurrency: number;
  /** Outcomes so far: tasks completed, failed, and lost (taken back by the server). */
  readonly stats = { completed: 0, failed: 0, lost: 0 };
  private readonly stopping = new AbortController();
  private readonly running = new Set<Promise<void>>();
  private readonly options: WorkerOptions;
  private readonly log: (m: string) => void;

  constructor(
    readonly queue: string,
    readonly handler: Handler,
    options: WorkerOptions = {},
  ) {
    this.options = options;
    // A given client polls in its own namespace; a second one beside it would be ignored.
    if (options.client && options.namespace !== undefined) throw new RangeError("pass namespace to the client, not beside it");
    this.client = options.client ?? new SundialClient(options);
    this.concurrency = options.concurrency ?? 1;
    if (!(this.concurrency >= 1)) throw new RangeError("concurrency must be at least 1");
    this.name = options.name ?? `node-${typeof process !== "undefined" ? process.pid : "worker"}`;
    this.log = options.log ?? ((m) => console.warn(`sundial worker: ${m}`));
  }

  /** Ask the worker to stop: no new polls; running handlers finish and report. */
  stop(): void {
    this.stopping.abort();
  }

  /** Run until stopped (SIGTERM, SIGINT or {@link stop}). */
  async run(): Promise<void> {
    const onSignal = () => this.stop();
    const signals = this.options.handleSignals !== false && typeof process !== "undefined";
    if (signals) {
      process.on("SIGTERM", onSignal);
      process.on("SIGINT", onSignal);
    }
    try {
      await this.pollLoop();
      await Promise.allSettled([...this.running]);
    } finally {
      if (signals) {
        process.off("SIGTERM", onSignal);
        process.off("SIGINT", onSignal);
      }
    }
  }

  private nextBackoff(current: number): number {
    return Math.min(this.options.maxBackoffMs ?? 10_000, Math.max(100, current * 2));
  }

  private async pollLoop(): Promise<void> {
    const stop = this.stopping.signal;
    let backoff = 0;
    let slotFreed: () => void = () => {};
    while (!stop.aborted) {
      const free = this.concurrency - this.running.size;
      if (free <= 0) {
        await new Promise<void>((resolve) => {
          slotFreed = resolve;
          stop.addEventListener("abort", () => resolve(), { once: true });
        });
        continue;
      }
      let tasks: PolledTask[];
      try {
        tasks = await this.client.poll(this.queue, this.name, {
          max: free,
          wait: this.options.pollWaitMs ?? 5_000,
          kinds: this.options.kinds,
        });
      } catch (e) {
        if (!isRetryable(e)) throw e;
        backoff = this.nextBackoff(backoff);
        let delay = jittered(backoff);
        // The server's Retry-After, when it gave one, within the backoff's cap.
        if (e instanceof ApiError && e.retryAfterSeconds !== undefined) {
          delay = Math.max(delay, Math.min(e.retryAfterSeconds * 1000, this.options.maxBackoffMs ?? 10_000));
        }
        this.log(`poll failed (${(e as Error).message}); retrying in ${Math.round(delay)} ms`);
        await sleep(delay, stop);
        continue;
      }
      backoff = 0;
      for (const task of tasks) {
        const p: Promise<void> = this.runOne(task).finally(() => {
          this.running.delete(p);
          slotFreed();
        });
        this.running.add(p);
      }
    }
  }

  private async runOne(task: PolledTask): Promise<void> {
    const timeoutMs = parseDuration(task.timeout);
    const lostController = new AbortController();
    const job = Object.defineProperties(
      { ...task },
      {
        signal: { value: lostController.signal, enumerable: true },
        lost: { get: () => lostController.signal.aborted, enumerable: true },
      },
    ) as Job;
    let leaseUntil = Date.now() + timeoutMs;
    const interval = this.options.heartbeatIntervalMs ?? Math.max(timeoutMs / 3, 50);
    let beating = false;
    const beat = setInterval(async () => {
      if (beating || lostController.signal.aborted) return;
      beating = true;
      try {
        await this.client.heartbeat(task.id, task.execution_id);
        leaseUntil = Date.now() + timeoutMs;
      } catch (e) {
        if (e instanceof Conflict || e instanceof NotFound) {
          this.log(`task ${task.id}: heartbeat refused (${e.message}): stop working on it`);
          lostController.abort();
        } else {
          this.log(`task ${task.id}: heartbeat failed (${(e as Error).message}); retrying`);
        }
      } finally {
        beating = false;
      }
    }, interval);
    let outcome: Outcome;
    try {
      const run = async () => this.handler(job);
      const hook = this.options.traceHook;
      outcome = { complete: true, result: await (hook ? hook(job, run) : run()) };
    } catch (e) {
      if (e instanceof Permanent) outcome = { complete: false, error: e.message || e.name, retryable: false };
      else outcome = { complete: false, error: e instanceof Error ? e.stack ?? e.message : String(e), retryable: true };
    } finally {
      clearInterval(beat);
    }
    if (lostController.signal.aborted) {
      this.stats.lost++;
      this.log(`task ${task.id}: the attempt was taken back; its outcome is dropped`);
      return;
    }
    await this.report(job, outcome, () => leaseUntil);
  }

  private async report(task: Job, outcome: Outcome, leaseUntil: () => number): Promise<void> {
    let backoff = 0;
    for (;;) {
      try {
        if (outcome.complete) {
          await this.client.complete(task.id, task.execution_id, outcome.result, { traceparent: task.traceparent });
          this.stats.completed++;
        } else {
          await this.client.fail(task.id, task.execution_id, outcome.error, {
            retryable: outcome.retryable,
            traceparent: task.traceparent,
          });
          this.stats.failed++;
        }
        return;
      } catch (e) {
        if (e instanceof Conflict || e instanceof NotFound) {
          this.stats.lost++;
          this.log(`task ${task.id}: the server refused the outcome (${e.message})`);
          return;
        }
        if (!isRetryable(e) || Date.now() > leaseUntil()) {
          this.stats.lost++;
          this.log(`task ${task.id}: cannot report the outcome (${(e as Error).message}); giving up`);
          return;
        }
        backoff = this.nextBackoff(backoff);
        await sleep(jittered(backoff));
      }
    }
  }
}
