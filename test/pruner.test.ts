import { afterAll, beforeAll, expect, test } from "bun:test";
import { fetchJobs } from "../src/db/fetch.ts";
import { completeJobs, failJobs } from "../src/db/outcome.ts";
import { pruneFinishedJobs } from "../src/db/prune.ts";
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
  await db.sql`update conveyor_jobs set state = 'completed', finalized_at = now() - interval '2 days' where id = ${job.id}`;
  const pruner = createPruner({ sql: db.sql, logger: silentLogger });
  await pruner.runOnce();
  const again = await enqueue(db.sql, { queue: "key", kind: "k", idempotencyKey: "once" });
  expect(again.duplicate).toBe(false);
  expect(again.job.id).not.toBe(job.id);
});
