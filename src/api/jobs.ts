// /v1/jobs: enqueue (one or a batch), read, list, cancel, retry.
import type { Hono, MiddlewareHandler } from "hono";
import { cancelJobs, listJobs, retryJobs, selectJobsById } from "../db/admin.ts";
import type { Pool } from "../db/db.ts";
import { notifyQueues } from "../db/wake.ts";
import {
  type EnqueueInput,
  type EnqueueOptions,
  type EnqueueResult,
  enqueue,
  enqueueMany,
} from "../enqueue.ts";
import { ValidationError } from "../errors.ts";
import { type Job, type JobRow, type JobState, jobFromRow } from "../job.ts";
import { TRACEPARENT_RE } from "../trace.ts";
import type { Scope } from "./auth.ts";
import { HttpError, validationError } from "./http-error.ts";
import { parse, readJson } from "./request.ts";
import {
  cancelRequestSchema,
  DEFAULT_LIST_LIMIT,
  type EnqueueRequest,
  emptyRequestSchema,
  enqueueBatchRequestSchema,
  enqueueRequestSchema,
  isJobId,
  listJobsQuerySchema,
} from "./schemas.ts";

export interface JobRoutesDeps {
  sql: Pool;
  enqueueDefaults: EnqueueOptions;
  auth: (scope: Scope) => MiddlewareHandler;
  bodyLimit: MiddlewareHandler;
}

export const DEFAULT_CANCEL_REASON = "cancelled through the API";
/** How often cancel/retry re-read a job whose state changed between the write and the check. */
const STATE_RACE_RETRIES = 3;

export function registerJobRoutes(app: Hono, d: JobRoutesDeps): void {
  const { sql, enqueueDefaults } = d;

  app.post("/v1/jobs/batch", d.auth("enqueue"), d.bodyLimit, async (c) => {
    if (c.req.header("idempotency-key") !== undefined) {
      throw validationError(
        "Idempotency-Key",
        "not supported on a batch; set idempotencyKey on each job",
      );
    }
    const { jobs } = await readJson(c, enqueueBatchRequestSchema, { emptyAllowed: false });
    const trace = traceFromHeaders(c.req.raw.headers);
    const inputs = jobs.map((j) => withTrace(j, trace));
    const results = await mapValidation(
      () => enqueueMany(sql, inputs, enqueueDefaults),
      (f) => f,
    );
    // 201 when the request created anything; 200 when every job already existed.
    const created = results.some((r) => !r.duplicate);
    return c.json({ results: results.map(resultJson) }, created ? 201 : 200);
  });

  app.post("/v1/jobs", d.auth("enqueue"), d.bodyLimit, async (c) => {
    const body = await readJson(c, enqueueRequestSchema, { emptyAllowed: false });
    const key = idempotencyKey(body.idempotencyKey, c.req.header("idempotency-key"));
    const input = withTrace({ ...body, idempotencyKey: key }, traceFromHeaders(c.req.raw.headers));
    const result = await mapValidation(
      () => enqueue(sql, input, enqueueDefaults),
      // enqueue() names fields from its own root, "job"; the body is the root here.
      (f) => (f === "job" ? "body" : f.replace(/^job\./, "")),
    );
    c.header("Location", `/v1/jobs/${result.job.id}`);
    return c.json(resultJson(result), result.duplicate ? 200 : 201);
  });

  app.get("/v1/jobs", d.auth("admin"), async (c) => {
    const q = parse(listJobsQuerySchema, c.req.query());
    const limit = q.limit ?? DEFAULT_LIST_LIMIT;
    const rows = await listJobs(sql, {
      queue: q.queue,
      state: q.state,
      kind: q.kind,
      beforeId: q.cursor === undefined ? undefined : decodeCursor(q.cursor),
      limit: limit + 1,
    });
    const page = rows.slice(0, limit);
    const last = page.at(-1);
    const nextCursor = rows.length > limit && last ? encodeCursor(last.id) : null;
    return c.json({ jobs: page.map(jobFromRow), nextCursor });
  });

  app.get("/v1/jobs/:id{[0-9]+}", d.auth("enqueue"), async (c) => {
    const id = jobId(c.req.param("id"));
    const [row] = await selectJobsById(sql, [id]);
    if (!row) throw notFound(id);
    return c.json({ job: jobFromRow(row) });
  });

  app.post("/v1/jobs/:id{[0-9]+}/cancel", d.auth("admin"), d.bodyLimit, async (c) => {
    const id = jobId(c.req.param("id"));
    const { reason } = await readJson(c, cancelRequestSchema, { emptyAllowed: true });
    const job = await changeState(
      sql,
      id,
      async () => (await cancelJobs(sql, [id], reason ?? DEFAULT_CANCEL_REASON))[0],
      ["pending", "available"],
      (state) =>
        state === "running"
          ? new HttpError(
              409,
              "job_running",
              `job ${id} is running; a running job can only be cancelled by its handler`,
            )
          : new HttpError(409, "job_finished", `job ${id} is already ${state}`),
    );
    return c.json({ job });
  });

  app.post("/v1/jobs/:id{[0-9]+}/retry", d.auth("admin"), d.bodyLimit, async (c) => {
    const id = jobId(c.req.param("id"));
    await readJson(c, emptyRequestSchema, { emptyAllowed: true });
    const job = await changeState(
      sql,
      id,
      async () => (await retryJobs(sql, [id]))[0],
      ["available", "completed", "cancelled", "discarded"],
      (state) =>
        state === "running"
          ? new HttpError(409, "job_running", `job ${id} is running`)
          : new HttpError(409, "job_pending", `job ${id} is waiting for its dependencies`),
    );
    await notifyQueues(sql, [job.queue]);
    return c.json({ job });
  });
}

/**
 * Runs a state-guarded write; when it changes nothing, reads the job to say
 * why (404 or 409). If the job has meanwhile moved into a state the write
 * accepts (say a worker released it), the write is tried again.
 */
async function changeState(
  sql: Pool,
  id: string,
  write: () => Promise<JobRow | undefined>,
  accepted: JobState[],
  conflict: (state: JobState) => HttpError,
): Promise<Job> {
  for (let i = 0; ; i++) {
    const row = await write();
    if (row) return jobFromRow(row);
    const [current] = await selectJobsById(sql, [id]);
    if (!current) throw notFound(id);
    if (!accepted.includes(current.state) || i >= STATE_RACE_RETRIES) {
      throw conflict(current.state);
    }
  }
}

const notFound = (id: string) => new HttpError(404, "not_found", `no job with id ${id}`);

/** The route admits digits only; this also bounds the value to a bigint. */
function jobId(raw: string): string {
  if (!isJobId(raw)) throw notFound(raw);
  return raw;
}

export function encodeCursor(id: string): string {
  return Buffer.from(id).toString("base64url");
}

function decodeCursor(cursor: string): string {
  const id = Buffer.from(cursor, "base64url").toString();
  if (!isJobId(id)) throw validationError("cursor", "not a cursor this API returned");
  return id;
}

const resultJson = (r: EnqueueResult) => ({ job: r.job, duplicate: r.duplicate });

/** enqueue() validates payloads (size, JSON-ness); its field names are mapped to body paths. */
async function mapValidation<T>(run: () => Promise<T>, field: (f: string) => string): Promise<T> {
  try {
    return await run();
  } catch (e) {
    if (e instanceof ValidationError) {
      const message = e.message.slice(e.field.length + 2); // "<field>: <message>"
      throw validationError(field(e.field), message);
    }
    throw e;
  }
}

/**
 * The key from the body or the Idempotency-Key header. The header may be a
 * structured-field string ("...") as the IETF draft has it, or a bare value.
 */
function idempotencyKey(fromBody: string | undefined, header: string | undefined) {
  if (header === undefined) return fromBody;
  const quoted = /^"(.*)"$/.exec(header);
  const key = quoted?.[1] ?? header;
  if (key.length < 1 || key.length > 512) {
    throw validationError("Idempotency-Key", "must be 1-512 characters");
  }
  if (fromBody !== undefined && fromBody !== key) {
    throw validationError("idempotencyKey", "differs from the Idempotency-Key header");
  }
  return key;
}

interface Trace {
  traceparent: string;
  tracestate: string | undefined;
}

/**
 * The request's W3C trace context, if valid. An invalid traceparent is
 * ignored rather than rejected, as the W3C spec asks: the job then starts a
 * trace of its own. tracestate only counts alongside a valid traceparent.
 */
function traceFromHeaders(h: Headers): Trace | undefined {
  const traceparent = h.get("traceparent")?.trim();
  if (!traceparent || !TRACEPARENT_RE.test(traceparent)) return undefined;
  const [version, traceId, parentId] = traceparent.split("-");
  if (version === "ff" || /^0+$/.test(traceId ?? "") || /^0+$/.test(parentId ?? "")) {
    return undefined;
  }
  const state = h.get("tracestate")?.trim();
  const tracestate =
    state && state.length <= 512 && state.isWellFormed() && !state.includes("\u0000")
      ? state
      : undefined;
  return { traceparent, tracestate };
}

/** A job's own trace context wins; the header's fills in for jobs without one. */
function withTrace(body: EnqueueRequest, trace: Trace | undefined): EnqueueInput {
  const input = body as EnqueueInput;
  if (trace === undefined || input.traceparent !== undefined || input.tracestate !== undefined) {
    return input;
  }
  return { ...input, traceparent: trace.traceparent, tracestate: trace.tracestate };
}
