// The fence: once a lease is reissued, nothing the old holder does changes a row.
import { afterAll, beforeAll, beforeEach, describe, expect, test } from "bun:test";
import type { Lease } from "../src/db/db.ts";
import { fetchJobs } from "../src/db/fetch.ts";
import { extendLeases, releaseJobs } from "../src/db/lease.ts";
import {
  cancelLeasedJobs,
  completeJobs,
  completeJobsIdempotent,
  errorRecorded,
  failJobs,
  selectCompletedBy,
  snoozed,
  snoozeJobs,
} from "../src/db/outcome.ts";
import { reapExpiredLeases } from "../src/db/reap.ts";
import { enqueue } from "../src/enqueue.ts";
import { StaleLeaseError } from "../src/errors.ts";
import { silentLogger } from "../src/logger.ts";
import { createWorker } from "../src/worker/worker.ts";
import { type TestDb, testDatabase } from "./harness.ts";

let db: TestDb;
beforeAll(async () => {
  db = await testDatabase();
  await db.sql`create table ledger (job_id bigint not null, token bigint not null, owner text not null)`;
});
afterAll(async () => {
  await db.drop();
});
beforeEach(async () => {
  await db.sql`truncate conveyor_jobs, ledger`;
});

const future = () => new Date(Date.now() + 3_600_000);
const err = { attempt: 1, at: new Date().toISOString(), name: "E", message: "m" };

async function snapshot(id: string) {
  const [row] = await db.sql`select * from conveyor_jobs where id = ${id}`;
  return row;
}

/** Worker A leases the job, its lease expires and is reaped, worker B leases it again. */
async function reissued(queue: string) {
  const { job } = await enqueue(db.sql, { queue, kind: "k" });
  const [a] = await fetchJobs(db.sql, {
    queue,
    owner: "A",
    limit: 1,
    leaseMs: 30_000,
    kinds: ["k"],
  });
  expect(a?.lease_version).toBe("1");
  const reaped = await reapExpiredLeases(db.sql, { limit: 10, now: future() });
  expect(reaped.map((r) => String(r.id))).toEqual([job.id]);
  const [b] = await fetchJobs(db.sql, {
    queue,
    owner: "B",
    limit: 1,
    leaseMs: 30_000,
    kinds: ["k"],
  });
  expect(b?.lease_version).toBe("2");
  const zombie: Lease = { id: job.id, version: 1 };
  const current: Lease = { id: job.id, version: 2 };
  return { id: job.id, zombie, current };
}

describe("a zombie's writes change nothing after its lease was reissued", () => {
  test("heartbeat, complete, fail, snooze, cancel and release all match 0 rows", async () => {
    const { id, zombie } = await reissued("z");
    const before = await snapshot(id);
    expect((await extendLeases(db.sql, "A", [zombie], 60_000)).size).toBe(0);
    expect((await completeJobs(db.sql, "A", [{ ...zombie, result: "zombie" }])).size).toBe(0);
    expect((await completeJobsIdempotent(db.sql, "A", [{ ...zombie, result: "z" }])).size).toBe(0);
    expect((await failJobs(db.sql, "A", [{ ...zombie, error: err, retryDelayMs: 0 }])).size).toBe(
      0,
    );
    expect((await snoozeJobs(db.sql, "A", [{ ...zombie, delayMs: 0 }])).size).toBe(0);
    expect((await cancelLeasedJobs(db.sql, "A", [{ ...zombie, error: err }])).size).toBe(0);
    expect((await releaseJobs(db.sql, "A", [zombie])).size).toBe(0);
    expect(await snapshot(id)).toEqual(before);
  });

  test("the right version under the wrong owner is rejected too", async () => {
    const { id, current } = await reissued("o");
    const before = await snapshot(id);
    expect((await completeJobs(db.sql, "A", [current])).size).toBe(0);
    expect((await extendLeases(db.sql, "A", [current], 60_000)).size).toBe(0);
    expect(await snapshot(id)).toEqual(before);
    expect((await completeJobs(db.sql, "B", [current])).size).toBe(1);
  });

  test("a finished job rejects even its last holder's writes", async () => {
    const { current, id } = await reissued("f");
    expect((await completeJobs(db.sql, "B", [{ ...current, result: 1 }])).size).toBe(1);
    const done = await snapshot(id);
    expect((await completeJobs(db.sql, "B", [{ ...current, result: 2 }])).size).toBe(0);
    expect((await failJobs(db.sql, "B", [{ ...current, error: err, retryDelayMs: 0 }])).size).toBe(
      0,
    );
    expect((await extendLeases(db.sql, "B", [current], 1)).size).toBe(0);
    expect(await snapshot(id)).toEqual(done);
  });

  test("after an unknown outcome, our own committed completion is told apart from a lost lease", async () => {
    const { id, zombie, current } = await reissued("unknown");
    expect((await completeJobs(db.sql, "B", [current])).size).toBe(1);
    // The retry of that completion matches 0 rows, like a stale write would…
    expect((await completeJobs(db.sql, "B", [current])).size).toBe(0);
    // …but only the real holder's commit is recognised as its own.
    expect([...(await selectCompletedBy(db.sql, "B", [current]))]).toEqual([id]);
    expect((await selectCompletedBy(db.sql, "A", [zombie])).size).toBe(0);
    expect((await selectCompletedBy(db.sql, "A", [current])).size).toBe(0);
  });

  test("the completer's write counts its own earlier commit as done, and nothing else", async () => {
    const a = await reissued("idem");
    // Every row passes the guard: the batch is the answer.
    expect([...(await completeJobsIdempotent(db.sql, "B", [a.current]))]).toEqual([a.id]);
    const b = await reissued("idem2");
    const { job } = await enqueue(db.sql, { queue: "idem3", kind: "k" });
    const [c] = await fetchJobs(db.sql, {
      queue: "idem3",
      owner: "B",
      limit: 1,
      leaseMs: 30_000,
      kinds: ["k"],
    });
    expect(c?.lease_version).toBe("1");
    const fresh = { id: job.id, version: 1 };
    // A retry after an unknown outcome, beside a stale lease and a live one:
    // the earlier commit counts, the zombie's lease does not.
    const done = await completeJobsIdempotent(db.sql, "B", [
      { ...a.current, result: "again" },
      { ...b.current, version: 1 },
      { ...fresh, result: 3 },
    ]);
    expect([...done].sort()).toEqual([a.id, job.id].sort());
    expect(await snapshot(a.id)).toMatchObject({ state: "completed", result: null });
    expect(await snapshot(b.id)).toMatchObject({ state: "running", lease_owner: "B" });
    expect(await snapshot(job.id)).toMatchObject({ state: "completed", result: 3 });
    // Another owner's completion of the same version is not ours.
    expect((await completeJobsIdempotent(db.sql, "A", [a.current])).size).toBe(0);
  });

  test("after an unknown outcome, our own committed fail or cancel is recognised by its error", async () => {
    const { id, current } = await reissued("unknown-fail");
    const mine = { attempt: 2, at: new Date().toISOString(), name: "Error", message: "boom" };
    // The reaper recorded attempt 1's LeaseExpired error; that is not ours.
    expect(await errorRecorded(db.sql, id, mine)).toBe(false);
    expect((await failJobs(db.sql, "B", [{ ...current, error: mine, retryDelayMs: 0 }])).size).toBe(
      1,
    );
    // A retry matches 0 rows; the error it would have written is already there.
    expect((await failJobs(db.sql, "B", [{ ...current, error: mine, retryDelayMs: 0 }])).size).toBe(
      0,
    );
    expect(await errorRecorded(db.sql, id, mine)).toBe(true);
    // Another error of the same attempt (another try's time) is not.
    expect(await errorRecorded(db.sql, id, { ...mine, at: new Date(0).toISOString() })).toBe(false);
    const row = await snapshot(id);
    expect(row?.errors).toHaveLength(2); // LeaseExpired, then ours, once

    const c = await reissued("unknown-cancel");
    const reason = { ...mine, name: "Cancelled", message: "no longer wanted" };
    expect((await cancelLeasedJobs(db.sql, "B", [{ ...c.current, error: reason }])).size).toBe(1);
    expect((await cancelLeasedJobs(db.sql, "B", [{ ...c.current, error: reason }])).size).toBe(0);
    expect(await errorRecorded(db.sql, c.id, reason)).toBe(true);
  });

  test("after an unknown outcome, our own committed snooze is told apart from a reaped lease", async () => {
    const { id, zombie, current } = await reissued("unknown-snooze");
    // A's lease (attempt 1) was reaped, and B leased the job again: over, but not by a snooze.
    expect(await snoozed(db.sql, zombie, 1)).toBe(false);
    expect(await snoozed(db.sql, current, 2)).toBe(false); // B still holds it
    expect((await snoozeJobs(db.sql, "B", [{ ...current, delayMs: 0 }])).size).toBe(1);
    expect((await snoozeJobs(db.sql, "B", [{ ...current, delayMs: 0 }])).size).toBe(0);
    expect(await snoozed(db.sql, current, 2)).toBe(true);
    // Still recognised once the snoozed job was leased again (by anyone).
    const [again] = await fetchJobs(db.sql, {
      queue: "unknown-snooze",
      owner: "C",
      limit: 1,
      leaseMs: 30_000,
      kinds: ["k"],
    });
    expect(again?.lease_version).toBe("3");
    expect(await snoozed(db.sql, current, 2)).toBe(true);
    expect(await snoozed(db.sql, zombie, 1)).toBe(false);
    expect(await snapshot(id)).toMatchObject({ state: "running", lease_owner: "C" });

    // Reaped while B held it: over, and not by B's snooze.
    await db.sql`update conveyor_jobs set state = 'completed', lease_expires_at = null where id = ${id}`;
    const r = await reissued("reaped-not-snoozed");
    expect((await reapExpiredLeases(db.sql, { limit: 10, now: future() })).length).toBe(1);
    expect(await snoozed(db.sql, r.current, 2)).toBe(false);
  });

  test("a batch applies the live rows and rejects only the stale ones", async () => {
    const a = await reissued("batch");
    const { job } = await enqueue(db.sql, { queue: "batch2", kind: "k" });
    await fetchJobs(db.sql, {
      queue: "batch2",
      owner: "B",
      limit: 1,
      leaseMs: 30_000,
      kinds: ["k"],
    });
    const done = await completeJobs(db.sql, "B", [
      { id: a.id, version: 1 },
      { id: job.id, version: 1 },
    ]);
    expect([...done]).toEqual([job.id]);
  });

  test("a heartbeat skips a row its holder's own transaction has locked, and extends the rest at once", async () => {
    await enqueue(db.sql, { queue: "hb-lock", kind: "k" });
    await enqueue(db.sql, { queue: "hb-lock", kind: "k" });
    const rows = await fetchJobs(db.sql, {
      queue: "hb-lock",
      owner: "A",
      limit: 2,
      leaseMs: 30_000,
      kinds: ["k"],
    });
    const [locked, free] = rows.map((r) => ({ id: r.id, version: Number(r.lease_version) })) as [
      Lease,
      Lease,
    ];
    let release!: () => void;
    const held = new Promise<void>((r) => (release = r));
    let lockTaken!: () => void;
    const taken = new Promise<void>((r) => (lockTaken = r));
    // A long guarded transaction of the same worker holds one job's row.
    const tx = db.sql.begin(async (t) => {
      await t`select 1 from conveyor_jobs where id = ${locked.id} for update`;
      lockTaken();
      await held;
    });
    await taken;
    // Were the heartbeat to wait for the lock, it would return only after this.
    const timer = setTimeout(release, 3_000);
    const t0 = performance.now();
    const extended = await extendLeases(db.sql, "A", [locked, free], 60_000);
    const waitedMs = performance.now() - t0;
    clearTimeout(timer);
    release();
    await tx;
    expect([...extended]).toEqual([free.id]);
    expect(waitedMs).toBeLessThan(2_500);
    const [row] = await db.sql`select (lease_expires_at > now() + interval '45 seconds') as extended
                                 from conveyor_jobs where id = ${free.id}`;
    expect(row?.extended).toBe(true);
  });

  test("a zombie handler's guarded effect rolls back; the live holder's commits once", async () => {
    const queue = "effect";
    const { job } = await enqueue(db.sql, { queue, kind: "pay" });
    let zombieResume!: () => void;
    const resumed = new Promise<void>((r) => (zombieResume = r));
    let zombieStarted!: () => void;
    const started = new Promise<void>((r) => (zombieStarted = r));
    let zombieError: unknown;
    let zombieSignalReason: unknown;
    const ledgerInsert =
      (token: number, owner: string) =>
      async (
        tx: Parameters<Parameters<import("../src/handler.ts").JobContext["transaction"]>[0]>[0],
      ) => {
        await tx`insert into ledger (job_id, token, owner) values (${job.id}, ${token}, ${owner})`;
        return { paid: true };
      };
    // Worker A: pauses mid-job (a SIGSTOP, a GC pause, a partition), with a
    // heartbeat far too slow to notice, then resumes and commits its effect.
    const a = createWorker({
      sql: db.connect(),
      owner: "A",
      queues: { [queue]: { concurrency: 1, leaseMs: 200 } },
      heartbeatMs: 60_000,
      reaper: false,
      listen: false,
      pollIntervalMs: 20,
      logger: silentLogger,
      handlers: {
        pay: async (_p, ctx) => {
          zombieStarted();
          await resumed;
          zombieSignalReason = ctx.signal.reason;
          try {
            return await ctx.transaction(ledgerInsert(ctx.fencingToken, "A"));
          } catch (e) {
            zombieError = e;
            throw e;
          }
        },
      },
    });
    await a.start();
    await started;
    // The lease (200 ms, Postgres clock) runs out; the reaper takes it back.
    await Bun.sleep(300);
    expect((await reapExpiredLeases(db.sql, { limit: 10 })).length).toBe(1);
    // Worker B runs the job to completion with its own effect.
    const b = createWorker({
      sql: db.connect(),
      owner: "B",
      queues: { [queue]: { concurrency: 1, leaseMs: 30_000 } },
      reaper: false,
      listen: false,
      pollIntervalMs: 20,
      logger: silentLogger,
      handlers: { pay: async (_p, ctx) => ctx.transaction(ledgerInsert(ctx.fencingToken, "B")) },
    });
    const lost: StaleLeaseError[] = [];
    a.events.on("lease:lost", ({ error }) => lost.push(error));
    await b.start();
    for (let i = 0; i < 100 && (await snapshot(job.id))?.state !== "completed"; i++)
      await Bun.sleep(20);
    // Now the zombie wakes up and tries to commit.
    zombieResume();
    await a.stop({ graceMs: 2_000 });
    await b.stop();
    expect(zombieError).toBeInstanceOf(StaleLeaseError);
    expect(zombieSignalReason).toBeUndefined(); // it never heard: only the fence stopped it
    expect(lost.map((e) => e.operation)).toContain("complete");
    expect(a.stats().staleWrites).toBe(lost.length);
    expect(b.stats()).toMatchObject({ completed: 1, staleWrites: 0 });
    const ledger = await db.sql`select token::int, owner from ledger where job_id = ${job.id}`;
    expect([...ledger]).toEqual([{ token: 2, owner: "B" }]);
    const row = await snapshot(job.id);
    expect(row?.state).toBe("completed");
    expect(row?.lease_owner).toBe("B");
    expect(row?.result).toEqual({ paid: true });
  });

  test("a heartbeat that finds the lease gone aborts the handler with StaleLeaseError", async () => {
    const queue = "hb";
    const { job } = await enqueue(db.sql, { queue, kind: "slow" });
    let reason: unknown;
    let startedResolve!: () => void;
    const started = new Promise<void>((r) => (startedResolve = r));
    const w = createWorker({
      sql: db.connect(),
      owner: "A",
      queues: { [queue]: { concurrency: 1, leaseMs: 10_000 } },
      heartbeatMs: 30,
      reaper: false,
      listen: false,
      logger: silentLogger,
      handlers: {
        slow: async (_p, ctx) => {
          startedResolve();
          await new Promise((r) => ctx.signal.addEventListener("abort", r, { once: true }));
          reason = ctx.signal.reason;
          return "done anyway";
        },
      },
    });
    await w.start();
    await started;
    // Someone else holds the job now (as after a reap and a new dequeue).
    await db.sql`update conveyor_jobs set lease_version = lease_version + 1, lease_owner = 'B' where id = ${job.id}`;
    for (let i = 0; i < 100 && reason === undefined; i++) await Bun.sleep(10);
    await w.stop();
    expect(reason).toBeInstanceOf(StaleLeaseError);
    expect((reason as StaleLeaseError).operation).toBe("heartbeat");
    const row = await snapshot(job.id);
    expect(row?.state).toBe("running");
    expect(row?.lease_owner).toBe("B");
    expect(row?.result).toBeNull();
  });
});
