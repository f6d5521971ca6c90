// Test databases on a real PostgreSQL. By default one embedded cluster
// (PostgreSQL 18 from npm) is started per `bun test` run; with
// CONVEYOR_TEST_DATABASE_URL set (an admin URL, e.g. the system's
// PostgreSQL 15) that server is used instead. Either way each test file gets
// a database of its own, migrated, and drops it afterwards.
import { chmod, mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import postgres from "postgres";
import type { Lease, Pool } from "../src/db/db.ts";
import { fetchJobs } from "../src/db/fetch.ts";
import { migrate } from "../src/db/migrate.ts";
import { type EmbeddedCluster, startEmbeddedPostgres } from "../src/embedded-postgres.ts";
import { enqueueMany } from "../src/enqueue.ts";
import { startProxy } from "./fault/proxy.ts";
import { rng } from "./fault/rng.ts";

let shared: Promise<{ cluster?: EmbeddedCluster; dir?: string; adminUrl: string }> | undefined;

export const TEST_SETTINGS = {
  // Tests need speed, not durability; benchmarks and fault runs keep fsync on.
  fsync: "off",
  synchronous_commit: "off",
  full_page_writes: "off",
  max_connections: 200,
};

export async function startSharedServer() {
  shared ??= (async () => {
    const url = process.env.CONVEYOR_TEST_DATABASE_URL;
    if (url) return { adminUrl: url };
    const dir = await mkdtemp(path.join(tmpdir(), "conveyor-test-"));
    await chmod(dir, 0o755); // the server runs as user postgres when we are root
    const cluster = await startEmbeddedPostgres({
      dataDir: path.join(dir, "pg"),
      settings: TEST_SETTINGS,
    });
    return { cluster, dir, adminUrl: cluster.url };
  })();
  return shared;
}

export async function stopSharedCluster(): Promise<void> {
  if (!shared) return;
  const s = await shared;
  shared = undefined;
  await s.cluster?.stop("fast");
  if (s.dir) await rm(s.dir, { recursive: true, force: true });
}

function withDatabase(url: string, db: string): string {
  const u = new URL(url);
  u.pathname = `/${db}`;
  return u.toString();
}

export interface TestDb {
  sql: Pool;
  url: string;
  name: string;
  /** A new pool on the same database (e.g. one per simulated worker process). */
  connect(opts?: postgres.Options<Record<string, postgres.PostgresType>>): Pool;
  drop(): Promise<void>;
}

/** A fresh, migrated database for one test file. */
export async function testDatabase(): Promise<TestDb> {
  const { adminUrl } = await startSharedServer();
  const name = `conveyor_t_${Date.now().toString(36)}_${Math.random().toString(36).slice(2, 8)}`;
  const admin = postgres(adminUrl, { max: 1, onnotice: () => {} });
  await admin.unsafe(`create database "${name}"`);
  await admin.end();
  const url = withDatabase(adminUrl, name);
  const pools: Pool[] = [];
  const connect = (opts = {}) => {
    const p = postgres(url, { max: 10, onnotice: () => {}, ...opts });
    pools.push(p);
    return p;
  };
  const sql = connect({ max: 20 });
  await migrate(sql);
  return {
    sql,
    url,
    name,
    connect,
    async drop() {
      await Promise.all(pools.map((p) => p.end({ timeout: 5 })));
      const a = postgres(adminUrl, { max: 1, onnotice: () => {} });
      await a.unsafe(`drop database if exists "${name}" with (force)`);
      await a.end();
    },
  };
}

/**
 * A pool on the test database that counts the statements it sends whose text
 * matches `pattern`. With `latencyMs`, it goes through a proxy that delays
 * every chunk that much each way once its `max` connections are open, so a
 * test can see what is sent before any reply can be back.
 */
export async function countingPool(
  db: TestDb,
  pattern: RegExp,
  o: { max: number; latencyMs?: number },
): Promise<{ sql: Pool; sent(): number; close(): Promise<void> }> {
  let sent = 0;
  const debug = (_connection: number, query: string) => {
    if (pattern.test(query)) sent++;
  };
  const u = new URL(db.url);
  const proxy = o.latencyMs
    ? await startProxy({ host: u.hostname, port: Number(u.port) }, rng(1))
    : undefined;
  const sql = db.connect({ max: o.max, debug, ...(proxy ? { port: proxy.port } : {}) });
  if (proxy) {
    await Promise.all(Array.from({ length: o.max }, () => sql`select 1`));
    proxy.set({ latencyMs: o.latencyMs ?? 0, dropPerSecond: 0 });
  }
  return {
    sql,
    sent: () => sent,
    async close() {
      proxy?.set({ latencyMs: 0, dropPerSecond: 0 });
      await sql.end({ timeout: 5 });
      await proxy?.close();
    },
  };
}

/**
 * Enqueues `n` jobs of kind "k" (payload {i}) in `queue` and leases them all
 * to `owner` with the worker's own dequeue; returns the leases in id order.
 */
export async function leaseNew(
  sql: Pool,
  queue: string,
  owner: string,
  n: number,
): Promise<Lease[]> {
  await enqueueMany(
    sql,
    Array.from({ length: n }, (_, i) => ({ queue, kind: "k", payload: { i } })),
  );
  const rows = await fetchJobs(sql, { queue, owner, limit: n, leaseMs: 30_000, kinds: ["k"] });
  if (rows.length !== n) throw new Error(`leased ${rows.length} of ${n} jobs in ${queue}`);
  return rows
    .map((r) => ({ id: String(r.id), version: Number(r.lease_version) }))
    .sort((a, b) => Number(a.id) - Number(b.id));
}
