import { afterAll, beforeAll, beforeEach, describe, expect, test } from "bun:test";
import { fetchJobs } from "../src/db/fetch.ts";
import { completeJobs, setResultsLocked } from "../src/db/outcome.ts";
import { reapExpiredLeases } from "../src/db/reap.ts";
import { analyzeIfOutgrown } from "../src/db/stats.ts";
import { enqueue } from "../src/enqueue.ts";
import { createEvents } from "../src/events.ts";
import { silentLogger } from "../src/logger.ts";
import { createReaper } from "../src/worker/reaper.ts";
import { pollUntil } from "./daemon-process.ts";
import { type TestDb, testDatabase } from "./harness.ts";

let db: TestDb;
beforeAll(async () => {
  db = await testDatabase();
});
afterAll(async () => {
  await db.drop();
});
beforeEach(async () => {
  // The truncate resets the table's live-row count in the statistics when its
  // connection reports them, which, unforced, can come seconds later and
  // wipe out the count of rows a test inserted since (the planner test below
  // reads it).
  const c = await db.sql.reserve();
  try {
    await c`truncate conveyor_jobs`;
    await c`select pg_stat_force_next_flush()`;
  } finally {
    c.release();
  }
});

const lease = (queue: string, owner: string, leaseMs = 30_000) =>
  fetchJobs(db.sql, { queue, owner, limit: 10, leaseMs, kinds: ["k"] });
const inAnHour = () => new Date(Date.now() + 3_600_000);

describe("reaper", () => {
  test("requeues expired leases, keeping the version for the next dequeue to bump", async () => {
    const { job } = await enqueue(db.sql, { queue: "r", kind: "k" });
    await lease("r", "A");
    expect(await reapExpiredLeases(db.sql, { limit: 10 })).toHaveLength(0); // not expired yet
    const reaped = await reapExpiredLeases(db.sql, { limit: 10, now: inAnHour() });
    expect(reaped).toEqual([
      { id: job.id, state: "available", lease_owner: "A", lease_version: "1" },
    ]);
    const [row] = await db.sql`select * from conveyor_jobs where id = ${job.id}`;
    expect(row?.state).toBe("available");
    expect(row?.lease_expires_at).toBeNull();
    expect(row?.errors[0].name).toBe("LeaseExpired");
    const [again] = await lease("r", "B");
    expect(again?.lease_version).toBe("2");
    expect(again?.attempts).toBe(2);
  });

  test("uses Postgres's clock: a lease expires by now(), not by the caller's clock", async () => {
    await enqueue(db.sql, { queue: "c", kind: "k" });
    await lease("c", "A", 150);
    expect(await reapExpiredLeases(db.sql, { limit: 10 })).toHaveLength(0);
    await Bun.sleep(200);
    expect(await reapExpiredLeases(db.sql, { limit: 10 })).toHaveLength(1);
  });

  test("discards a job whose expired lease was its last attempt", async () => {
    const { job } = await enqueue(db.sql, { queue: "d", kind: "k", maxAttempts: 1 });
    await lease("d", "A");
    const reaped = await reapExpiredLeases(db.sql, { limit: 10, now: inAnHour() });
    expect(reaped[0]?.state).toBe("discarded");
    const [row] = await db.sql`select state, finalized_at from conveyor_jobs where id = ${job.id}`;
    expect(row?.state).toBe("discarded");
    expect(row?.finalized_at).not.toBeNull();
  });

  test("skips a job whose guarded transaction is open, and the commit wins", async () => {
    const { job } = await enqueue(db.sql, { queue: "t", kind: "k" });
    await lease("t", "A");
    const holder = db.connect({ max: 1 });
    let release!: () => void;
    const hold = new Promise<void>((r) => (release = r));
    let locked!: () => void;
    const isLocked = new Promise<void>((r) => (locked = r));
    const tx = holder.begin(async (t) => {
      const done = await completeJobs(t, "A", [{ id: job.id, version: 1 }]);
      expect(done.size).toBe(1);
      locked();
      await hold;
    });
    await isLocked;
    expect(await reapExpiredLeases(db.sql, { limit: 10, now: inAnHour() })).toHaveLength(0);
    release();
    await tx;
    expect(await reapExpiredLeases(db.sql, { limit: 10, now: inAnHour() })).toHaveLength(0);
    const [row] = await db.sql`select state from conveyor_jobs where id = ${job.id}`;
    expect(row?.state).toBe("completed");
  });

  test("the reaper loop keeps reaping after its connection is terminated", async () => {
    // Named, so that only its connection is killed: the shared pool's idle
    // connections ran statements naming lease_expires_at too.
    const broken = db.connect({ max: 1, connection: { application_name: "reaper-under-test" } });
    const reaper = createReaper({
      sql: broken,
      intervalMs: 20,
      logger: silentLogger,
      events: createEvents(),
    });
    reaper.start();
    // Kill its connection server-side, as a Postgres restart or a proxy would,
    // once it has one (a loaded machine may take longer than a round).
    const killed = await pollUntil(
      async () => {
        const rows = await db.sql`select pg_terminate_backend(pid) from pg_stat_activity
                  where datname = current_database() and application_name = 'reaper-under-test'`;
        return rows.length > 0 ? rows.length : undefined;
      },
      2_000,
      "the reaper's connection",
    );
    expect(killed).toBe(1);
    await enqueue(db.sql, { queue: "s", kind: "k" });
    await lease("s", "A", 1);
    await Bun.sleep(300);
    await reaper.stop();
    const [row] = await db.sql`select state from conveyor_jobs where queue = 's'`;
    expect(row?.state).toBe("available");
  });
});

describe("planner statistics", () => {
  test("a reaper round analyzes the table once it outgrew its statistics, and a plan cached while it was empty probes the primary key again", async () => {
    const c = await db.sql.reserve();
    try {
      // A fenced write: its batch is unnested typed arrays.
      const complete = () => completeJobs(c, "W", [{ id: "1", version: 1 }]);
      // A write whose batch is a jsonb document (estimated at 100 rows).
      const setResults = () => setResultsLocked(c, [{ id: "1", result: 1 }]);
      /** Sequential scans of conveyor_jobs by one run of `write` on c (rolled back). */
      const scansOf = async (write: () => Promise<unknown>) => {
        // The view also shows counts of earlier transactions not yet flushed: a difference.
        const seqScans = async () => {
          const [r] = await c`
            select seq_scan from pg_stat_xact_user_tables where relname = 'conveyor_jobs'`;
          return Number(r?.seq_scan);
        };
        await c`begin`;
        try {
          const before = await seqScans();
          await write();
          return (await seqScans()) - before;
        } finally {
          await c`rollback`;
        }
      };
      // An autovacuum ANALYZE in the middle would invalidate the plans too
      // early. (Altering the table invalidates them as well: before they are made.)
      await c`alter table conveyor_jobs set (autovacuum_enabled = off)`;
      // Planned while the table is empty, from its sixth run on c the plan is cached.
      for (let i = 0; i < 8; i++) {
        await complete();
        await setResults();
      }
      await c`
        insert into conveyor_jobs (queue, kind, state, lease_owner, lease_version, lease_expires_at)
        select 'grown', 'k', 'running', 'W', 1, now() + interval '1 hour'
          from generate_series(1, 5000)`;
      // The insert's row counts reach pg_stat_user_tables at c's next transaction end.
      await c`select pg_stat_force_next_flush()`;
      await c`select 1`;
      // The fenced write's cached plan probes the primary key even so; the
      // other's scans the 5,000 rows.
      expect(await scansOf(complete)).toBe(0);
      expect(await scansOf(setResults)).toBe(1);

      const reaper = createReaper({ sql: db.sql, logger: silentLogger, events: createEvents() });
      await reaper.runOnce();
      const [stats] = await db.sql`
        select reltuples::float8 as n from pg_class where oid = 'conveyor_jobs'::regclass`;
      expect(Number(stats?.n)).toBeGreaterThanOrEqual(4_000);
      expect(await scansOf(setResults)).toBe(0);
      expect(await scansOf(complete)).toBe(0);
      // Statistics that match the table are left alone.
      expect(await analyzeIfOutgrown(db.sql)).toBe(false);
    } finally {
      await c`alter table conveyor_jobs reset (autovacuum_enabled)`;
      c.release();
    }
  });
});
