// The completer's batching: what reaches Postgres, counted on the wire.
import { afterAll, beforeAll, expect, test } from "bun:test";
import type { Lease } from "../src/db/db.ts";
import { silentLogger } from "../src/logger.ts";
import { COMPLETER_SECOND_BATCH_MIN, createCompleter } from "../src/worker/completer.ts";
import { countingPool, leaseNew, type TestDb, testDatabase } from "./harness.ts";

let db: TestDb;
beforeAll(async () => {
  db = await testDatabase();
});
afterAll(async () => {
  await db.drop();
});

test("completions handed in during one turn of the event loop share one statement", async () => {
  const queue = "cb";
  const leases = await leaseNew(db.sql, queue, "W", 7);
  const pool = await countingPool(db, /update conveyor_jobs/, { max: 1 });
  const completer = createCompleter(pool.sql, "W", silentLogger);
  // As the executor hands them in: one after another, each from its own job.
  const done = await Promise.all(leases.map((l) => completer.complete(l)));
  expect(done).toEqual(leases.map(() => true));
  expect(pool.sent()).toBe(1);
  await pool.close();
  const [n] =
    await db.sql`select count(*)::int as n from conveyor_jobs where queue = ${queue} and state = 'completed'`;
  expect(n?.n).toBe(7);
});

/**
 * One completion, then `more` 30 ms later, through a pool 100 ms away each
 * way (the first batch cannot be back within 200 ms). Returns 60 ms after
 * that, with the pool (its statements counted so far) and every completion.
 */
async function firstThenMore(queue: string, more: number, batchesInFlight?: number) {
  const [a, ...rest] = await leaseNew(db.sql, queue, "W", 1 + more);
  const pool = await countingPool(db, /update conveyor_jobs/, { max: 2, latencyMs: 100 });
  const completer = createCompleter(pool.sql, "W", silentLogger, undefined, batchesInFlight);
  const first = completer.complete(a as Lease);
  await Bun.sleep(30);
  const done = Promise.all([first, ...rest.map((l) => completer.complete(l))]);
  await Bun.sleep(60);
  return { pool, done };
}

test("a few completions wait for the batch being written, then go together", async () => {
  const { pool, done } = await firstThenMore("cb2", 2);
  try {
    expect(pool.sent()).toBe(1);
    expect(await done).toEqual([true, true, true]);
    expect(pool.sent()).toBe(2);
  } finally {
    await pool.close();
  }
});

test("with two batches allowed, a second goes at once when enough completions wait", async () => {
  const { pool, done } = await firstThenMore("cb3", COMPLETER_SECOND_BATCH_MIN, 2);
  try {
    expect(pool.sent()).toBe(2);
    expect((await done).every((d) => d)).toBe(true);
    const [n] =
      await db.sql`select count(*)::int as n from conveyor_jobs where queue = 'cb3' and state = 'completed'`;
    expect(n?.n).toBe(1 + COMPLETER_SECOND_BATCH_MIN);
  } finally {
    await pool.close();
  }
});

test("by default one batch is written at a time, however many completions wait", async () => {
  const { pool, done } = await firstThenMore("cb4", COMPLETER_SECOND_BATCH_MIN);
  try {
    expect(pool.sent()).toBe(1);
    expect((await done).every((d) => d)).toBe(true);
    // The rest went together in one statement after the first committed.
    expect(pool.sent()).toBe(2);
  } finally {
    await pool.close();
  }
});

test("submit tells each callback once, with its own context: committed, or lost; one that throws does not hold up the rest", async () => {
  const queue = "cb5";
  const [a, b, c] = (await leaseNew(db.sql, queue, "W", 3)) as [Lease, Lease, Lease];
  const completer = createCompleter(db.sql, "W", silentLogger);
  const told: [string, boolean, unknown][] = [];
  const settle = (ctx: string, committed: boolean, error: unknown) => {
    told.push([ctx, committed, error]);
    if (ctx === "a") throw new Error("a callback that throws");
  };
  completer.submit(a, "a", settle);
  // A stale token: the fence matches no row, nothing is written.
  completer.submit({ ...b, version: b.version + 1 }, "b", settle);
  completer.submit(c, "c", settle);
  await completer.flush();
  expect(told).toEqual([
    ["a", true, undefined],
    ["b", false, undefined],
    ["c", true, undefined],
  ]);
  const rows = await db.sql<{ id: string; state: string }[]>`
    select id, state from conveyor_jobs where queue = ${queue} order by id`;
  expect(rows.map((r) => [r.id, r.state])).toEqual([
    [a.id, "completed"],
    [b.id, "running"],
    [c.id, "completed"],
  ]);
});

test("submit passes the error once a batch is given up after its retries, and writes nothing", async () => {
  const queue = "cb6";
  const [a] = (await leaseNew(db.sql, queue, "W", 1)) as [Lease];
  const sql = db.connect({ max: 1 });
  await sql.end();
  const completer = createCompleter(sql, "W", silentLogger);
  const told: [boolean, unknown][] = [];
  completer.submit(a, undefined, (_ctx, committed, error) => told.push([committed, error]));
  await completer.flush();
  expect(told).toHaveLength(1);
  expect(told[0]?.[0]).toBe(false);
  expect(told[0]?.[1]).toBeInstanceOf(Error);
  const [row] = await db.sql<
    { state: string }[]
  >`select state from conveyor_jobs where id = ${a.id}`;
  expect(row?.state).toBe("running");
});
