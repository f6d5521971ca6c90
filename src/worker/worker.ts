// Worker: composes one process's loops over one pool — a producer per queue,
// the executor, the completer, the heartbeat, optionally the reaper — and
// drains them on stop.
import { hostname } from "node:os";
import { z } from "zod";
import { ping } from "../db/admin.ts";
import type { Pool } from "../db/db.ts";
import { onHandOff } from "../db/handoff.ts";
import { releaseJobs } from "../db/lease.ts";
import { QUEUE_NAME_RE } from "../enqueue.ts";
import { ShutdownError } from "../errors.ts";
import { createEvents, type Events } from "../events.ts";
import type { Handler, HandlerSpec } from "../handler.ts";
import { jsonLogger, type Logger } from "../logger.ts";
import { DEFAULT_BACKOFF } from "../retry.ts";
import { parseOrThrow } from "../validate.ts";
import { createCompleter } from "./completer.ts";
import { createEffectRunner, EFFECT_GROUP_MAX, EFFECT_ISOLATION } from "./effects.ts";
import { abortExecution, doneOf, type Execution } from "./execution.ts";
import { createExecutor } from "./executor.ts";
import { createHeartbeat } from "./heartbeat.ts";
import { DB_CALL_DEADLINE_MS, withDeadline } from "./loop.ts";
import { createProducer, type Producer } from "./producer.ts";
import { createReaper } from "./reaper.ts";
import { listenForJobs, type Wakeup } from "./wakeup.ts";

export const DEFAULT_CONCURRENCY = 10;
export const DEFAULT_LEASE_MS = 30_000;
export const DEFAULT_POLL_INTERVAL_MS = 1_000;
export const DEFAULT_GRACE_MS = 10_000;
export const DEFAULT_EFFECT_BATCH = 50;
export const DEFAULT_EFFECT_CONCURRENCY = 4;
/**
 * Jobs leased per fetch, by default min(concurrency, DEFAULT_FETCH_BATCH).
 * Bigger fetches cost fewer statements per job: at 10,000 and 100,000 no-op
 * jobs, concurrency 1,000 with fetches of 1,000 ran 13-17% faster than with
 * fetches of 500 (2 cores, fsync on, same hour); 2,000 was no better than
 * 1,000. The cap keeps one fetch's reply and its completion statement to a
 * few hundred kilobytes.
 */
export const DEFAULT_FETCH_BATCH = 1_000;
export const MAX_FETCH_BATCH = 2_000;

/** The jobs one fetch leases: the queue's fetchBatch, else min(concurrency, DEFAULT_FETCH_BATCH). */
export function fetchBatchOf(q: { concurrency: number; fetchBatch?: number | undefined }): number {
  return q.fetchBatch ?? Math.min(q.concurrency, DEFAULT_FETCH_BATCH);
}
/** After the grace period, how long stop() waits for outcomes already produced to be written. */
export const FINAL_FLUSH_MS = 10_000;

export const backoffSchema = z
  .object({
    baseMs: z.number().positive(),
    maxMs: z.number().positive(),
    factor: z.number().min(1),
    jitter: z.number().min(0).max(1),
  })
  .partial()
  .strict();

export const queueOptionsSchema = z
  .object({
    concurrency: z.number().int().min(1).max(10_000).default(DEFAULT_CONCURRENCY),
    /** Jobs leased per round trip; default min(concurrency, DEFAULT_FETCH_BATCH). */
    fetchBatch: z.number().int().min(1).max(MAX_FETCH_BATCH).optional(),
    leaseMs: z.number().int().min(100).max(86_400_000).default(DEFAULT_LEASE_MS),
    /** Retry delays for this queue; overrides the worker's, overridden by a kind's. */
    backoff: backoffSchema.optional(),
  })
  .strict();
export type QueueOptions = z.input<typeof queueOptionsSchema>;

const handlerSpecSchema = z.union([
  z.function(),
  z
    .object({
      handler: z.function(),
      timeoutMs: z.number().int().positive().optional(),
      backoff: backoffSchema.optional(),
    })
    .strict(),
]);

export const workerOptionsSchema = z
  .object({
    sql: z.custom<Pool>((v) => typeof v === "function", "a postgres.js pool"),
    queues: z
      .record(z.string().regex(QUEUE_NAME_RE, "invalid queue name"), queueOptionsSchema)
      .refine((q) => Object.keys(q).length > 0, "at least one queue"),
    handlers: z
      .record(z.string().min(1), handlerSpecSchema)
      .refine((h) => Object.keys(h).length > 0, "at least one handler"),
    owner: z.string().min(1).max(200).optional(),
    heartbeatMs: z.number().int().min(10).optional(),
    pollIntervalMs: z.number().int().min(10).default(DEFAULT_POLL_INTERVAL_MS),
    /** Run the reaper in this worker (default). Any number of processes may. */
    reaper: z
      .union([z.literal(false), z.object({ intervalMs: z.number().int().min(10) })])
      .optional(),
    backoff: backoffSchema.optional(),
    /** LISTEN for enqueue notifications (default true); polling alone otherwise. */
    listen: z.boolean().default(true),
    /**
     * Take jobs this process enqueues on a pool to the same database while
     * idle, leased by the insert itself, with no fetch (default true;
     * src/db/handoff.ts).
     */
    handOff: z.boolean().default(true),
    /**
     * Wait for each batch of plain completions to reach the disk before
     * reporting its jobs completed (default true). False commits the batch
     * with synchronous_commit off: a Postgres crash in the moment after can
     * undo it, which runs those jobs again (src/db/outcome.ts).
     */
    durableCompletions: z.boolean().default(true),
    /**
     * ctx.transaction(): most jobs whose effects share one transaction, 1 for
     * a transaction per job. One commit is one WAL flush, so sharing is what
     * lets effects run faster than the disk flushes.
     */
    effectBatch: z.number().int().min(1).max(EFFECT_GROUP_MAX).default(DEFAULT_EFFECT_BATCH),
    /** ctx.transaction(): shared transactions in flight at once, each holding a connection. */
    effectConcurrency: z.number().int().min(1).max(64).default(DEFAULT_EFFECT_CONCURRENCY),
    /**
     * ctx.transaction(): "rerun" (default) runs a shared transaction's fns with
     * no savepoint and, if one fails, rolls back and runs the group again with
     * a savepoint each (a fn may run twice); "savepoint" gives each fn its
     * savepoint from the start (each runs once, at a subtransaction per job).
     */
    effectIsolation: z.enum(EFFECT_ISOLATION).default("rerun"),
    /**
     * ctx.transaction(): longest a shared transaction may take, its fns
     * included. Past it the transaction is abandoned (it sends no COMMIT any
     * more, and the server ends it once idle that long) and its jobs fail
     * and retry.
     */
    effectTimeoutMs: z.number().int().min(100).max(86_400_000).default(DB_CALL_DEADLINE_MS),
    /** How long any one database call may take before the loop waiting for it moves on. */
    callDeadlineMs: z.number().int().min(100).max(600_000).optional(),
    logger: z.custom<Logger>().optional(),
    events: z.custom<Events>().optional(),
  })
  .strict();

export type WorkerOptions = Omit<z.input<typeof workerOptionsSchema>, "handlers"> & {
  // biome-ignore lint/suspicious/noExplicitAny: each handler types its own payload.
  handlers: Record<string, Handler<any> | HandlerSpec<any>>;
};

export interface WorkerStats {
  running: number;
  pendingCompletions: number;
  completed: number;
  failed: number;
  /** Fenced writes that matched 0 rows: a zombie's writes, rejected. */
  staleWrites: number;
  reaped: number;
}

export interface Worker {
  readonly owner: string;
  readonly events: Events;
  start(): Promise<void>;
  /** Stops fetching, waits up to graceMs for running jobs, then aborts and releases the rest. Idempotent. */
  stop(opts?: { graceMs?: number }): Promise<void>;
  stats(): WorkerStats;
  /** Wakes the producers of these queues (or all): the same as a notification. */
  wake(queue?: string): void;
}

/** How long start() waits for its connections before it starts the loops anyway. */
export const OPEN_CONNECTIONS_DEADLINE_MS = 2_000;

export function defaultOwner(): string {
  return `${hostname()}:${process.pid}:${Math.random().toString(36).slice(2, 8)}`;
}

export function createWorker(options: WorkerOptions): Worker {
  const o = parseOrThrow(workerOptionsSchema, options, "worker");
  const owner = o.owner ?? defaultOwner();
  const logger = (o.logger ?? jsonLogger()).child({ component: "worker", owner });
  const events =
    o.events ?? createEvents((name, error) => logger.warn("event listener threw", { name, error }));
  const sql = o.sql;
  const running = new Map<string, Execution>();
  const handlers = new Map<string, HandlerSpec>();
  for (const [kind, h] of Object.entries(options.handlers)) {
    handlers.set(kind, typeof h === "function" ? { handler: h } : h);
  }
  const kinds = [...handlers.keys()];
  const completer = createCompleter(sql, owner, logger.child({ component: "completer" }), {
    deadlineMs: o.callDeadlineMs,
    // No fetch in flight: two completion batches may go (COMPLETER_IDLE_BATCHES).
    fetchIdle: () => {
      for (const p of producers.values()) if (p.fetching > 0) return false;
      return true;
    },
    durable: o.durableCompletions,
  });
  const effects = createEffectRunner({
    sql,
    owner,
    maxGroup: o.effectBatch,
    concurrency: o.effectConcurrency,
    isolation: o.effectIsolation,
    timeoutMs: o.effectTimeoutMs,
  });
  const execute = createExecutor({
    sql,
    owner,
    handlers,
    completer,
    effects,
    running,
    backoff: { ...DEFAULT_BACKOFF, ...o.backoff },
    queueBackoff: new Map(
      Object.entries(o.queues).flatMap(([q, c]) => (c.backoff ? [[q, c.backoff]] : [])),
    ),
    events,
    logger,
    ...(o.callDeadlineMs ? { deadlineMs: o.callDeadlineMs } : {}),
  });
  const queueEntries = Object.entries(o.queues);
  const minLease = Math.min(...queueEntries.map(([, q]) => q.leaseMs));
  const producers = new Map<string, Producer>(
    queueEntries.map(([queue, q]) => [
      queue,
      createProducer({
        sql,
        queue,
        owner,
        kinds,
        concurrency: q.concurrency,
        fetchBatch: fetchBatchOf(q),
        leaseMs: q.leaseMs,
        pollIntervalMs: o.pollIntervalMs,
        execute,
        logger: logger.child({ queue }),
        events,
        ...(o.callDeadlineMs ? { deadlineMs: o.callDeadlineMs } : {}),
      }),
    ]),
  );
  const heartbeat = createHeartbeat({
    sql,
    owner,
    running,
    intervalMs: o.heartbeatMs ?? Math.max(10, Math.floor(minLease / 3)),
    logger,
    events,
    ...(o.callDeadlineMs ? { deadlineMs: o.callDeadlineMs } : {}),
  });
  const reaper =
    o.reaper === false
      ? undefined
      : createReaper({ sql, intervalMs: o.reaper?.intervalMs, logger, events });
  const counts = { completed: 0, failed: 0, staleWrites: 0, reaped: 0 };
  events.on("job:completed", () => counts.completed++);
  events.on("job:failed", () => counts.failed++);
  events.on("lease:lost", () => counts.staleWrites++);
  events.on("lease:reaped", () => counts.reaped++);
  let wakeup: Wakeup | undefined;
  let offHandOff: (() => void) | undefined;
  let stopping: Promise<void> | undefined;
  let started = false;

  const wake = (queue?: string) => {
    if (queue === undefined) for (const p of producers.values()) p.wake();
    else producers.get(queue)?.wake();
  };

  async function drain(graceMs: number) {
    offHandOff?.();
    await Promise.all([...producers.values()].map((p) => p.stop()));
    await wakeup?.stop();
    const waitAll = () => Promise.all([...running.values()].map(doneOf));
    let timer: ReturnType<typeof setTimeout> | undefined;
    await Promise.race([waitAll(), new Promise((r) => (timer = setTimeout(r, graceMs)))]);
    clearTimeout(timer);
    const left = [...running.values()].filter((e) => !e.finishing && !e.committed);
    if (left.length > 0) {
      logger.warn("grace period over; aborting and releasing jobs", { count: left.length });
      const releasable = left.filter((e) => !e.inTransaction);
      for (const e of left) abortExecution(e, new ShutdownError());
      for (const e of releasable) e.released = true;
      try {
        const released = await releaseJobs(
          sql,
          owner,
          releasable.map((e) => e.lease),
        );
        for (const id of released) events.emit("job:released", { jobId: id });
      } catch (error) {
        logger.error("could not release leases; the reaper will take them back", { error });
      }
    }
    // Let outcome writes already under way land.
    await Promise.race([
      Promise.all([...running.values()].filter((e) => e.finishing).map(doneOf)),
      Bun.sleep(5_000),
    ]);
    // Bounded: with the database unreachable, completions would retry for
    // minutes. What is not written by then reruns after its lease expires.
    await withDeadline(
      Promise.all([completer.flush(), heartbeat.stop(), reaper?.stop()]),
      "final completions",
      FINAL_FLUSH_MS,
    ).catch((error) =>
      logger.warn("stopping without writing every outcome; those jobs will rerun", { error }),
    );
  }

  /**
   * Opens, before the first fetch, the pool connections the no-op pipeline
   * keeps busy at once: each queue's fetch, a completion batch, and one for
   * the loops beside them (reaper, heartbeat, hand-off). Opened lazily
   * instead, the first completion batch found the only open connection busy
   * with the second fetch and waited for a new one, its SCRAM handshake on
   * our CPU, its backend's start and the statement's first parse, all inside
   * the first batch (30-40 ms of a 250 ms run of 10,000 jobs). Effect
   * transactions open theirs when first used: opening those too (four more
   * by default) cost 90 ms at start and no throughput, and its 1,000/s
   * latency runs had the worse p99 (medians 7.7 against 6.2 ms, noisy).
   * Best effort: a database that is not there yet fails the loops' own
   * calls, which retry.
   */
  const openPipelineConnections = async () => {
    const max = Number((sql as { options?: { max?: number } }).options?.max ?? 1);
    const want = Math.min(max, producers.size + 2);
    await withDeadline(
      Promise.all(Array.from({ length: want }, () => ping(sql))),
      "opening connections",
      OPEN_CONNECTIONS_DEADLINE_MS,
    ).catch(() => {});
  };

  return {
    owner,
    events,
    async start() {
      if (started) return;
      started = true;
      if (o.listen) {
        wakeup = listenForJobs(
          sql,
          (queue) => wake(queue),
          () => wake(),
          logger,
        );
      }
      await openPipelineConnections();
      // stop() while the connections opened: start nothing.
      if (stopping) return;
      heartbeat.start();
      reaper?.start();
      for (const p of producers.values()) p.start();
      if (o.handOff) {
        offHandOff = onHandOff(sql, (queue, kind) => producers.get(queue)?.takeHandOff(kind));
      }
      logger.info("worker started", {
        queues: Object.fromEntries(queueEntries.map(([q, c]) => [q, c.concurrency])),
        kinds,
      });
    },
    stop(opts = {}) {
      stopping ??= drain(opts.graceMs ?? DEFAULT_GRACE_MS).then(() =>
        logger.info("worker stopped"),
      );
      return stopping;
    },
    stats: () => ({ running: running.size, pendingCompletions: completer.pending, ...counts }),
    wake,
  };
}
