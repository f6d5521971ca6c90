// The completer's batching: what reaches Postgres, counted on the wire.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { fetchJobs } from "../src/db/fetch.ts";
import { enqueueMany } from "../src/enqueue.ts";
import { silentLogger } from "../src/logger.ts";
import { createCompleter } from "../src/worker/completer.ts";
import { countingPool, type TestDb, testDatabase } from "./harness.ts";

let db: TestDb;
beforeAll(async () => {
  db = await testDatabase();
});
afterAll(async () => {
  await db.drop();
});

test("completions handed in during one turn of the event loop share one statement", async () => {
  const queue = "cb";
  await enqueueMany(
    db.sql,
    Array.from({ length: 7 }, () => ({ queue, kind: "k" })),
  );
  const rows = await fetchJobs(db.sql, {
    queue,
    owner: "W",
    limit: 7,
    leaseMs: 30_000,
    kinds: ["k"],
  });
  expect(rows).toHaveLength(7);
  const pool = await countingPool(db, /update conveyor_jobs/, { max: 1 });
  const completer = createCompleter(pool.sql, "W", silentLogger);
  // As the executor hands them in: one after another, each from its own job.
  const done = await Promise.all(
    rows.map((r) => completer.complete({ id: r.id, version: Number(r.lease_version) })),
  );
  expect(done).toEqual(rows.map(() => true));
  expect(pool.sent()).toBe(1);
  await pool.close();
  const [n] =
    await db.sql`select count(*)::int as n from conveyor_jobs where queue = ${queue} and state = 'completed'`;
  expect(n?.n).toBe(7);
});

test("a second batch goes while the first is still being written", async () => {
  const queue = "cb2";
  await enqueueMany(db.sql, [
    { queue, kind: "k" },
    { queue, kind: "k" },
  ]);
  const rows = await fetchJobs(db.sql, {
    queue,
    owner: "W",
    limit: 2,
    leaseMs: 30_000,
    kinds: ["k"],
  });
  const [a, b] = rows.map((r) => ({ id: r.id, version: Number(r.lease_version) }));
  // 100 ms each way: the first batch cannot be back within 200 ms.
  const pool = await countingPool(db, /update conveyor_jobs/, { max: 2, latencyMs: 100 });
  try {
    const completer = createCompleter(pool.sql, "W", silentLogger);
    const first = completer.complete(a as { id: string; version: number });
    await Bun.sleep(30);
    const second = completer.complete(b as { id: string; version: number });
    await Bun.sleep(60);
    expect(pool.sent()).toBe(2);
    expect(await Promise.all([first, second])).toEqual([true, true]);
  } finally {
    await pool.close();
  }
});
