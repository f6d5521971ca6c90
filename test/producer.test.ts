// The producer's fetch scheduling, observed on the wire.
import { afterAll, beforeAll, expect, test } from "bun:test";
import fc from "fast-check";
import postgres from "postgres";
import type { LeasedRow } from "../src/db/fetch.ts";
import { enqueueMany } from "../src/enqueue.ts";
import { createEvents } from "../src/events.ts";
import { silentLogger } from "../src/logger.ts";
import { createProducer } from "../src/worker/producer.ts";
import { countingPool, type TestDb, testDatabase } from "./harness.ts";

/** A producer's execute that runs `fn` and says the job is over when it settles, as the executor does. */
const executing =
  (fn: (row: LeasedRow, handlerDone: () => void) => Promise<void>) =>
  (row: LeasedRow, _leaseMs: number, handlerDone: () => void, over: () => void) => {
    fn(row, handlerDone).then(over, over);
  };

let db: TestDb;
beforeAll(async () => {
  db = await testDatabase();
});
afterAll(async () => {
  await db.drop();
});

/**
 * A producer over a backlog of 2,000 jobs in `queue`, fetching 500 at a time
 * through a pool 100 ms away each way (no fetch returns within 200 ms), that
 * counts its fetches and the jobs it ran; its first job holds the thread for
 * `busyFirstMs`, as a slow batch of handlers would.
 */
async function backlogProducer(
  queue: string,
  o: { fetchesInFlight?: number; busyFirstMs?: number } = {},
) {
  await enqueueMany(
    db.sql,
    Array.from({ length: 2_000 }, () => ({ queue, kind: "k" })),
  );
  const pool = await countingPool(db, /set state = 'running'/, { max: 4, latencyMs: 100 });
  // Per job run: fetches sent by then, and when it ran (ms on performance.now()).
  const counts = { ran: 0, sentWhenRun: [] as number[], ranAt: [] as number[] };
  const producer = createProducer({
    sql: pool.sql,
    queue,
    owner: "W",
    kinds: ["k"],
    concurrency: 1_000,
    fetchBatch: 500,
    leaseMs: 30_000,
    pollIntervalMs: 60_000,
    execute: executing(async (_row, handlerDone) => {
      counts.sentWhenRun.push(pool.sent());
      counts.ranAt.push(performance.now());
      if (counts.ran++ === 0) Bun.sleepSync(o.busyFirstMs ?? 0);
      handlerDone();
    }),
    logger: silentLogger,
    events: createEvents(),
    ...(o.fetchesInFlight === undefined ? {} : { fetchesInFlight: o.fetchesInFlight }),
  });
  return { pool, producer, counts };
}

test("with a backlog and two fetches allowed, a busy producer keeps two in flight, not one after another", async () => {
  const { pool, producer } = await backlogProducer("backlog", { fetchesInFlight: 2 });
  try {
    producer.start();
    await Bun.sleep(120);
    expect(pool.sent()).toBe(2);
  } finally {
    await producer.stop();
    await pool.close();
  }
});

test("fetching counts the fetches whose statement has not returned", async () => {
  const { pool, producer } = await backlogProducer("inflight", { fetchesInFlight: 2 });
  try {
    expect(producer.fetching).toBe(0);
    producer.start();
    await Bun.sleep(120);
    // Both sent, neither back (a round trip takes 200 ms).
    expect(producer.fetching).toBe(2);
    await producer.stop();
    expect(producer.fetching).toBe(0);
  } finally {
    await producer.stop();
    await pool.close();
  }
});

test("by default a busy producer has one fetch in flight, and sends the next before the batch it returned runs", async () => {
  // The first batch's handlers hold the thread for 300 ms; a round trip takes 200.
  const { pool, producer, counts } = await backlogProducer("backlog1", { busyFirstMs: 300 });
  try {
    producer.start();
    await Bun.sleep(120);
    expect(pool.sent()).toBe(1);
    const started = performance.now();
    while (counts.ran < 1_000 && performance.now() - started < 5_000) await Bun.sleep(1);
    // Each batch's first job ran after the next fetch had been issued, and
    // not before the one after it: one fetch in flight.
    expect(counts.sentWhenRun[0]).toBe(2);
    expect(counts.sentWhenRun[499]).toBe(2);
    expect(counts.sentWhenRun[500]).toBe(3);
    // And it was on the wire while the first batch ran: the second batch came
    // back as the first one's 300 ms ended, not a 200 ms round trip after.
    const gap = (counts.ranAt[500] as number) - (counts.ranAt[0] as number);
    expect(gap).toBeGreaterThanOrEqual(300);
    expect(gap).toBeLessThan(450);
  } finally {
    await producer.stop();
    await pool.close();
  }
});

test("after a failed fetch the producer waits for its backoff before the next", async () => {
  // Nothing listens on port 1: every fetch fails at once.
  const sql = postgres("postgres://nobody@127.0.0.1:1/none", {
    max: 1,
    connect_timeout: 1,
    onnotice: () => {},
  });
  const events = createEvents();
  let errors = 0;
  events.on("loop:error", () => errors++);
  const producer = createProducer({
    sql,
    queue: "q",
    owner: "W",
    kinds: ["k"],
    concurrency: 10,
    fetchBatch: 10,
    leaseMs: 30_000,
    pollIntervalMs: 60_000,
    execute: executing(async () => {}),
    logger: silentLogger,
    events,
  });
  producer.start();
  await Bun.sleep(500);
  // Wake-ups during the backoff do not bring the next fetch forward either.
  producer.wake();
  await Bun.sleep(100);
  await producer.stop();
  await sql.end({ timeout: 1 });
  // The first fetch failed; the retry is due after 700-1,300 ms.
  expect(errors).toBe(1);
});

test("any concurrency, fetch size and backlog: each job leased once, at most fetchBatch per fetch, at most concurrency running", async () => {
  let run = 0;
  // One connection: fetches run one after another, so no two share a
  // transaction start time (attempted_at), which groups rows by fetch below.
  const sql = db.connect({ max: 1 });
  await fc.assert(
    fc.asyncProperty(
      fc.integer({ min: 1, max: 60 }),
      fc.integer({ min: 1, max: 40 }),
      fc.integer({ min: 0, max: 150 }),
      fc.array(fc.integer({ min: 0, max: 3 }), { minLength: 1, maxLength: 8 }),
      async (concurrency, fetchBatch, n, delays) => {
        const queue = `prop-${run++}`;
        if (n > 0) {
          await enqueueMany(
            db.sql,
            Array.from({ length: n }, (_, i) => ({ queue, kind: "k", payload: { i } })),
          );
        }
        const seen: string[] = [];
        let active = 0;
        let maxActive = 0;
        let allSeen!: () => void;
        const done = new Promise<void>((r) => (allSeen = r));
        if (n === 0) allSeen();
        const producer = createProducer({
          sql,
          queue,
          owner: "W",
          kinds: ["k"],
          concurrency,
          fetchBatch,
          leaseMs: 30_000,
          pollIntervalMs: 60_000,
          execute: executing(async (row, handlerDone) => {
            active++;
            maxActive = Math.max(maxActive, active);
            seen.push(row.id);
            await Bun.sleep(delays[seen.length % delays.length] ?? 0);
            active--;
            handlerDone();
            if (seen.length === n) allSeen();
          }),
          logger: silentLogger,
          events: createEvents(),
        });
        producer.start();
        try {
          await done;
        } finally {
          await producer.stop();
        }
        expect(new Set(seen).size).toBe(n);
        expect(seen.length).toBe(n);
        expect(maxActive).toBeLessThanOrEqual(concurrency);
        // One fetch statement, one transaction: its rows share attempted_at = now().
        const groups = await db.sql<{ size: number; versions: string }[]>`
          select count(*)::int as size, string_agg(distinct lease_version::text, ',') as versions
            from conveyor_jobs where queue = ${queue} group by attempted_at`;
        for (const g of groups) {
          expect(g.size).toBeLessThanOrEqual(Math.min(fetchBatch, concurrency));
          expect(g.versions).toBe("1");
        }
        expect(groups.reduce((a, g) => a + g.size, 0)).toBe(n);
      },
    ),
    { numRuns: 15 },
  );
  await sql.end({ timeout: 5 });
}, 60_000);

/** A producer of kind "k" that polls once a minute and records the ids of the jobs it runs. */
function recordingProducer(queue: string, concurrency: number, fetchBatch = concurrency) {
  const ran: string[] = [];
  const producer = createProducer({
    sql: db.sql,
    queue,
    owner: "W",
    kinds: ["k"],
    concurrency,
    fetchBatch,
    leaseMs: 30_000,
    pollIntervalMs: 60_000,
    execute: executing(async (row, handlerDone) => {
      ran.push(row.id);
      handlerDone();
    }),
    logger: silentLogger,
    events: createEvents(),
  });
  return { producer, ran };
}

test("a producer offers a hand-off only while idle, and stop() waits for one in flight", async () => {
  const { producer, ran } = recordingProducer("handoff-stop", 2);
  // Before its first fetch came back short, a producer may have a backlog: no offer.
  expect(producer.takeHandOff("k")).toBeUndefined();
  producer.start();
  await Bun.sleep(100); // the first fetch: nothing there
  expect(producer.takeHandOff("other-kind")).toBeUndefined();
  const first = producer.takeHandOff("k");
  expect(first?.owner).toBe("W");
  // A second would leave no slot for a fetch (half a fetch batch, here 1).
  expect(producer.takeHandOff("k")).toBeUndefined();
  let stopped = false;
  const stopping = producer.stop().then(() => {
    stopped = true;
  });
  await Bun.sleep(50);
  expect(stopped).toBe(false); // the first hand-off's insert has not returned
  expect(producer.takeHandOff("k")).toBeUndefined(); // stopping: no new offers
  first?.deliver({
    id: "42",
    queue: "handoff-stop",
    kind: "k",
    payload: {},
    priority: 0,
    attempts: 1,
    max_attempts: 25,
    lease_version: "1",
    idempotency_key: null,
    traceparent: null,
    tracestate: null,
    run_at_ms: 0,
    created_at_ms: 0,
    lease_expires_at_ms: 0,
    errors: null,
  });
  await stopping;
  expect(ran).toEqual(["42"]); // delivered before stop() returned: it ran
});

test("a fetch in flight does not stop a hand-off: its slots are reserved already", async () => {
  // 10 slots, fetches of 4: a fetch in flight holds 4, and a hand-off leaves
  // more than half a fetch batch free.
  const { producer, ran } = recordingProducer("handoff-fetching", 10, 4);
  producer.start();
  await Bun.sleep(100); // the first fetch: nothing there, so the producer is idle
  const jobs = await enqueueMany(
    db.sql,
    [1, 2].map((i) => ({ queue: "handoff-fetching", kind: "k", payload: { i } })),
  );
  producer.wake();
  // The wake-up's fetch starts on the next turn; its reply cannot come in this one.
  await new Promise<void>((r) => setImmediate(r));
  const during = producer.takeHandOff("k");
  expect(during?.owner).toBe("W");
  during?.release();
  const deadline = Date.now() + 5_000;
  while (ran.length < 2 && Date.now() < deadline) await Bun.sleep(10);
  expect(ran.sort()).toEqual(jobs.map((j) => j.job.id).sort());
  await producer.stop();
});

test("hand-offs in flight leave a fetch its slots: jobs they missed still run", async () => {
  const { producer, ran } = recordingProducer("handoff-room", 10);
  producer.start();
  await Bun.sleep(100); // the first fetch: nothing there, so the producer is idle
  // Enqueues whose inserts have not returned (a busy pool, a slow commit) hold
  // their slots; offers stop while 5 (half a fetch batch) are left.
  const held = [];
  for (let h = producer.takeHandOff("k"); h; h = producer.takeHandOff("k")) held.push(h);
  expect(held).toHaveLength(5);
  // Jobs that were not handed off: a wake-up fetches them at once.
  const jobs = await enqueueMany(
    db.sql,
    [1, 2, 3].map((i) => ({ queue: "handoff-room", kind: "k", payload: { i } })),
  );
  producer.wake();
  const deadline = Date.now() + 5_000;
  while (ran.length < 3 && Date.now() < deadline) await Bun.sleep(10);
  expect(ran.sort()).toEqual(jobs.map((j) => j.job.id).sort());
  for (const h of held) h.release();
  await producer.stop();
});
