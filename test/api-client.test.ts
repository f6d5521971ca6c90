// The typed client against the API over a real socket.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import type { Server } from "bun";
import { createApi } from "../src/api/app.ts";
import { ApiError, type Client, createClient } from "../src/client/index.ts";
import { fetchJobs } from "../src/db/fetch.ts";
import { silentLogger } from "../src/logger.ts";
import { type TestDb, testDatabase } from "./harness.ts";

let db: TestDb;
let server: Server<undefined>;
let admin: Client;
let producer: Client;

beforeAll(async () => {
  db = await testDatabase();
  const app = createApi({
    sql: db.sql,
    logger: silentLogger,
    version: "client-test",
    auth: {
      tokens: [
        { token: "admin-secret", scopes: ["admin"] },
        { token: "producer-secret", scopes: ["enqueue"] },
      ],
    },
  });
  server = Bun.serve({ hostname: "127.0.0.1", port: 0, fetch: app.fetch });
  const baseUrl = `http://127.0.0.1:${server.port}/`;
  admin = createClient({ baseUrl, token: "admin-secret" });
  producer = createClient({ baseUrl, token: "producer-secret" });
}, 60_000);

afterAll(async () => {
  await server?.stop(true);
  await db?.drop();
});

const caught = async (p: Promise<unknown>): Promise<ApiError> => {
  try {
    await p;
  } catch (e) {
    if (e instanceof ApiError) return e;
    throw e;
  }
  throw new Error("expected an ApiError");
};

describe("client", () => {
  test("enqueue returns a Job with Dates; a repeated key is a duplicate", async () => {
    const runAt = new Date(Date.now() + 60_000);
    const a = await producer.enqueue({
      queue: "c1",
      kind: "mail",
      payload: { n: 1 },
      runAt,
      idempotencyKey: "client-1",
    });
    expect(a.duplicate).toBe(false);
    expect(a.job.runAt).toBeInstanceOf(Date);
    expect(a.job.runAt.getTime()).toBe(runAt.getTime());
    expect(a.job.createdAt).toBeInstanceOf(Date);
    expect(a.job.finalizedAt).toBeNull();
    const b = await producer.enqueue({ queue: "c1", kind: "mail", idempotencyKey: "client-1" });
    expect(b).toMatchObject({ duplicate: true, job: { id: a.job.id, payload: { n: 1 } } });
    expect(await producer.getJob(a.job.id)).toEqual(a.job);
  });

  test("enqueueBatch keeps input order", async () => {
    const results = await producer.enqueueBatch([
      { queue: "c2", kind: "x" },
      { queue: "c2", kind: "y", idempotencyKey: "c2-k" },
      { queue: "c2", kind: "z", idempotencyKey: "c2-k" },
    ]);
    expect(results.map((r) => [r.job.kind, r.duplicate])).toEqual([
      ["x", false],
      ["y", false],
      ["y", true],
    ]);
  });

  test("listJobPages walks every page once", async () => {
    await admin.enqueueBatch(Array.from({ length: 12 }, () => ({ queue: "c3", kind: "p" })));
    const pages = [];
    for await (const page of admin.listJobPages({ queue: "c3", limit: 5 })) pages.push(page);
    expect(pages.map((p) => p.jobs.length)).toEqual([5, 5, 2]);
    const ids = pages.flatMap((p) => p.jobs.map((j) => BigInt(j.id)));
    expect(new Set(ids).size).toBe(12);
    expect(ids).toEqual([...ids].sort((a, b) => (a > b ? -1 : 1)));
    const first = await admin.listJobs({ queue: "c3", limit: 5 });
    const second = await admin.listJobs({ queue: "c3", limit: 5, cursor: first.nextCursor ?? "" });
    expect(second.jobs[0]?.id).toBe(pages[1]?.jobs[0]?.id as string);
  });

  test("cancel, retry, and their conflicts as ApiError", async () => {
    const { job } = await admin.enqueue({ queue: "c4", kind: "k" });
    const cancelled = await admin.cancelJob(job.id, "not needed");
    expect(cancelled.state).toBe("cancelled");
    expect(cancelled.finalizedAt).toBeInstanceOf(Date);
    const again = await caught(admin.cancelJob(job.id));
    expect(again).toMatchObject({ status: 409, code: "job_finished" });
    const retried = await admin.retryJob(job.id);
    expect(retried.state).toBe("available");
    const [leased] = await fetchJobs(db.sql, {
      queue: "c4",
      owner: "w",
      limit: 1,
      leaseMs: 60_000,
      kinds: ["k"],
    });
    expect(leased?.id).toBe(job.id);
    expect(await caught(admin.cancelJob(job.id))).toMatchObject({
      status: 409,
      code: "job_running",
    });
    expect(await caught(admin.getJob("424242424242"))).toMatchObject({
      status: 404,
      code: "not_found",
    });
  });

  test("pause, resume and queue counts", async () => {
    await admin.enqueue({ queue: "c5", kind: "k" });
    const paused = await admin.pauseQueue("c5");
    expect(paused).toMatchObject({ name: "c5", paused: true });
    expect(paused.updatedAt).toBeInstanceOf(Date);
    let list = await admin.listQueues();
    expect(list.queues.find((q) => q.name === "c5")).toMatchObject({
      paused: true,
      counts: { available: 1 },
    });
    await admin.resumeQueue("c5");
    list = await admin.listQueues();
    expect(list.queues.find((q) => q.name === "c5")?.paused).toBe(false);
  });

  test("errors carry status, code and field", async () => {
    const invalid = await caught(producer.enqueue({ kind: "k", priority: 1e6 }));
    expect(invalid).toMatchObject({ status: 400, code: "validation_error", field: "priority" });
    const forbidden = await caught(producer.listQueues());
    expect(forbidden).toMatchObject({ status: 403, code: "forbidden" });
    const anonymous = createClient({ baseUrl: `http://127.0.0.1:${server.port}` });
    expect(await caught(anonymous.enqueue({ kind: "k" }))).toMatchObject({
      status: 401,
      code: "unauthorized",
    });
  });

  test("a response that is not the API's JSON is still an ApiError", async () => {
    const proxy = createClient({
      baseUrl: "http://example.invalid",
      fetch: (async () =>
        new Response("<html>bad gateway</html>", { status: 502 })) as unknown as typeof fetch,
    });
    expect(await caught(proxy.listQueues())).toMatchObject({
      status: 502,
      code: "invalid_response",
    });
  });
});
