import { afterAll, beforeAll, expect, test } from "bun:test";
import { fetchJobs } from "../src/db/fetch.ts";
import { completeJobs, failJobs } from "../src/db/outcome.ts";
import { pruneCompletedFrom, pruneFinishedJobs } from "../src/db/prune.ts";
import { enqueue, enqueueMany } from "../src/enqueue.ts";
import { silentLogger } from "../src/logger.ts";
import { createPruner } from "../src/worker/pruner.ts";
import { type TestDb, testDatabase } from "./harness.ts";

let db: TestDb;
beforeAll(async () => {
  db = await testDatabase();
});
afterAll(async () => {
  await db.drop();
});

const states = async () =>
  Object.fromEntries(
    (await db.sql`select state::text, count(*)::int as n from conveyor_jobs group by 1`).map(
      (r) => [r.state, r.n],
    ),
  );

test("deletes only finished jobs past their retention, per state", async () => {
  await enqueueMany(
    db.sql,
    Array.from({ length: 6 }, () => ({ queue: "p", kind: "k", maxAttempts: 1 })),
  );
  const leased = await fetchJobs(db.sql, {
    queue: "p",
    owner: "w",
    limit: 4,
    leaseMs: 60_000,
    kinds: ["k"],
  });
  const [a, b, c] = leased.map((r) => ({ id: r.id, version: Number(r.lease_version) }));
  if (!a || !b || !c) throw new Error("expected leases");
  await completeJobs(db.sql, "w", [a, b]);
  await failJobs(db.sql, "w", [
    { ...c, error: { attempt: 1, at: "", name: "E", message: "m" }, retryDelayMs: 0 },
  ]);
  expect(await states()).toEqual({ available: 2, running: 1, completed: 2, discarded: 1 });
  const hourLater = new Date(Date.now() + 3_600_000);
  // Not old enough yet.
  expect(
    await pruneFinishedJobs(db.sql, {
      state: "completed",
      olderThanMs: 7_200_000,
      limit: 10,
      now: hourLater,
    }),
  ).toBe(0);
  expect(
    await pruneFinishedJobs(db.sql, {
      state: "completed",
      olderThanMs: 1_800_000,
      limit: 1,
      now: hourLater,
    }),
  ).toBe(1);
  expect(
    await pruneFinishedJobs(db.sql, {
      state: "completed",
      olderThanMs: 1_800_000,
      limit: 10,
      now: hourLater,
    }),
  ).toBe(1);
  expect(await states()).toEqual({ available: 2, running: 1, discarded: 1 });
  // Available and running jobs are never pruned, however old.
  await db.sql`update conveyor_jobs set finalized_at = now() - interval '1 year' where state in ('available', 'running')`;
  for (const state of ["completed", "cancelled", "discarded"] as const) {
    await pruneFinishedJobs(db.sql, { state, olderThanMs: 0, limit: 100, now: hourLater });
  }
  expect(await states()).toEqual({ available: 2, running: 1 });
});

test("a pruned job's idempotency key can be used again", async () => {
  const { job } = await enqueue(db.sql, { queue: "key", kind: "k", idempotencyKey: "once" });
  // Created before it was finalized, as every job is: the completed walk stops at
  // the first job created after the retention's cutoff.
  await db.sql`update conveyor_jobs
    set state = 'completed', created_at = now() - interval '3 days',
        finalized_at = now() - interval '2 days' where id = ${job.id}`;
  const pruner = createPruner({ sql: db.sql, logger: silentLogger });
  await pruner.runOnce();
  const again = await enqueue(db.sql, { queue: "key", kind: "k", idempotencyKey: "once" });
  expect(again.duplicate).toBe(false);
  expect(again.job.id).not.toBe(job.id);
});

/** Jobs of queue `queue` in the given states, created and finalized `ages` hours ago, in id order. */
async function jobsAged(
  queue: string,
  rows: { state: string; hours: number }[],
): Promise<string[]> {
  const results = await enqueueMany(
    db.sql,
    rows.map(() => ({ queue, kind: "k" })),
  );
  const ids = results.map((r) => r.job.id).sort((a, b) => Number(a) - Number(b));
  for (const [i, r] of rows.entries()) {
    const final = ["completed", "cancelled", "discarded"].includes(r.state);
    await db.sql`update conveyor_jobs
      set state = ${r.state}::conveyor_job_state,
          created_at = now() - ${r.hours + 1}::float8 * interval '1 hour',
          finalized_at = ${final ? db.sql`now() - ${r.hours}::float8 * interval '1 hour'` : db.sql`null`},
          lease_owner = case when ${r.state} = 'running' then 'w' end,
          lease_expires_at = case when ${r.state} = 'running' then now() + interval '1 hour' end
      where id = ${ids[i] as string}::bigint`;
  }
  return ids;
}

const present = async (ids: string[]) =>
  (
    await db.sql`select id::text from conveyor_jobs where id = any(${ids}::bigint[]) order by id`
  ).map((r) => r.id as string);

test("the completed walk passes kept rows and stops at the first job created after the cutoff", async () => {
  await db.sql`delete from conveyor_jobs`;
  const ids = await jobsAged("walk", [
    { state: "completed", hours: 50 },
    { state: "discarded", hours: 49 }, // kept: another state
    { state: "available", hours: 48 }, // never pruned
    { state: "completed", hours: 47 },
    { state: "running", hours: 46 },
    { state: "completed", hours: 45 },
    { state: "completed", hours: 1 }, // too young, and created after the cutoff
    { state: "completed", hours: 2 },
    { state: "completed", hours: 30 }, // old enough, but past the stop
  ]);
  // Steps of 2 rows: the walk crosses step boundaries, and a step that reaches
  // the job created an hour ago ends it.
  const n = await pruneFinishedJobs(db.sql, {
    state: "completed",
    olderThanMs: 24 * 3_600_000,
    limit: 100,
    scanRows: 2,
  });
  expect(n).toBe(3);
  expect(await present(ids)).toEqual([ids[1], ids[2], ids[4], ids[6], ids[7], ids[8]] as string[]);
  // Found by a later run, once the cutoff has passed the young jobs.
  expect(
    await pruneFinishedJobs(db.sql, {
      state: "completed",
      olderThanMs: 0,
      limit: 100,
      now: new Date(Date.now() + 60_000),
      scanRows: 2,
    }),
  ).toBe(3);
});

test("the completed walk deletes at most `limit` a call, and the next call goes on", async () => {
  await db.sql`delete from conveyor_jobs`;
  const ids = await jobsAged(
    "walk-limit",
    Array.from({ length: 7 }, (_, i) => ({ state: "completed", hours: 40 - i })),
  );
  const opts = { state: "completed", olderThanMs: 24 * 3_600_000, limit: 3, scanRows: 2 } as const;
  // From the start each time.
  expect(await pruneFinishedJobs(db.sql, opts)).toBe(3);
  expect(await present(ids)).toEqual(ids.slice(3));
  expect(await pruneFinishedJobs(db.sql, opts)).toBe(3);
  // Carried on from where the call before stopped, as the pruner does.
  const first = await pruneCompletedFrom(db.sql, "0", { ...opts, limit: 1 });
  expect(first).toEqual({ deleted: 1, next: ids[6] as string });
  expect(await pruneCompletedFrom(db.sql, first.next as string, opts)).toEqual({
    deleted: 0,
    next: null,
  });
  expect(await present(ids)).toEqual([]);
});

test("the pruner's completed walk keeps a job retried since it completed", async () => {
  await db.sql`delete from conveyor_jobs`;
  const ids = await jobsAged("walk-retry", [
    { state: "completed", hours: 30 },
    { state: "completed", hours: 30 },
  ]);
  // What retryJobs writes: available again, finalized_at cleared.
  await db.sql`update conveyor_jobs set state = 'available', finalized_at = null where id = ${ids[0] as string}::bigint`;
  const pruner = createPruner({ sql: db.sql, logger: silentLogger });
  await pruner.runOnce();
  expect(await present(ids)).toEqual([ids[0] as string]);
});
