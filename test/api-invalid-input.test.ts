// Property: no invalid body, however malformed, gets past validation. Every
// POST endpoint answers 4xx with a JSON error (naming the field for schema
// errors), nothing is written, and the server keeps serving.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import fc from "fast-check";
import type { Hono } from "hono";
import type { z } from "zod";
import { createApi } from "../src/api/app.ts";
import { fieldPath, MAX_JSON_DEPTH } from "../src/api/request.ts";
import {
  cancelRequestSchema,
  enqueueBatchRequestSchema,
  enqueueRequestSchema,
} from "../src/api/schemas.ts";
import { silentLogger } from "../src/logger.ts";
import { type TestDb, testDatabase } from "./harness.ts";

const MAX_BODY = 64 * 1024;
const RUNS = 150;

let db: TestDb;
let app: Hono;
let cancellable: string;
let retryable: string;

beforeAll(async () => {
  db = await testDatabase();
  app = createApi({
    sql: db.sql,
    logger: silentLogger,
    auth: { tokens: [] },
    version: "fuzz",
    maxBodyBytes: MAX_BODY,
  });
  // Targets a valid body would change: an available job (cancel) and a
  // cancelled one (retry).
  const [a] = await db.sql`insert into conveyor_jobs (queue, kind) values ('fz', 'k') returning id`;
  const [c] = await db.sql`
    insert into conveyor_jobs (queue, kind, state, finalized_at)
    values ('fz', 'k', 'cancelled', now()) returning id`;
  cancellable = String(a?.id);
  retryable = String(c?.id);
}, 60_000);

afterAll(async () => {
  await db.drop();
});

interface Endpoint {
  path: () => string;
  /** A valid body to mutate. */
  valid: Record<string, unknown>;
  /** Fields the body schema knows, each with its schema (to generate values it rejects). */
  fields: Record<string, z.ZodType>;
  /** Where a job object sits in the body, for the batch endpoint. */
  jobPath?: PropertyKey[];
}

const jobFields = (({ payload: _payload, ...rest }) => rest)(enqueueRequestSchema.shape);
const ENDPOINTS: Record<string, Endpoint> = {
  enqueue: { path: () => "/v1/jobs", valid: { kind: "fuzz", queue: "fz" }, fields: jobFields },
  batch: {
    path: () => "/v1/jobs/batch",
    valid: { jobs: [{ kind: "fuzz", queue: "fz" }] },
    fields: enqueueBatchRequestSchema.shape,
  },
  cancel: {
    path: () => `/v1/jobs/${cancellable}/cancel`,
    valid: { reason: "fuzz" },
    fields: cancelRequestSchema.shape,
  },
  retry: { path: () => `/v1/jobs/${retryable}/retry`, valid: {}, fields: {} },
  pause: { path: () => "/v1/queues/fz-unregistered/pause", valid: {}, fields: {} },
  resume: { path: () => "/v1/queues/fz-unregistered/resume", valid: {}, fields: {} },
};

interface Attempt {
  text: string;
  /** The field the error must name, when the body has exactly one known fault. */
  field?: string;
}

const weirdString = fc.oneof(
  fc.string(),
  fc.string({ unit: "binary" }),
  fc.constantFrom("\u0000", "a\u0000b", "\ud800", "x\udfff", "", " ", "null", "{}"),
  fc.integer({ min: 1, max: 300_000 }).map((n) => "x".repeat(n)),
);
const anyJson = fc.oneof(
  fc.jsonValue(),
  weirdString,
  fc.constantFrom(1e300, -1, 0.5, 2 ** 31, -(2 ** 40), Number.MAX_SAFE_INTEGER + 2),
);

/** Text that is not JSON (and not blank, which some endpoints accept as {}). */
const malformed = (valid: unknown): fc.Arbitrary<Attempt> =>
  fc
    .oneof(
      fc.string(),
      fc.string({ unit: "binary" }),
      fc.nat().map((n) => {
        const t = JSON.stringify(valid);
        return t.slice(0, n % t.length);
      }),
      fc.constantFrom("{", "}", "[1,]", "{'a':1}", '{"a":01}', "NaN", "undefined", '"\\x"'),
    )
    .filter((text) => {
      if (text.trim() === "") return false;
      try {
        JSON.parse(text);
        return false;
      } catch {
        return true;
      }
    })
    .map((text) => ({ text }));

/** Any JSON that is not an object: every endpoint's body must be one. */
const notAnObject: fc.Arbitrary<Attempt> = anyJson
  .filter((v) => v === null || typeof v !== "object" || Array.isArray(v))
  .map((v) => ({ text: JSON.stringify(v), field: "body" }));

const unknownKey = (known: string[]) =>
  fc.string({ maxLength: 20 }).filter((k) => !known.includes(k));

function unknownField(e: Endpoint): fc.Arbitrary<Attempt> {
  const top = fc
    .tuple(unknownKey(Object.keys(e.fields)), anyJson)
    .map(([k, v]) => ({ text: JSON.stringify({ ...e.valid, [k]: v }), field: fieldPath([k]) }));
  if (!e.fields.jobs) return top;
  const inJob = fc
    .tuple(unknownKey(Object.keys(enqueueRequestSchema.shape)), anyJson, fc.nat(3))
    .map(([k, v, i]) => ({
      text: JSON.stringify({ jobs: [...jobs(i), { kind: "fuzz", [k]: v }] }),
      field: fieldPath(["jobs", i, k]),
    }));
  return fc.oneof(top, inJob);
}

const jobs = (n: number) => Array.from({ length: n }, () => ({ kind: "fuzz", queue: "fz" }));

/** One known field set to a value its schema rejects. */
function wrongValue(e: Endpoint): fc.Arbitrary<Attempt> | undefined {
  const names = Object.keys(e.fields);
  if (names.length === 0) return undefined;
  const arbs = names.map((name) =>
    anyJson
      .filter((v) => !(e.fields[name] as z.ZodType).safeParse(v).success)
      .map((v) => ({ text: JSON.stringify({ ...e.valid, [name]: v }), field: name })),
  );
  if (e.fields.jobs) {
    const perJob = Object.entries(jobFields).map(([name, schema]) =>
      fc
        .tuple(
          anyJson.filter((v) => !(schema as z.ZodType).safeParse(v).success),
          fc.nat(3),
        )
        .map(([v, i]) => ({
          text: JSON.stringify({ jobs: [...jobs(i), { kind: "fuzz", [name]: v }] }),
          field: fieldPath(["jobs", i, name]),
        })),
    );
    arbs.push(...perJob);
  }
  return fc.oneof(...arbs);
}

/** Payloads jsonb would refuse: U+0000, lone surrogates, absurd nesting. */
const badPayload: fc.Arbitrary<Attempt> = fc
  .oneof(
    fc.constantFrom("\u0000", "\ud800", "\udc00x").map((s) => ({ v: { s } as unknown, at: ["s"] })),
    fc.constantFrom("a\u0000", "\ud83d").map((k) => ({ v: { [k]: 1 } as unknown, at: [] })),
    fc.integer({ min: MAX_JSON_DEPTH, max: 5000 }).map((depth) => {
      let v: unknown = 1;
      for (let i = 0; i < depth; i++) v = [v];
      return { v, at: Array.from({ length: MAX_JSON_DEPTH - 1 }, () => 0) };
    }),
  )
  .map(({ v, at }) => ({
    text: JSON.stringify({ kind: "fuzz", payload: v }),
    field: fieldPath(["payload", ...at]),
  }));

async function post(path: string, text: string) {
  const res = await app.fetch(
    new Request(`http://localhost${path}`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: text,
    }),
  );
  const raw = await res.text();
  return { status: res.status, raw };
}

async function snapshot() {
  const [jobs] = await db.sql`
    select count(*)::int as n, string_agg(id || state::text, ',' order by id) as states
      from conveyor_jobs`;
  const [queues] = await db.sql`select count(*)::int as n from conveyor_queues`;
  return { jobs, queues: queues?.n };
}

describe("invalid bodies", () => {
  for (const [name, e] of Object.entries(ENDPOINTS)) {
    test(`POST ${name}: 4xx, JSON error naming the field, nothing written`, async () => {
      const before = await snapshot();
      const kinds = [malformed(e.valid), notAnObject, unknownField(e)];
      const wrong = wrongValue(e);
      if (wrong) kinds.push(wrong);
      if (name === "enqueue") kinds.push(badPayload);
      await fc.assert(
        fc.asyncProperty(fc.oneof(...kinds), async (attempt) => {
          const { status, raw } = await post(e.path(), attempt.text);
          expect(status).toBeGreaterThanOrEqual(400);
          expect(status).toBeLessThan(500);
          const body = JSON.parse(raw);
          expect(typeof body.error.code).toBe("string");
          expect(typeof body.error.message).toBe("string");
          if (body.error.code === "validation_error") {
            expect(typeof body.error.field).toBe("string");
            expect(body.error.field.length).toBeGreaterThan(0);
          }
          if (status === 413) {
            expect(new TextEncoder().encode(attempt.text).length).toBeGreaterThan(MAX_BODY);
          } else if (attempt.field !== undefined) {
            // A bad value inside a container (jobs: [{}]) is named at its own path.
            const f = attempt.field;
            const named: string = body.error.field;
            expect(named === f || named.startsWith(`${f}[`) || named.startsWith(`${f}.`)).toBe(
              true,
            );
          } else {
            expect(body.error.code).toBe("invalid_json");
          }
        }),
        { numRuns: RUNS },
      );
      expect(await snapshot()).toEqual(before);
    });
  }

  test("the server still serves afterwards", async () => {
    const health = await app.fetch(new Request("http://localhost/healthz"));
    expect(health.status).toBe(200);
    const { status, raw } = await post("/v1/jobs", JSON.stringify({ kind: "after", queue: "fz" }));
    expect(status).toBe(201);
    expect(JSON.parse(raw).job.kind).toBe("after");
  });
});
