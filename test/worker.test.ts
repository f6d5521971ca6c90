import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { fetchJobs } from "../src/db/fetch.ts";
import { enqueue, enqueueMany } from "../src/enqueue.ts";
import { JobTimeoutError } from "../src/errors.ts";
import { cancel, snooze } from "../src/handler.ts";
import { type LogFields, type Logger, silentLogger } from "../src/logger.ts";
import {
  createWorker,
  MAX_FETCH_BATCH,
  OPEN_CONNECTIONS_DEADLINE_MS,
  type WorkerOptions,
} from "../src/worker/worker.ts";
import { type TestDb, testDatabase } from "./harness.ts";

let db: TestDb;
beforeAll(async () => {
  db = await testDatabase();
});
afterAll(async () => {
  await db.drop();
});

let queueSeq = 0;
const freshQueue = () => `q${++queueSeq}`;

function worker(queue: string, o: Partial<WorkerOptions> & Pick<WorkerOptions, "handlers">) {
  return createWorker({
    sql: db.connect(),
    queues: { [queue]: { concurrency: 10, leaseMs: 5_000 } },
    pollIntervalMs: 50,
    logger: silentLogger,
    ...o,
  });
}

async function job(id: string) {
  const [row] = await db.sql`select * from conveyor_jobs where id = ${id}`;
  if (!row) throw new Error(`no job ${id}`);
  return row;
}

async function until(pred: () => Promise<boolean>, ms = 10_000) {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    if (await pred()) return;
    await Bun.sleep(10);
  }
  throw new Error("condition not met in time");
}

const stateOf = async (id: string) => (await job(id)).state as string;

describe("worker", () => {
  test("start() opens the connections the pipeline uses at once, before the first fetch; gives up on them after a deadline", async () => {
    const q = freshQueue();
    const app = `conveyor-open-${q}`;
    const sql = db.connect({ max: 10, connection: { application_name: app } });
    const backends = async () =>
      Number(
        (
          await db.sql`select count(*)::int as n from pg_stat_activity where application_name = ${app}`
        )[0]?.n,
      );
    const w = createWorker({
      sql,
      queues: { [q]: { concurrency: 10, leaseMs: 5_000 } },
      handlers: { noop: () => undefined },
      effectConcurrency: 3,
      listen: false,
      pollIntervalMs: 60_000,
      logger: silentLogger,
    });
    expect(await backends()).toBe(0);
    await w.start();
    // One queue's fetch, one completion batch, one for the loops beside
    // them; effect transactions open theirs on first use.
    expect(await backends()).toBe(3);
    await w.stop();
    await sql.end();

    // A server that accepts connections and never answers: each connection
    // would wait out its 30 s connect timeout; start() must not.
    const silent = Bun.listen({
      hostname: "127.0.0.1",
      port: 0,
      socket: { data() {} },
    });
    const down = db.connect({ max: 10, port: silent.port, connect_timeout: 30 });
    const lost = createWorker({
      sql: down,
      queues: { [q]: { concurrency: 10, leaseMs: 5_000 } },
      handlers: { noop: () => undefined },
      listen: false,
      logger: silentLogger,
    });
    const t = performance.now();
    await lost.start();
    expect(performance.now() - t).toBeLessThan(OPEN_CONNECTIONS_DEADLINE_MS + 1_000);
    await lost.stop({ graceMs: 0 });
    await down.end({ timeout: 1 });
    silent.stop(true);
  });

  test("stop() while start() opens its connections: nothing starts after", async () => {
    const q = freshQueue();
    let ran = 0;
    const w = worker(q, { handlers: { k: () => void ran++ } });
    const starting = w.start();
    await w.stop({ graceMs: 0 });
    await starting;
    const { job: j } = await enqueue(db.sql, { queue: q, kind: "k", payload: {} });
    await Bun.sleep(300); // six polls' worth
    expect(ran).toBe(0);
    expect(await stateOf(j.id)).toBe("available");
  });

  test("runs every job exactly once when nothing fails, storing results", async () => {
    const q = freshQueue();
    const calls = new Map<string, number>();
    const w = worker(q, {
      queues: { [q]: { concurrency: 20, leaseMs: 5_000 } },
      handlers: {
        add: async (p: { a: number; b: number }, ctx) => {
          calls.set(ctx.job.id, (calls.get(ctx.job.id) ?? 0) + 1);
          return { sum: p.a + p.b };
        },
      },
    });
    const res = await enqueueMany(
      db.sql,
      Array.from({ length: 500 }, (_, i) => ({ queue: q, kind: "add", payload: { a: i, b: 1 } })),
    );
    await w.start();
    await until(async () => {
      const [r] =
        await db.sql`select count(*)::int as n from conveyor_jobs where queue = ${q} and state = 'completed'`;
      return r?.n === 500;
    });
    await w.stop();
    expect(calls.size).toBe(500);
    expect([...calls.values()].every((n) => n === 1)).toBe(true);
    const first = res[7]?.job.id as string;
    expect((await job(first)).result).toEqual({ sum: 8 });
  });

  test("handlers get the fencing token, a stable idempotency key and the trace context", async () => {
    const q = freshQueue();
    const seen: { token: number; key: string; tp: string; copies: unknown[] }[] = [];
    const w = worker(q, {
      handlers: {
        k: (_p, ctx) => {
          seen.push({
            token: ctx.fencingToken,
            key: ctx.idempotencyKey,
            tp: ctx.job.traceparent,
            // Derived when first read: copies of the job must carry it as a value.
            copies: [{ ...ctx.job }.traceparent, JSON.parse(JSON.stringify(ctx.job)).traceparent],
          });
          if (seen.length === 1) throw new Error("first attempt fails");
        },
      },
      backoff: { baseMs: 10, jitter: 0 },
    });
    const { job: j } = await enqueue(db.sql, { queue: q, kind: "k", idempotencyKey: "order-9" });
    await w.start();
    await until(async () => (await stateOf(j.id)) === "completed");
    await w.stop();
    expect(seen.map((s) => s.token)).toEqual([1, 2]);
    expect(seen.map((s) => s.key)).toEqual(["order-9", "order-9"]);
    // Stable across attempts: derived from the job, as none was given.
    expect(seen.map((s) => s.tp)).toEqual([j.traceparent, j.traceparent]);
    expect(seen[0]?.copies).toEqual([j.traceparent, j.traceparent]);
  });

  test("failures retry with growing backoff, then discard after max attempts", async () => {
    const q = freshQueue();
    const w = worker(q, {
      handlers: {
        boom: () => {
          throw new TypeError("always broken");
        },
      },
      backoff: { baseMs: 40, factor: 2, jitter: 0 },
    });
    const { job: j } = await enqueue(db.sql, { queue: q, kind: "boom", maxAttempts: 4 });
    await w.start();
    await until(async () => (await stateOf(j.id)) === "discarded");
    await w.stop();
    const row = await job(j.id);
    expect(row.attempts).toBe(4);
    expect(row.finalized_at).not.toBeNull();
    const errors = row.errors as { attempt: number; name: string; message: string; at: string }[];
    expect(errors.map((e) => e.attempt)).toEqual([1, 2, 3, 4]);
    expect(errors.every((e) => e.name === "TypeError" && e.message === "always broken")).toBe(true);
    // Gaps between attempts follow 40, 80, 160 ms (plus polling slack).
    const at = errors.map((e) => Date.parse(e.at));
    const gaps = at.slice(1).map((t, i) => t - (at[i] as number));
    expect(gaps[0]).toBeGreaterThanOrEqual(40);
    expect(gaps[1]).toBeGreaterThanOrEqual(80);
    expect(gaps[2]).toBeGreaterThanOrEqual(160);
  });

  test("snooze reschedules without spending an attempt; cancel finishes as cancelled", async () => {
    const q = freshQueue();
    let runs = 0;
    const w = worker(q, {
      handlers: {
        snoozer: () => (++runs === 1 ? snooze(30) : "woke"),
        quitter: () => cancel("customer left"),
      },
    });
    const { job: s } = await enqueue(db.sql, { queue: q, kind: "snoozer", maxAttempts: 1 });
    const { job: c } = await enqueue(db.sql, { queue: q, kind: "quitter" });
    await w.start();
    await until(
      async () => (await stateOf(s.id)) === "completed" && (await stateOf(c.id)) === "cancelled",
    );
    await w.stop();
    const sr = await job(s.id);
    expect(sr.attempts).toBe(2);
    expect(sr.max_attempts).toBe(2);
    expect(sr.result).toBe("woke");
    const cr = await job(c.id);
    expect(cr.errors[0]).toMatchObject({ name: "Cancelled", message: "customer left" });
    expect(cr.finalized_at).not.toBeNull();
  });

  test("a handler over its timeout is aborted and the attempt fails", async () => {
    const q = freshQueue();
    let reason: unknown;
    const w = worker(q, {
      handlers: {
        slow: {
          timeoutMs: 50,
          handler: async (_p, ctx) => {
            await new Promise((r) => ctx.signal.addEventListener("abort", r, { once: true }));
            reason = ctx.signal.reason;
            throw ctx.signal.reason;
          },
        },
      },
    });
    const { job: j } = await enqueue(db.sql, { queue: q, kind: "slow", maxAttempts: 1 });
    await w.start();
    await until(async () => (await stateOf(j.id)) === "discarded");
    await w.stop();
    expect(reason).toBeInstanceOf(JobTimeoutError);
    expect((await job(j.id)).errors[0].name).toBe("JobTimeoutError");
  });

  test("a result that is not JSON fails the attempt with a clear error", async () => {
    const q = freshQueue();
    const w = worker(q, { handlers: { bad: () => ({ when: new Date() }) as never } });
    const { job: j } = await enqueue(db.sql, { queue: q, kind: "bad", maxAttempts: 1 });
    await w.start();
    await until(async () => (await stateOf(j.id)) === "discarded");
    await w.stop();
    expect((await job(j.id)).errors[0].message).toContain("result.when");
  });

  test("a notification wakes an idle worker long before its poll interval", async () => {
    const q = freshQueue();
    let startedAt = 0;
    const w = worker(q, {
      pollIntervalMs: 60_000,
      handlers: {
        k: () => {
          startedAt = performance.now();
        },
      },
    });
    await w.start();
    await Bun.sleep(200); // LISTEN is up
    const t0 = performance.now();
    const { job: j } = await enqueue(db.sql, { queue: q, kind: "k" });
    await until(async () => (await stateOf(j.id)) === "completed", 5_000);
    await w.stop();
    expect(startedAt - t0).toBeLessThan(1_000);
  });

  test("with LISTEN off, polling alone still picks up every job", async () => {
    const q = freshQueue();
    const w = worker(q, { listen: false, pollIntervalMs: 30, handlers: { k: () => {} } });
    await w.start();
    const res = await enqueueMany(
      db.sql,
      Array.from({ length: 30 }, () => ({ queue: q, kind: "k" })),
    );
    await until(async () => {
      const states = await Promise.all(res.map((r) => stateOf(r.job.id)));
      return states.every((s) => s === "completed");
    });
    await w.stop();
  });

  test("the worker's reaper recovers a job whose worker died holding the lease", async () => {
    const q = freshQueue();
    const { job: j } = await enqueue(db.sql, { queue: q, kind: "k" });
    // A worker that leased the job and then vanished (kill -9): no heartbeat, no outcome.
    const [dead] = await fetchJobs(db.sql, {
      queue: q,
      owner: "dead",
      limit: 1,
      leaseMs: 100,
      kinds: ["k"],
    });
    expect(dead?.lease_version).toBe("1");
    let token = 0;
    const w = worker(q, {
      reaper: { intervalMs: 50 },
      handlers: {
        k: (_p, ctx) => {
          token = ctx.fencingToken;
        },
      },
    });
    await w.start();
    await until(async () => (await stateOf(j.id)) === "completed");
    await w.stop();
    expect(token).toBe(2);
    const row = await job(j.id);
    expect(row.attempts).toBe(2);
    expect(row.errors[0].name).toBe("LeaseExpired");
  });

  test("a handler may destructure ctx: transaction, signal and logger work detached", async () => {
    const q = freshQueue();
    await db.sql`create table if not exists destructured_effects (job_id bigint primary key)`;
    const seen: boolean[] = [];
    // Records every line with the fields of the child loggers it came through.
    const lines: { msg: string; fields: LogFields }[] = [];
    const recording = (bound: LogFields): Logger => ({
      debug: (msg, fields) => void lines.push({ msg, fields: { ...bound, ...fields } }),
      info() {},
      warn() {},
      error() {},
      child: (fields) => recording({ ...bound, ...fields }),
    });
    const w = worker(q, {
      logger: recording({}),
      handlers: {
        k: async (_p, { job, transaction, signal, logger }) => {
          logger.debug("destructured");
          seen.push(signal.aborted);
          return transaction(async (tx) => {
            await tx`insert into destructured_effects (job_id) values (${job.id})`;
            return { id: job.id };
          });
        },
      },
    });
    const { job: j } = await enqueue(db.sql, { queue: q, kind: "k" });
    await w.start();
    await until(async () => (await stateOf(j.id)) === "completed");
    await w.stop();
    expect(seen).toEqual([false]);
    // The detached logger is the job's: its line carries the job's fields.
    expect(lines.filter((l) => l.msg === "destructured")).toEqual([
      { msg: "destructured", fields: expect.objectContaining({ jobId: j.id, kind: "k" }) },
    ]);
    expect((await job(j.id)).result).toEqual({ id: j.id });
    const [effect] =
      await db.sql`select count(*)::int as n from destructured_effects where job_id = ${j.id}`;
    expect(effect?.n).toBe(1);
  });

  test("ctx.transaction runs once per job: a second call, during or after the first, throws", async () => {
    const q = freshQueue();
    const errors: string[] = [];
    const w = worker(q, {
      handlers: {
        k: async (_p, ctx) => {
          const first = ctx.transaction(async (tx) => {
            await tx`select pg_sleep(0.05)`;
            return "first";
          });
          // While the first is in flight, and through a detached reference.
          const { transaction } = ctx;
          await transaction(async () => "during").catch((e: Error) => errors.push(e.message));
          const out = await first;
          await ctx.transaction(async () => "after").catch((e: Error) => errors.push(e.message));
          return out;
        },
      },
    });
    const { job: j } = await enqueue(db.sql, { queue: q, kind: "k" });
    await w.start();
    await until(async () => (await stateOf(j.id)) === "completed");
    await w.stop();
    expect(errors).toEqual([
      "ctx.transaction() may be called once per job",
      "ctx.transaction() may be called once per job",
    ]);
    expect((await job(j.id)).result).toBe("first");
  });

  test("a handler may return a thenable that is not a Promise; its value is the result", async () => {
    const q = freshQueue();
    const w = worker(q, {
      handlers: {
        // Plugins are plain JavaScript: the types do not stop this.
        k: (() => ({
          // biome-ignore lint/suspicious/noThenProperty: the point of the test.
          then: (resolve: (v: unknown) => void) => setTimeout(() => resolve(7), 10),
        })) as unknown as () => Promise<number>,
      },
    });
    const { job: j } = await enqueue(db.sql, { queue: q, kind: "k" });
    await w.start();
    await until(async () => (await stateOf(j.id)) === "completed");
    await w.stop();
    expect((await job(j.id)).result).toBe(7);
  });

  test("stop drains: running jobs finish within the grace period, nothing new is fetched", async () => {
    const q = freshQueue();
    let started = 0;
    const w = worker(q, {
      queues: { [q]: { concurrency: 2, leaseMs: 5_000 } },
      handlers: {
        slow: async () => {
          started++;
          await Bun.sleep(300);
          return "finished";
        },
      },
    });
    const res = await enqueueMany(
      db.sql,
      Array.from({ length: 5 }, () => ({ queue: q, kind: "slow" })),
    );
    await w.start();
    await until(async () => started === 2);
    await w.stop({ graceMs: 5_000 });
    const states = await Promise.all(res.map((r) => stateOf(r.job.id)));
    expect(states.filter((s) => s === "completed")).toHaveLength(2);
    expect(states.filter((s) => s === "available")).toHaveLength(3);
    expect(started).toBe(2);
  });

  test("after the grace period, handlers are aborted and their leases released for a prompt retry", async () => {
    const q = freshQueue();
    let aborted = 0;
    const w = worker(q, {
      handlers: {
        stuck: async (_p, ctx) => {
          await new Promise((r) => ctx.signal.addEventListener("abort", r, { once: true }));
          aborted++;
          await Bun.sleep(100); // ignores the abort for a while, then returns
          return "too late";
        },
      },
    });
    const { job: j } = await enqueue(db.sql, { queue: q, kind: "stuck" });
    await w.start();
    await until(async () => (await stateOf(j.id)) === "running");
    await w.stop({ graceMs: 100 });
    expect(aborted).toBe(1);
    await Bun.sleep(150); // the handler returns; its completion must not apply
    const row = await job(j.id);
    expect(row.state).toBe("available");
    expect(row.attempts).toBe(0); // an interrupted attempt is not counted
    expect(row.result).toBeNull();
    expect(new Date(row.run_at).getTime()).toBeLessThanOrEqual(Date.now() + 1_000);
    // Another worker picks it up at once with a new token.
    let token = 0;
    const w2 = worker(q, {
      handlers: {
        stuck: (_p, ctx) => {
          token = ctx.fencingToken;
        },
      },
    });
    await w2.start();
    await until(async () => (await stateOf(j.id)) === "completed");
    await w2.stop();
    expect(token).toBe(2);
  });

  test("invalid worker options are rejected with the field named", () => {
    expect(() => createWorker({ sql: db.sql, queues: {}, handlers: { k: () => {} } })).toThrow(
      /worker\.queues/,
    );
    expect(() =>
      createWorker({ sql: db.sql, queues: { q: { concurrency: 0 } }, handlers: { k: () => {} } }),
    ).toThrow(/worker\.queues\.q\.concurrency/);
    expect(() =>
      createWorker({
        sql: db.sql,
        queues: { q: { concurrency: 5_000, fetchBatch: MAX_FETCH_BATCH + 1 } },
        handlers: { k: () => {} },
      }),
    ).toThrow(/worker\.queues\.q\.fetchBatch/);
    expect(() =>
      createWorker({ sql: db.sql, queues: { "bad queue": {} }, handlers: { k: () => {} } }),
    ).toThrow(/worker\.queues/);
    expect(() => createWorker({ sql: db.sql, queues: { q: {} }, handlers: {} })).toThrow(
      /worker\.handlers/,
    );
  });
});
