import type postgres from "postgres";

/** A postgres.js pool or a transaction on it: every statement accepts either. */
// biome-ignore lint/suspicious/noExplicitAny: postgres.js's custom-type parameter is irrelevant here.
export type Db = postgres.Sql<any> | postgres.TransactionSql<any>;
// biome-ignore lint/suspicious/noExplicitAny: as above.
export type Pool = postgres.Sql<any>;

/** A lease as the worker holds it: the job and the fencing token it was issued. */
export interface Lease {
  id: string;
  version: number;
}

/** Columns returned for a job; listed once so every statement returns the same shape. */
export const JOB_COLUMNS = `id, queue, kind, payload, state, priority, run_at, attempts, max_attempts,
  lease_owner, lease_version, lease_expires_at, idempotency_key, result, errors,
  traceparent, tracestate, created_at, attempted_at, finalized_at`;
