import { afterAll, beforeAll, beforeEach, describe, expect, test } from "bun:test";
import fc from "fast-check";
import { fetchJobs } from "../src/db/fetch.ts";
import { completeJobs } from "../src/db/outcome.ts";
import { reapExpiredLeases } from "../src/db/reap.ts";
import { enqueue, enqueueMany } from "../src/enqueue.ts";
import { type JobRow, jobFromLeasedRow, jobFromRow } from "../src/job.ts";
import { type TestDb, testDatabase } from "./harness.ts";

let db: TestDb;
beforeAll(async () => {
  db = await testDatabase();
});
afterAll(async () => {
  await db.drop();
});
beforeEach(async () => {
  await db.sql`truncate conveyor_jobs, conveyor_queues`;
});

const fetch = (queue: string, owner: string, limit: number, kinds = ["k"]) =>
  fetchJobs(db.sql, { queue, owner, limit, leaseMs: 30_000, kinds });

describe("dequeue", () => {
  test("orders by priority, then run_at, then id; leases with a new version", async () => {
    const now = Date.now();
    await enqueueMany(db.sql, [
      { queue: "o", kind: "k", payload: "p5-late", priority: 5, runAt: new Date(now - 1000) },
      { queue: "o", kind: "k", payload: "p0-late", priority: 0, runAt: new Date(now - 1000) },
      { queue: "o", kind: "k", payload: "p0-early", priority: 0, runAt: new Date(now - 5000) },
      { queue: "o", kind: "k", payload: "p-1", priority: -1 },
      { queue: "o", kind: "k", payload: "future", runAt: new Date(now + 60_000) },
    ]);
    const order: string[] = [];
    for (;;) {
      const [row] = await fetch("o", "w", 1);
      if (!row) break;
      order.push(String(row.payload));
      expect(row.lease_version).toBe("1");
      expect(row.attempts).toBe(1);
      expect(row.lease_expires_at_ms).toBeGreaterThan(Date.now() + 20_000);
      const [stored] =
        await db.sql`select state, lease_owner from conveyor_jobs where id = ${row.id}`;
      expect(stored).toEqual({ state: "running", lease_owner: "w" });
    }
    expect(order).toEqual(["p-1", "p0-early", "p0-late", "p5-late"]);
  });

  test("takes at most the batch size, only its queue and only kinds it handles", async () => {
    await enqueueMany(db.sql, [
      ...Array.from({ length: 7 }, () => ({ queue: "a", kind: "k" })),
      { queue: "a", kind: "unknown" },
      { queue: "b", kind: "k" },
    ]);
    expect(await fetch("a", "w", 5)).toHaveLength(5);
    expect(await fetch("a", "w", 5)).toHaveLength(2);
    expect(await fetch("a", "w", 5)).toHaveLength(0);
    const [left] =
      await db.sql`select count(*)::int as n from conveyor_jobs where state = 'available'`;
    expect(left?.n).toBe(2); // the unknown kind waits, and queue b is untouched
  });

  test("property: the job a handler sees is the stored row, times to the millisecond", async () => {
    // run_at and created_at with microseconds (as now() writes them), before
    // and after 1970 and near millisecond boundaries, and whole milliseconds
    // (as a JS Date gives them: a run_at the caller chose), past 2038 too;
    // run_at is past, so the job is runnable.
    const micros = (max: number) =>
      fc.oneof(
        fc.integer({ min: -2_000_000_000_000_000, max }),
        fc.integer({ min: 0, max: 1_000 }).map((us) => 1_700_000_000_000_000 + us),
        fc
          .integer({ min: -2_000_000_000_000, max: Math.floor(max / 1_000) })
          .map((ms) => ms * 1_000),
      );
    const now = Date.now() * 1_000;
    await fc.assert(
      fc.asyncProperty(
        micros(now - 1_000_000),
        micros(4_000_000_000_000_000),
        fc.integer({ min: 0, max: 3 }),
        // The fetch sends created_at only when it differs from run_at.
        fc.boolean(),
        async (runUs, otherUs, attempts, same) => {
          const createdUs = same ? runUs : otherUs;
          await db.sql`truncate conveyor_jobs`;
          await db.sql`
          insert into conveyor_jobs (queue, kind, run_at, created_at, attempts, max_attempts, lease_version)
          values ('t', 'k', timestamptz 'epoch' + ${runUs}::int8 * interval '1 microsecond',
                  timestamptz 'epoch' + ${createdUs}::int8 * interval '1 microsecond',
                  ${attempts}, 10, ${attempts})`;
          const [leased] = await fetch("t", "w", 1);
          if (!leased) throw new Error("nothing leased");
          const [stored] = (await db.sql`select * from conveyor_jobs`) as unknown as JobRow[];
          if (!stored) throw new Error("no row");
          const seen = jobFromLeasedRow(leased, "w", 30_000);
          const want = jobFromRow(stored);
          // attemptedAt included: the worker derives it from lease_expires_at,
          // which the fetch sets to now() + the lease as it sets attempted_at to now().
          expect(seen).toEqual(want);
        },
      ),
      {
        numRuns: 100,
        // Whole milliseconds of 2004 that floor(date_part('epoch', t) * 1000)
        // put 1 ms low: the fetch's conversion until it rounded to microseconds.
        examples: [[1_073_753_959_531_000, 1_073_761_608_110_000, 1, false]],
      },
    );
  });

  test("property: a batch comes back whole, whatever its jobs hold", async () => {
    // The fetch returns a batch as one row of arrays (src/db/fetch.ts), and
    // any job with a large payload or errors in a row of its own; kinds, as
    // a hand-written insert may have them, come back by their index in the
    // worker's list.
    const kinds = ["k", "two words", "line\nbreak", "ключ"];
    const text = fc.option(fc.string({ maxLength: 40 }), { nil: null });
    const payload = fc
      .oneof(fc.jsonValue({ maxDepth: 3 }), fc.string({ minLength: 2_500, maxLength: 6_000 }))
      .filter((v) => !JSON.stringify(v).includes("\\u0000"));
    const error = fc.record({
      attempt: fc.integer({ min: 1, max: 9 }),
      at: fc.constant("2026-01-01T00:00:00.000Z"),
      name: fc.string({ maxLength: 10 }),
      message: fc.string({ maxLength: 3_000 }),
    });
    const job = fc.record({
      kind: fc.constantFrom(...kinds),
      payload,
      idempotencyKey: text,
      traceparent: text,
      tracestate: text,
      errors: fc.array(error, { maxLength: 3 }),
    });
    await fc.assert(
      fc.asyncProperty(fc.array(job, { minLength: 1, maxLength: 12 }), async (jobs) => {
        await db.sql`truncate conveyor_jobs`;
        for (const [i, j] of jobs.entries()) {
          // Keys are unique per queue.
          const key = j.idempotencyKey === null ? null : `${i}:${j.idempotencyKey}`;
          await db.sql`
            insert into conveyor_jobs (queue, kind, payload, idempotency_key, traceparent, tracestate, errors)
            values ('t', ${j.kind}, ${JSON.stringify(j.payload)}::jsonb, ${key},
                    ${j.traceparent}, ${j.tracestate}, ${JSON.stringify(j.errors)}::jsonb)`;
        }
        const leased = await fetch("t", "w", 100, kinds);
        const stored = (await db.sql`select * from conveyor_jobs`) as unknown as JobRow[];
        expect(leased).toHaveLength(jobs.length);
        const seen = new Map(leased.map((r) => [r.id, jobFromLeasedRow(r, "w", 30_000)]));
        expect(seen.size).toBe(jobs.length);
        for (const row of stored) expect(seen.get(String(row.id))).toEqual(jobFromRow(row));
      }),
      { numRuns: 30 },
    );
  }, 30_000);

  test("a payload of a megabyte, stored compressed, comes back whole beside small ones", async () => {
    const big = "a".repeat(1_000_000);
    await enqueueMany(db.sql, [
      { queue: "big", kind: "k", payload: { i: 0 } },
      { queue: "big", kind: "k", payload: { big } },
      { queue: "big", kind: "k", payload: { i: 2 } },
    ]);
    const [size] = await db.sql`
      select max(pg_column_size(payload))::int as n from conveyor_jobs where queue = 'big'`;
    expect(size?.n).toBeLessThan(100_000); // stored compressed
    const leased = await fetch("big", "w", 10);
    expect(
      leased
        .map((r) => r.payload)
        .sort((a, b) => JSON.stringify(a).length - JSON.stringify(b).length),
    ).toEqual([{ i: 0 }, { i: 2 }, { big }]);
  });

  test("a paused queue yields nothing until resumed", async () => {
    await enqueue(db.sql, { queue: "p", kind: "k" });
    await db.sql`insert into conveyor_queues (name, paused) values ('p', true)`;
    expect(await fetch("p", "w", 10)).toHaveLength(0);
    await db.sql`update conveyor_queues set paused = false where name = 'p'`;
    expect(await fetch("p", "w", 10)).toHaveLength(1);
  });

  test("property: concurrent dequeuers never hold one job under two live leases", async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.integer({ min: 1, max: 150 }),
        fc.array(fc.integer({ min: 1, max: 20 }), { minLength: 2, maxLength: 6 }),
        fc.integer({ min: 0, max: 3 }),
        async (jobs, batchSizes, reaps) => {
          await db.sql`truncate conveyor_jobs`;
          await enqueueMany(
            db.sql,
            Array.from({ length: jobs }, () => ({ queue: "race", kind: "k" })),
          );
          const pools = batchSizes.map(() => db.connect({ max: 1 }));
          // leases[id] = every (owner, version) issued for that job
          const leases = new Map<string, { owner: string; version: number }[]>();
          const dequeuer = async (i: number) => {
            const owner = `w${i}`;
            for (;;) {
              const rows = await fetchJobs(pools[i] as (typeof pools)[0], {
                queue: "race",
                owner,
                limit: batchSizes[i] as number,
                leaseMs: 30_000,
                kinds: ["k"],
              });
              if (rows.length === 0) return;
              for (const r of rows) {
                const list = leases.get(r.id) ?? [];
                list.push({ owner, version: Number(r.lease_version) });
                leases.set(r.id, list);
              }
            }
          };
          // Rounds of concurrent dequeues, with every lease expiring between rounds.
          for (let round = 0; round <= reaps; round++) {
            await Promise.all(batchSizes.map((_, i) => dequeuer(i)));
            if (round < reaps)
              await reapExpiredLeases(db.sql, {
                limit: 10_000,
                now: new Date(Date.now() + 3_600_000),
              });
          }
          await Promise.all(pools.map((p) => p.end()));
          expect(leases.size).toBe(jobs);
          for (const [id, list] of leases) {
            // One lease per round, versions 1..n, never repeated.
            expect(list.map((l) => l.version).sort((a, b) => a - b)).toEqual(
              Array.from({ length: reaps + 1 }, (_, k) => k + 1),
            );
            // Only the newest lease passes the fence.
            for (const l of list) {
              const ok = await completeJobs(db.sql, l.owner, [{ id, version: l.version }]);
              expect(ok.size).toBe(l.version === reaps + 1 ? 1 : 0);
            }
          }
        },
      ),
      { numRuns: 12 },
    );
  });
});
