// The producer's fetch scheduling, observed on the wire.
import { afterAll, beforeAll, expect, test } from "bun:test";
import postgres from "postgres";
import { enqueueMany } from "../src/enqueue.ts";
import { createEvents } from "../src/events.ts";
import { silentLogger } from "../src/logger.ts";
import { createProducer } from "../src/worker/producer.ts";
import { countingPool, type TestDb, testDatabase } from "./harness.ts";

let db: TestDb;
beforeAll(async () => {
  db = await testDatabase();
});
afterAll(async () => {
  await db.drop();
});

test("with a backlog, a busy producer keeps two fetches in flight, not one after another", async () => {
  const queue = "backlog";
  await enqueueMany(
    db.sql,
    Array.from({ length: 2_000 }, () => ({ queue, kind: "k" })),
  );
  // 100 ms each way: no fetch can return within 200 ms.
  const pool = await countingPool(db, /with next as/, { max: 4, latencyMs: 100 });
  const producer = createProducer({
    sql: pool.sql,
    queue,
    owner: "W",
    kinds: ["k"],
    concurrency: 1_000,
    fetchBatch: 500,
    leaseMs: 30_000,
    pollIntervalMs: 60_000,
    execute: async (_row, _leaseMs, handlerDone) => handlerDone(),
    logger: silentLogger,
    events: createEvents(),
  });
  try {
    producer.start();
    await Bun.sleep(120);
    expect(pool.sent()).toBe(2);
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
    execute: async () => {},
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
