// What the benchmark runs against, started and reset by the orchestrator:
// one embedded PostgreSQL 18 cluster with one set of settings for every
// system, the machine's Redis (one dedicated db index), and optionally a
// private Redis with an fsync-per-write append-only file.

import { chmod, mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { RedisClient, type Subprocess, spawnSync } from "bun";
import postgres from "postgres";
import {
  type EmbeddedCluster,
  freePort,
  startEmbeddedPostgres,
} from "../../src/embedded-postgres.ts";
import { ENQUEUE_POOL, openLoop } from "./driver.ts";
import { round, summarize } from "./stats.ts";

/**
 * The same for every system. Durability stays at PostgreSQL's defaults
 * (fsync, synchronous_commit, full_page_writes on): each commit waits for its
 * WAL flush. Memory and checkpoint spacing are sized for the 24 GB machine so
 * a 100k run is not cut by a size-triggered checkpoint.
 */
export const PG_SETTINGS = {
  fsync: "on",
  synchronous_commit: "on",
  full_page_writes: "on",
  shared_buffers: "2GB",
  effective_cache_size: "8GB",
  work_mem: "16MB",
  maintenance_work_mem: "256MB",
  max_wal_size: "8GB",
  checkpoint_timeout: "15min",
  max_connections: 400,
} as const;

export const BENCH_DB = "bench";

export interface BenchPostgres {
  cluster: EmbeddedCluster;
  /** Connection string of the per-run database. */
  url: string;
  reset(): Promise<void>;
  version(): Promise<string>;
  /** Median and p99 ms of single-row insert commits on one connection: the disk's fsync cost. */
  commitLatency(count?: number): Promise<{ p50: number; p99: number }>;
  /**
   * The same commit issued on a schedule, as the latency phase enqueues
   * (open loop, `rate` per second, from a pool like its clients'): the floor
   * of any enqueue that is durable before it is acknowledged.
   */
  commitLatencyAt(rate: number, count: number): Promise<{ p50: number; p99: number }>;
  stop(): Promise<void>;
}

/** `extra` adds settings for a tool that needs them (a preloaded extension, say). */
export async function startBenchPostgres(
  extra: Record<string, string | number> = {},
): Promise<BenchPostgres> {
  const dir = await mkdtemp(path.join(tmpdir(), "conveyor-bench-"));
  // The server runs as user postgres when we are root: the folder must be searchable.
  await chmod(dir, 0o755);
  const cluster = await startEmbeddedPostgres({
    dataDir: path.join(dir, "pg"),
    settings: { ...PG_SETTINGS, ...extra },
  });
  const admin = postgres(cluster.url, { max: 1, onnotice: () => {} });
  const reset = async () => {
    await admin.unsafe(`drop database if exists ${BENCH_DB} with (force)`);
    await admin.unsafe(`create database ${BENCH_DB}`);
  };
  /**
   * One-row insert commits into a fresh table from a pool of `max`, timed;
   * `schedule` decides when each is issued (`untimed` issues one unmeasured).
   */
  const timeCommits = async (
    max: number,
    schedule: (commit: () => Promise<void>, untimed: () => Promise<unknown>) => Promise<void>,
  ) => {
    await reset();
    const db = postgres(cluster.urlFor(BENCH_DB), { max, onnotice: () => {} });
    try {
      await db`create table commit_probe (id bigint generated always as identity, at timestamptz default now())`;
      const insert = () => db`insert into commit_probe default values`;
      const times: number[] = [];
      await schedule(async () => {
        const t = performance.now();
        await insert();
        times.push(performance.now() - t);
      }, insert);
      const s = summarize(times);
      return { p50: round(s.p50, 3), p99: round(s.p99, 3) };
    } finally {
      await db.end({ timeout: 5 });
    }
  };
  return {
    cluster,
    url: cluster.urlFor(BENCH_DB),
    reset,
    async version() {
      const [r] = await admin`show server_version`;
      return String(r?.server_version);
    },
    commitLatency: (count = 200) =>
      timeCommits(1, async (commit) => {
        for (let i = 0; i < count; i++) await commit();
      }),
    commitLatencyAt: (rate, count) =>
      timeCommits(ENQUEUE_POOL, async (commit, untimed) => {
        // Every connection opened before the clock starts.
        await Promise.all(Array.from({ length: ENQUEUE_POOL }, untimed));
        await openLoop(rate, count, commit);
      }),
    async stop() {
      await admin.end({ timeout: 5 });
      await cluster.stop("fast");
      await rm(dir, { recursive: true, force: true });
    },
  };
}

export interface BenchRedis {
  url: string;
  reset(): Promise<void>;
  describe(): Promise<Record<string, string>>;
  stop(): Promise<void>;
}

async function redisInfo(client: RedisClient): Promise<Record<string, string>> {
  const info = String(await client.send("INFO", ["server"]));
  const version = /redis_version:(\S+)/.exec(info)?.[1] ?? "unknown";
  const get = async (key: string) => {
    const r = (await client.send("CONFIG", ["GET", key])) as unknown;
    if (Array.isArray(r)) return String(r[1] ?? "");
    if (r && typeof r === "object") return String((r as Record<string, unknown>)[key] ?? "");
    return "";
  };
  return {
    version,
    appendonly: await get("appendonly"),
    appendfsync: await get("appendfsync"),
    save: await get("save"),
  };
}

/** The machine's Redis; only `url`'s db index is ever flushed. */
export async function connectRedis(url: string): Promise<BenchRedis> {
  const client = new RedisClient(url);
  await client.send("PING", []);
  return {
    url,
    reset: async () => {
      await client.send("FLUSHDB", []);
    },
    describe: () => redisInfo(client),
    async stop() {
      client.close();
    },
  };
}

/**
 * A private redis-server with appendonly yes / appendfsync always: every write
 * is fsynced before it is acknowledged, the durability Postgres gives the
 * other systems. Undefined when redis-server is not installed.
 */
export async function startDurableRedis(): Promise<BenchRedis | undefined> {
  const which = spawnSync(["which", "redis-server"]);
  if (which.exitCode !== 0) return undefined;
  const bin = which.stdout.toString().trim();
  const dir = await mkdtemp(path.join(tmpdir(), "conveyor-bench-redis-"));
  const port = await freePort();
  const proc: Subprocess = Bun.spawn(
    [
      bin,
      "--port",
      String(port),
      "--bind",
      "127.0.0.1",
      "--dir",
      dir,
      "--appendonly",
      "yes",
      "--appendfsync",
      "always",
      "--save",
      "",
      "--protected-mode",
      "no",
    ],
    { stdout: "ignore", stderr: "ignore" },
  );
  process.once("exit", () => proc.kill("SIGKILL"));
  const url = `redis://127.0.0.1:${port}/0`;
  const deadline = Date.now() + 10_000;
  for (;;) {
    try {
      const r = await connectRedis(url);
      return {
        ...r,
        async stop() {
          await r.stop();
          proc.kill("SIGTERM");
          await proc.exited;
          await rm(dir, { recursive: true, force: true });
        },
      };
    } catch (error) {
      if (Date.now() > deadline) throw error;
      await Bun.sleep(100);
    }
  }
}
