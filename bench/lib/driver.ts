// The measurement process: reads one Task, drives one system's Adapter
// through one scenario, prints one Result. Runs on Bun (Conveyor, bare SQL)
// and on Node (the peers), so it uses nothing runtime-specific, except one
// allocator figure of the rss scenario, read only under Bun.
//
// Timing rules, the same for every system:
// - throughput: jobs are pre-enqueued with the system's own batch API, then
//   the database is settled (CHECKPOINT, VACUUM ANALYZE). The clock runs from
//   the first handler call to the moment the last completion is durable
//   (committed to Postgres, or acknowledged by Redis), so connection set-up
//   and schema checks are reported separately as startupMs.
// - latency: one process enqueues one job at a time on a fixed schedule
//   (open loop: a slow enqueue does not delay the next one) with
//   performance.timeOrigin + performance.now() in the payload; the handler
//   subtracts it from the same clock. Also reported from the moment the
//   enqueue call returned (its commit acknowledged), which can be negative:
//   a worker woken by the commit may start before the client hears back.
// - rss: the process samples its own RSS on a timer while it drains a backlog.
import { readdirSync, readFileSync } from "node:fs";
import postgres from "postgres";
import { RESULT_PREFIX, type Result, type RssSample, type Task } from "./protocol.ts";
import { type ServerCpu, serverCpu } from "./server-cpu.ts";
import { round, roundAll, slope, summarize } from "./stats.ts";

export interface Payload {
  i: number;
  /** Enqueue time, ms on the epoch clock (latency runs). */
  t0?: number;
}

/** One system, as the driver sees it. Every method is that system's ordinary public API. */
export interface Adapter {
  /** Installs schema / queues. Untimed. */
  setup(): Promise<void>;
  /** Pre-enqueues jobs payload i = 0..n-1 with the system's batch API. Untimed. */
  preload(n: number): Promise<void>;
  enqueueOne(payload: Payload): Promise<void>;
  enqueueBatch(payloads: Payload[]): Promise<void>;
  /** Starts processing; `onStart` must be the first thing each handler does. */
  start(onStart: (payload: Payload) => void): Promise<void>;
  /** Resolves once n jobs' outcomes are durable (called after n handlers started). */
  waitCompleted(n: number): Promise<void>;
  close(): Promise<void>;
  /** True when jobs live in Postgres: the driver settles the database after the preload. */
  readonly postgres: boolean;
  /** Scenarios this adapter cannot run (e.g. the bare loop has no latency path). */
  readonly unsupported?: readonly Task["scenario"][];
  readonly notes?: string[];
}

/**
 * Connections the enqueuing side of every system gets (its own pool where the
 * library allows one), so that at 1,000 jobs/s one-per-call enqueues queue on
 * the commit, not on a small client pool.
 */
export const ENQUEUE_POOL = 20;

/** bench/stalls.ts's ways of issuing a job (bench/stalls-ab.ts checks its option against them too). */
export const STALLS_VARIANTS = ["bare", "row", "row-returning", "enqueue", "handoff"] as const;

export const nowMs = () => performance.timeOrigin + performance.now();
// setTimeout, not Bun.sleep: Bun.sleep returns at once for less than 1 ms.
export const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/**
 * Calls issue(0 .. count-1) on a fixed schedule, `rate` per second, open
 * loop: a slow call does not delay the next. Waits for every call; returns
 * the schedule's start and the time of the last issue (epoch ms).
 */
export async function openLoop(
  rate: number,
  count: number,
  issue: (i: number, at: number) => Promise<void>,
): Promise<{ begin: number; lastIssue: number }> {
  const interval = 1_000 / rate;
  const inflight: Promise<void>[] = [];
  const begin = nowMs();
  let issued = 0;
  let lastIssue = begin;
  while (issued < count) {
    const due = Math.min(count, Math.floor((nowMs() - begin) / interval) + 1);
    while (issued < due) {
      lastIssue = nowMs();
      inflight.push(issue(issued++, lastIssue));
    }
    const next = begin + issued * interval - nowMs();
    await sleep(Math.max(0, Math.min(next, 5)));
  }
  await Promise.all(inflight);
  return { begin, lastIssue };
}

/** Polls `check` every intervalMs until it returns true; throws after timeoutMs. */
export async function pollUntil(
  check: () => Promise<boolean> | boolean,
  intervalMs = 2,
  timeoutMs = 600_000,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`condition not met within ${timeoutMs} ms`);
    await sleep(intervalMs);
  }
}

/** A counter whose `reach(n)` resolves once it has been incremented n times. */
export function counter() {
  let value = 0;
  const waiters: { n: number; resolve: () => void }[] = [];
  return {
    get value() {
      return value;
    },
    add(k = 1) {
      value += k;
      for (let i = waiters.length - 1; i >= 0; i--) {
        const w = waiters[i] as { n: number; resolve: () => void };
        if (value >= w.n) {
          waiters.splice(i, 1);
          w.resolve();
        }
      }
    },
    reach(n: number): Promise<void> {
      if (value >= n) return Promise.resolve();
      return new Promise((resolve) => waiters.push({ n, resolve }));
    },
  };
}

export function readTask(): Task {
  const raw = process.env.BENCH_TASK;
  if (!raw) throw new Error("BENCH_TASK is not set: run measurements through bench/run.ts");
  return JSON.parse(raw) as Task;
}

/** Bun's version when running under Bun, else undefined. */
const bunVersion = (process.versions as Record<string, string | undefined>).bun;

export function runtimeName(): string {
  return bunVersion ? `bun ${bunVersion}` : `node ${process.versions.node}`;
}

/** Settles the database; returns the cluster's CPU sampler, if /proc shows it. */
export async function settle(url: string): Promise<ServerCpu | undefined> {
  // A checkpoint due to the preload's WAL would otherwise land inside the
  // measured window of some runs and not others; fresh statistics let the
  // planner see the preloaded rows.
  const sql = postgres(url, { max: 1, onnotice: () => {} });
  try {
    await sql`checkpoint`;
    await sql`vacuum analyze`;
    return await serverCpu(sql);
  } finally {
    await sql.end({ timeout: 5 });
  }
}

const payloads = (from: number, count: number): Payload[] =>
  Array.from({ length: count }, (_, k) => ({ i: from + k }));

/**
 * CPU ms so far of each live thread of this process, keyed by thread id:
 * its name and /proc's schedstat (nanoseconds on the CPU). Undefined
 * where /proc does not show them. Node and Bun children alike.
 */
function threadCpu(): Map<string, [string, number]> | undefined {
  const out = new Map<string, [string, number]>();
  try {
    for (const tid of readdirSync("/proc/self/task")) {
      try {
        const dir = `/proc/self/task/${tid}`;
        const name = readFileSync(`${dir}/comm`, "utf8")
          .trim()
          .replace(/[\s#]*\d+$/, "");
        const ns = Number(readFileSync(`${dir}/schedstat`, "utf8").split(" ")[0]);
        out.set(tid, [name, ns / 1e6]);
      } catch {
        // the thread ended between the listing and the read
      }
    }
  } catch {
    return undefined;
  }
  return out;
}

/** CPU ms by thread name between two threadCpu() readings; a thread born in between counts whole. */
function threadCpuBetween(
  before: Map<string, [string, number]> | undefined,
  after: Map<string, [string, number]> | undefined,
): Record<string, number> | undefined {
  if (!before || !after) return undefined;
  const by: Record<string, number> = {};
  for (const [tid, [name, ms]] of after) {
    by[name] = (by[name] ?? 0) + ms - (before.get(tid)?.[1] ?? 0);
  }
  for (const name of Object.keys(by)) by[name] = round(by[name] as number, 1);
  return by;
}

async function throughput(task: Task, a: Adapter): Promise<Result> {
  await a.setup();
  await a.preload(task.n);
  const server = a.postgres ? await settle(task.databaseUrl) : undefined;
  const started = counter();
  let first = 0;
  let cpuAtFirst = process.cpuUsage();
  let faultsAtFirst = process.resourceUsage().minorPageFault;
  let threadsAtFirst = threadCpu();
  let serverAtFirst = 0;
  const t0 = nowMs();
  await a.start(() => {
    if (started.value === 0) {
      // Before the clock starts: reading the threads takes a few hundred µs.
      threadsAtFirst = threadCpu();
      first = nowMs();
      cpuAtFirst = process.cpuUsage();
      faultsAtFirst = process.resourceUsage().minorPageFault;
      // About 0.2 ms, inside the window: the same for every PostgreSQL system.
      serverAtFirst = server?.sample() ?? 0;
    }
    started.add();
  });
  await started.reach(task.n);
  await a.waitCompleted(task.n);
  const end = nowMs();
  const cpu = process.cpuUsage(cpuAtFirst);
  const minorFaults = process.resourceUsage().minorPageFault - faultsAtFirst;
  const threads = threadCpuBetween(threadsAtFirst, threadCpu());
  const serverMs = server ? server.sample() - serverAtFirst : undefined;
  await a.close();
  const elapsedMs = end - first;
  return {
    jobsPerSec: round((task.n / elapsedMs) * 1000),
    elapsedMs: round(elapsedMs, 1),
    startupMs: round(first - t0, 1),
    cpuMs: round((cpu.user + cpu.system) / 1000, 1),
    systemCpuMs: round(cpu.system / 1000, 1),
    minorFaults,
    ...(serverMs === undefined ? {} : { serverCpuMs: round(serverMs, 1) }),
    ...(threads ? { threadCpuMs: threads } : {}),
    runtime: runtimeName(),
  };
}

async function latency(task: Task, a: Adapter): Promise<Result> {
  const rate = task.rate ?? 100;
  const warmup = task.warmup ?? 0;
  const total = warmup + task.n;
  await a.setup();
  // Every system starts from a fresh checkpoint: otherwise the dirty buffers
  // and WAL of the phase before (a 100,000-job ledger run writes gigabytes)
  // are flushed during whichever run comes next, and the commits it measures
  // wait behind that flush (enqueue-to-ack p99 of 40-170 ms in one full run,
  // in the first runs after the ledger phase; Redis systems share the disk).
  await settle(task.databaseUrl);
  // Handler start, enqueue call, enqueue acknowledged (commit), per job.
  const startAt = new Float64Array(total).fill(Number.NaN);
  const callAt = new Float64Array(total).fill(Number.NaN);
  const ackAt = new Float64Array(total).fill(Number.NaN);
  const started = counter();
  await a.start((p) => {
    if (p.t0 !== undefined && p.i >= 0) {
      startAt[p.i] = nowMs();
      callAt[p.i] = p.t0;
    }
    started.add();
  });
  // Let the worker reach its idle state (LISTEN connected, first empty fetch done).
  await sleep(1_000);
  // Open the enqueue pool's connections before the clock: ENQUEUE_POOL jobs
  // enqueued at once, through the system's own API. A pool opens its
  // connections lazily, under the first burst that needs them, and opening
  // them during the run (a server process, authentication, a driver's type
  // query each, on a busy machine) was the largest part of the 1,000/s p99
  // in development runs. Not timed; their handlers ignore them (i < 0).
  await Promise.all(Array.from({ length: ENQUEUE_POOL }, () => a.enqueueOne({ i: -1 })));
  await started.reach(ENQUEUE_POOL);
  await sleep(200);
  const errors: unknown[] = [];
  const { begin, lastIssue } = await openLoop(rate, total, (i, at) =>
    a.enqueueOne({ i, t0: at }).then(
      () => {
        ackAt[i] = nowMs();
      },
      (e) => void errors.push(e),
    ),
  );
  if (errors.length > 0) throw errors[0];
  await started.reach(ENQUEUE_POOL + total);
  await a.close();
  const fromCall: number[] = [];
  const fromAck: number[] = [];
  for (let i = warmup; i < total; i++) {
    fromCall.push((startAt[i] as number) - (callAt[i] as number));
    fromAck.push((startAt[i] as number) - (ackAt[i] as number));
  }
  return {
    ...roundAll(summarize(fromCall)),
    fromAck: roundAll(summarize(fromAck)),
    achievedRate: round(((total - 1) / (lastIssue - begin)) * 1000, 1),
    runtime: runtimeName(),
  };
}

async function enqueue(task: Task, a: Adapter): Promise<Result> {
  await a.setup();
  const batch = task.batchSize ?? 1_000;
  // Warm the connection pool and prepared statements; not counted.
  for (let i = 0; i < 20; i++) await a.enqueueOne({ i: -1 });
  if (task.enqueueMode === "batched") {
    await a.enqueueBatch(payloads(0, Math.min(batch, 100)));
    const t0 = nowMs();
    for (let i = 0; i < task.n; i += batch) {
      await a.enqueueBatch(payloads(i, Math.min(batch, task.n - i)));
    }
    const elapsed = nowMs() - t0;
    await a.close();
    return {
      jobsPerSec: round((task.n / elapsed) * 1000),
      elapsedMs: round(elapsed, 1),
      runtime: runtimeName(),
    };
  }
  const calls: number[] = [];
  const t0 = nowMs();
  for (let i = 0; i < task.n; i++) {
    const c0 = nowMs();
    await a.enqueueOne({ i });
    calls.push(nowMs() - c0);
  }
  const elapsed = nowMs() - t0;
  await a.close();
  return {
    jobsPerSec: round((task.n / elapsed) * 1000),
    elapsedMs: round(elapsed, 1),
    ...roundAll(summarize(calls)),
    runtime: runtimeName(),
  };
}

/**
 * Under Bun, a reader of the bytes its allocator (mimalloc) counts as
 * committed: its live allocations, what was freed and not yet purged, and
 * pages it purged but still counts (those leave RSS). A cheap call (about
 * 15 µs); `heapStats()` would also count every object, tens of ms on a full
 * heap.
 */
async function allocatorCommitted(): Promise<(() => number) | undefined> {
  if (!bunVersion) return undefined;
  const jsc = (await import("bun:jsc")) as { memoryUsage?: () => { currentCommit: number } };
  const read = jsc.memoryUsage;
  return read ? () => read().currentCommit : undefined;
}

async function rss(task: Task, a: Adapter): Promise<Result> {
  await a.setup();
  await a.preload(task.n);
  if (a.postgres) await settle(task.databaseUrl);
  const started = counter();
  const samples: RssSample[] = [];
  const committed = await allocatorCommitted();
  const mb = (bytes: number) => round(bytes / 1024 / 1024, 1);
  const t0 = nowMs();
  const sample = () => {
    const m = process.memoryUsage();
    samples.push({
      t: round(nowMs() - t0),
      rssMb: mb(m.rss),
      heapMb: mb(m.heapUsed),
      heapTotalMb: mb(m.heapTotal),
      externalMb: mb(m.external),
      ...(committed && { committedMb: mb(committed()) }),
      done: started.value,
    });
  };
  sample();
  const timer = setInterval(sample, task.sampleMs ?? 500);
  await a.start(() => started.add());
  await started.reach(task.n);
  await a.waitCompleted(task.n);
  const elapsed = nowMs() - t0;
  clearInterval(timer);
  sample();
  await a.close();
  // Start-up allocation (pools, JIT) is not growth: fit after the first 10%.
  const steady = samples.filter((s) => s.t >= elapsed * 0.1);
  const ts = steady.map((s) => s.t / 60_000);
  const ms = steady.map((s) => s.rssMb);
  return {
    jobsPerSec: round((task.n / elapsed) * 1000),
    elapsedMs: round(elapsed),
    rss: samples,
    maxRssMb: Math.max(...samples.map((s) => s.rssMb)),
    rssSlopeMbPerMin: round(slope(ts, ms), 2),
    rssSlopeMbPer100k: round(
      slope(
        steady.map((s) => s.done / 100_000),
        ms,
      ),
      2,
    ),
    runtime: runtimeName(),
  };
}

/** Entry point of every system file: build the adapter, run the task, print the result, exit. */
export async function runChild(build: (task: Task) => Promise<Adapter> | Adapter): Promise<void> {
  const task = readTask();
  const a = await build(task);
  if (a.unsupported?.includes(task.scenario)) {
    throw new Error(`${task.system} does not support scenario ${task.scenario}`);
  }
  const run = { throughput, latency, enqueue, rss }[task.scenario];
  const result = await run(task, a);
  if (a.notes) result.notes = a.notes;
  process.stdout.write(`${RESULT_PREFIX}${JSON.stringify(result)}\n`);
  // Some clients keep timers or sockets alive after close; the result is out.
  process.exit(0);
}

/** Top-level wrapper for system files: any failure exits non-zero with the stack on stderr. */
export function main(build: Parameters<typeof runChild>[0]): void {
  runChild(build).catch((error) => {
    process.stderr.write(
      `${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`,
    );
    process.exit(1);
  });
}
