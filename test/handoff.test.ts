// Hand-off (src/db/handoff.ts): a job this process enqueues goes to an idle
// worker of this process, leased by the insert, with no fetch; everything
// that is not plainly runnable by that worker goes the usual way.
import { afterAll, beforeAll, beforeEach, describe, expect, test } from "bun:test";
import fc from "fast-check";
import postgres from "postgres";
import { setQueuesPaused } from "../src/db/admin.ts";
import type { Pool } from "../src/db/db.ts";
import { takeHandOff } from "../src/db/handoff.ts";
import { enqueue, enqueueMany } from "../src/enqueue.ts";
import { type Job, type JobRow, jobFromRow } from "../src/job.ts";
import type { JsonValue } from "../src/json.ts";
import { silentLogger } from "../src/logger.ts";
import { createWorker } from "../src/worker/worker.ts";
import { startResetProxy } from "./fixtures/reset-proxy.ts";
import { countingPool, type TestDb, testDatabase } from "./harness.ts";

let db: TestDb;
beforeAll(async () => {
  db = await testDatabase();
});
afterAll(async () => {
  await db.drop();
});
beforeEach(async () => {
  await db.sql`truncate conveyor_jobs`;
  await db.sql`delete from conveyor_queues`;
});

async function until(check: () => boolean | Promise<boolean>, ms = 10_000) {
  const deadline = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error("condition not met in time");
    await Bun.sleep(5);
  }
}

/**
 * Resolves once a worker on the pool's database would take a job of this
 * queue: its first fetch came back empty, and no other is about to start.
 */
async function idle(pool: Pool, queue: string) {
  const free = () => {
    const h = takeHandOff(pool, queue, "k");
    h?.release();
    return h !== undefined;
  };
  const turn = () => new Promise<void>((r) => setImmediate(r));
  await until(async () => {
    if (!free()) return false;
    // A fetch that ends with more wanted schedules the next for the next
    // turn (nextTurn): idle only if still so once that turn has run.
    await turn();
    await turn();
    return free();
  });
}

/**
 * A started worker whose first fetch came back empty, and that polls once a
 * minute: anything it runs soon came by hand-off or wake-up.
 */
async function idleWorker(
  sql: Pool,
  queue: string,
  o: {
    concurrency?: number;
    /** Awaited by every job's handler; a function is called per job. */
    block?: Promise<void> | (() => Promise<void>);
    leaseMs?: number;
  } = {},
) {
  const seen: Job[] = [];
  const tokens: number[] = [];
  // The worker's LISTEN, watched: once it is confirmed the worker wakes its
  // producers, whose fetch must be counted before the test counts fetches.
  let listening = false;
  const listened = () => {
    listening = true;
  };
  const watched = new Proxy(sql, {
    get(target, prop, receiver) {
      if (prop !== "listen") return Reflect.get(target, prop, receiver);
      const listen: Pool["listen"] = (channel, onMessage, onListen) =>
        target.listen(channel, onMessage, () => {
          onListen?.();
          // The producers' fill runs on the next turn (nextTurn); this after it.
          setImmediate(listened);
        });
      return listen;
    },
  });
  const worker = createWorker({
    sql: watched,
    queues: { [queue]: { concurrency: o.concurrency ?? 5, leaseMs: o.leaseMs ?? 30_000 } },
    handlers: {
      k: async (_p: unknown, ctx) => {
        seen.push(ctx.job);
        tokens.push(ctx.fencingToken);
        await (typeof o.block === "function" ? o.block() : o.block);
      },
    },
    pollIntervalMs: o.leaseMs ? 100 : 60_000,
    reaper: o.leaseMs ? { intervalMs: 100 } : false,
    logger: silentLogger,
  });
  await worker.start();
  // Idle after the fetch that LISTEN's first connection triggers, too: else
  // that fetch may come after the test has counted the fetches so far.
  await until(() => listening)
    .then(() => idle(sql, queue))
    .catch(async (error) => {
      await worker.stop();
      throw error;
    });
  return { worker, seen, tokens };
}

const row = async (id: string) =>
  (
    await db.sql`select state, attempts, lease_version, lease_owner, run_at, created_at, errors
                  from conveyor_jobs where id = ${id}`
  )[0];

describe("hand-off", () => {
  test("an idle worker takes a job this process enqueues, leased by the insert: no fetch", async () => {
    const counted = await countingPool(db, /set state = 'running'/, { max: 5 });
    const { worker, seen, tokens } = await idleWorker(counted.sql, "h-idle");
    try {
      const fetches = counted.sent(); // one or two at start
      expect(fetches).toBeGreaterThan(0);
      // Enqueued on another pool to the same database, as the API does.
      const { job, duplicate } = await enqueue(db.sql, { queue: "h-idle", kind: "k" });
      expect(duplicate).toBe(false);
      expect(job).toMatchObject({
        state: "running",
        attempts: 1,
        leaseVersion: 1,
        leaseOwner: worker.owner,
      });
      await until(() => seen.length === 1);
      await until(async () => (await row(job.id))?.state === "completed");
      expect(counted.sent()).toBe(fetches);
      expect(tokens).toEqual([1]);
      const stored = await row(job.id);
      expect(stored).toMatchObject({ attempts: 1, lease_version: "1", lease_owner: worker.owner });
      // The handler's job is the stored row, to the millisecond, as after a fetch.
      const [ms] = await db.sql`
        select floor(date_part('epoch', run_at) * 1000)::int8 as run_at,
               floor(date_part('epoch', created_at) * 1000)::int8 as created_at
          from conveyor_jobs where id = ${job.id}`;
      expect(seen[0]?.runAt.getTime()).toBe(Number(ms?.run_at));
      expect(seen[0]?.createdAt.getTime()).toBe(Number(ms?.created_at));
      expect(seen[0]).toMatchObject({ id: job.id, attempts: 1, leaseVersion: 1, state: "running" });
    } finally {
      await worker.stop();
      await counted.close();
    }
  });

  test("property: the enqueue's job and the handler's are the stored row, whatever the job holds", async () => {
    // The hand-off's insert returns only what it decides and fills in the
    // rest from what it inserted (src/db/enqueue.ts): both must be the row
    // a select reads, to the millisecond, as a fetched job's are.
    let open!: () => void;
    const { worker, seen } = await idleWorker(db.connect({ max: 4 }), "h-row", {
      concurrency: 2,
      block: () => new Promise<void>((r) => (open = r)),
    });
    const text = (max: number) =>
      fc.option(fc.stringMatching(new RegExp(`^[\\x20-\\x7e]{1,${max}}$`)), { nil: undefined });
    const hex = (n: number) => fc.stringMatching(new RegExp(`^[0-9a-f]{${n}}$`));
    const input = fc.record({
      payload: fc
        .jsonValue({ maxDepth: 3 })
        .map((v) => JSON.stringify(v))
        .filter((v) => !v.includes("\\u0000"))
        .map((v) => JSON.parse(v) as JsonValue),
      priority: fc.option(fc.integer({ min: -32768, max: 32767 }), { nil: undefined }),
      maxAttempts: fc.option(fc.integer({ min: 1, max: 1000 }), { nil: undefined }),
      idempotencyKey: text(40),
      traceparent: fc.option(
        fc.tuple(hex(32), hex(16)).map(([t, s]) => `00-${t}-${s}-01`),
        { nil: undefined },
      ),
      tracestate: text(60),
    });
    try {
      await fc.assert(
        fc.asyncProperty(input, async (i) => {
          await db.sql`truncate conveyor_jobs`;
          await idle(db.sql, "h-row");
          const before = seen.length;
          const { job } = await enqueue(db.sql, { queue: "h-row", kind: "k", ...i });
          expect(job.state).toBe("running"); // handed off, and held by the handler below
          await until(() => seen.length === before + 1);
          try {
            const [stored] = (await db.sql`
              select * from conveyor_jobs where id = ${job.id}`) as unknown as JobRow[];
            const expected = jobFromRow(stored as JobRow);
            expect(job).toEqual(expected);
            expect(seen.at(-1)).toEqual(expected);
          } finally {
            open(); // a failing run must not leave its slot taken for the shrinking runs
          }
          await until(async () => (await row(job.id))?.state === "completed");
        }),
        { numRuns: 25 },
      );
    } finally {
      open?.();
      await worker.stop();
    }
  });

  test("a paused queue's job is inserted available and the slot given back", async () => {
    const { worker, seen } = await idleWorker(db.connect({ max: 4 }), "h-paused", {
      concurrency: 1,
    });
    try {
      await setQueuesPaused(db.sql, ["h-paused"], true);
      const { job } = await enqueue(db.sql, { queue: "h-paused", kind: "k" });
      expect(job.state).toBe("available");
      expect(job.leaseOwner).toBeNull();
      const [stored] = (await db.sql`
        select * from conveyor_jobs where id = ${job.id}`) as unknown as JobRow[];
      expect(job).toEqual(jobFromRow(stored as JobRow));
      await setQueuesPaused(db.sql, ["h-paused"], false);
      // The one slot came back: the next job is handed off.
      const next = await enqueue(db.sql, { queue: "h-paused", kind: "k" });
      expect(next.job.state).toBe("running");
      await until(() => seen.length === 1);
      expect(seen[0]?.id).toBe(next.job.id);
    } finally {
      await worker.stop();
    }
  });

  test("scheduled jobs, kinds the worker lacks, batches and a busy worker go the usual way", async () => {
    let unblock!: () => void;
    const block = new Promise<void>((r) => (unblock = r));
    const { worker, seen } = await idleWorker(db.connect({ max: 4 }), "h-usual", {
      concurrency: 1,
      block,
    });
    try {
      const later = await enqueue(db.sql, { queue: "h-usual", kind: "k", delayMs: 60_000 });
      expect(later.job.state).toBe("available");
      const other = await enqueue(db.sql, { queue: "h-usual", kind: "not-here" });
      expect(other.job.state).toBe("available");
      const pair = await enqueueMany(db.sql, [
        { queue: "h-usual", kind: "k" },
        { queue: "h-usual", kind: "k" },
      ]);
      expect(pair.map((r) => r.job.state)).toEqual(["available", "available"]);
      // The pair woke the worker, which fetched one (concurrency 1) and is now busy.
      await until(() => seen.length === 1);
      const busy = await enqueue(db.sql, { queue: "h-usual", kind: "k" });
      expect(busy.job.state).toBe("available");
      unblock();
      await until(() => seen.length === 3);
      expect(seen.map((j) => j.id).sort()).toEqual(
        [String(pair[0]?.job.id), String(pair[1]?.job.id), busy.job.id].sort(),
      );
    } finally {
      unblock();
      await worker.stop();
    }
  });

  test("a duplicate idempotency key hands nothing off, and the slot comes back", async () => {
    const { worker, seen } = await idleWorker(db.connect({ max: 4 }), "h-dup", {
      concurrency: 1,
    });
    try {
      const first = await enqueue(db.sql, { queue: "h-dup", kind: "k", idempotencyKey: "a" });
      expect(first.job.state).toBe("running");
      await until(async () => (await row(first.job.id))?.state === "completed");
      const again = await enqueue(db.sql, { queue: "h-dup", kind: "k", idempotencyKey: "a" });
      expect(again).toMatchObject({ duplicate: true, job: { id: first.job.id } });
      const next = await enqueue(db.sql, { queue: "h-dup", kind: "k" });
      expect(next.job.state).toBe("running");
      await until(() => seen.length === 2);
    } finally {
      await worker.stop();
    }
  });

  test("an insert whose reply is lost leaves a lease nobody holds: it expires and the job runs", async () => {
    const proxy = await startResetProxy(db.url, {
      match: (chunk) => chunk.includes("insert into conveyor_jobs as j"),
      when: "after",
    });
    const enqueuer = postgres(proxy.url, { max: 2, onnotice: () => {} });
    // The worker's pool goes through the proxy too: hand-offs are per database.
    const { worker, seen } = await idleWorker(enqueuer, "h-lost", { leaseMs: 500 });
    try {
      const error = await enqueue(enqueuer, { queue: "h-lost", kind: "k" }).then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(proxy.resets).toBe(1);
      expect((error as { code?: string }).code).toBe("ECONNRESET");
      // Committed, leased to the worker, which never heard of it.
      const [lost] = await db.sql`select id, state, lease_owner from conveyor_jobs`;
      expect(lost).toMatchObject({ state: "running", lease_owner: worker.owner });
      await until(() => seen.length === 1, 15_000);
      await until(async () => (await row(String(lost?.id)))?.state === "completed");
      const done = await row(String(lost?.id));
      expect(done).toMatchObject({ attempts: 2, lease_version: "2" });
      expect(done?.errors).toHaveLength(1);
      expect(done?.errors).toMatchObject([{ name: "LeaseExpired", attempt: 1 }]);
    } finally {
      await worker.stop();
      await enqueuer.end({ timeout: 0.2 });
      proxy.close();
    }
  }, 30_000);

  test("handOff: false leaves every enqueue to the fetch", async () => {
    const worker = createWorker({
      sql: db.connect({ max: 4 }),
      queues: { "h-off": { concurrency: 5 } },
      handlers: { k: () => {} },
      pollIntervalMs: 60_000,
      handOff: false,
      logger: silentLogger,
    });
    await worker.start();
    try {
      // Registered for no hand-off at all: the probe finds no taker.
      expect(takeHandOff(db.sql, "h-off", "k")).toBeUndefined();
      const { job } = await enqueue(db.sql, { queue: "h-off", kind: "k" });
      expect(job.state).toBe("available");
      await until(async () => (await row(job.id))?.state === "completed"); // by wake-up and fetch
    } finally {
      await worker.stop();
    }
  });
});
