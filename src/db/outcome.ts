import type { AttemptError, JobState } from "../job.ts";
import type { JsonValue } from "../json.ts";
import { type Db, fencedBatch, type Lease } from "./db.ts";

// Every statement here is one fenced write (spec: Complete, Fail, Snooze,
// Cancel), with the guard of db.ts `fencedBatch`: id, version, owner and state
// 'running' must all match. A row that fails the guard is not changed and not
// returned; callers compare what came back with what they sent and report the
// rest as stale.

export interface Completion extends Lease {
  result?: JsonValue;
}

/** Marks leased jobs completed in one statement: the completer's batch and the guarded transaction's first statement. */
export async function completeJobs(
  db: Db,
  owner: string,
  items: Completion[],
): Promise<Set<string>> {
  if (items.length === 0) return new Set();
  const rows = await db`${completion(db, owner, items)} returning j.id`;
  return new Set(rows.map((r) => String(r.id)));
}

/**
 * The fenced completion both completeJobs and completeJobsIdempotent send.
 * Unless `durable`, its transaction commits with synchronous_commit off
 * (set_config with is_local: for this statement's own transaction only, so
 * nothing after it on the connection runs that way).
 */
function completion(db: Db, owner: string, items: Completion[], durable = true) {
  return db`
    update conveyor_jobs j
       set state = 'completed', result = t.result, finalized_at = now(), lease_expires_at = null
      from ${fencedBatch(db, owner, items, [{ name: "result", type: "jsonb", value: (i) => i.result }])}
           ${durable ? db`` : db`, (select set_config('synchronous_commit', 'off', true)) as lazy_commit`}
     where j.id = t.id and j.lease_version = t.version
       and j.lease_owner = t.owner and j.state = t.state`;
}

/**
 * The completer's write: completeJobs's statement without its rows. Returns
 * the ids of these leases whose job is completed under that very lease once
 * the write is done, by it or by an earlier write of this owner: a retry
 * after an unknown outcome, or a ctx.transaction() that committed the job
 * before its reply was lost. Safe for plain completions only, whose write
 * is the state and the result: counting an earlier commit as done lets
 * nothing commit twice. Never for the first statement of an effect's
 * transaction (completeJobs), where it would let the effect run again.
 *
 * The statement returns its count: when the guard passed every row, as it
 * nearly always does, the batch is the answer. Else selectCompletedBy tells
 * which; a job this statement completed reads so unless someone changed it
 * in the instant between (an operator's retry, say), when it is reported a
 * lost lease, its state right either way.
 *
 * `returning j.id` sent back a row per job: in a fetch-and-complete loop of
 * 100,000 jobs on PostgreSQL 18 (2 loops, batches of 1,000, 4 alternating
 * rounds, 2 cores, fsync on) dropping it took the server's CPU per job from
 * 25.0-29.6 to 23.2-25.7 µs and the loop's from 3.6-4.0 to 3.2-3.6 µs.
 * Returning only the rejected ids, by an anti-join of the batch against the
 * updated rows in a CTE, cost the server more than the rows did.
 *
 * Unless `durable`, the write commits without waiting for its WAL flush
 * (synchronous_commit off for its own transaction; PostgreSQL flushes it
 * within three wal_writer_delay, 0.6 s by default, or with the next commit
 * that waits). A plain completion is a state and a result, no effect of the
 * job's: what a Postgres crash in that moment can undo is the completion
 * alone, and the job, back to 'running' under the lease it had, runs again
 * once the lease expires (at least once, as after a worker crash before its
 * completion). The WAL is flushed in order: a later commit that waits for
 * its flush (one that read the completed row, say) makes this one durable
 * too. A job on its last attempt is then discarded by the reaper, as after
 * a worker crash. The effect transaction (completeJobs), the fetch (its
 * token must never be issued twice), fail, snooze and the hand-off's insert
 * all wait for theirs.
 *
 * Durable by default. Not waiting was meant for the 1,000/s latency
 * cells, where a completion commits a moment after each job starts and the
 * next enqueue's commit could wait behind its flush. `bench/stalls-ab.ts
 * --patch bench/experiments/lazy-completion.patch --variants bare,handoff
 * --pairs 12` (results/stalls-2026-12-07-lazy-completion.json, 2 cores,
 * fsync on) put enqueue-to-start p50 at 0.775 -> 0.665 ms (lower in 8 of 12
 * pairs), but the bench's own latency cells did not follow: `bench/ab.ts
 * --phase latency --base de346fd --head 8943979 --rounds 10`
 * (results/ab-2026-12-07-lazy-completion-latency.json), lazy against
 * durable, 1,000/s p50 median difference +0.012 ms (lower in 5 of 10
 * rounds), and 100/s p50 +0.206 ms (higher in 9 of 10). A weaker
 * completion for no measured gain is not the default.
 */
export async function completeJobsIdempotent(
  db: Db,
  owner: string,
  items: Completion[],
  durable = true,
): Promise<Set<string>> {
  if (items.length === 0) return new Set();
  const { count } = await completion(db, owner, items, durable);
  if (count === items.length) return new Set(items.map((i) => i.id));
  return selectCompletedBy(db, owner, items);
}

export interface Failure extends Lease {
  error: AttemptError;
  /** Delay before the retry, computed by the caller's backoff policy. */
  retryDelayMs: number;
  /** Skip remaining attempts (the handler said the error is permanent). */
  discard?: boolean;
}

/**
 * Records a failed attempt: back to 'available' at now() + delay while
 * attempts remain, else 'discarded'. Returns the new state per job id.
 */
export async function failJobs(
  db: Db,
  owner: string,
  items: Failure[],
): Promise<Map<string, JobState>> {
  if (items.length === 0) return new Map();
  const rows = await db`
    update conveyor_jobs j
       set state = case when t.discard or j.attempts >= j.max_attempts
                        then 'discarded' else 'available' end::conveyor_job_state,
           run_at = case when t.discard or j.attempts >= j.max_attempts then j.run_at
                         else now() + t.delay_ms * interval '1 millisecond' end,
           finalized_at = case when t.discard or j.attempts >= j.max_attempts then now() end,
           errors = j.errors || jsonb_build_array(t.error),
           lease_expires_at = null
      from ${fencedBatch(db, owner, items, [
        { name: "error", type: "jsonb", value: (f) => f.error },
        { name: "delay_ms", type: "float8", value: (f) => f.retryDelayMs },
        { name: "discard", type: "boolean", value: (f) => f.discard === true },
      ])}
     where j.id = t.id and j.lease_version = t.version
       and j.lease_owner = t.owner and j.state = t.state
    returning j.id, j.state`;
  return new Map(rows.map((r) => [String(r.id), r.state as JobState]));
}

export interface Snooze extends Lease {
  delayMs: number;
}

/**
 * Puts jobs back to run after a delay without spending an attempt: like River
 * and Oban, max_attempts grows by one so `attempts` still counts real runs.
 */
export async function snoozeJobs(db: Db, owner: string, items: Snooze[]): Promise<Set<string>> {
  if (items.length === 0) return new Set();
  const rows = await db`
    update conveyor_jobs j
       set state = 'available', run_at = now() + t.delay_ms * interval '1 millisecond',
           max_attempts = j.max_attempts + 1, lease_expires_at = null
      from ${fencedBatch(db, owner, items, [
        { name: "delay_ms", type: "float8", value: (s) => s.delayMs },
      ])}
     where j.id = t.id and j.lease_version = t.version
       and j.lease_owner = t.owner and j.state = t.state
    returning j.id`;
  return new Set(rows.map((r) => String(r.id)));
}

export interface Cancellation extends Lease {
  error: AttemptError;
}

/** A handler cancelled its own job: finalized as 'cancelled' with the reason recorded. */
export async function cancelLeasedJobs(
  db: Db,
  owner: string,
  items: Cancellation[],
): Promise<Set<string>> {
  if (items.length === 0) return new Set();
  const rows = await db`
    update conveyor_jobs j
       set state = 'cancelled', finalized_at = now(), lease_expires_at = null,
           errors = j.errors || jsonb_build_array(t.error)
      from ${fencedBatch(db, owner, items, [{ name: "error", type: "jsonb", value: (c) => c.error }])}
     where j.id = t.id and j.lease_version = t.version
       and j.lease_owner = t.owner and j.state = t.state
    returning j.id`;
  return new Set(rows.map((r) => String(r.id)));
}

/**
 * Stores results inside the guarded transaction, after completeJobs has
 * locked and fenced the rows; needs no guard of its own for that reason.
 * Returns the ids it wrote.
 */
export async function setResultsLocked(
  db: Db,
  items: { id: string; result: JsonValue }[],
): Promise<Set<string>> {
  if (items.length === 0) return new Set();
  const rows = await db`
    update conveyor_jobs j set result = t.result
      from (select * from jsonb_to_recordset(${JSON.stringify(items)}::text::jsonb)
              as r(id bigint, result jsonb)
             limit ${items.length}) t
     where j.id = t.id
    returning j.id`;
  return new Set(rows.map((r) => String(r.id)));
}

/**
 * Of these leases, the ones whose job this owner completed under that very
 * token. After a write whose outcome is unknown (the connection dropped during
 * COMMIT), a retry matches 0 rows both when the first try committed and when
 * the lease was lost; this tells the two apart. Found by the model check
 * (spec/README.md): without it a committed completion was reported as stale.
 */
export async function selectCompletedBy(
  db: Db,
  owner: string,
  leases: Lease[],
): Promise<Set<string>> {
  if (leases.length === 0) return new Set();
  const rows = await db`
    select j.id from ${fencedBatch(db, owner, leases)}
      join conveyor_jobs j on j.id = t.id and j.lease_version = t.version
     where j.lease_owner = t.owner and j.state = 'completed'`;
  return new Set(rows.map((r) => String(r.id)));
}

/**
 * Whether this attempt error is in the job's errors. A fail or cancel write
 * appends exactly one such object, unique by its attempt and time, so after a
 * retry matched 0 rows, an earlier try committed (its reply lost) exactly
 * when its error is there: whatever happened to the job since.
 */
export async function errorRecorded(db: Db, id: string, error: AttemptError): Promise<boolean> {
  const rows = await db`
    select 1 from conveyor_jobs
     where id = ${id} and errors @> jsonb_build_array(${JSON.stringify(error)}::text::jsonb)`;
  return rows.length > 0;
}

/**
 * Whether an earlier try of a snooze committed, after a retry matched 0 rows.
 * The lease (id, version) is over: the job is no longer 'running' under it,
 * or was leased again since (a higher version). A lease ends without its
 * holder's write only when the reaper takes it, and the reaper records a
 * LeaseExpired error for that attempt (attempts and version both grow by one
 * per lease); a snooze records none. So the snooze committed exactly when the
 * lease is over and no such error is there.
 */
export async function snoozed(db: Db, lease: Lease, attempt: number): Promise<boolean> {
  const rows = await db`
    select 1 from conveyor_jobs j
     where j.id = ${lease.id}
       and (j.lease_version > ${lease.version}
            or (j.lease_version = ${lease.version} and j.state <> 'running'))
       and not j.errors @> jsonb_build_array(
             jsonb_build_object('attempt', ${attempt}::int, 'name', 'LeaseExpired'))`;
  return rows.length > 0;
}

/**
 * Locks the rows of leases this owner still holds (FOR UPDATE) and returns
 * their ids: the fence of a shared effect transaction, taken before any
 * handler's effect runs. Once locked, nobody else can change the rows until
 * the transaction ends (the reaper and dequeue skip locked rows), so the
 * completion written at its end is still guarded and still matches.
 */
export async function lockLeasedJobs(db: Db, owner: string, leases: Lease[]): Promise<Set<string>> {
  if (leases.length === 0) return new Set();
  const rows = await db`
    select j.id from ${fencedBatch(db, owner, leases)}
      join conveyor_jobs j
        on j.id = t.id and j.lease_version = t.version
       and j.lease_owner = t.owner and j.state = t.state
       for update of j`;
  return new Set(rows.map((r) => String(r.id)));
}
