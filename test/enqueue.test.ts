import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import fc from "fast-check";
import { parseWake, wakesSent } from "../src/db/wake.ts";
import { enqueue, enqueueMany } from "../src/enqueue.ts";
import { ValidationError } from "../src/errors.ts";
import { type JobRow, jobFromRow } from "../src/job.ts";
import { rootTraceparent } from "../src/trace.ts";
import { type TestDb, testDatabase } from "./harness.ts";

let db: TestDb;
beforeAll(async () => {
  db = await testDatabase();
});
afterAll(async () => {
  await db.drop();
});

const count = async (where = db.sql`true`) =>
  Number((await db.sql`select count(*)::int as n from conveyor_jobs where ${where}`)[0]?.n);

describe("enqueue", () => {
  test("stores one job with defaults and a trace context", async () => {
    const { job, duplicate } = await enqueue(db.sql, { kind: "email", payload: { to: "a@b.c" } });
    expect(duplicate).toBe(false);
    expect(job).toMatchObject({
      queue: "default",
      kind: "email",
      payload: { to: "a@b.c" },
      state: "available",
      attempts: 0,
      maxAttempts: 25,
      leaseVersion: 0,
      priority: 0,
    });
    expect(job.traceparent).toMatch(/^00-[0-9a-f]{32}-[0-9a-f]{16}-01$/);
  });

  test("a job enqueued outside any trace stores none and reads back one derived root", async () => {
    const { job } = await enqueue(db.sql, { kind: "t" });
    const [row] = await db.sql<JobRow[]>`select * from conveyor_jobs where id = ${job.id}`;
    if (!row) throw new Error("job row missing");
    expect(row.traceparent).toBeNull();
    expect(job.traceparent).toBe(rootTraceparent(job.id, job.createdAt.getTime()));
    // The API and the handler read it from the row as jobFromRow does.
    expect(jobFromRow(row).traceparent).toBe(job.traceparent);
    const [a, b] = await enqueueMany(db.sql, [{ kind: "t" }, { kind: "t" }]);
    expect(a?.job.traceparent).not.toBe(b?.job.traceparent);
    expect(a?.job.traceparent).not.toBe(job.traceparent);
  });

  test("keeps the caller's trace context", async () => {
    const traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    const { job } = await enqueue(db.sql, { kind: "t", traceparent, tracestate: "k=v" });
    expect(job.traceparent).toBe(traceparent);
    expect(job.tracestate).toBe("k=v");
    const [row] = await db.sql`select traceparent from conveyor_jobs where id = ${job.id}`;
    expect(row?.traceparent).toBe(traceparent);
  });

  test("delayMs and runAt schedule by the database clock", async () => {
    const { job } = await enqueue(db.sql, { kind: "later", delayMs: 60_000 });
    const [row] =
      await db.sql`select run_at - created_at as d from conveyor_jobs where id = ${job.id}`;
    expect(String(row?.d)).toContain("00:01:00");
    const at = new Date(Date.now() + 3_600_000);
    const { job: j2 } = await enqueue(db.sql, { kind: "later", runAt: at });
    expect(j2.runAt.getTime()).toBe(at.getTime());
  });

  test("per-queue defaults apply to jobs that do not set priority or maxAttempts", async () => {
    const opts = { queueDefaults: { slow: { priority: 5, maxAttempts: 3 } } };
    const { job: a } = await enqueue(db.sql, { queue: "slow", kind: "k" }, opts);
    const { job: b } = await enqueue(
      db.sql,
      { queue: "slow", kind: "k", priority: -1, maxAttempts: 9 },
      opts,
    );
    const { job: c } = await enqueue(db.sql, { queue: "other", kind: "k" }, opts);
    expect([a.priority, a.maxAttempts]).toEqual([5, 3]);
    expect([b.priority, b.maxAttempts]).toEqual([-1, 9]);
    expect([c.priority, c.maxAttempts]).toEqual([0, 25]);
  });

  test("a repeated idempotency key returns the existing job and says so", async () => {
    const a = await enqueue(db.sql, {
      queue: "q1",
      kind: "k",
      idempotencyKey: "order-1",
      payload: 1,
    });
    const b = await enqueue(db.sql, {
      queue: "q1",
      kind: "k",
      idempotencyKey: "order-1",
      payload: 2,
    });
    expect(a.duplicate).toBe(false);
    expect(b.duplicate).toBe(true);
    expect(b.job.id).toBe(a.job.id);
    expect(b.job.payload).toBe(1);
    // The key is per queue.
    const c = await enqueue(db.sql, { queue: "q2", kind: "k", idempotencyKey: "order-1" });
    expect(c.duplicate).toBe(false);
    expect(c.job.id).not.toBe(a.job.id);
  });

  test("many parallel enqueues with one key insert exactly one job", async () => {
    const pools = Array.from({ length: 4 }, () => db.connect({ max: 8 }));
    const results = await Promise.all(
      Array.from({ length: 64 }, (_, i) =>
        enqueue(pools[i % pools.length] as (typeof pools)[0], {
          queue: "race",
          kind: "k",
          idempotencyKey: "same",
        }),
      ),
    );
    expect(new Set(results.map((r) => r.job.id)).size).toBe(1);
    expect(results.filter((r) => !r.duplicate)).toHaveLength(1);
    expect(await count(db.sql`queue = 'race'`)).toBe(1);
  });

  test("a batch returns results in input order, deduplicating keys within and across batches", async () => {
    await enqueue(db.sql, { queue: "b", kind: "k", idempotencyKey: "x" });
    const res = await enqueueMany(db.sql, [
      { queue: "b", kind: "k1" },
      { queue: "b", kind: "k2", idempotencyKey: "x" },
      { queue: "b", kind: "k3", idempotencyKey: "y" },
      { queue: "b", kind: "k4", idempotencyKey: "y" },
      { queue: "b", kind: "k5" },
    ]);
    expect(res.map((r) => r.duplicate)).toEqual([false, true, false, true, false]);
    expect(res.map((r) => r.job.kind)).toEqual(["k1", "k", "k3", "k3", "k5"]);
    expect(res[2]?.job.id).toBe(res[3]?.job.id as string);
    expect(await count(db.sql`queue = 'b'`)).toBe(4);
  });

  test("inside the caller's transaction, the job exists only if it commits", async () => {
    const before = await count(db.sql`queue = 'tx'`);
    await expect(
      db.sql.begin(async (tx) => {
        await enqueue(tx, { queue: "tx", kind: "k" });
        throw new Error("caller rolls back");
      }),
    ).rejects.toThrow("caller rolls back");
    expect(await count(db.sql`queue = 'tx'`)).toBe(before);
    await db.sql.begin(async (tx) => {
      await enqueue(tx, { queue: "tx", kind: "k" });
    });
    expect(await count(db.sql`queue = 'tx'`)).toBe(before + 1);
  });

  test("wakes listeners once per queue with jobs runnable now, and only on commit", async () => {
    const heard: string[] = [];
    const sub = await db.sql.listen("conveyor_jobs", (payload) =>
      heard.push(parseWake(payload).queue),
    );
    // A rolled-back enqueue and a future job wake nobody.
    await db.sql
      .begin(async (tx) => {
        await enqueue(tx, { queue: "wk-rolled-back", kind: "k" });
        throw new Error("roll back");
      })
      .catch(() => {});
    await enqueue(db.sql, { queue: "wk-later", kind: "k", delayMs: 60_000 });
    const res = await enqueueMany(db.sql, [
      { queue: "wk-a", kind: "k", idempotencyKey: "x" },
      { queue: "wk-a", kind: "k" },
      { queue: "wk-b", kind: "k" },
    ]);
    expect(res.map((r) => r.job.queue)).toEqual(["wk-a", "wk-a", "wk-b"]);
    // A duplicate inserts nothing, so it wakes nobody either.
    expect(
      (await enqueue(db.sql, { queue: "wk-a", kind: "k", idempotencyKey: "x" })).duplicate,
    ).toBe(true);
    // Enqueues on a pool notify after their commit, without delaying the caller.
    await wakesSent(db.sql);
    await db.sql`select pg_notify('conveyor_jobs', 'wk-end')`;
    const deadline = Date.now() + 5_000;
    while (!heard.includes("wk-end") && Date.now() < deadline) await Bun.sleep(10);
    await sub.unlisten();
    expect(heard.sort()).toEqual(["wk-a", "wk-b", "wk-end"]);
  });

  test("payload over the size limit is refused, naming the field", async () => {
    const err = await enqueue(
      db.sql,
      { kind: "big", payload: { s: "x".repeat(2000) } },
      { maxPayloadBytes: 1000 },
    ).catch((e) => e);
    expect(err).toBeInstanceOf(ValidationError);
    expect(err.field).toBe("job.payload");
    expect(err.message).toContain("exceeds the limit of 1000");
  });

  test("non-JSON payloads are refused with the path of the bad value", async () => {
    const cases: [unknown, string][] = [
      [{ a: undefined }, "job.payload.a"],
      [{ a: [1, Number.NaN] }, "job.payload.a[1]"],
      [{ d: new Date() }, "job.payload.d"],
      [{ f: () => 1 }, "job.payload.f"],
      [{ b: 1n }, "job.payload.b"],
      [{ s: "nul\u0000" }, "job.payload.s"],
      [{ s: "lone \ud800 surrogate" }, "job.payload.s"],
      [
        [[[{ deep: JSON.parse(`${"[".repeat(300)}${"]".repeat(300)}`) }]]],
        "job.payload[0][0][0].deep[0][0]…",
      ],
    ];
    for (const [payload, field] of cases) {
      // biome-ignore lint/suspicious/noExplicitAny: deliberately wrong input.
      const err = await enqueue(db.sql, { kind: "k", payload: payload as any }).catch((e) => e);
      expect(err).toBeInstanceOf(ValidationError);
      if (field.endsWith("…")) expect(err.field.startsWith(field.slice(0, -1))).toBe(true);
      else expect(err.field).toBe(field);
    }
    const wrongOptions: [Record<string, unknown>, string][] = [
      [{ kind: "k", idempotencyKey: "a\u0000b" }, "job.idempotencyKey"],
      [{ kind: "k", idempotencyKey: "\udc00" }, "job.idempotencyKey"],
      [{ kind: "k", tracestate: "k=v\u0000" }, "job.tracestate"],
      [{ kind: "k", runAt: true }, "job.runAt"],
      [{ kind: "k", runAt: 5 }, "job.runAt"],
      [{ kind: "k", runAt: "0000-01-01T00:00:00Z" }, "job.runAt"],
      [{ kind: "k", runAt: "tomorrow" }, "job.runAt"],
    ];
    for (const [input, field] of wrongOptions) {
      // biome-ignore lint/suspicious/noExplicitAny: deliberately wrong input.
      const err = await enqueue(db.sql, input as any).catch((e) => e);
      expect(err).toBeInstanceOf(ValidationError);
      expect(err.field).toBe(field);
    }
    const { job: isoJob } = await enqueue(db.sql, { kind: "k", runAt: "2030-01-02T03:04:05Z" });
    expect(isoJob.runAt.toISOString()).toBe("2030-01-02T03:04:05.000Z");
    const cyclic: Record<string, unknown> = {};
    cyclic.self = cyclic;
    // biome-ignore lint/suspicious/noExplicitAny: deliberately wrong input.
    const err = await enqueue(db.sql, { kind: "k", payload: cyclic as any }).catch((e) => e);
    expect(err.message).toContain("circular");
  });

  test("invalid options of every kind get a ValidationError naming the field and insert nothing", async () => {
    const before = await count();
    const bad = fc.oneof(
      fc
        .record({ kind: fc.constantFrom("", "has space", "x".repeat(300)) })
        .map((v) => ["kind", v] as const),
      fc
        .record({
          kind: fc.constant("k"),
          queue: fc.constantFrom("", "bad/queue", "q".repeat(200)),
        })
        .map((v) => ["queue", v] as const),
      fc
        .record({
          kind: fc.constant("k"),
          priority: fc.oneof(fc.integer({ min: 32768 }), fc.double({ min: 0.1, max: 0.9 })),
        })
        .map((v) => ["priority", v] as const),
      fc
        .record({ kind: fc.constant("k"), maxAttempts: fc.integer({ max: 0 }) })
        .map((v) => ["maxAttempts", v] as const),
      fc
        .record({ kind: fc.constant("k"), delayMs: fc.integer({ max: -1 }) })
        .map((v) => ["delayMs", v] as const),
      fc
        .record({ kind: fc.constant("k"), idempotencyKey: fc.constant("") })
        .map((v) => ["idempotencyKey", v] as const),
      fc
        .record({ kind: fc.constant("k"), traceparent: fc.string() })
        .map((v) => ["traceparent", v] as const),
      fc
        .record({ kind: fc.constant("k"), unknownOption: fc.anything() })
        .map((v) => ["job", v] as const),
    );
    await fc.assert(
      fc.asyncProperty(bad, async ([field, input]) => {
        // biome-ignore lint/suspicious/noExplicitAny: deliberately wrong input.
        const err = await enqueue(db.sql, input as any).catch((e) => e);
        expect(err).toBeInstanceOf(ValidationError);
        expect(err.field.startsWith(field === "job" ? "job" : `job.${field}`)).toBe(true);
      }),
      { numRuns: 150 },
    );
    // A bad row anywhere in a batch rejects the whole batch before any insert.
    const err = await enqueueMany(db.sql, [{ kind: "ok" }, { kind: "" }]).catch((e) => e);
    expect(err.field).toBe("jobs[1].kind");
    expect(await count()).toBe(before);
  });

  test("any JSON payload round-trips unchanged", async () => {
    await fc.assert(
      fc.asyncProperty(fc.jsonValue({ noUnicodeString: false }), async (payload) => {
        const clean = JSON.parse(JSON.stringify(payload).replaceAll("\\u0000", ""));
        const { job } = await enqueue(db.sql, { queue: "json", kind: "k", payload: clean });
        const [row] = await db.sql`select payload from conveyor_jobs where id = ${job.id}`;
        expect(row?.payload).toEqual(clean);
      }),
      { numRuns: 60 },
    );
  });
});
