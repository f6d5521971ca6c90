// What `npm run bench` measures: the systems, the settings tried for each,
// and the sizes of each scenario for the full and the quick profile.
//
// Settings are what a competent user would pick for throughput, from each
// project's own documentation; the README explains each one. A system's
// figure is the median over repetitions of its best setting at that size.
import type { SettingValues, SystemId } from "./lib/protocol.ts";

export type Runtime = "bun" | "node";

export interface SystemSpec {
  id: SystemId;
  label: string;
  runtime: Runtime;
  /** Script under bench/systems/. */
  file: string;
  /** No-op throughput settings. */
  settings: Record<string, SettingValues>;
  /** Settings for throughput with a ledger insert per job (only systems that can do it transactionally). */
  ledgerSettings?: Record<string, SettingValues>;
  /** Runs the no-op throughput phase (default true). */
  throughput?: boolean;
  latency: boolean;
  enqueue: boolean;
  /** Needs the machine's Redis, or the private durable one. */
  redis?: "machine" | "durable";
}

const grid = (loops: number[], batches: number[]) =>
  Object.fromEntries(
    loops.flatMap((l) =>
      batches.map((b) => [`l${l}-b${b}`, { loops: l, batch: b, poolMax: l + 1 }]),
    ),
  );

const bullmqSettings = (pool: boolean) => ({
  c50: { concurrency: 50, ...(pool ? { poolMax: 10 } : {}) },
  c200: { concurrency: 200, ...(pool ? { poolMax: 20 } : {}) },
  c1000: { concurrency: 1000, ...(pool ? { poolMax: 40 } : {}) },
});

export const SYSTEMS: SystemSpec[] = [
  {
    id: "conveyor",
    label: "Conveyor",
    runtime: "bun",
    file: "conveyor.ts",
    settings: {
      c100: { concurrency: 100, poolMax: 10 },
      "c2000-b1000": { concurrency: 2000, fetchBatch: 1000, poolMax: 20 },
      "c4000-b2000": { concurrency: 4000, fetchBatch: 2000, poolMax: 20 },
    },
    ledgerSettings: {
      "c200-e2": { concurrency: 200, poolMax: 10, effectConcurrency: 2 },
      "c500-e4": { concurrency: 500, fetchBatch: 250, poolMax: 10, effectConcurrency: 4 },
      "c1000-e8": { concurrency: 1000, fetchBatch: 500, poolMax: 20, effectConcurrency: 8 },
      "c1000-e16": { concurrency: 1000, fetchBatch: 500, poolMax: 30, effectConcurrency: 16 },
      // The same as c1000-e8 with a savepoint per job from the start: what the
      // default's optimistic first pass saves.
      "c1000-e8-sp": {
        concurrency: 1000,
        fetchBatch: 500,
        poolMax: 20,
        effectConcurrency: 8,
        effectIsolation: "savepoint",
      },
      // The handler declares its insert independent (ctx.transaction(fn,
      // { independent: true })): a group's fns run at once, their inserts
      // pipelined on the transaction's connection.
      "c500-e4-ind": {
        concurrency: 500,
        fetchBatch: 250,
        poolMax: 10,
        effectConcurrency: 4,
        independent: true,
      },
      "c1000-e8-ind": {
        concurrency: 1000,
        fetchBatch: 500,
        poolMax: 20,
        effectConcurrency: 8,
        independent: true,
      },
    },
    latency: true,
    enqueue: true,
  },
  {
    id: "conveyor-http",
    label: "Conveyor over HTTP (createApi + typed client)",
    runtime: "bun",
    file: "conveyor.ts",
    settings: { default: { concurrency: 100 } },
    throughput: false,
    latency: false,
    enqueue: true,
  },
  {
    id: "bare-sql",
    label: "bare SQL loop (ceiling)",
    runtime: "bun",
    file: "bare-sql.ts",
    // l8 and b100 never led in development runs (no results file kept); trimmed to fit a run in an hour.
    settings: grid([1, 2, 4], [500, 1000]),
    ledgerSettings: {
      "l2-b500": { loops: 2, batch: 500, poolMax: 3 },
      "l4-b500": { loops: 4, batch: 500, poolMax: 5 },
      "l4-b1000": { loops: 4, batch: 1000, poolMax: 5 },
    },
    latency: false,
    enqueue: true,
  },
  {
    id: "bare-sql-conveyor-schema",
    label: "bare SQL loop on Conveyor's table and statements",
    runtime: "bun",
    file: "bare-sql.ts",
    settings: grid([2, 4], [500, 1000]),
    latency: false,
    enqueue: false,
  },
  {
    id: "graphile-worker",
    label: "graphile-worker",
    runtime: "node",
    file: "graphile-worker.ts",
    settings: {
      c24: { concurrency: 24, maxPoolSize: 25 },
      "c24-lq500-batch0": {
        concurrency: 24,
        maxPoolSize: 25,
        localQueueSize: 500,
        completeJobBatchDelay: 0,
        failJobBatchDelay: 0,
      },
      "c100-lq1000-batch0": {
        concurrency: 100,
        maxPoolSize: 25,
        localQueueSize: 1000,
        completeJobBatchDelay: 0,
        failJobBatchDelay: 0,
      },
    },
    latency: true,
    enqueue: true,
  },
  {
    id: "pg-boss",
    label: "pg-boss",
    runtime: "node",
    file: "pg-boss.ts",
    settings: {
      "b50-lc2": { batchSize: 50, localConcurrency: 2, poolMax: 10 },
      "b200-lc4": { batchSize: 200, localConcurrency: 4, poolMax: 10 },
      "b1000-lc2": { batchSize: 1000, localConcurrency: 2, poolMax: 10 },
    },
    latency: true,
    enqueue: true,
  },
  {
    id: "bullmq-redis",
    label: "BullMQ on Redis (machine's Redis, its persistence)",
    runtime: "node",
    file: "bullmq.ts",
    settings: bullmqSettings(false),
    latency: true,
    enqueue: true,
    redis: "machine",
  },
  {
    id: "bullmq-redis-aof",
    label: "BullMQ on Redis, appendfsync always",
    runtime: "node",
    file: "bullmq.ts",
    settings: bullmqSettings(false),
    latency: true,
    enqueue: true,
    redis: "durable",
  },
  {
    id: "bullmq-postgres",
    label: "BullMQ on PostgreSQL (createPostgresBackend)",
    runtime: "node",
    file: "bullmq.ts",
    settings: bullmqSettings(true),
    latency: true,
    enqueue: true,
  },
];

export interface Profile {
  name: "full" | "quick";
  reps: number;
  throughputN: number[];
  ledgerN: number[];
  latency: { rate: number; n: number; warmup: number }[];
  enqueueSingleN: number;
  enqueueBatched: { n: number; batchSize: number };
  /** Conveyor with this many completed rows already in the table, at size n. */
  scale: { finishedRows: number; n: number };
  rssBacklog: number;
  /** Throughput size whose best setting each system uses for latency, scale and RSS. */
  referenceN: number;
}

export const FULL: Profile = {
  name: "full",
  reps: 3,
  throughputN: [500, 10_000, 100_000],
  ledgerN: [10_000, 100_000],
  latency: [
    { rate: 100, n: 1_000, warmup: 100 },
    { rate: 1_000, n: 5_000, warmup: 500 },
  ],
  enqueueSingleN: 2_000,
  enqueueBatched: { n: 100_000, batchSize: 1_000 },
  scale: { finishedRows: 1_000_000, n: 10_000 },
  rssBacklog: 1_000_000,
  referenceN: 10_000,
};

export const QUICK: Profile = {
  name: "quick",
  reps: 1,
  throughputN: [500, 2_000],
  ledgerN: [2_000],
  latency: [
    { rate: 100, n: 200, warmup: 20 },
    { rate: 1_000, n: 1_000, warmup: 100 },
  ],
  enqueueSingleN: 500,
  enqueueBatched: { n: 10_000, batchSize: 1_000 },
  scale: { finishedRows: 100_000, n: 2_000 },
  rssBacklog: 20_000,
  referenceN: 2_000,
};

/** Hard limit of one measurement process. */
export function timeLimitMs(n: number): number {
  return 60_000 + n * 2;
}
