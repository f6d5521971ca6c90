import { z } from "zod";
import type { Db } from "./db/db.ts";
import type { InsertRow } from "./db/enqueue.ts";
import { insertJobs, selectJobsByIdempotencyKey } from "./db/enqueue.ts";
import { ConveyorError, ValidationError } from "./errors.ts";
import { type Job, type JobRow, jobFromRow } from "./job.ts";
import { assertJson, type JsonValue } from "./json.ts";
import { TRACEPARENT_RE } from "./trace.ts";
import { parseOrThrow } from "./validate.ts";

export const DEFAULT_QUEUE = "default";
export const DEFAULT_MAX_ATTEMPTS = 25;
export const DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024;
export const MAX_BATCH = 10_000;

export const QUEUE_NAME_RE = /^[A-Za-z0-9_.:-]{1,128}$/;
/** No control characters (U+0000 breaks Postgres text), no lone surrogates. */
const PRINTABLE_RE = /^[^\p{Cc}\p{Cs}]+$/u;
export const KIND_RE = /^[A-Za-z0-9_.:/-]{1,256}$/;

export const enqueueInputSchema = z
  .object({
    queue: z
      .string()
      .regex(QUEUE_NAME_RE, "1-128 characters from A-Z a-z 0-9 _ . : -")
      .default(DEFAULT_QUEUE),
    kind: z.string().regex(KIND_RE, "1-256 characters from A-Z a-z 0-9 _ . : / -"),
    payload: z.unknown().optional(),
    priority: z.number().int().min(-32768).max(32767).optional(),
    runAt: z
      .union([z.date(), z.iso.datetime({ offset: true })])
      .transform((v) => new Date(v))
      .refine((d) => {
        const y = d.getUTCFullYear();
        return !Number.isNaN(d.getTime()) && y >= 1970 && y <= 9999;
      }, "a valid date between 1970 and 9999")
      .optional(),
    delayMs: z
      .number()
      .min(0)
      .max(10 * 365 * 86_400_000)
      .optional(),
    maxAttempts: z.number().int().min(1).max(1000).optional(),
    idempotencyKey: z
      .string()
      .min(1)
      .max(512)
      .regex(PRINTABLE_RE, "printable characters only")
      .optional(),
    traceparent: z.string().regex(TRACEPARENT_RE, "W3C traceparent").optional(),
    tracestate: z
      .string()
      .max(512)
      .regex(/^[\x20-\x7e]*$/, "printable ASCII (W3C tracestate)")
      .optional(),
  })
  .strict()
  .refine((v) => !(v.runAt && v.delayMs !== undefined), {
    message: "give runAt or delayMs, not both",
    path: ["delayMs"],
  });

export type EnqueueInput = z.input<typeof enqueueInputSchema> & { payload?: JsonValue };

export interface EnqueueOptions {
  /** Reject payloads larger than this once serialised. Default 1 MiB. */
  maxPayloadBytes?: number;
  /** max_attempts for jobs that do not set it. Default 25. */
  defaultMaxAttempts?: number;
  /** Per-queue defaults for jobs that do not set them (from conveyor.toml's [queues.<name>]). */
  queueDefaults?: Record<string, { priority?: number; maxAttempts?: number }>;
}

export interface EnqueueResult {
  job: Job;
  /** True when a job with this idempotency key already existed in the queue; nothing was inserted. */
  duplicate: boolean;
}

function toRow(input: unknown, i: number, root: string, opts: EnqueueOptions): InsertRow {
  const v = parseOrThrow(enqueueInputSchema, input, root);
  const payload = v.payload === undefined ? {} : v.payload;
  assertJson(payload, `${root}.payload`);
  const max = opts.maxPayloadBytes ?? DEFAULT_MAX_PAYLOAD_BYTES;
  const size = Buffer.byteLength(JSON.stringify(payload));
  if (size > max) {
    throw new ValidationError(`${root}.payload`, `${size} bytes exceeds the limit of ${max}`);
  }
  if (v.runAt && Number.isNaN(v.runAt.getTime())) {
    throw new ValidationError(`${root}.runAt`, "invalid date");
  }
  const queueDefaults = opts.queueDefaults?.[v.queue];
  return {
    i,
    queue: v.queue,
    kind: v.kind,
    payload,
    priority: v.priority ?? queueDefaults?.priority ?? 0,
    run_at: v.runAt ? v.runAt.toISOString() : null,
    delay_ms: v.delayMs ?? null,
    max_attempts:
      v.maxAttempts ??
      queueDefaults?.maxAttempts ??
      opts.defaultMaxAttempts ??
      DEFAULT_MAX_ATTEMPTS,
    idempotency_key: v.idempotencyKey ?? null,
    // Without one the job gets a root derived from its id and creation time
    // (Job.traceparent, rootTraceparent).
    traceparent: v.traceparent ?? null,
    tracestate: v.tracestate ?? null,
  };
}

/**
 * Enqueues one job. Pass a transaction (`sql.begin(tx => enqueue(tx, ...))`)
 * and the job exists only if that transaction commits.
 */
export async function enqueue(
  db: Db,
  input: EnqueueInput,
  opts: EnqueueOptions = {},
): Promise<EnqueueResult> {
  const [result] = await insertBatch(db, [toRow(input, 0, "job", opts)]);
  if (!result) throw new Error("unreachable: insert returned no row");
  return result;
}

/** Enqueues a batch in one statement; results are in input order. */
export async function enqueueMany(
  db: Db,
  inputs: EnqueueInput[],
  opts: EnqueueOptions = {},
): Promise<EnqueueResult[]> {
  if (!Array.isArray(inputs)) throw new ValidationError("jobs", "expected an array");
  if (inputs.length > MAX_BATCH) {
    throw new ValidationError(
      "jobs",
      `${inputs.length} jobs exceeds the batch limit of ${MAX_BATCH}`,
    );
  }
  return insertBatch(
    db,
    inputs.map((input, i) => toRow(input, i, `jobs[${i}]`, opts)),
  );
}

const keyOf = (queue: string, key: string) => `${queue}\u0000${key}`;

async function insertBatch(db: Db, rows: InsertRow[]): Promise<EnqueueResult[]> {
  if (rows.length === 0) return [];
  // A key repeated inside one batch is inserted once; later copies are duplicates of the first.
  const firstByKey = new Map<string, InsertRow>();
  const toInsert: InsertRow[] = [];
  for (const row of rows) {
    if (row.idempotency_key === null) {
      toInsert.push(row);
      continue;
    }
    const k = keyOf(row.queue, row.idempotency_key);
    if (!firstByKey.has(k)) {
      firstByKey.set(k, row);
      toInsert.push(row);
    }
  }
  const inserted = await insertJobs(db, toInsert);
  const byKey = new Map<string, { row: JobRow; fresh: boolean }>();
  const keyless: JobRow[] = [];
  for (const r of inserted) {
    if (r.idempotency_key === null) keyless.push(r);
    else byKey.set(keyOf(r.queue, r.idempotency_key), { row: r, fresh: true });
  }
  const missing = [...firstByKey.entries()]
    .filter(([k]) => !byKey.has(k))
    .map(([, r]) => ({ queue: r.queue, key: r.idempotency_key as string }));
  for (const r of await selectJobsByIdempotencyKey(db, missing)) {
    byKey.set(keyOf(r.queue, r.idempotency_key as string), { row: r, fresh: false });
  }
  let nextKeyless = 0;
  const claimed = new Set<string>();
  return rows.map((row) => {
    if (row.idempotency_key === null) {
      const r = keyless[nextKeyless++];
      if (!r) throw new Error("unreachable: fewer rows returned than inserted");
      return { job: jobFromRow(r), duplicate: false };
    }
    const k = keyOf(row.queue, row.idempotency_key);
    const found = byKey.get(k);
    if (!found) {
      // Inserted by a concurrent transaction that has not committed visibly to us
      // (only possible under REPEATABLE READ or stricter isolation).
      throw new ConveyorError(
        `job with idempotency key ${row.idempotency_key} in queue ${row.queue} exists but is not visible to this transaction's snapshot; retry the transaction`,
      );
    }
    const duplicate = !found.fresh || claimed.has(k);
    claimed.add(k);
    return { job: jobFromRow(found.row), duplicate };
  });
}
