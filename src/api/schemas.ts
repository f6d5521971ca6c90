// The HTTP API's wire format as zod schemas: requests are parsed with them and
// /openapi.json is generated from them, so the two cannot drift apart. Every
// object is strict: an unknown field is a 400 naming it, never silently
// dropped.
import { z } from "zod";
import { enqueueInputSchema, MAX_BATCH } from "../enqueue.ts";
import { JOB_STATES } from "../job.ts";

/** Schemas published as OpenAPI components, by name. */
export const components = z.registry<{ id: string; description?: string }>();

export const DEFAULT_LIST_LIMIT = 50;
export const MAX_LIST_LIMIT = 500;
export const MAX_REASON_LENGTH = 1000;

const base = enqueueInputSchema.shape;

// Postgres text and jsonb reject U+0000 and unpaired surrogates; a request
// carrying them is the client's error, so it must be a 400 and not a 500.
const pgText = (s: z.ZodString) =>
  s.refine((v) => !v.includes("\u0000") && v.isWellFormed(), {
    message: "must be well-formed Unicode without U+0000",
  });

const runAt = z.iso
  .datetime({ offset: true })
  .refine((v) => new Date(v).getUTCFullYear() >= 1, { message: "year must be 0001 or later" })
  .describe("When the job becomes runnable (ISO 8601 with Z or an offset).");

export const enqueueRequestSchema = z
  .object({
    queue: base.queue.describe("Queue name; default 'default'."),
    kind: base.kind.describe("Handler name the job runs."),
    payload: z.unknown().optional().describe("Any JSON value; {} when omitted."),
    priority: base.priority.describe("Lower runs first."),
    runAt: runAt.optional(),
    delayMs: base.delayMs.describe("Run this many milliseconds from now (not with runAt)."),
    maxAttempts: base.maxAttempts.describe("Attempts before the job is discarded; default 25."),
    idempotencyKey: pgText(z.string().min(1).max(512))
      .optional()
      .describe(
        "Unique per queue while the job row exists; a repeat returns the existing job. " +
          "May be sent as the Idempotency-Key header instead.",
      ),
    traceparent: base.traceparent.describe(
      "W3C traceparent; the request's traceparent header is used when absent.",
    ),
    tracestate: pgText(z.string().max(512)).optional().describe("W3C tracestate."),
  })
  .strict()
  .refine((v) => !(v.runAt !== undefined && v.delayMs !== undefined), {
    message: "give runAt or delayMs, not both",
    path: ["delayMs"],
  });
export type EnqueueRequest = z.input<typeof enqueueRequestSchema>;
components.add(enqueueRequestSchema, { id: "EnqueueRequest" });

export const enqueueBatchRequestSchema = z
  .object({ jobs: z.array(enqueueRequestSchema).min(1).max(MAX_BATCH) })
  .strict();
components.add(enqueueBatchRequestSchema, { id: "EnqueueBatchRequest" });

export const cancelRequestSchema = z
  .object({
    reason: pgText(z.string().min(1).max(MAX_REASON_LENGTH))
      .optional()
      .describe("Recorded as the message of the job's last error entry."),
  })
  .strict();
components.add(cancelRequestSchema, { id: "CancelRequest" });

/** Retry and pause/resume take no options; an empty body or {} is accepted. */
export const emptyRequestSchema = z.object({}).strict();
components.add(emptyRequestSchema, { id: "EmptyRequest" });

const ID_RE = /^[0-9]{1,19}$/;
const MAX_ID = 9223372036854775807n;
export const isJobId = (v: string) => ID_RE.test(v) && BigInt(v) <= MAX_ID && BigInt(v) > 0n;

export const listJobsQuerySchema = z
  .object({
    queue: base.queue.unwrap().optional(),
    state: z.enum(JOB_STATES).optional(),
    kind: base.kind.optional(),
    limit: z
      .string()
      .regex(/^[0-9]{1,4}$/, "an integer")
      .transform(Number)
      .pipe(z.number().int().min(1).max(MAX_LIST_LIMIT))
      .optional()
      .describe(`Page size, 1-${MAX_LIST_LIMIT}; default ${DEFAULT_LIST_LIMIT}.`),
    cursor: z.string().max(64).optional().describe("nextCursor from the previous page; opaque."),
  })
  .strict();

const date = z.iso.datetime();

export const attemptErrorSchema = z.object({
  attempt: z.number().int(),
  at: z.string(),
  name: z.string(),
  message: z.string(),
  stack: z.string().optional(),
});
components.add(attemptErrorSchema, { id: "AttemptError" });

/** The Job type as JSON: dates as ISO strings, the id as a decimal string. */
export const jobSchema = z.object({
  id: z.string().regex(ID_RE),
  queue: z.string(),
  kind: z.string(),
  payload: z.unknown(),
  state: z.enum(JOB_STATES),
  priority: z.number().int(),
  runAt: date,
  attempts: z.number().int(),
  maxAttempts: z.number().int(),
  leaseOwner: z.string().nullable(),
  leaseVersion: z.number().int().describe("Fencing token of the latest lease."),
  leaseExpiresAt: date.nullable(),
  idempotencyKey: z.string().nullable(),
  result: z.unknown(),
  errors: z.array(attemptErrorSchema),
  traceparent: z
    .string()
    .describe(
      "W3C traceparent: the one the job was enqueued with, or a root derived from its id and createdAt.",
    ),
  tracestate: z.string().nullable(),
  createdAt: date,
  attemptedAt: date.nullable(),
  finalizedAt: date.nullable(),
});
components.add(jobSchema, { id: "Job" });

export const jobResponseSchema = z.object({ job: jobSchema });
components.add(jobResponseSchema, { id: "JobResponse" });

export const enqueueResponseSchema = z.object({ job: jobSchema, duplicate: z.boolean() });
components.add(enqueueResponseSchema, { id: "EnqueueResponse" });

export const enqueueBatchResponseSchema = z.object({
  results: z.array(enqueueResponseSchema).describe("In the order of the request's jobs."),
});
components.add(enqueueBatchResponseSchema, { id: "EnqueueBatchResponse" });

export const jobListResponseSchema = z.object({
  jobs: z.array(jobSchema),
  nextCursor: z.string().nullable().describe("Pass as cursor for the next page; null at the end."),
});
components.add(jobListResponseSchema, { id: "JobList" });

export const FINAL_STATES = ["completed", "cancelled", "discarded"] as const;

export const queueSchema = z.object({
  name: z.string(),
  paused: z.boolean(),
  counts: z.object({
    available: z.number().int().describe("Runnable now."),
    scheduled: z.number().int().describe("Available, with runAt in the future."),
    running: z.number().int(),
    completed: z.number().int(),
    cancelled: z.number().int(),
    discarded: z.number().int(),
  }),
});
components.add(queueSchema, { id: "Queue" });

export const queueListResponseSchema = z.object({
  queues: z.array(queueSchema),
  finalCounts: z
    .object({
      window: z.number().int(),
      exact: z.object({
        completed: z.boolean(),
        cancelled: z.boolean(),
        discarded: z.boolean(),
      }),
    })
    .describe(
      "Finished jobs are counted among the `window` most recently finalized of each state; " +
        "where exact is false, that state's counts are lower bounds.",
    ),
});
components.add(queueListResponseSchema, { id: "QueueList" });

export const queueResponseSchema = z.object({
  queue: z.object({ name: z.string(), paused: z.boolean(), updatedAt: date }),
});
components.add(queueResponseSchema, { id: "QueueStateResponse" });

export const errorResponseSchema = z.object({
  error: z.object({
    code: z.string().describe("Stable, machine-readable."),
    message: z.string(),
    field: z
      .string()
      .optional()
      .describe("Path of the offending input, e.g. jobs[2].payload.a, or a header name."),
  }),
});
components.add(errorResponseSchema, { id: "Error" });

export const healthResponseSchema = z.object({ status: z.literal("ok"), version: z.string() });
components.add(healthResponseSchema, { id: "Health" });
