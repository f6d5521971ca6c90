// The cron scheduler against a real database, with "now" injected: several
// schedulers covering the same slots enqueue each exactly once.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { type CronEntry, createCronScheduler } from "../src/cron/scheduler.ts";
import { silentLogger } from "../src/logger.ts";
import { type TestDb, testDatabase } from "./harness.ts";

let db: TestDb;
beforeAll(async () => {
  db = await testDatabase();
}, 60_000);
afterAll(async () => {
  await db.drop();
});

const entry = (over: Partial<CronEntry>): CronEntry => ({
  name: "tick",
  schedule: "* * * * * *",
  timezone: "UTC",
  queue: "cron-test",
  kind: "demo/hello",
  payload: { from: "cron" },
  missed: "skip",
  priority: 3,
  maxAttempts: 2,
  ...over,
});

const jobsOf = async (name: string) =>
  (await db.sql`
    select idempotency_key, priority, max_attempts, payload from conveyor_jobs
     where idempotency_key like ${`cron:${name}:%`} order by idempotency_key`) as unknown as {
    idempotency_key: string;
    priority: number;
    max_attempts: number;
  }[];

describe("cron scheduler", () => {
  test("three schedulers over overlapping windows enqueue each slot once", async () => {
    const t0 = Date.parse("2030-01-01T00:00:00.200Z");
    const schedulers = [0, 1, 2].map(() =>
      createCronScheduler({
        sql: db.sql,
        entries: [entry({ name: "race" })],
        logger: silentLogger,
      }),
    );
    await Promise.all(schedulers.map((s) => s.runStartup(new Date(t0))));
    // Ticks at different moments, as timers in different processes would fire.
    const results = await Promise.all(
      schedulers.flatMap((s, i) =>
        [1, 2, 3, 4, 5].map(async (k) => s.runOnce(new Date(t0 + k * 1000 + i * 37))),
      ),
    );
    const rows = await jobsOf("race");
    expect(rows.map((r) => r.idempotency_key)).toEqual([
      "cron:race:2030-01-01T00:00:01.000Z",
      "cron:race:2030-01-01T00:00:02.000Z",
      "cron:race:2030-01-01T00:00:03.000Z",
      "cron:race:2030-01-01T00:00:04.000Z",
      "cron:race:2030-01-01T00:00:05.000Z",
    ]);
    expect(rows[0]).toMatchObject({ priority: 3, max_attempts: 2 });
    const fresh = results.flat().filter((r) => !r.duplicate);
    expect(fresh).toHaveLength(5);
  });

  test("catch_up_one enqueues the last missed slot on start, once", async () => {
    const now = new Date("2030-02-01T10:30:00Z");
    const nightly = entry({ name: "nightly", schedule: "0 3 * * *", missed: "catch_up_one" });
    const a = createCronScheduler({ sql: db.sql, entries: [nightly], logger: silentLogger });
    const b = createCronScheduler({ sql: db.sql, entries: [nightly], logger: silentLogger });
    expect((await a.runStartup(now)).map((r) => r.duplicate)).toEqual([false]);
    expect((await b.runStartup(new Date(now.getTime() + 60_000))).map((r) => r.duplicate)).toEqual([
      true,
    ]);
    expect((await jobsOf("nightly")).map((r) => r.idempotency_key)).toEqual([
      "cron:nightly:2030-02-01T03:00:00.000Z",
    ]);
  });

  test("skip enqueues nothing for slots before the start", async () => {
    const s = createCronScheduler({
      sql: db.sql,
      entries: [entry({ name: "skipper", schedule: "0 3 * * *" })],
      logger: silentLogger,
    });
    expect(await s.runStartup(new Date("2030-02-01T10:30:00Z"))).toEqual([]);
    expect(await s.runOnce(new Date("2030-02-01T10:31:00Z"))).toEqual([]);
    expect(await jobsOf("skipper")).toEqual([]);
  });

  test("a failed tick is covered by the next one", async () => {
    const s = createCronScheduler({
      sql: db.sql,
      entries: [entry({ name: "retry", kind: "cron/blocked" })],
      logger: silentLogger,
    });
    const t0 = Date.parse("2030-03-01T00:00:00.500Z");
    await s.runStartup(new Date(t0));
    // Make the insert fail, as an unreachable database would.
    await db.sql`alter table conveyor_jobs add constraint cron_blocked check (kind <> 'cron/blocked') not valid`;
    try {
      await expect(s.runOnce(new Date(t0 + 1000))).rejects.toThrow();
    } finally {
      await db.sql`alter table conveyor_jobs drop constraint cron_blocked`;
    }
    await s.runOnce(new Date(t0 + 2000));
    expect((await jobsOf("retry")).map((r) => r.idempotency_key)).toEqual([
      "cron:retry:2030-03-01T00:00:01.000Z",
      "cron:retry:2030-03-01T00:00:02.000Z",
    ]);
  });
});
