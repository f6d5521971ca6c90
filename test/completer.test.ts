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

test("a completion batch waits for its flush by default, not with durable false, and leaves the connection as it was", async () => {
  // undefined: the default, durable.
  for (const durable of [false, true, undefined]) {
    const queue = `cl-${durable}`;
    const leases = await leaseNew(db.sql, queue, "W", 3);
    const pool = await countingPool(db, /set_config\('synchronous_commit', 'off', true\)/, {
      max: 1,
    });
    try {
      // The session's own setting (the test cluster's default is off): what
      // the completion must leave behind.
      await pool.sql`set synchronous_commit = on`;
      const completer = createCompleter(pool.sql, "W", silentLogger, { durable });
      expect(await Promise.all(leases.map((l) => completer.complete(l)))).toEqual([
        true,
        true,
        true,
      ]);
      expect(pool.sent()).toBe(durable === false ? 1 : 0);
      // The setting was the completion's transaction's alone: the pool's one
      // connection runs the next statement (a fetch, an effect) durably.
      const [row] = await pool.sql`show synchronous_commit`;
      expect(row?.synchronous_commit).toBe("on");
    } finally {
      await pool.close();
    }
    const [n] =
      await db.sql`select count(*)::int as n from conveyor_jobs where queue = ${queue} and state = 'completed'`;
    expect(n?.n).toBe(3);
  }
});

/**
 * Completions through a pool 100 ms away each way (no batch can be back
 * within 200 ms), as `o` says: with `firstAlone`, one completion, then the
 * rest 30 ms later; else all `n` in one turn. Returns the statements sent 60
 * ms after the last was handed in (before any could be back), the total once
 * all are written, how many committed, and the jobs completed.
 */
async function onTheWire(
  queue: string,
  n: number,
  o: { firstAlone?: boolean; batchesInFlight?: number; fetchIdle?: () => boolean } = {},
) {
  const leases = await leaseNew(db.sql, queue, "W", n);
  const pool = await countingPool(db, /update conveyor_jobs/, { max: 2, latencyMs: 100 });
  try {
    const completer = createCompleter(pool.sql, "W", silentLogger, {
      batchesInFlight: o.batchesInFlight,
      fetchIdle: o.fetchIdle,
    });
    const first = o.firstAlone ? [completer.complete(leases.shift() as Lease)] : [];
    if (o.firstAlone) await Bun.sleep(30);
    const done = Promise.all([...first, ...leases.map((l) => completer.complete(l))]);
    await Bun.sleep(60);
    const atOnce = pool.sent();
    const committed = (await done).filter((d) => d).length;
    const [c] =
      await db.sql`select count(*)::int as n from conveyor_jobs where queue = ${queue} and state = 'completed'`;
    return { atOnce, total: pool.sent(), committed, completed: c?.n };
  } finally {
    await pool.close();
  }
}

const firstAlone = true;
const MIN = COMPLETER_SECOND_BATCH_MIN;

test("a few completions wait for the batch being written, then go together", async () => {
  expect(await onTheWire("cb2", 3, { firstAlone })).toEqual({
    atOnce: 1,
    total: 2,
    committed: 3,
    completed: 3,
  });
});

test("with two batches allowed, a second goes at once when enough completions wait", async () => {
  expect(await onTheWire("cb3", 1 + MIN, { firstAlone, batchesInFlight: 2 })).toEqual({
    atOnce: 2,
    total: 2,
    committed: 1 + MIN,
    completed: 1 + MIN,
  });
});

test("by default one batch is written at a time, however many completions wait", async () => {
  // The rest went together in one statement after the first committed.
  expect(await onTheWire("cb4", 1 + MIN, { firstAlone })).toEqual({
    atOnce: 1,
    total: 2,
    committed: 1 + MIN,
    completed: 1 + MIN,
  });
});

test("while no fetch is in flight, a second batch goes at once when enough completions wait; a few still wait", async () => {
  const fetchIdle = () => true;
  expect(await onTheWire("cb7", 1 + MIN, { firstAlone, fetchIdle })).toEqual({
    atOnce: 2,
    total: 2,
    committed: 1 + MIN,
    completed: 1 + MIN,
  });
  expect(await onTheWire("cb8", MIN, { firstAlone, fetchIdle })).toEqual({
    atOnce: 1,
    total: 2,
    committed: MIN,
    completed: MIN,
  });
});

test("with nothing in flight and no fetch either, a large batch goes as two halves side by side", async () => {
  const n = 2 * MIN + 1;
  expect(await onTheWire("cb9", n, { fetchIdle: () => true })).toEqual({
    atOnce: 2,
    total: 2,
    committed: n,
    completed: n,
  });
  // Below twice the threshold a half is not worth a statement of its own.
  const m = 2 * MIN - 1;
  expect(await onTheWire("cb10", m, { fetchIdle: () => true })).toEqual({
    atOnce: 1,
    total: 1,
    committed: m,
    completed: m,
  });
  // A fetch in flight that is back a turn later (the empty one at the end
  // of a drain): the completer waits that turn, then splits.
  let asked = 0;
  expect(await onTheWire("cb12", n, { fetchIdle: () => asked++ > 0 })).toEqual({
    atOnce: 2,
    total: 2,
    committed: n,
    completed: n,
  });
  // While a fetch stays in flight, one statement.
  expect(await onTheWire("cb11", n, { fetchIdle: () => false })).toEqual({
    atOnce: 1,
    total: 1,
    committed: n,
    completed: n,
  });
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
