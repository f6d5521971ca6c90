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
    if (handOff) return insertHandedOff(db, only, handOff);
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
 * attempt 1, lease version 1, expiry by Postgres's clock. In a paused queue
 * it is inserted 'available' instead, and a duplicate key inserts nothing;
 * either way the slot goes back. The worker gets the job only once the
 * insert has committed.
 *
 * This is the enqueue of the 1,000/s latency cells, so it is lean: the row's
 * values go as plain parameters (no jsonb_to_recordset for one row), and it
 * returns only what the insert decides (id, state, owner, payload as stored,
 * and the numbers and times, packed in one text column: postgres.js decodes
 * each column with a Buffer.toString call of its own, and a timestamptz
 * with a Date parse). The rest of the row is what was inserted, or the
 * column's default (no result, no errors, not finalized).
 */
async function insertHandedOff(pool: Pool, row: InsertRow, handOff: HandOff): Promise<JobRow[]> {
  let inserted: HandedOffRow[];
  try {
    inserted = (await pool`
      insert into conveyor_jobs as j
        (queue, kind, payload, priority, max_attempts, idempotency_key, traceparent, tracestate,
         state, attempts, lease_owner, lease_version, lease_expires_at, attempted_at)
      select ${row.queue}::text, ${row.kind}::text, ${JSON.stringify(row.payload)}::text::jsonb,
             ${row.priority}::smallint, ${row.max_attempts}::int, ${row.idempotency_key}::text,
             ${row.traceparent}::text, ${row.tracestate}::text,
             case when p.paused then 'available' else 'running' end::conveyor_job_state,
             case when p.paused then 0 else 1 end,
             case when p.paused then null else ${handOff.owner} end,
             case when p.paused then 0 else 1 end,
             case when p.paused then null
                  else now() + ${handOff.leaseMs}::float8 * interval '1 millisecond' end,
             case when p.paused then null else now() end
        from (select exists (select 1 from conveyor_queues q
                              where q.name = ${row.queue} and q.paused) as paused) p
      on conflict (queue, idempotency_key) where idempotency_key is not null do nothing
      returning j.state, j.lease_owner, j.payload,
                concat_ws(' ', j.id, j.lease_version, j.priority, j.attempts, j.max_attempts,
                          floor(date_part('epoch', j.run_at) * 1000)::int8,
                          floor(date_part('epoch', j.created_at) * 1000)::int8,
                          coalesce(floor(date_part('epoch', j.lease_expires_at) * 1000)::int8::text, ''),
                          coalesce(floor(date_part('epoch', j.attempted_at) * 1000)::int8::text, ''))
                  as n`) as unknown as HandedOffRow[];
  } catch (error) {
    handOff.release();
    throw error;
  }
  const r = inserted[0];
  if (!r) {
    handOff.release(); // a duplicate key: nothing inserted
    return [];
  }
  const job = handedOffJob(row, r);
  if (job.state === "running" && job.lease_owner === handOff.owner && job.lease_expires_at) {
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
      lease_expires_at_ms: job.lease_expires_at.getTime(),
      errors: null,
    });
    // No wake-up: the job is already running.
    return [job];
  }
  handOff.release();
  wakeAfterCommit(pool, [job.queue]); // a paused queue's job, woken as any insert is
  return [job];
}

interface HandedOffRow {
  state: JobRow["state"];
  lease_owner: string | null;
  payload: JsonValue;
  /** id, lease version, priority, attempts, max attempts, run_at, created_at, lease expiry, attempted_at (ms; the last two empty when null). */
  n: string;
}

/** The whole row: the insert's reply, the rest as inserted (test/handoff.test.ts compares it with a select). */
function handedOffJob(row: InsertRow, r: HandedOffRow): JobRow {
  const f = r.n.split(" ");
  const ms = (s: string | undefined) => (s ? new Date(Number(s)) : null);
  return {
    id: f[0] as string,
    queue: row.queue,
    kind: row.kind,
    payload: r.payload,
    state: r.state,
    priority: Number(f[2]),
    run_at: new Date(Number(f[5])),
    attempts: Number(f[3]),
    max_attempts: Number(f[4]),
    lease_owner: r.lease_owner,
    lease_version: f[1] as string,
    lease_expires_at: ms(f[7]),
    idempotency_key: row.idempotency_key,
    result: null,
    errors: [],
    traceparent: row.traceparent,
    tracestate: row.tracestate,
    created_at: new Date(Number(f[6])),
    attempted_at: ms(f[8]),
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
