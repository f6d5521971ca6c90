export type { Db, Lease, Pool } from "./db/db.ts";
export { MIGRATIONS, migrate } from "./db/migrate.ts";
export { reapExpiredLeases } from "./db/reap.ts";
export {
  DEFAULT_MAX_ATTEMPTS,
  DEFAULT_QUEUE,
  type EnqueueInput,
  type EnqueueOptions,
  type EnqueueResult,
  enqueue,
  enqueueMany,
} from "./enqueue.ts";
export * from "./errors.ts";
export { type ConveyorEvents, createEvents, type Events } from "./events.ts";
export {
  cancel,
  type Handler,
  type HandlerOutcome,
  type HandlerSpec,
  type JobContext,
  snooze,
  type TransactionOptions,
} from "./handler.ts";
export { type AttemptError, JOB_STATES, type Job, type JobState } from "./job.ts";
export type { JsonValue } from "./json.ts";
export { jsonLogger, type Logger, silentLogger } from "./logger.ts";
export { definePlugin, type PayloadSchema, type Plugin } from "./plugins/plugin.ts";
export { type BackoffPolicy, DEFAULT_BACKOFF, retryDelayMs } from "./retry.ts";
export { createReaper } from "./worker/reaper.ts";
export {
  createWorker,
  type QueueOptions,
  type Worker,
  type WorkerOptions,
} from "./worker/worker.ts";
