import type { LeasedRow } from "./db/fetch.ts";
import type { JsonValue } from "./json.ts";
import { jobTraceparent, rootTraceparent } from "./trace.ts";

export const JOB_STATES = [
  "pending",
  "available",
  "running",
  "completed",
  "cancelled",
  "discarded",
] as const;
export type JobState = (typeof JOB_STATES)[number];

/** The error recorded for one failed (or cancelled, or expired) attempt. */
export interface AttemptError {
  attempt: number;
  at: string;
  name: string;
  message: string;
  stack?: string;
}

/** A job as stored. Ids are decimal strings (bigint in Postgres, safe in JSON). */
export interface Job {
  id: string;
  queue: string;
  kind: string;
  payload: JsonValue;
  state: JobState;
  priority: number;
  runAt: Date;
  attempts: number;
  maxAttempts: number;
  leaseOwner: string | null;
  /** The fencing token of the latest lease; increases by one on every dequeue. */
  leaseVersion: number;
  leaseExpiresAt: Date | null;
  idempotencyKey: string | null;
  result: JsonValue | null;
  errors: AttemptError[];
  /**
   * W3C trace context: the one the job was enqueued with, or for a job
   * enqueued outside any trace a root derived from its id and creation time
   * (`rootTraceparent`; the row stores NULL).
   */
  traceparent: string;
  tracestate: string | null;
  createdAt: Date;
  attemptedAt: Date | null;
  finalizedAt: Date | null;
}

/** Row shape returned by `select *` / `returning *` on conveyor_jobs. */
export interface JobRow {
  id: string;
  queue: string;
  kind: string;
  payload: JsonValue;
  state: JobState;
  priority: number;
  run_at: Date;
  attempts: number;
  max_attempts: number;
  lease_owner: string | null;
  lease_version: string;
  lease_expires_at: Date | null;
  idempotency_key: string | null;
  result: JsonValue | null;
  errors: AttemptError[];
  traceparent: string | null;
  tracestate: string | null;
  created_at: Date;
  attempted_at: Date | null;
  finalized_at: Date | null;
}

export function jobFromRow(row: JobRow): Job {
  return {
    id: row.id,
    queue: row.queue,
    kind: row.kind,
    payload: row.payload,
    state: row.state,
    priority: row.priority,
    runAt: row.run_at,
    attempts: row.attempts,
    maxAttempts: row.max_attempts,
    leaseOwner: row.lease_owner,
    leaseVersion: Number(row.lease_version),
    leaseExpiresAt: row.lease_expires_at,
    idempotencyKey: row.idempotency_key,
    result: row.result,
    errors: row.errors,
    traceparent: jobTraceparent(row.traceparent, row.id, row.created_at.getTime()),
    tracestate: row.tracestate,
    createdAt: row.created_at,
    attemptedAt: row.attempted_at,
    finalizedAt: row.finalized_at,
  };
}

/**
 * The Job a handler sees, from the columns fetchJobs returns. A root trace
 * context is derived when first read (an own enumerable getter: spreads and
 * JSON.stringify see it as a value), not for every job a no-op handler runs.
 */
export function jobFromLeasedRow(row: LeasedRow, owner: string, leaseMs: number): Job {
  let traceparent = row.traceparent;
  return {
    id: row.id,
    queue: row.queue,
    kind: row.kind,
    payload: row.payload,
    state: "running",
    priority: row.priority,
    runAt: new Date(row.run_at_ms),
    attempts: row.attempts,
    maxAttempts: row.max_attempts,
    leaseOwner: owner,
    leaseVersion: Number(row.lease_version),
    leaseExpiresAt: new Date(row.lease_expires_at_ms),
    idempotencyKey: row.idempotency_key,
    result: null,
    errors: row.errors ?? [],
    get traceparent(): string {
      traceparent ??= rootTraceparent(row.id, row.created_at_ms);
      return traceparent;
    },
    tracestate: row.tracestate,
    createdAt: new Date(row.created_at_ms),
    attemptedAt: new Date(row.lease_expires_at_ms - leaseMs),
    finalizedAt: null,
  };
}
