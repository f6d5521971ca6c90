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
 *
 * The float8 epoch is rounded to whole microseconds before it is floored to
 * milliseconds: floor(epoch * 1000) alone put some whole-millisecond times
 * 1 ms low (0.5% of those between 2001 and 2038, 12% after: the float's
 * error crosses the boundary). Rounded, it is exact up to 2106, where
 * the float's error reaches half a microsecond. It cost nothing measurable:
 * through the bench's Conveyor throughput cells (bench/ab.ts, 8 alternating
 * rounds, results/ab-2026-12-06-epoch-round.json) the server's CPU per job
 * was -0.04 and -0.24 µs at 10,000 and 100,000 jobs, jobs/s x0.959 and
 * x0.988 (faster in 3 and 4 of 8 rounds), within the host's drift.
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
  const groups = (await db`
    with leased as (
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
      returning j.id,
                concat_ws(' ', j.id, j.lease_version, j.priority, j.attempts, j.max_attempts,
                          floor(round(date_part('epoch', j.run_at) * 1e6) / 1e3)::int8,
                          case when j.created_at <> j.run_at
                               then floor(round(date_part('epoch', j.created_at) * 1e6) / 1e3)::int8::text
                               else '' end,
                          array_position(${p.kinds}::text[], j.kind)) as n,
                j.payload, j.idempotency_key, j.traceparent, j.tracestate, j.errors)
    select string_agg(n, ' ') as n,
           floor(round(date_part('epoch', now() + ${p.leaseMs}::float8 * interval '1 millisecond')
                       * 1e6) / 1e3)::int8::text as lease_expires_at_ms,
           json_agg(payload) as payloads,
           json_agg(traceparent) as traceparents,
           json_object_agg(id, json_build_array(idempotency_key, tracestate,
                                                case when errors <> '[]'::jsonb then errors end))
             filter (where idempotency_key is not null or tracestate is not null
                        or errors <> '[]'::jsonb) as rare
      from leased
     group by case when pg_column_size(payload) + pg_column_size(errors) <= ${INLINE_BYTES}
                        and pg_column_compression(payload) is null
                        and pg_column_compression(errors) is null
                   then null else id end`) as unknown as LeasedGroup[];
  const out: LeasedRow[] = [];
  for (const g of groups) unpackGroup(g, p.queue, p.kinds, out);
  return out;
}

/**
 * A job whose payload and errors are stored uncompressed in at most this
 * many bytes comes in one row of the fetch's result with the rest of its
 * batch; any other in a row of its own. A row of MAX_FETCH_BATCH such jobs
 * is some megabytes of text at worst (a jsonb string of control characters
 * prints six bytes for each it stores), far below the 1 GB a value may
 * hold; 2,000 bytes compressed could print a thousand times as many.
 */
const INLINE_BYTES = 2_000;

/**
 * Several leased jobs in one row of the fetch's result, in one order in
 * every column. One row instead of one per job: postgres.js makes a Buffer
 * view, an object and a string per column of every row it decodes, and a
 * JSON.parse per jsonb value; here one of each per column of the batch.
 * Kinds come as their index in the worker's list (the fetch takes only
 * those), so they need no text of their own. What most jobs lack
 * (idempotency key, tracestate, errors) comes only for the jobs that have
 * it, keyed by id. In a fetch-and-complete loop of 100,000 jobs on
 * PostgreSQL 18 (2 loops, batches of 1,000, 4 alternating rounds, 2 cores,
 * fsync on) the loop's CPU per job went from 4.8-5.4 to 3.3-4.2 µs, the
 * server's about as much as before (24.0-30.4 against 23.1-28.3 µs; the
 * size and compression checks cost part of it), and the loop ran
 * 48,282-64,385 -> 52,469-65,142 jobs/s, each round faster than its pair.
 *
 * Every job of a fetch gets the same lease expiry (now() is the
 * statement's transaction time), so the group sends it once, and a job's
 * created_at only when it differs from its run_at (as it does not for a
 * job enqueued to run now): fewer epoch conversions for the server, the
 * costliest part of each job's numbers. Through the bench's Conveyor
 * throughput cells (bench/ab.ts, 8 alternating rounds, twice:
 * results/ab-2026-12-05-epoch-once.json and -epoch-once-confirm.json):
 * the server's CPU per job -0.47 and -0.92 µs at 10,000 jobs, -0.42 and
 * -0.14 at 100,000; jobs/s x1.05 and x1.029 (faster in 5 of 8 both
 * times), x1.032 and x1.005 (6 and 4 of 8). Small, and at 100,000 within
 * the host's drift, but never more work for the server.
 */
interface LeasedGroup {
  n: string;
  lease_expires_at_ms: string;
  payloads: JsonValue[];
  traceparents: (string | null)[];
  rare: Record<string, [string | null, string | null, AttemptError[] | null]> | null;
}

function unpackGroup(g: LeasedGroup, queue: string, kinds: string[], out: LeasedRow[]): void {
  // Per job: id, version, priority, attempts, max attempts, run_at, created_at
  // (empty when it equals run_at) and the kind's index in `kinds`. Every job of
  // the batch got the same lease expiry, sent once.
  const f = g.n.split(" ");
  const leaseExpiresAtMs = Number(g.lease_expires_at_ms);
  for (let i = 0; i < g.payloads.length; i++) {
    const k = i * 8;
    const id = f[k] as string;
    const rare = g.rare?.[id];
    const runAtMs = Number(f[k + 5]);
    const created = f[k + 6] as string;
    out.push({
      id,
      queue,
      kind: kinds[Number(f[k + 7]) - 1] as string,
      payload: g.payloads[i] as JsonValue,
      priority: Number(f[k + 2]),
      attempts: Number(f[k + 3]),
      max_attempts: Number(f[k + 4]),
      lease_version: f[k + 1] as string,
      idempotency_key: rare ? rare[0] : null,
      traceparent: g.traceparents[i] ?? null,
      tracestate: rare ? rare[1] : null,
      run_at_ms: runAtMs,
      created_at_ms: created === "" ? runAtMs : Number(created),
      lease_expires_at_ms: leaseExpiresAtMs,
      errors: rare ? rare[2] : null,
    });
  }
}
