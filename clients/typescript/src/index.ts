/**
 * Sundial's TypeScript client: {@link SundialClient} (tasks, batches, schedules, workflows with
 * automatic paging), a long-poll {@link Worker}, typed errors, and {@link verifySignature} for push
 * deliveries. No runtime dependency beyond the platform's `fetch` and Web Crypto (Node.js 20+).
 */

export * from "./client.js";
export * from "./errors.js";
export * from "./types.js";
export * from "./webhooks.js";
export * from "./worker.js";
export type { components, paths } from "./openapi.js";
