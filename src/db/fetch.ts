import type { AttemptError } from "../job.ts";
import type { JsonValue } from "../json.ts";
import type { Db } from "./db.ts";

export interface FetchParams {
  queue: string;
  owner: string;
  limit: number;
  leaseMs: number;
  /** Only kinds this worker can run; other jobs wait for a worker that can. */
  kinds: string[];
}

/**
 * What a worker needs of a job it leased. Fewer columns than `returning *`:
 * decoding 20 columns (five timestamps into Dates, three jsonb) was a third
 * of the worker's CPU per job in a 20,000-job profile. Times come as whole
 * epoch milliseconds, floored as a JS Date would truncate them: an integer
 * decodes far faster than a timestamp string, and date_part (float8) costs
 * the server much less than extract (numeric since Postgres 14); in a bare
 * fetch-and-complete loop of 100,000 jobs that was 57,600-62,800 -> 64,400-
 * 67,200 jobs/s. Errors come only when an earlier attempt left some.
 */
export interface LeasedRow {
  id: string;
  queue: string;
  kind: string;
  payload: JsonValue;
  priority: number;
  attempts: number;
  max_attempts: number;
  lease_version: string;
  idempotency_key: string | null;
  traceparent: string | null;
  tracestate: string | null;
  run_at_ms: number;
  created_at_ms: number;
  lease_expires_at_ms: number;
  errors: AttemptError[] | null;
}

/**
 * Leases up to `limit` runnable jobs of one queue in one statement (spec: Dequeue).
 *
 * SKIP LOCKED lets concurrent fetchers take disjoint rows without waiting.
 * Each leased row gets lease_version + 1: the new fencing token. Expiry comes
 * from Postgres's clock, never the worker's. A paused queue yields nothing.
 * The inner select reads only conveyor_jobs_dequeue_idx (state = 'available'),
 * so finished rows do not slow it down.
 *
 * The update takes the locked ids as an array and probes the primary key for
 * each. Joined to them as a CTE instead, on an analyzed table of some
 * thousands of rows the planner hashed the batch against a sequential scan
 * of the whole table, every row version included: 4.9 of 9 ms for 250 jobs
 * on 10,000 rows (auto_explain), the largest statement cost per job of a
 * 10,000-job ledger run, 47 µs of exec time per job against 20 µs now
 * (pg_stat_statements; test/plans.test.ts).
 */
export async function fetchJobs(db: Db, p: FetchParams): Promise<LeasedRow[]> {
  const rows = (await db`
    update conveyor_jobs j
       set state = 'running',
           attempts = j.attempts + 1,
           lease_owner = ${p.owner},
           lease_version = j.lease_version + 1,
           lease_expires_at = now() + ${p.leaseMs}::float8 * interval '1 millisecond',
           attempted_at = now()
     where j.id = any(array(
       select id from conveyor_jobs
        where state = 'available' and queue = ${p.queue} and run_at <= now()
          and kind = any(${p.kinds}::text[])
          and not exists (select 1 from conveyor_queues q where q.name = ${p.queue} and q.paused)
        order by priority, run_at, id
        limit ${p.limit}
        for update skip locked))
    returning ${packedNumbers(db)} as n,
              j.kind, j.payload, j.idempotency_key, j.traceparent, j.tracestate,
              case when j.errors <> '[]'::jsonb then j.errors end as errors`) as unknown as PackedRow[];
  return rows.map((r) => unpack(r, p.queue));
}

/** A leased row `j`'s eight numbers in one text column, as unpack() reads them. */
export function packedNumbers(db: Db) {
  return db`concat_ws(' ', j.id, j.lease_version, j.priority, j.attempts, j.max_attempts,
                      floor(date_part('epoch', j.run_at) * 1000)::int8,
                      floor(date_part('epoch', j.created_at) * 1000)::int8,
                      floor(date_part('epoch', j.lease_expires_at) * 1000)::int8)`;
}

/**
 * The numbers of a leased row come packed in one text column: postgres.js
 * decodes every column with its own Buffer.toString call, and those calls
 * were the largest single cost of the worker (26% of its CPU at 100,000
 * no-op jobs with 15 columns). Eight numbers in one column are one call and
 * one split. Kinds and queues never contain spaces (KIND_RE), but the kind is
 * its own column anyway: a row inserted by hand must not break the parse.
 */
export interface PackedRow {
  n: string;
  kind: string;
  payload: JsonValue;
  idempotency_key: string | null;
  traceparent: string | null;
  tracestate: string | null;
  errors: AttemptError[] | null;
}

export function unpack(r: PackedRow, queue: string): LeasedRow {
  const f = r.n.split(" ");
  return {
    id: f[0] as string,
    queue,
    kind: r.kind,
    payload: r.payload,
    priority: Number(f[2]),
    attempts: Number(f[3]),
    max_attempts: Number(f[4]),
    lease_version: f[1] as string,
    idempotency_key: r.idempotency_key,
    traceparent: r.traceparent,
    tracestate: r.tracestate,
    run_at_ms: Number(f[5]),
    created_at_ms: Number(f[6]),
    lease_expires_at_ms: Number(f[7]),
    errors: r.errors,
  };
}
