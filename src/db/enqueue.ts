import type { JobRow } from "../job.ts";
import type { JsonValue } from "../json.ts";
import { JOBS_CHANNEL } from "../worker/wakeup.ts";
import type { Db } from "./db.ts";

/** One row to insert; `i` is its position in the caller's batch. */
export interface InsertRow {
  i: number;
  queue: string;
  kind: string;
  payload: JsonValue;
  priority: number;
  run_at: string | null;
  delay_ms: number | null;
  max_attempts: number;
  idempotency_key: string | null;
  traceparent: string | null;
  tracestate: string | null;
}

/**
 * Inserts a batch in one statement. Rows whose (queue, idempotency_key) exists
 * already are skipped by ON CONFLICT DO NOTHING: a concurrent insert of the
 * same key waits for the other transaction and then skips, so parallel
 * duplicates insert exactly one row and never raise. The whole batch travels
 * as one jsonb parameter (graphile-worker's add_jobs does the same), so the
 * statement's size does not grow with the batch.
 *
 * The same statement wakes listening workers: one pg_notify per queue that
 * got a job runnable now, delivered when the transaction commits (so a job
 * enqueued in a transaction that rolls back wakes nobody), and folded with
 * duplicates by Postgres. A trigger did this until migration 0002; this costs
 * a fraction of it (see that file).
 *
 * Rows come back in insertion order (ORDER BY i feeds the insert, and the
 * one-row `woke` joins without reordering), which is how the caller maps
 * key-less rows back to its input.
 */
export async function insertJobs(db: Db, rows: InsertRow[]): Promise<JobRow[]> {
  if (rows.length === 0) return [];
  return (await db`
    with ins as (
      insert into conveyor_jobs
        (queue, kind, payload, priority, run_at, max_attempts, idempotency_key, traceparent, tracestate)
      select t.queue, t.kind, coalesce(t.payload, 'null'::jsonb), t.priority,
             coalesce(t.run_at, now() + coalesce(t.delay_ms, 0) * interval '1 millisecond'),
             t.max_attempts, t.idempotency_key, t.traceparent, t.tracestate
        from jsonb_to_recordset(${JSON.stringify(rows)}::text::jsonb) as t(
               i int, queue text, kind text, payload jsonb, priority smallint, run_at timestamptz,
               delay_ms float8, max_attempts int, idempotency_key text, traceparent text, tracestate text)
       order by t.i
      on conflict (queue, idempotency_key) where idempotency_key is not null do nothing
      returning *
    ), woke as (
      -- Referenced below: a SELECT in WITH runs only if something reads it.
      select count(pg_notify(${JOBS_CHANNEL}, q.queue)) as n
        from (select distinct queue from ins where state = 'available' and run_at <= now()) q
    )
    select ins.* from woke, ins`) as unknown as JobRow[];
}

/** The existing jobs for (queue, idempotency_key) pairs; used for duplicates insertJobs skipped. */
export async function selectJobsByIdempotencyKey(
  db: Db,
  keys: { queue: string; key: string }[],
): Promise<JobRow[]> {
  if (keys.length === 0) return [];
  return (await db`
    select j.* from conveyor_jobs j
      join jsonb_to_recordset(${JSON.stringify(keys)}::text::jsonb) as k(queue text, key text)
        on j.queue = k.queue and j.idempotency_key = k.key`) as unknown as JobRow[];
}
