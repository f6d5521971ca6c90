// Shared effect transactions: several jobs' ctx.transaction() in one commit,
// each fenced; one job's failing fn undoes nothing of the others', whether
// the group reruns with savepoints after a failure ("rerun", the default) or
// runs with them from the start ("savepoint").
import { afterAll, beforeAll, beforeEach, describe, expect, test } from "bun:test";
import fc from "fast-check";
import type { Lease } from "../src/db/db.ts";
import { fetchJobs } from "../src/db/fetch.ts";
import { reapExpiredLeases } from "../src/db/reap.ts";
import { enqueueMany } from "../src/enqueue.ts";
import { ConveyorError, DeadlineError, StaleLeaseError } from "../src/errors.ts";
import { silentLogger } from "../src/logger.ts";
import {
  createEffectRunner,
  EFFECT_ISOLATION,
  type EffectRunner,
  type EffectRunnerOptions,
} from "../src/worker/effects.ts";
import { createWorker, type Worker } from "../src/worker/worker.ts";
import { countingPool, leaseNew, type TestDb, testDatabase } from "./harness.ts";

let db: TestDb;
beforeAll(async () => {
  db = await testDatabase();
  await db.sql`create table effect_ledger (job_id bigint primary key, note text not null)`;
  // Checked at COMMIT, after every savepoint was released: lets a test make
  // the shared transaction itself fail.
  await db.sql`create table effect_deferred (
    id int primary key,
    ref int references effect_deferred (id) deferrable initially deferred)`;
});
afterAll(async () => {
  await db.drop();
});
beforeEach(async () => {
  await db.sql`truncate conveyor_jobs, effect_ledger, effect_deferred`;
});

/** Leases n jobs to owner A; the ones listed in `stolen` are reaped and re-leased to B. */
async function lease(n: number, stolen: number[] = []): Promise<Lease[]> {
  const queue = `q${Math.random().toString(36).slice(2, 8)}`;
  const leases = await leaseNew(db.sql, queue, "A", n);
  if (stolen.length > 0) {
    const ids = stolen.map((i) => (leases[i] as Lease).id);
    await db.sql`update conveyor_jobs set lease_expires_at = now() - interval '1 second'
                  where id = any(${ids}::bigint[])`;
    await reapExpiredLeases(db.sql, { limit: 1_000 });
    const again = await fetchJobs(db.sql, {
      queue,
      owner: "B",
      limit: n,
      leaseMs: 30_000,
      kinds: ["k"],
    });
    expect(again.length).toBe(stolen.length);
  }
  return leases;
}

/**
 * Holds the runner's only slot until released, so what is submitted meanwhile
 * forms one group. Submit the rest after `begun`: requests of one turn of the
 * event loop would share the blocker's group.
 */
function blocker() {
  let release!: () => void;
  let onStart!: () => void;
  const gate = new Promise<void>((r) => (release = r));
  const begun = new Promise<void>((r) => (onStart = r));
  const fn = async () => {
    await gate;
    return undefined;
  };
  return { release, fn, onStart, begun };
}

/** A runner for owner A, one transaction at a time, groups up to 60. */
const oneSlotRunner = (o: Partial<EffectRunnerOptions> = {}) =>
  createEffectRunner({ sql: db.sql, owner: "A", maxGroup: 60, concurrency: 1, ...o });

/**
 * A runner with one slot, held by the job `first` until the returned
 * `release` is called (which resolves once that job committed): what is
 * submitted meanwhile forms one group.
 */
async function heldRunner(first: Lease, o: Partial<EffectRunnerOptions> = {}) {
  const runner = oneSlotRunner(o);
  const gate = blocker();
  const done = runner.run(first, gate.fn, gate.onStart);
  await gate.begun;
  const release = async () => {
    gate.release();
    await done;
  };
  return { runner, release };
}

/**
 * Five requests behind a blocker, so they form one group; the fn of the one
 * at failAt throws after its insert. Counts each fn's runs.
 */
async function groupOfFive(runner: EffectRunner, failAt?: number, independent = false) {
  const leases = await lease(6);
  const gate = blocker();
  const first = runner.run(leases[0] as Lease, gate.fn, gate.onStart);
  await gate.begun;
  const rest = leases.slice(1);
  const runs = rest.map(() => 0);
  const results = rest.map((l, i) =>
    runner.run(
      l,
      async (tx) => {
        runs[i] = (runs[i] as number) + 1;
        await tx`insert into effect_ledger values (${l.id}, 'ok')`;
        if (i === failAt) throw new Error("boom");
        return { i };
      },
      undefined,
      independent,
    ),
  );
  gate.release();
  await first;
  return { rest, runs, settled: await Promise.allSettled(results) };
}

/** Starts the worker, waits for n job:completed events, then stops it. */
async function runUntilCompleted(worker: Worker, n: number) {
  let completed = 0;
  const all = new Promise<void>((resolve) =>
    worker.events.on("job:completed", () => ++completed === n && resolve()),
  );
  await worker.start();
  await all;
  await worker.stop();
}

async function jobRows() {
  const rows = await db.sql`select id, state, lease_owner, result from conveyor_jobs order by id`;
  return new Map(rows.map((r) => [String(r.id), r]));
}

describe("shared effect transactions", () => {
  test.each(EFFECT_ISOLATION)(
    "%s: in one group, a thrown fn, a failed statement and a lost lease touch only their own job",
    async (isolation) => {
      const leases = await lease(6, [3]);
      const runner = oneSlotRunner({ isolation });
      const [l0, l1, l2, l3, l4, l5] = leases as [Lease, Lease, Lease, Lease, Lease, Lease];
      const gate = blocker();
      const first = runner.run(l0, gate.fn, gate.onStart);
      await gate.begun;
      let stolenRan = false;
      const results = [
        runner.run(l1, async (tx) => {
          await tx`insert into effect_ledger values (${l1.id}, 'ok')`;
          return { paid: 1 };
        }),
        runner.run(l2, async (tx) => {
          await tx`insert into effect_ledger values (${l2.id}, 'then throws')`;
          throw new Error("handler bug");
        }),
        runner.run(l3, async (tx) => {
          stolenRan = true;
          await tx`insert into effect_ledger values (${l3.id}, 'zombie')`;
          return undefined;
        }),
        runner.run(l4, async (tx) => {
          await tx`insert into effect_ledger values (${l4.id}, 'dup')`;
          await tx`insert into effect_ledger values (${l4.id}, 'dup')`; // unique violation
          return undefined;
        }),
        runner.run(l5, async (tx) => {
          await tx`insert into effect_ledger values (${l5.id}, 'ok')`;
          return undefined;
        }),
      ];
      expect(runner.pending).toBe(5);
      gate.release();
      const settled = await Promise.allSettled([first, ...results]);

      expect(settled.map((s) => s.status)).toEqual([
        "fulfilled",
        "fulfilled",
        "rejected",
        "rejected",
        "rejected",
        "fulfilled",
      ]);
      expect((settled[1] as PromiseFulfilledResult<unknown>).value).toEqual({ paid: 1 });
      expect((settled[2] as PromiseRejectedResult).reason.message).toBe("handler bug");
      expect((settled[3] as PromiseRejectedResult).reason).toBeInstanceOf(StaleLeaseError);
      expect((settled[4] as PromiseRejectedResult).reason.code).toBe("23505");
      expect(stolenRan).toBe(false);

      const ledger = await db.sql`select job_id, note from effect_ledger order by job_id`;
      expect(ledger.map((r) => [String(r.job_id), r.note])).toEqual([
        [l1.id, "ok"],
        [l5.id, "ok"],
      ]);
      const rows = await jobRows();
      expect(rows.get(l0.id)?.state).toBe("completed");
      expect(rows.get(l1.id)?.state).toBe("completed");
      expect(rows.get(l1.id)?.result).toEqual({ paid: 1 });
      expect(rows.get(l5.id)?.state).toBe("completed");
      // Failed effects leave the lease held, for the handler's own fail write.
      expect(rows.get(l2.id)?.state).toBe("running");
      expect(rows.get(l2.id)?.lease_owner).toBe("A");
      expect(rows.get(l4.id)?.state).toBe("running");
      // The new holder's lease is untouched.
      expect(rows.get(l3.id)?.state).toBe("running");
      expect(rows.get(l3.id)?.lease_owner).toBe("B");
    },
  );

  test("rerun: a clean group is completed by its first statement, with no row lock of its own; a stale lease's fn never runs, results are stored", async () => {
    // Counts the statements of the shared transaction: the lock (savepoint
    // pass only), completions, and result writes.
    const locks = await countingPool(db, /for update of j/i, { max: 2 });
    try {
      const [l0, ...rest] = await lease(6, [3]);
      const runner = createEffectRunner({
        sql: locks.sql,
        owner: "A",
        maxGroup: 60,
        concurrency: 1,
      });
      const gate = blocker();
      const first = runner.run(l0 as Lease, gate.fn, gate.onStart);
      await gate.begun;
      const ran = rest.map(() => false);
      const results = rest.map((l, i) =>
        runner.run(
          l,
          async (tx) => {
            ran[i] = true;
            await tx`insert into effect_ledger values (${l.id}, 'ok')`;
            // Every other job returns a result; the rest return nothing.
            return i % 2 === 0 ? { i } : undefined;
          },
          undefined,
          i >= 3,
        ),
      );
      gate.release();
      await first;
      const settled = await Promise.allSettled(results);
      expect(settled.map((s) => s.status)).toEqual([
        "fulfilled",
        "fulfilled",
        "rejected",
        "fulfilled",
        "fulfilled",
      ]);
      expect((settled[2] as PromiseRejectedResult).reason).toBeInstanceOf(StaleLeaseError);
      expect(ran).toEqual([true, true, false, true, true]);
      expect(locks.sent()).toBe(0);
      const ledger = (await db.sql`select job_id from effect_ledger`).map((r) => String(r.job_id));
      expect(ledger.sort()).toEqual(
        rest
          .filter((_, i) => i !== 2)
          .map((l) => l.id)
          .sort(),
      );
      const rows = await jobRows();
      rest.forEach((l, i) => {
        if (i === 2) {
          expect(rows.get(l.id)?.state).toBe("running");
          expect(rows.get(l.id)?.lease_owner).toBe("B");
          expect(rows.get(l.id)?.result).toBeNull();
          return;
        }
        expect(rows.get(l.id)?.state).toBe("completed");
        expect(rows.get(l.id)?.result).toEqual(i % 2 === 0 ? { i } : null);
      });
    } finally {
      await locks.close();
    }
  });

  test("rerun: a fn that catches its own failed statement reruns the group, even when no fn returns a result", async () => {
    const leases = await lease(3);
    // Groups of two: the first two jobs share a transaction, the third has its own.
    const runner = oneSlotRunner({ maxGroup: 2 });
    const runs = leases.map(() => 0);
    const settled = await Promise.allSettled(
      leases.map((l, i) =>
        runner.run(l, async (tx) => {
          runs[i] = (runs[i] as number) + 1;
          await tx`insert into effect_ledger values (${l.id}, 'ok')`;
          // The second swallows its statement's error: the transaction is aborted all the same.
          if (i === 1) await tx`select 1 / 0`.catch(() => {});
          return undefined;
        }),
      ),
    );
    expect(settled.map((s) => s.status)).toEqual(["fulfilled", "rejected", "fulfilled"]);
    expect(runs).toEqual([2, 2, 1]);
    const ledger = (await db.sql`select job_id from effect_ledger`).map((r) => String(r.job_id));
    expect(ledger.sort()).toEqual([leases[0], leases[2]].map((l) => (l as Lease).id).sort());
  });

  test("rerun: a group runs with no savepoint; after a failure it rolls back and runs again with one per fn, and the next group too; independent fns alike", async () => {
    const pool = await countingPool(db, /^\s*savepoint/i, { max: 2 });
    try {
      const runner = createEffectRunner({
        sql: pool.sql,
        owner: "A",
        maxGroup: 60,
        concurrency: 1,
      });
      const group = (failAt?: number) => groupOfFive(runner, failAt);

      const clean = await group();
      expect(clean.settled.every((s) => s.status === "fulfilled")).toBe(true);
      expect(clean.runs).toEqual([1, 1, 1, 1, 1]);
      expect(pool.sent()).toBe(0);

      const failed = await group(2);
      expect(failed.settled.map((s) => s.status)).toEqual([
        "fulfilled",
        "fulfilled",
        "rejected",
        "fulfilled",
        "fulfilled",
      ]);
      // The first pass stopped at the failing fn; the second ran all five.
      expect(failed.runs).toEqual([2, 2, 2, 1, 1]);
      expect(pool.sent()).toBe(5);
      const ledger = (await db.sql`select job_id from effect_ledger`).map((r) => String(r.job_id));
      const expected = [...clean.rest, ...failed.rest.filter((_, i) => i !== 2)].map((l) => l.id);
      expect(ledger.sort()).toEqual(expected.sort());
      const rows = await jobRows();
      failed.rest.forEach((l, i) => {
        expect(rows.get(l.id)?.state).toBe(i === 2 ? "running" : "completed");
        if (i !== 2) expect(rows.get(l.id)?.result).toEqual({ i });
      });

      // After a failure, the next group takes savepoints from the start (each
      // fn once); once one runs clean, groups go without them again.
      const next = await group();
      expect(next.runs).toEqual([1, 1, 1, 1, 1]);
      expect(pool.sent()).toBe(10);
      const after = await group();
      expect(after.runs).toEqual([1, 1, 1, 1, 1]);
      expect(pool.sent()).toBe(10);

      // Independent fns fail the same way: all five ran at once and rolled
      // back together, then each ran once more, alone, in a savepoint.
      const independent = await groupOfFive(runner, 2, true);
      expect(independent.settled.map((s) => s.status)).toEqual(failed.settled.map((s) => s.status));
      expect(independent.runs).toEqual([2, 2, 2, 2, 2]);
      expect(pool.sent()).toBe(15);
      const committed = await jobRows();
      independent.rest.forEach((l, i) => {
        expect(committed.get(l.id)?.state).toBe(i === 2 ? "running" : "completed");
      });
    } finally {
      await pool.close();
    }
  });

  test("savepoint: every fn runs once, in its own savepoint", async () => {
    const pool = await countingPool(db, /^\s*savepoint/i, { max: 2 });
    try {
      const runner = createEffectRunner({
        sql: pool.sql,
        owner: "A",
        maxGroup: 60,
        concurrency: 1,
        isolation: "savepoint",
      });
      const { runs, settled } = await groupOfFive(runner, 2);
      expect(settled.map((s) => s.status)).toEqual([
        "fulfilled",
        "fulfilled",
        "rejected",
        "fulfilled",
        "fulfilled",
      ]);
      expect(runs).toEqual([1, 1, 1, 1, 1]);
      expect(pool.sent()).toBe(5);
      expect((await db.sql`select count(*)::int as n from effect_ledger`)[0]?.n).toBe(4);
    } finally {
      await pool.close();
    }
  });

  test("requests made in one turn of the event loop share one transaction, even with free slots", async () => {
    const leases = await lease(8);
    const pool = await countingPool(db, /^\s*begin/i, { max: 4 });
    const runner = createEffectRunner({ sql: pool.sql, owner: "A", maxGroup: 60, concurrency: 4 });
    // As a fetched batch's handlers call ctx.transaction(): one after another, in one turn.
    const out = await Promise.all(
      leases.map((l) =>
        runner.run(l, async (tx) => {
          await tx`insert into effect_ledger values (${l.id}, 'ok')`;
          return undefined;
        }),
      ),
    );
    expect(out).toHaveLength(8);
    expect(pool.sent()).toBe(1);
    await pool.close();
    expect((await db.sql`select count(*)::int as n from effect_ledger`)[0]?.n).toBe(8);
  });

  test("when the shared COMMIT fails, every job in the group is rejected and nothing commits", async () => {
    const leases = await lease(4);
    const { runner, release } = await heldRunner(leases[0] as Lease);
    const group = leases.slice(1).map((l, i) =>
      runner.run(l, async (tx) => {
        await tx`insert into effect_ledger values (${l.id}, 'ok')`;
        // The last one leaves a dangling deferred reference: COMMIT fails.
        if (i === 2) await tx`insert into effect_deferred values (1, 999)`;
        return undefined;
      }),
    );
    await release();
    const settled = await Promise.allSettled(group);
    for (const s of settled) {
      expect(s.status).toBe("rejected");
      expect((s as PromiseRejectedResult).reason.code).toBe("23503");
    }
    expect((await db.sql`select count(*)::int as n from effect_ledger`)[0]?.n).toBe(0);
    const rows = await jobRows();
    for (const l of leases.slice(1)) expect(rows.get(l.id)?.state).toBe("running");
  });

  test("independent fns of a group run at once, before the others, which run one by one", async () => {
    const leases = await lease(8);
    const { runner, release } = await heldRunner(leases[0] as Lease);
    const log: string[] = [];
    // Each independent fn waits, after its insert, until all four have begun:
    // run one by one, the first would wait forever (here: fail after 5 s).
    let begun = 0;
    let allBegun!: () => void;
    const together = new Promise<void>((r) => (allBegun = r));
    const independent = leases.slice(1, 5).map((l) =>
      runner.run(
        l,
        async (tx) => {
          log.push(`i${l.id} start`);
          if (++begun === 4) allBegun();
          await tx`insert into effect_ledger values (${l.id}, 'independent')`;
          await Promise.race([
            together,
            Bun.sleep(5_000).then(() =>
              Promise.reject(new Error("independent fns ran one by one")),
            ),
          ]);
          log.push(`i${l.id} end`);
          return undefined;
        },
        undefined,
        true,
      ),
    );
    const plain = leases.slice(5).map((l) =>
      runner.run(l, async (tx) => {
        log.push(`p${l.id} start`);
        await tx`insert into effect_ledger values (${l.id}, 'plain')`;
        log.push(`p${l.id} end`);
        return undefined;
      }),
    );
    await release();
    const settled = await Promise.allSettled([...independent, ...plain]);
    expect(settled.map((s) => s.status)).toEqual(Array(7).fill("fulfilled"));
    // All independent fns begin before any ends; plain fns start only after
    // every independent one ended, and never overlap one another.
    const firstEnd = log.findIndex((e) => e.endsWith("end"));
    expect(log.slice(0, firstEnd).filter((e) => e.startsWith("i"))).toHaveLength(4);
    expect(log.slice(0, 8).every((e) => e.startsWith("i"))).toBe(true);
    expect(log.slice(8).map((e) => e.split(" ")[1])).toEqual([
      "start",
      "end",
      "start",
      "end",
      "start",
      "end",
    ]);
    const rows = await jobRows();
    for (const l of leases) expect(rows.get(l.id)?.state).toBe("completed");
    expect((await db.sql`select count(*)::int as n from effect_ledger`)[0]?.n).toBe(7);
  });

  test.each(EFFECT_ISOLATION)(
    "%s: an independent fn's tx refuses savepoints, and its job's effect does not commit",
    async (isolation) => {
      const [alone, a, b] = (await lease(3)) as [Lease, Lease, Lease];
      const runner = oneSlotRunner({ isolation });
      const viaSavepoint = (l: Lease) =>
        runner.run(
          l,
          async (tx) => {
            await tx`insert into effect_ledger values (${l.id}, 'before')`;
            await tx.savepoint(
              (sp) => sp`insert into effect_ledger values (${l.id} + 1000000, 'inside')`,
            );
            return undefined;
          },
          undefined,
          true,
        );
      // Alone (a transaction of its own) and in a group with a plain fn.
      await expect(viaSavepoint(alone)).rejects.toThrow(/may not take savepoints/);
      const [refused, plain] = await Promise.allSettled([
        viaSavepoint(a),
        runner.run(b, async (tx) => {
          await tx`insert into effect_ledger values (${b.id}, 'plain')`;
          return undefined;
        }),
      ]);
      expect((refused as PromiseRejectedResult).reason).toBeInstanceOf(ConveyorError);
      expect(plain?.status).toBe("fulfilled");
      const ledger = await db.sql`select job_id, note from effect_ledger`;
      expect(ledger.map((r) => [String(r.job_id), r.note])).toEqual([[b.id, "plain"]]);
      const rows = await jobRows();
      expect([alone, a, b].map((l) => rows.get(l.id)?.state)).toEqual([
        "running",
        "running",
        "completed",
      ]);
    },
  );

  test.each(EFFECT_ISOLATION)(
    "%s, property: an effect is committed exactly when its completion is, whatever the mix",
    async (isolation) => {
      // caughtError: fn catches its own failed statement and returns normally;
      // the transaction is aborted all the same, so the job must not complete.
      type Kind = "ok" | "result" | "throw" | "sqlError" | "caughtError" | "stolen";
      await fc.assert(
        fc.asyncProperty(
          fc.array(
            fc.tuple(
              fc.constantFrom<Kind>("ok", "result", "throw", "sqlError", "caughtError", "stolen"),
              fc.boolean(), // declared independent
            ),
            {
              minLength: 1,
              maxLength: 40,
            },
          ),
          fc.integer({ min: 1, max: 60 }),
          fc.integer({ min: 1, max: 4 }),
          async (jobs, maxGroup, concurrency) => {
            const kinds = jobs.map(([k]) => k);
            await db.sql`truncate conveyor_jobs, effect_ledger`;
            const stolen = kinds.flatMap((k, i) => (k === "stolen" ? [i] : []));
            const leases = await lease(kinds.length, stolen);
            const runner = createEffectRunner({
              sql: db.sql,
              owner: "A",
              maxGroup,
              concurrency,
              isolation,
            });
            const runs = kinds.map(() => 0);
            const settled = await Promise.allSettled(
              kinds.map((k, i) => {
                const l = leases[i] as Lease;
                return runner.run(
                  l,
                  async (tx) => {
                    runs[i] = (runs[i] as number) + 1;
                    await tx`insert into effect_ledger values (${l.id}, ${k})`;
                    if (k === "throw") throw new Error("boom");
                    if (k === "sqlError") await tx`select 1 / 0`;
                    if (k === "caughtError") await tx`select 1 / 0`.catch(() => {});
                    return k === "result" ? { i } : undefined;
                  },
                  undefined,
                  jobs[i]?.[1],
                );
              }),
            );
            // A fn runs once, or in "rerun" twice when something failed in its
            // group (groups are not visible here: anything failed at all).
            const anyFailed = kinds.some(
              (k) => k === "throw" || k === "sqlError" || k === "caughtError",
            );
            kinds.forEach((k, i) => {
              if (k === "stolen") expect(runs[i]).toBe(0);
              else if (isolation === "savepoint" || !anyFailed) expect(runs[i]).toBe(1);
              else expect(runs[i]).toBeGreaterThanOrEqual(1);
              expect(runs[i]).toBeLessThanOrEqual(2);
            });
            const ledger = new Set(
              (await db.sql`select job_id from effect_ledger`).map((r) => String(r.job_id)),
            );
            const rows = await jobRows();
            kinds.forEach((k, i) => {
              const l = leases[i] as Lease;
              const row = rows.get(l.id);
              const s = settled[i] as PromiseSettledResult<unknown>;
              const committed = k === "ok" || k === "result";
              expect(s.status).toBe(committed ? "fulfilled" : "rejected");
              expect(ledger.has(l.id)).toBe(committed);
              expect(row?.state).toBe(committed ? "completed" : "running");
              expect(row?.lease_owner).toBe(k === "stolen" ? "B" : "A");
              if (k === "stolen")
                expect((s as PromiseRejectedResult).reason).toBeInstanceOf(StaleLeaseError);
              if (k === "result") expect(row?.result).toEqual({ i });
            });
          },
        ),
        { numRuns: 40 },
      );
    },
  );

  for (const [effectBatch, independent] of [
    [1, false],
    [50, false],
    [50, true],
  ] as const) {
    test(`a worker's handlers with effectBatch ${effectBatch}${independent ? ", independent" : ""}: 300 jobs, each effect once`, async () => {
      const queue = `effects-worker-${effectBatch}-${independent}`;
      await enqueueMany(
        db.sql,
        Array.from({ length: 300 }, (_, i) => ({ queue, kind: "pay", payload: { i } })),
      );
      const worker = createWorker({
        sql: db.sql,
        queues: { [queue]: { concurrency: 100 } },
        handlers: {
          pay: async (_p, ctx) =>
            ctx.transaction(
              async (tx) => {
                await tx`insert into effect_ledger values (${ctx.job.id}, 'paid')`;
                return undefined;
              },
              { independent },
            ),
        },
        effectBatch,
        logger: silentLogger,
        reaper: false,
      });
      await runUntilCompleted(worker, 300);
      // xmin is the transaction that wrote the row's current version: the
      // number of distinct ones is the number of commits that completed jobs.
      const [counts] = await db.sql`
        select (select count(*)::int from effect_ledger) as effects,
               (select count(*)::int from conveyor_jobs where state = 'completed') as done,
               (select count(distinct xmin::text)::int from conveyor_jobs where state = 'completed') as commits`;
      expect(counts?.effects).toBe(300);
      expect(counts?.done).toBe(300);
      if (effectBatch === 1) expect(counts?.commits).toBe(300);
      else expect(counts?.commits).toBeLessThan(100);
    });
  }
  test("a request waiting behind a slow transaction keeps its lease: heartbeats continue until its own begins", async () => {
    const queue = "effects-waiting";
    await enqueueMany(db.sql, [
      { queue, kind: "slow", payload: {} },
      { queue, kind: "quick", payload: {} },
    ]);
    let slowStarted!: () => void;
    const slowInside = new Promise<void>((r) => (slowStarted = r));
    const worker = createWorker({
      sql: db.sql,
      queues: { [queue]: { concurrency: 2, leaseMs: 400 } },
      heartbeatMs: 50,
      reaper: { intervalMs: 50 },
      effectConcurrency: 1,
      handlers: {
        slow: async (_p, ctx) =>
          ctx.transaction(async (tx) => {
            slowStarted();
            await tx`insert into effect_ledger values (${ctx.job.id}, 'slow')`;
            await Bun.sleep(1_500); // well past the other job's lease
            return undefined;
          }),
        quick: async (_p, ctx) => {
          await slowInside;
          return ctx.transaction(async (tx) => {
            await tx`insert into effect_ledger values (${ctx.job.id}, 'quick')`;
            return undefined;
          });
        },
      },
      logger: silentLogger,
    });
    await runUntilCompleted(worker, 2);
    expect(worker.stats().staleWrites).toBe(0);
    const rows = await db.sql`select j.kind, j.state, j.lease_version::int as v, l.note
      from conveyor_jobs j join effect_ledger l on l.job_id = j.id where j.queue = ${queue} order by j.kind`;
    // Each ran under its first lease: nothing was reaped and re-leased.
    expect(rows.map((r) => [r.kind, r.state, r.v, r.note])).toEqual([
      ["quick", "completed", 1, "quick"],
      ["slow", "completed", 1, "slow"],
    ]);
  });
});

/** Waits until no transaction holds these jobs' rows (what the reaper needs); false after `ms`. */
async function rowsReleased(ids: string[], ms: number): Promise<boolean> {
  const end = Date.now() + ms;
  for (;;) {
    const free = await db.sql.begin(
      (tx) =>
        tx`select id from conveyor_jobs where id = any(${ids}::bigint[]) for update skip locked`,
    );
    if (free.length === ids.length) return true;
    if (Date.now() > end) return false;
    await Bun.sleep(50);
  }
}

describe("an effect transaction past its timeout", () => {
  const sizes = { alone: 1, group: 3 } as const;

  test.each(Object.keys(sizes) as (keyof typeof sizes)[])(
    "%s: whose fn hangs is rejected, frees its slot, commits nothing, and the server ends it, releasing the rows",
    async (mode) => {
      const runner = oneSlotRunner({ timeoutMs: 300 });
      const leases = await lease(sizes[mode]);
      let unhang!: () => void;
      const hang = new Promise<void>((r) => (unhang = r));
      const started = performance.now();
      const settled = await Promise.allSettled(
        leases.map((l, i) =>
          runner.run(l, async (tx) => {
            await tx`insert into effect_ledger values (${l.id}, 'hung')`;
            if (i === 0) await hang;
            return { i };
          }),
        ),
      );
      expect(performance.now() - started).toBeGreaterThanOrEqual(290);
      for (const s of settled) {
        expect(s.status === "rejected" && s.reason).toBeInstanceOf(DeadlineError);
      }
      // The one slot is free again while the fn still hangs.
      const [next] = await lease(1);
      expect(await runner.run(next as Lease, async () => ({ next: true }))).toEqual({ next: true });
      // Idle in transaction past the limit: the server ends it.
      const ids = leases.map((l) => l.id);
      expect(await rowsReleased(ids, 5_000)).toBe(true);
      unhang();
      await Bun.sleep(100);
      const rows = await db.sql`select j.state, j.lease_owner, count(l.job_id)::int as effects
        from conveyor_jobs j left join effect_ledger l on l.job_id = j.id
        where j.id = any(${ids}::bigint[]) group by j.id order by j.id`;
      expect(rows.map((r) => [r.state, r.lease_owner, r.effects])).toEqual(
        leases.map(() => ["running", "A", 0]),
      );
    },
  );

  test.each(Object.keys(sizes) as (keyof typeof sizes)[])(
    "%s: whose fn is still busy in a statement rolls back when it returns, though nothing failed",
    async (mode) => {
      const runner = oneSlotRunner({ timeoutMs: 300 });
      const leases = await lease(sizes[mode]);
      const settled = await Promise.allSettled(
        leases.map((l, i) =>
          runner.run(l, async (tx) => {
            await tx`insert into effect_ledger values (${l.id}, 'busy')`;
            // Busy, not idle: the server's idle limit does not end it.
            if (i === 0) await tx`select pg_sleep(0.8)`;
            return { i };
          }),
        ),
      );
      for (const s of settled) {
        expect(s.status === "rejected" && s.reason).toBeInstanceOf(DeadlineError);
      }
      const ids = leases.map((l) => l.id);
      expect(await rowsReleased(ids, 5_000)).toBe(true);
      const [effects] = await db.sql`select count(*)::int as n from effect_ledger
        where job_id = any(${ids}::bigint[])`;
      expect(effects?.n).toBe(0);
      const states = await db.sql`select state from conveyor_jobs where id = any(${ids}::bigint[])`;
      expect(states.map((r) => r.state)).toEqual(leases.map(() => "running"));
    },
  );

  test("a worker's job whose effect hung fails with DeadlineError and completes on its next attempt", async () => {
    const queue = "effects-hung";
    // Released at the end: a fn that never returns keeps its pool connection.
    let unhang!: () => void;
    const hang = new Promise<void>((r) => (unhang = r));
    const [{ job } = { job: undefined }] = await enqueueMany(db.sql, [
      { queue, kind: "hangs-once", payload: {} },
    ]);
    const worker = createWorker({
      sql: db.sql,
      queues: { [queue]: { concurrency: 1, leaseMs: 1_000 } },
      heartbeatMs: 100,
      reaper: { intervalMs: 100 },
      backoff: { baseMs: 10, maxMs: 10 },
      effectTimeoutMs: 300,
      handlers: {
        "hangs-once": async (_p, ctx) =>
          ctx.transaction(async (tx) => {
            await tx`insert into effect_ledger values (${ctx.job.id}, ${`attempt ${ctx.job.attempts}`})`;
            if (ctx.job.attempts === 1) await hang;
            return { attempt: ctx.job.attempts };
          }),
      },
      logger: silentLogger,
    });
    await runUntilCompleted(worker, 1);
    unhang();
    const [row] = await db.sql`select state, attempts, result, errors from conveyor_jobs
      where id = ${job?.id as string}`;
    expect(row?.state).toBe("completed");
    expect(row?.attempts).toBe(2);
    expect(row?.result).toEqual({ attempt: 2 });
    expect(row?.errors.map((e: { name: string }) => e.name)).toEqual(["DeadlineError"]);
    const notes = await db.sql`select note from effect_ledger where job_id = ${job?.id as string}`;
    expect(notes.map((r) => r.note)).toEqual(["attempt 2"]);
  });
});
