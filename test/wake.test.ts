import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import path from "node:path";
import type { Pool } from "../src/db/db.ts";
import { onLocalWake, parseWake, senderTag, wakeAfterCommit, wakesSent } from "../src/db/wake.ts";
import { enqueue } from "../src/enqueue.ts";
import { silentLogger } from "../src/logger.ts";
import { createWorker } from "../src/worker/worker.ts";
import { countingPool, type TestDb, testDatabase } from "./harness.ts";

let db: TestDb;
beforeAll(async () => {
  db = await testDatabase();
});
afterAll(async () => {
  await db.drop();
});

async function listen() {
  const heard: string[] = [];
  const sub = await db.connect({ max: 1 }).listen("conveyor_jobs", (p) => heard.push(p));
  return { heard, unlisten: sub.unlisten };
}

async function until(pred: () => boolean | Promise<boolean>, ms = 5_000) {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    if (await pred()) return;
    await Bun.sleep(10);
  }
  throw new Error("condition not met in time");
}

/** A worker for one queue that only notifications (or local wake-ups) can wake: its poll is a minute. */
function idleWorker(sql: Pool, queue: string, handOff = true) {
  let ran = 0;
  const worker = createWorker({
    sql,
    queues: { [queue]: { concurrency: 5 } },
    handlers: { k: () => void ran++ },
    pollIntervalMs: 60_000,
    handOff,
    logger: silentLogger,
  });
  return { worker, ran: () => ran };
}

describe("wake-ups", () => {
  test("a committed enqueue wakes this process's listeners at once, then notifies with its tag", async () => {
    const local: string[] = [];
    const other = db.connect({ max: 2 });
    // Registered through another pool on the same database: keyed by database, not pool.
    const off = onLocalWake(other, (q) => local.push(q));
    const l = await listen();
    try {
      wakeAfterCommit(db.sql, ["w-a", "w-b", "w-a"]);
      // Synchronously, before any round trip.
      expect(local).toEqual(["w-a", "w-b", "w-a"]);
      await wakesSent(db.sql);
      await until(() => l.heard.length >= 2);
      const parsed = l.heard.map(parseWake);
      expect(parsed.map((p) => p.queue).sort()).toEqual(["w-a", "w-b"]);
      for (const p of parsed) expect(p.sender).toBe(senderTag(other));
    } finally {
      off();
      await l.unlisten();
    }
    expect(parseWake("plain")).toEqual({ queue: "plain", sender: undefined });
  });

  test("concurrent enqueues on one pool share notifications", async () => {
    const l = await listen();
    const n = 200;
    await Promise.all(
      Array.from({ length: n }, (_, i) =>
        enqueue(db.sql, { queue: "w-many", kind: "k", payload: { i } }),
      ),
    );
    await wakesSent(db.sql);
    await db.sql`select pg_notify('conveyor_jobs', 'w-end')`;
    await until(() => l.heard.includes("w-end"));
    await l.unlisten();
    const many = l.heard.filter((p) => parseWake(p).queue === "w-many");
    expect(many.length).toBeGreaterThanOrEqual(1);
    expect(many.length).toBeLessThan(n / 2);
  });

  test("an enqueue in the caller's transaction notifies at its commit, untagged", async () => {
    const l = await listen();
    await db.sql.begin(async (tx) => {
      await enqueue(tx, { queue: "w-tx", kind: "k" });
      await Bun.sleep(100);
      // Nothing before the commit.
      expect(l.heard).toEqual([]);
    });
    await until(() => l.heard.length > 0);
    await l.unlisten();
    expect(l.heard).toEqual(["w-tx"]);
  });

  test("a worker skips the notification of its own process's enqueue: one fetch per job", async () => {
    const q = "w-self";
    const counted = await countingPool(db, /set state = 'running'/, { max: 5 });
    // Without the hand-off, which would take these jobs with no fetch at all (handoff.test.ts).
    const { worker: w, ran } = idleWorker(counted.sql, q, false);
    await w.start();
    try {
      await until(() => counted.sent() >= 1); // the first fetch, at start
      await Bun.sleep(300); // LISTEN is up
      for (let i = 1; i <= 3; i++) {
        const before = counted.sent();
        await enqueue(db.sql, { queue: q, kind: "k" });
        await until(() => ran() === i);
        await wakesSent(db.sql);
        await Bun.sleep(150); // long enough for the notification to arrive and be acted on
        expect(counted.sent() - before).toBe(1);
      }
    } finally {
      await w.stop();
      await counted.close();
    }
  });

  test("an enqueue from another process wakes an idle worker through NOTIFY", async () => {
    const q = "w-remote";
    const { worker: w, ran } = idleWorker(db.connect(), q);
    await w.start();
    try {
      await Bun.sleep(300); // first fetch done, LISTEN up
      const enqueueTs = path.join(import.meta.dir, "..", "src", "enqueue.ts");
      const script = `
        import postgres from "postgres";
        import { enqueue } from ${JSON.stringify(enqueueTs)};
        const sql = postgres(${JSON.stringify(db.url)}, { onnotice: () => {} });
        await enqueue(sql, { queue: ${JSON.stringify(q)}, kind: "k" });
        await sql.end();`;
      const child = Bun.spawn([process.execPath, "-e", script], {
        cwd: path.join(import.meta.dir, ".."),
        stderr: "pipe",
      });
      expect(await child.exited).toBe(0);
      // Long before the 60 s poll.
      await until(() => ran() === 1, 5_000);
    } finally {
      await w.stop();
    }
  });
});
