// What the orchestrator (bench/run.ts) sends a measurement process and what
// that process sends back. Shared by Bun and Node children, so type-only.

export type Scenario = "throughput" | "latency" | "enqueue" | "rss";

export type SystemId =
  | "conveyor"
  | "conveyor-http"
  | "bare-sql"
  | "bare-sql-conveyor-schema"
  | "graphile-worker"
  | "pg-boss"
  | "bullmq-redis"
  | "bullmq-redis-aof"
  | "bullmq-postgres";

export type SettingValues = Record<string, number | string | boolean>;

/** One measurement: run in its own process, against a freshly reset database / Redis db. */
export interface Task {
  system: SystemId;
  scenario: Scenario;
  /** Name of the setting (a row of bench/plan.ts), and its values. */
  setting: string;
  settings: SettingValues;
  /** Postgres database of this run (dropped and created before it). */
  databaseUrl: string;
  /** Redis database of this run (flushed before it), for the BullMQ-on-Redis systems. */
  redisUrl?: string;
  /** throughput / rss / enqueue: number of jobs. */
  n: number;
  /** throughput: each job inserts a ledger row inside ctx.transaction (Conveyor, bare SQL). */
  ledger?: boolean;
  /** throughput: completed jobs inserted before the run (one insert ... generate_series). */
  finishedRows?: number;
  /** latency: jobs per second, enqueued one at a time on a fixed schedule. */
  rate?: number;
  /** latency: jobs not counted at the start of the run. */
  warmup?: number;
  /** enqueue: one job per call, or `batchSize` per call. */
  enqueueMode?: "single" | "batched";
  batchSize?: number;
  /** rss: sampling period. */
  sampleMs?: number;
}

export interface RssSample {
  /** ms since the worker started */
  t: number;
  rssMb: number;
  /**
   * The JavaScript heap in use (process.memoryUsage().heapUsed), MB: a step
   * of RSS that this does not take is the allocator's or native memory,
   * not live objects. Absent from files before it was recorded.
   */
  heapMb?: number;
  /** The JavaScript heap's capacity (process.memoryUsage().heapTotal), MB. */
  heapTotalMb?: number;
  /**
   * Memory held outside the JavaScript heap by its objects
   * (process.memoryUsage().external, which includes arrayBuffers under Bun
   * and Node), MB. The files of 2026-12-08 recorded external + arrayBuffers,
   * counting array buffers twice: there it is at most twice the true figure.
   */
  externalMb?: number;
  /**
   * Bytes the allocator (mimalloc, under Bun) counts as committed, MB: live
   * allocations, freed memory not yet purged, and purged pages it still
   * counts (which RSS no longer does). A step of RSS that this takes and
   * neither heap figure does is the allocator's. Absent under Node and from
   * files before it was recorded.
   */
  committedMb?: number;
  done: number;
}

export interface Result {
  /** throughput, enqueue, rss: jobs per second. */
  jobsPerSec?: number;
  elapsedMs?: number;
  /** throughput: from starting the worker to the first handler call (not counted in jobsPerSec). */
  startupMs?: number;
  /** throughput: CPU time this process used inside the measured window (user + system). */
  cpuMs?: number;
  /** throughput: the part of `cpuMs` spent in the kernel (system time). */
  systemCpuMs?: number;
  /**
   * throughput on PostgreSQL: CPU time of every process of the cluster inside
   * the same window (bench/lib/server-cpu.ts), when /proc shows them.
   */
  serverCpuMs?: number;
  /**
   * throughput: `cpuMs` by thread, in ms, when /proc shows this process's
   * threads: the main thread, JavaScriptCore's compilers (JITWorker), its
   * GC helpers (HeapHelper) and block warm-up (JSCWarmUp), the allocator's
   * scavenger, and so on, by the name each thread gives itself (trailing
   * digits dropped, so that numbered threads of one kind add up).
   */
  threadCpuMs?: Record<string, number>;
  /**
   * throughput: minor page faults this process took inside the measured
   * window (all threads). Where the kernel isolates page tables, each one
   * costs a kernel entry and exit on top of zeroing the page.
   */
  minorFaults?: number;
  /** latency (enqueue-to-start) and enqueue single (per call), in ms. */
  p50?: number;
  p95?: number;
  p99?: number;
  max?: number;
  mean?: number;
  samples?: number;
  /** latency: from the enqueue call's return (commit acknowledged) to handler start. */
  fromAck?: { p50: number; p95: number; p99: number; max: number; mean: number; samples: number };
  /** latency: the rate the schedule actually achieved. */
  achievedRate?: number;
  /** rss */
  rss?: RssSample[];
  maxRssMb?: number;
  /** MB per minute, least squares over the samples after the first 10% of the run. */
  rssSlopeMbPerMin?: number;
  /** MB per 100,000 jobs over the same samples. */
  rssSlopeMbPer100k?: number;
  runtime: string;
  notes?: string[];
}

export const RESULT_PREFIX = "@@result ";
