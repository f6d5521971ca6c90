import type { JobRow } from "../job.ts";
import type { JsonValue } from "../json.ts";
import type { Db, Pool } from "./db.ts";
import { type HandOff, takeHandOff } from "./handoff.ts";
import { isPool, JOBS_CHANNEL, wakeAfterCommit } from "./wake.ts";

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
 * Inserted jobs runnable now wake listening workers: one notification per
 * queue (src/db/wake.ts). On a pool the insert commits by itself and the
 * pool's waker notifies after the commit, coalesced with other enqueues, so
 * that notifying does not serialise the enqueues' commits. In a caller's
 * transaction the statement notifies itself, delivered only if that
 * transaction commits (a job enqueued in a transaction that rolls back wakes
 * nobody), and folded with duplicates by Postgres.
 *
 * Rows come back in insertion order (ORDER BY i feeds the insert, and the
 * one-row `woke` joins without reordering), which is how the caller maps
 * key-less rows back to its input.
 */
export async function insertJobs(db: Db, rows: InsertRow[]): Promise<JobRow[]> {
  if (rows.length === 0) return [];
  const only = rows.length === 1 ? rows[0] : undefined;
  // One job runnable now, enqueued on a pool: an idle worker of this process
  // may take it in the insert itself (src/db/handoff.ts).
  if (only && isPool(db) && only.run_at === null && !only.delay_ms) {
    const handOff = takeHandOff(db, only.queue, only.kind);
    if (handOff) {
      const leased = await insertHandedOff(db, only, handOff);
      if (leased) return [leased];
      // A paused queue or a duplicate key: nothing was inserted. The usual
      // insert puts a paused queue's job in 'available' and skips a duplicate.
    }
  }
  // A fragment: postgres.js inlines it, with its parameter, where it is interpolated.
  const insert = db`
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
  `;
  if (isPool(db)) {
    const inserted = (await db`
      ${insert}
      returning *, state = 'available' and run_at <= now() as runnable_now`) as unknown as (JobRow & {
      runnable_now: boolean;
    })[];
    const woken = new Set<string>();
    for (const r of inserted) if (r.runnable_now) woken.add(r.queue);
    wakeAfterCommit(db, woken);
    return inserted;
  }
  return (await db`
    with ins as (
      ${insert}
      returning *
    ), woke as (
      -- Referenced below: a SELECT in WITH runs only if something reads it.
      select count(pg_notify(${JOBS_CHANNEL}, q.queue)) as n
        from (select distinct queue from ins where state = 'available' and run_at <= now()) q
    )
    select ins.* from woke, ins`) as unknown as JobRow[];
}

/**
 * Inserts one job leased to the hand-off's worker, as its first dequeue would
 * lease it (spec: HANDOFF, Enqueue and Dequeue in one transaction): 'running',
 * attempt 1, lease version 1, expiry by Postgres's clock. It inserts nothing
 * into a paused queue or over a duplicate key, gives the slot back and
 * returns undefined; insertJobs then inserts the job the usual way. The
 * worker gets the job only once the insert has committed.
 *
 * This is the enqueue of the 1,000/s latency cells, so it is lean: the row's
 * values go as plain parameters, and it returns only what the insert
 * decides: the id, the payload as stored, and the transaction's now() in
 * whole milliseconds, which is the job's run_at, created_at and attempted_at
 * (the lease expiry is that and the lease's whole milliseconds). The rest is
 * what was inserted, or the column's default. In the open-loop enqueue at
 * 1,000/s (bench/stalls.ts, 20 connections, 4 rounds) the statement alone
 * took p50 0.40-0.42 ms when it decided the state, owner and times by CASE
 * over the queue's paused flag and returned them, against 0.36-0.38 in this
 * form and 0.33-0.35 for a plain insert of a running row with no parameters.
 */
async function insertHandedOff(
  pool: Pool,
  row: InsertRow,
  handOff: HandOff,
): Promise<JobRow | undefined> {
  let inserted: HandedOffRow[];
  try {
    inserted = (await pool`
      insert into conveyor_jobs as j
        (queue, kind, payload, priority, max_attempts, idempotency_key, traceparent, tracestate,
         state, attempts, lease_owner, lease_version, lease_expires_at, attempted_at)
      select ${row.queue}::text, ${row.kind}::text, ${JSON.stringify(row.payload)}::text::jsonb,
             ${row.priority}::smallint, ${row.max_attempts}::int, ${row.idempotency_key}::text,
             ${row.traceparent}::text, ${row.tracestate}::text,
             'running', 1, ${handOff.owner}::text, 1,
             now() + ${handOff.leaseMs}::int * interval '1 millisecond', now()
       where not exists (select 1 from conveyor_queues q where q.name = ${row.queue} and q.paused)
      on conflict (queue, idempotency_key) where idempotency_key is not null do nothing
      returning j.id, j.payload,
                (date_part('epoch', date_trunc('milliseconds', now())) * 1000)::int8::text
                  as now_ms`) as unknown as HandedOffRow[];
  } catch (error) {
    handOff.release();
    throw error;
  }
  const r = inserted[0];
  if (!r) {
    handOff.release();
    return undefined;
  }
  const job = handedOffJob(row, r, handOff);
  handOff.deliver({
    id: job.id,
    queue: job.queue,
    kind: job.kind,
    payload: job.payload,
    priority: job.priority,
    attempts: job.attempts,
    max_attempts: job.max_attempts,
    lease_version: job.lease_version,
    idempotency_key: job.idempotency_key,
    traceparent: job.traceparent,
    tracestate: job.tracestate,
    run_at_ms: job.run_at.getTime(),
    created_at_ms: job.created_at.getTime(),
    lease_expires_at_ms: (job.lease_expires_at as Date).getTime(),
    errors: null,
  });
  // No wake-up: the job is already running.
  return job;
}

interface HandedOffRow {
  id: string;
  payload: JsonValue;
  /** The insert's now(), truncated to whole milliseconds, as a Date of it would be. */
  now_ms: string;
}

/** The whole row: the insert's reply, the rest as inserted (test/handoff.test.ts compares it with a select). */
function handedOffJob(row: InsertRow, r: HandedOffRow, handOff: HandOff): JobRow {
  // run_at and created_at default to now(), attempted_at is now(), and the
  // lease expiry is now() plus a whole number of milliseconds.
  const now = Number(r.now_ms);
  return {
    id: r.id,
    queue: row.queue,
    kind: row.kind,
    payload: r.payload,
    state: "running",
    priority: row.priority,
    run_at: new Date(now),
    attempts: 1,
    max_attempts: row.max_attempts,
    lease_owner: handOff.owner,
    lease_version: "1",
    lease_expires_at: new Date(now + handOff.leaseMs),
    idempotency_key: row.idempotency_key,
    result: null,
    errors: [],
    traceparent: row.traceparent,
    tracestate: row.tracestate,
    created_at: new Date(now),
    attempted_at: new Date(now),
    finalized_at: null,
  };
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
