import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import type { Hono } from "hono";
import { createApi } from "../src/api/app.ts";
import {
  enqueueBatchResponseSchema,
  enqueueResponseSchema,
  jobListResponseSchema,
  queueListResponseSchema,
} from "../src/api/schemas.ts";
import { fetchJobs } from "../src/db/fetch.ts";
import { completeJobs } from "../src/db/outcome.ts";
import { freePort } from "../src/embedded-postgres.ts";
import type { LogFields } from "../src/logger.ts";
import { silentLogger } from "../src/logger.ts";
import { type TestDb, testDatabase } from "./harness.ts";

let db: TestDb;
let app: Hono;
beforeAll(async () => {
  db = await testDatabase();
  app = createApi({ sql: db.sql, logger: silentLogger, auth: { tokens: [] }, version: "test" });
}, 60_000);
afterAll(async () => {
  await db.drop();
});

interface Reply {
  status: number;
  headers: Headers;
  // biome-ignore lint/suspicious/noExplicitAny: tests read arbitrary JSON.
  body: any;
}

async function call(
  method: string,
  path: string,
  opts: { body?: unknown; raw?: string; headers?: Record<string, string>; on?: Hono } = {},
): Promise<Reply> {
  const headers = new Headers(opts.headers);
  let body: string | undefined = opts.raw;
  if (opts.body !== undefined) body = JSON.stringify(opts.body);
  if (body !== undefined && !headers.has("content-type")) {
    headers.set("content-type", "application/json");
  }
  const res = await (opts.on ?? app).fetch(
    new Request(`http://localhost:7070${path}`, { method, headers, body: body ?? null }),
  );
  const text = await res.text();
  return { status: res.status, headers: res.headers, body: text ? JSON.parse(text) : undefined };
}

const count = async () =>
  Number((await db.sql`select count(*)::int as n from conveyor_jobs`)[0]?.n);

describe("POST /v1/jobs", () => {
  test("creates a job: 201 with the job as JSON", async () => {
    const r = await call("POST", "/v1/jobs", {
      body: { queue: "mail", kind: "send", payload: { to: "a@b.c" }, priority: 3 },
    });
    expect(r.status).toBe(201);
    expect(enqueueResponseSchema.parse(r.body).duplicate).toBe(false);
    expect(r.body.job).toMatchObject({
      queue: "mail",
      kind: "send",
      payload: { to: "a@b.c" },
      priority: 3,
      state: "available",
      maxAttempts: 25,
    });
    expect(r.body.job.id).toMatch(/^[0-9]+$/);
    expect(r.body.job.createdAt).toMatch(/^\d{4}-\d\d-\d\dT.*Z$/);
    expect(r.headers.get("location")).toBe(`/v1/jobs/${r.body.job.id}`);
  });

  test("a repeated body idempotency key returns the first job with 200", async () => {
    const body = { kind: "k", idempotencyKey: "body-key-1", payload: 1 };
    const a = await call("POST", "/v1/jobs", { body });
    const b = await call("POST", "/v1/jobs", { body: { ...body, payload: 2 } });
    expect([a.status, b.status]).toEqual([201, 200]);
    expect(b.body.duplicate).toBe(true);
    expect(b.body.job.id).toBe(a.body.job.id);
    expect(b.body.job.payload).toBe(1);
  });

  test("the Idempotency-Key header works like the body field, quoted or not", async () => {
    const a = await call("POST", "/v1/jobs", {
      body: { kind: "k" },
      headers: { "Idempotency-Key": "hdr-1" },
    });
    const b = await call("POST", "/v1/jobs", {
      body: { kind: "k" },
      headers: { "Idempotency-Key": '"hdr-1"' },
    });
    const c = await call("POST", "/v1/jobs", {
      body: { kind: "k", idempotencyKey: "hdr-1" },
      headers: { "Idempotency-Key": "hdr-1" },
    });
    expect([a.status, b.status, c.status]).toEqual([201, 200, 200]);
    expect(a.body.job.idempotencyKey).toBe("hdr-1");
    expect(c.body.job.id).toBe(a.body.job.id);
  });

  test("a header key that differs from the body's is a 400 naming the field", async () => {
    const before = await count();
    const r = await call("POST", "/v1/jobs", {
      body: { kind: "k", idempotencyKey: "x" },
      headers: { "Idempotency-Key": "y" },
    });
    expect(r.status).toBe(400);
    expect(r.body.error).toMatchObject({ code: "validation_error", field: "idempotencyKey" });
    expect(await count()).toBe(before);
  });

  test("takes the trace context from headers unless the body has one", async () => {
    const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    const own = "00-11111111111111111111111111111111-2222222222222222-01";
    const fromHeader = await call("POST", "/v1/jobs", {
      body: { kind: "t" },
      headers: { traceparent: tp, tracestate: "v=1" },
    });
    expect(fromHeader.body.job).toMatchObject({ traceparent: tp, tracestate: "v=1" });
    const fromBody = await call("POST", "/v1/jobs", {
      body: { kind: "t", traceparent: own },
      headers: { traceparent: tp, tracestate: "v=1" },
    });
    expect(fromBody.body.job).toMatchObject({ traceparent: own, tracestate: null });
    // An invalid header is ignored (W3C): the job starts a trace of its own.
    const invalid = await call("POST", "/v1/jobs", {
      body: { kind: "t" },
      headers: { traceparent: "00-zz-bad", tracestate: "v=1" },
    });
    expect(invalid.status).toBe(201);
    expect(invalid.body.job.traceparent).not.toBe(tp);
    expect(invalid.body.job.tracestate).toBeNull();
  });

  test("runAt and delayMs schedule the job", async () => {
    const at = "2999-01-02T03:04:05.000Z";
    const r = await call("POST", "/v1/jobs", { body: { kind: "later", runAt: at } });
    expect(r.body.job.runAt).toBe(at);
    const both = await call("POST", "/v1/jobs", {
      body: { kind: "later", runAt: at, delayMs: 5 },
    });
    expect(both.status).toBe(400);
    expect(both.body.error.field).toBe("delayMs");
  });

  test("validation errors name the field path", async () => {
    const cases: [unknown, string][] = [
      [{}, "kind"],
      [{ kind: 5 }, "kind"],
      [{ kind: "k", priority: 1.5 }, "priority"],
      [{ kind: "k", colour: "red" }, "colour"],
      [{ kind: "k", runAt: "tomorrow" }, "runAt"],
      [{ kind: "k", payload: { a: { b: "\u0000" } } }, "payload.a.b"],
      [{ kind: "k", payload: [1, "\ud800"] }, "payload[1]"],
      [[], "body"],
      ["text", "body"],
    ];
    for (const [body, field] of cases) {
      const r = await call("POST", "/v1/jobs", { body });
      expect({ body, status: r.status, field: r.body.error.field }).toEqual({
        body,
        status: 400,
        field,
      });
    }
  });

  test("enqueue()'s payload size limit is reported against the body path", async () => {
    const small = createApi({
      sql: db.sql,
      logger: silentLogger,
      auth: { tokens: [] },
      version: "t",
      enqueueDefaults: { maxPayloadBytes: 100 },
    });
    const r = await call("POST", "/v1/jobs", {
      body: { kind: "k", payload: { s: "x".repeat(200) } },
      on: small,
    });
    expect(r.status).toBe(400);
    expect(r.body.error).toMatchObject({ code: "validation_error", field: "payload" });
    const b = await call("POST", "/v1/jobs/batch", {
      body: { jobs: [{ kind: "k" }, { kind: "k", payload: "x".repeat(200) }] },
      on: small,
    });
    expect(b.body.error.field).toBe("jobs[1].payload");
  });

  test("invalid JSON is a 400 invalid_json; a non-JSON content type is a 415", async () => {
    const before = await count();
    const bad = await call("POST", "/v1/jobs", { raw: '{"kind": "k",' });
    expect(bad.status).toBe(400);
    expect(bad.body.error.code).toBe("invalid_json");
    const empty = await call("POST", "/v1/jobs", { raw: "" });
    expect(empty.body.error.code).toBe("invalid_json");
    const form = await call("POST", "/v1/jobs", {
      raw: '{"kind":"k"}',
      headers: { "content-type": "text/plain" },
    });
    expect(form.status).toBe(415);
    expect(form.body.error.code).toBe("unsupported_media_type");
    expect(await count()).toBe(before);
  });

  test("a body over maxBodyBytes is a 413, with or without Content-Length", async () => {
    const tiny = createApi({
      sql: db.sql,
      logger: silentLogger,
      auth: { tokens: [] },
      version: "t",
      maxBodyBytes: 1000,
    });
    const r = await call("POST", "/v1/jobs", {
      body: { kind: "k", payload: "x".repeat(2000) },
      on: tiny,
    });
    expect(r.status).toBe(413);
    expect(r.body.error.code).toBe("payload_too_large");
    const chunks = new ReadableStream({
      start(ctl) {
        for (let i = 0; i < 3; i++) ctl.enqueue(new TextEncoder().encode("x".repeat(500)));
        ctl.close();
      },
    });
    const streamed = await tiny.fetch(
      new Request("http://localhost:7070/v1/jobs", {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: chunks,
      }),
    );
    expect(streamed.status).toBe(413);
    const ok = await call("POST", "/v1/jobs", { body: { kind: "k" }, on: tiny });
    expect(ok.status).toBe(201);
  });
});

describe("POST /v1/jobs/batch", () => {
  test("results follow input order, duplicates included", async () => {
    const r = await call("POST", "/v1/jobs/batch", {
      body: {
        jobs: [
          { kind: "a", idempotencyKey: "batch-1" },
          { kind: "b" },
          { kind: "c", idempotencyKey: "batch-1" },
          { kind: "d", queue: "other" },
        ],
      },
    });
    expect(r.status).toBe(201);
    const { results } = enqueueBatchResponseSchema.parse(r.body);
    expect(results.map((x) => [x.job.kind, x.duplicate])).toEqual([
      ["a", false],
      ["b", false],
      ["a", true],
      ["d", false],
    ]);
    expect(results[2]?.job.id).toBe(results[0]?.job.id as string);
  });

  test("200 when every job already existed", async () => {
    const body = { jobs: [{ kind: "a", idempotencyKey: "batch-2" }] };
    expect((await call("POST", "/v1/jobs/batch", { body })).status).toBe(201);
    const again = await call("POST", "/v1/jobs/batch", { body });
    expect(again.status).toBe(200);
    expect(again.body.results[0].duplicate).toBe(true);
  });

  test("an invalid job fails the whole batch, naming its index", async () => {
    const before = await count();
    const r = await call("POST", "/v1/jobs/batch", {
      body: { jobs: [{ kind: "ok" }, { kind: "ok", extra: 1 }] },
    });
    expect(r.status).toBe(400);
    expect(r.body.error.field).toBe("jobs[1].extra");
    const empty = await call("POST", "/v1/jobs/batch", { body: { jobs: [] } });
    expect(empty.body.error.field).toBe("jobs");
    const header = await call("POST", "/v1/jobs/batch", {
      body: { jobs: [{ kind: "k" }] },
      headers: { "Idempotency-Key": "k" },
    });
    expect(header.body.error.field).toBe("Idempotency-Key");
    expect(await count()).toBe(before);
  });
});

describe("GET /v1/jobs", () => {
  test("pages by id descending over several pages, with filters", async () => {
    const jobs = Array.from({ length: 23 }, (_, i) => ({
      queue: "listing",
      kind: i % 2 === 0 ? "even" : "odd",
    }));
    const created = await call("POST", "/v1/jobs/batch", { body: { jobs } });
    const ids: string[] = created.body.results.map((r: { job: { id: string } }) => r.job.id);

    const seen: string[] = [];
    let cursor: string | null = null;
    let pages = 0;
    do {
      const qs = new URLSearchParams({ queue: "listing", limit: "5" });
      if (cursor) qs.set("cursor", cursor);
      const r = await call("GET", `/v1/jobs?${qs}`);
      expect(r.status).toBe(200);
      const page = jobListResponseSchema.parse(r.body);
      expect(page.jobs.length).toBeLessThanOrEqual(5);
      seen.push(...page.jobs.map((j) => j.id));
      cursor = page.nextCursor;
      pages++;
    } while (cursor);
    expect(pages).toBe(5);
    expect(seen).toEqual([...ids].sort((a, b) => Number(b) - Number(a)));

    const odd = await call("GET", "/v1/jobs?queue=listing&kind=odd&limit=100");
    expect(odd.body.jobs).toHaveLength(11);
    expect(odd.body.nextCursor).toBeNull();
    const none = await call("GET", "/v1/jobs?queue=listing&state=completed");
    expect(none.body.jobs).toEqual([]);
  });

  test("bad query parameters are 400s naming the parameter", async () => {
    for (const [qs, field] of [
      ["state=done", "state"],
      ["limit=0", "limit"],
      ["limit=abc", "limit"],
      ["limit=501", "limit"],
      ["cursor=%%%", "cursor"],
      ["cursor=bm9wZQ", "cursor"],
      ["queue=a%20b", "queue"],
      ["sort=asc", "sort"],
    ]) {
      const r = await call("GET", `/v1/jobs?${qs}`);
      expect({ qs, status: r.status, field: r.body.error.field }).toEqual({
        qs,
        status: 400,
        field,
      });
    }
  });
});

describe("GET /v1/jobs/:id", () => {
  test("200 with the job, 404 when absent or malformed", async () => {
    const { body } = await call("POST", "/v1/jobs", { body: { kind: "get" } });
    const r = await call("GET", `/v1/jobs/${body.job.id}`);
    expect(r.status).toBe(200);
    expect(r.body.job).toEqual(body.job);
    const missing = await call("GET", "/v1/jobs/999999999");
    expect(missing.status).toBe(404);
    expect(missing.body.error.code).toBe("not_found");
    expect((await call("GET", "/v1/jobs/12abc")).status).toBe(404);
    expect((await call("GET", "/v1/jobs/0")).status).toBe(404);
    const huge = await call("GET", "/v1/jobs/99999999999999999999");
    expect(huge.status).toBe(404);
    expect(huge.body.error.code).toBe("not_found");
  });
});

/** Leases the job's queue's available jobs as a worker would; returns the leases. */
async function lease(queue: string, kinds: string[]) {
  return fetchJobs(db.sql, { queue, owner: "test-worker", limit: 100, leaseMs: 60_000, kinds });
}

describe("cancel and retry", () => {
  test("cancel: available → cancelled with the reason recorded; then 409", async () => {
    const { body } = await call("POST", "/v1/jobs", { body: { queue: "cx", kind: "c" } });
    const r = await call("POST", `/v1/jobs/${body.job.id}/cancel`, {
      body: { reason: "customer asked" },
    });
    expect(r.status).toBe(200);
    expect(r.body.job.state).toBe("cancelled");
    expect(r.body.job.finalizedAt).not.toBeNull();
    expect(r.body.job.errors.at(-1)).toMatchObject({
      name: "Cancelled",
      message: "customer asked",
      attempt: 0,
    });
    const again = await call("POST", `/v1/jobs/${body.job.id}/cancel`);
    expect(again.status).toBe(409);
    expect(again.body.error.code).toBe("job_finished");
  });

  test("cancel works on scheduled jobs and refuses running ones", async () => {
    const scheduled = await call("POST", "/v1/jobs", {
      body: { queue: "cx2", kind: "s", delayMs: 3_600_000 },
    });
    const c = await call("POST", `/v1/jobs/${scheduled.body.job.id}/cancel`, { body: {} });
    expect(c.body.job.state).toBe("cancelled");
    expect(c.body.job.errors.at(-1).message).toBe("cancelled through the API");

    const running = await call("POST", "/v1/jobs", { body: { queue: "cx3", kind: "r" } });
    expect(await lease("cx3", ["r"])).toHaveLength(1);
    const r = await call("POST", `/v1/jobs/${running.body.job.id}/cancel`);
    expect(r.status).toBe(409);
    expect(r.body.error.code).toBe("job_running");
    const retry = await call("POST", `/v1/jobs/${running.body.job.id}/retry`);
    expect(retry.status).toBe(409);
    expect(retry.body.error.code).toBe("job_running");
    expect((await call("POST", "/v1/jobs/999999999/cancel")).status).toBe(404);
    expect((await call("POST", "/v1/jobs/999999999/retry")).status).toBe(404);
  });

  test("retry: cancelled, completed and discarded jobs become available now", async () => {
    const cancelled = await call("POST", "/v1/jobs", {
      body: { queue: "rt", kind: "x", delayMs: 3_600_000 },
    });
    await call("POST", `/v1/jobs/${cancelled.body.job.id}/cancel`);
    const r = await call("POST", `/v1/jobs/${cancelled.body.job.id}/retry`);
    expect(r.status).toBe(200);
    expect(r.body.job).toMatchObject({ state: "available", finalizedAt: null });
    expect(new Date(r.body.job.runAt).getTime()).toBeLessThanOrEqual(Date.now() + 1000);
    expect(r.body.job.errors).toHaveLength(1); // the history stays

    // completed: leased, then completed through the fenced write.
    const done = await call("POST", "/v1/jobs", {
      body: { queue: "rt2", kind: "x", maxAttempts: 1 },
    });
    const [leased] = await lease("rt2", ["x"]);
    if (!leased) throw new Error("no lease");
    await completeJobs(db.sql, "test-worker", [
      { id: leased.id, version: Number(leased.lease_version), result: { ok: true } },
    ]);
    const rc = await call("POST", `/v1/jobs/${done.body.job.id}/retry`);
    expect(rc.body.job).toMatchObject({
      state: "available",
      attempts: 1,
      maxAttempts: 2, // room for one more attempt
      result: null,
      finalizedAt: null,
    });

    // discarded
    const [d] = await db.sql`
      insert into conveyor_jobs (queue, kind, state, attempts, max_attempts, finalized_at)
      values ('rt3', 'x', 'discarded', 3, 3, now()) returning id`;
    const rd = await call("POST", `/v1/jobs/${d?.id}/retry`);
    expect(rd.body.job).toMatchObject({ state: "available", attempts: 3, maxAttempts: 4 });
    expect(await lease("rt3", ["x"])).toHaveLength(1);
  });

  test("retry of a pending job is a 409; of a scheduled one, moves it to now", async () => {
    const [p] = await db.sql`
      insert into conveyor_jobs (queue, kind, state) values ('rt4', 'x', 'pending') returning id`;
    const r = await call("POST", `/v1/jobs/${p?.id}/retry`);
    expect(r.status).toBe(409);
    expect(r.body.error.code).toBe("job_pending");
    const s = await call("POST", "/v1/jobs", { body: { queue: "rt4", kind: "y", delayMs: 1e7 } });
    const moved = await call("POST", `/v1/jobs/${s.body.job.id}/retry`);
    expect(new Date(moved.body.job.runAt).getTime()).toBeLessThan(Date.now() + 1000);
    expect(moved.body.job.maxAttempts).toBe(25);
  });

  test("unknown fields in the cancel body are rejected before any change", async () => {
    const { body } = await call("POST", "/v1/jobs", { body: { kind: "c" } });
    const r = await call("POST", `/v1/jobs/${body.job.id}/cancel`, { body: { force: true } });
    expect(r.status).toBe(400);
    expect(r.body.error.field).toBe("force");
    expect((await call("GET", `/v1/jobs/${body.job.id}`)).body.job.state).toBe("available");
  });
});

describe("queues", () => {
  test("pause stops dequeue; resume lets it through", async () => {
    await call("POST", "/v1/jobs", { body: { queue: "pq", kind: "p" } });
    const paused = await call("POST", "/v1/queues/pq/pause");
    expect(paused.status).toBe(200);
    expect(paused.body.queue).toMatchObject({ name: "pq", paused: true });
    expect(await lease("pq", ["p"])).toHaveLength(0);
    const resumed = await call("POST", "/v1/queues/pq/resume", { body: {} });
    expect(resumed.body.queue.paused).toBe(false);
    expect(await lease("pq", ["p"])).toHaveLength(1);
    const bad = await call("POST", "/v1/queues/has%20space/pause");
    expect(bad.status).toBe(400);
    expect(bad.body.error.field).toBe("name");
  });

  test("counts per queue and state, including paused queues with no jobs", async () => {
    const q = "counted";
    const batch = await call("POST", "/v1/jobs/batch", {
      body: {
        jobs: [
          { queue: q, kind: "a" },
          { queue: q, kind: "a" },
          { queue: q, kind: "a" },
          { queue: q, kind: "a", delayMs: 3_600_000 },
          { queue: q, kind: "b" },
        ],
      },
    });
    const [first] = await lease(q, ["b"]);
    if (!first) throw new Error("no lease");
    await call("POST", `/v1/jobs/${batch.body.results[0].job.id}/cancel`);
    await call("POST", "/v1/queues/empty-paused/pause");

    const r = await call("GET", "/v1/queues");
    expect(r.status).toBe(200);
    const list = queueListResponseSchema.parse(r.body);
    const counted = list.queues.find((x) => x.name === q);
    expect(counted).toEqual({
      name: q,
      paused: false,
      counts: { available: 2, scheduled: 1, running: 1, completed: 0, cancelled: 1, discarded: 0 },
    });
    expect(list.queues.find((x) => x.name === "empty-paused")).toMatchObject({
      paused: true,
      counts: { available: 0, running: 0 },
    });
    expect(list.finalCounts.exact).toEqual({ completed: true, cancelled: true, discarded: true });
    const names = list.queues.map((x) => x.name);
    expect(names).toEqual([...names].sort());
  });
});

describe("auth", () => {
  const authed = () =>
    createApi({
      sql: db.sql,
      logger: silentLogger,
      version: "t",
      auth: {
        tokens: [
          { token: "producer-token", scopes: ["enqueue"] },
          { token: "admin-token", scopes: ["admin"] },
        ],
      },
    });

  test("401 without or with an unknown token, 403 for a missing scope, 200 with it", async () => {
    const on = authed();
    const bearer = (t: string) => ({ authorization: `Bearer ${t}` });
    const none = await call("POST", "/v1/jobs", { body: { kind: "k" }, on });
    expect(none.status).toBe(401);
    expect(none.headers.get("www-authenticate")).toStartWith("Bearer");
    expect(none.body.error.code).toBe("unauthorized");
    const wrong = await call("GET", "/v1/queues", { on, headers: bearer("nope") });
    expect(wrong.status).toBe(401);
    expect(wrong.headers.get("www-authenticate")).toContain("invalid_token");
    const basic = await call("GET", "/v1/queues", {
      on,
      headers: { authorization: "Basic YWRtaW4tdG9rZW4=" },
    });
    expect(basic.status).toBe(401);

    const producer = bearer("producer-token");
    const created = await call("POST", "/v1/jobs", { body: { kind: "k" }, on, headers: producer });
    expect(created.status).toBe(201);
    const id = created.body.job.id;
    expect(
      (
        await call("POST", "/v1/jobs/batch", {
          body: { jobs: [{ kind: "k" }] },
          on,
          headers: producer,
        })
      ).status,
    ).toBe(201);
    expect((await call("GET", `/v1/jobs/${id}`, { on, headers: producer })).status).toBe(200);
    for (const [method, path] of [
      ["GET", "/v1/jobs"],
      ["GET", "/v1/queues"],
      ["POST", `/v1/jobs/${id}/cancel`],
      ["POST", `/v1/jobs/${id}/retry`],
      ["POST", "/v1/queues/q/pause"],
      ["POST", "/v1/queues/q/resume"],
    ] as const) {
      const r = await call(method, path, { on, headers: producer });
      expect({ path, status: r.status, code: r.body.error.code }).toEqual({
        path,
        status: 403,
        code: "forbidden",
      });
    }

    const admin = bearer("admin-token");
    expect((await call("GET", "/v1/jobs", { on, headers: admin })).status).toBe(200);
    expect((await call("GET", "/v1/queues", { on, headers: admin })).status).toBe(200);
    expect((await call("POST", `/v1/jobs/${id}/cancel`, { on, headers: admin })).status).toBe(200);
    expect(
      (await call("POST", "/v1/jobs", { body: { kind: "k" }, on, headers: admin })).status,
    ).toBe(201);
    // Probes and the document need no token.
    expect((await call("GET", "/healthz", { on })).status).toBe(200);
    expect((await call("GET", "/readyz", { on })).status).toBe(200);
    expect((await call("GET", "/openapi.json", { on })).status).toBe(200);
  });

  test("without tokens, a cross-origin browser request is refused", async () => {
    const r = await call("POST", "/v1/jobs", {
      body: { kind: "k" },
      headers: { origin: "https://evil.example" },
    });
    expect(r.status).toBe(403);
    expect(r.body.error.code).toBe("cross_origin");
    const same = await call("POST", "/v1/jobs", {
      body: { kind: "k" },
      headers: { origin: "http://localhost:7070" },
    });
    expect(same.status).toBe(201);
  });

  test("without tokens, only loopback host names are served (DNS rebinding)", async () => {
    const at = async (host: string) =>
      (
        await app.fetch(
          new Request(`http://${host}/v1/queues`, { headers: { origin: `http://${host}` } }),
        )
      ).status;
    expect(await at("evil.example:7070")).toBe(403);
    expect(await at("127.0.0.1:7070")).toBe(200);
    expect(await at("[::1]:7070")).toBe(200);
    expect(await at("conveyor.localhost")).toBe(200);
    const tokened = createApi({
      sql: db.sql,
      logger: silentLogger,
      version: "t",
      auth: { tokens: [{ token: "t0k3n", scopes: ["admin"] }] },
    });
    const r = await tokened.fetch(
      new Request("http://conveyor.example.com/v1/queues", {
        headers: { authorization: "Bearer t0k3n" },
      }),
    );
    expect(r.status).toBe(200);
  });

  test("rejects invalid options at construction", () => {
    expect(() =>
      createApi({
        sql: db.sql,
        logger: silentLogger,
        version: "t",
        // @ts-expect-error: an unknown scope
        auth: { tokens: [{ token: "t", scopes: ["root"] }] },
      }),
    ).toThrow(/api\.auth\.tokens\[0\]\.scopes/);
  });
});

describe("errors, probes and the document", () => {
  test("unknown routes are JSON 404s; wrong methods are 405s with Allow", async () => {
    const r = await call("GET", "/v2/nothing");
    expect(r.status).toBe(404);
    expect(r.body.error.code).toBe("not_found");
    const m = await call("DELETE", "/v1/jobs/1");
    expect(m.status).toBe(405);
    expect(m.headers.get("allow")).toBe("GET");
    const b = await call("GET", "/v1/jobs/batch");
    expect(b.status).toBe(405);
    expect(b.headers.get("allow")).toBe("POST");
    expect((await call("PUT", "/v1/jobs")).headers.get("allow")).toBe("GET, POST");
  });

  test("an unexpected failure is a bare 500, logged with its detail", async () => {
    const logged: { msg: string; fields?: LogFields }[] = [];
    const logger = {
      ...silentLogger,
      error: (msg: string, fields?: LogFields) => logged.push({ msg, fields }),
    };
    // Reachable, but where the tables are not: "relation does not exist".
    const broken = db.connect({ max: 1, connection: { search_path: "no_such_schema" } });
    try {
      const on = createApi({ sql: broken, logger, auth: { tokens: [] }, version: "t" });
      const r = await call("GET", "/v1/queues", { on });
      expect(r.status).toBe(500);
      expect(r.body).toEqual({ error: { code: "internal", message: "internal error" } });
      expect(logged).toHaveLength(1);
      expect(logged[0]?.fields?.error).toBeInstanceOf(Error);
    } finally {
      await broken.end();
    }
  });

  test("an unreachable database is a 503 with Retry-After, not a 500; nothing is lost once it is back", async () => {
    const warned: { msg: string; fields?: LogFields }[] = [];
    const errors: string[] = [];
    const logger = {
      ...silentLogger,
      warn: (msg: string, fields?: LogFields) => warned.push({ msg, fields }),
      error: (msg: string) => errors.push(msg),
    };
    // A real refused connection: a port nothing listens on.
    const down = db.connect({ max: 1, port: await freePort(), connect_timeout: 2 });
    try {
      const on = createApi({ sql: down, logger, auth: { tokens: [] }, version: "t" });
      const body = { queue: "unreachable", kind: "k", payload: { n: 1 } };
      const headers = { "Idempotency-Key": "retry-me" };
      for (const [method, path, b] of [
        ["POST", "/v1/jobs", body],
        ["GET", "/v1/jobs/1", undefined],
        ["GET", "/v1/queues", undefined],
      ] as const) {
        const r = await call(method, path, { on, body: b, headers });
        expect(r.status).toBe(503);
        expect(r.headers.get("retry-after")).toBe("1");
        expect(r.body.error.code).toBe("database_unavailable");
      }
      expect(warned.map((w) => w.msg)).toEqual(Array(3).fill("api: database unavailable"));
      expect(errors).toEqual([]);
      expect((await call("GET", "/readyz", { on })).status).toBe(503);
      // The client's retry, once the database answers, enqueues it once.
      const first = await call("POST", "/v1/jobs", { body, headers });
      const again = await call("POST", "/v1/jobs", { body, headers });
      expect([first.status, again.status]).toEqual([201, 200]);
      expect(again.body.job.id).toBe(first.body.job.id);
    } finally {
      await down.end({ timeout: 1 });
    }
  });

  test("healthz, readyz (with isReady) and openapi.json", async () => {
    expect((await call("GET", "/healthz")).body).toEqual({ status: "ok", version: "test" });
    expect((await call("GET", "/readyz")).body).toEqual({ status: "ok", version: "test" });
    let ready = false;
    const on = createApi({
      sql: db.sql,
      logger: silentLogger,
      auth: { tokens: [] },
      version: "t",
      isReady: async () => ready,
    });
    expect((await call("GET", "/readyz", { on })).status).toBe(503);
    ready = true;
    expect((await call("GET", "/readyz", { on })).status).toBe(200);

    const doc = (await call("GET", "/openapi.json")).body;
    expect(doc.openapi).toBe("3.1.0");
    expect(Object.keys(doc.paths)).toContain("/v1/jobs/{id}/cancel");
    const req = doc.components.schemas.EnqueueRequest;
    expect(req.required).toEqual(["kind"]);
    expect(req.additionalProperties).toBe(false);
    expect(doc.components.schemas.Job.properties.state.enum).toContain("discarded");
    // Every $ref resolves to a component.
    const refs = [...JSON.stringify(doc).matchAll(/"#\/components\/schemas\/([A-Za-z]+)"/g)];
    expect(refs.length).toBeGreaterThan(10);
    for (const [, id] of refs) expect(doc.components.schemas).toHaveProperty(id as string);
  });
});
