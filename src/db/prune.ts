import type { JobState } from "../job.ts";
import type { Db } from "./db.ts";

export type FinalState = Extract<JobState, "completed" | "cancelled" | "discarded">;

/** Rows of the primary key one statement of the completed walk reads. */
export const PRUNE_SCAN_ROWS = 5_000;

export interface PruneOptions {
  state: FinalState;
  olderThanMs: number;
  /** At most this many jobs deleted by one call. */
  limit: number;
  /** The clock the retention counts back from (tests); the database's now() by default. */
  now?: Date | undefined;
  /** Rows per step of the completed walk; PRUNE_SCAN_ROWS by default. */
  scanRows?: number;
}

/**
 * Deletes up to `limit` jobs that reached `state` more than `olderThanMs` ago
 * (spec: not modelled; finished jobs take no part in the lease protocol).
 * Deleting frees the job's idempotency key: a retention shorter than a
 * client's retry window would let a late retry enqueue the job again.
 *
 * Cancelled and discarded jobs are read from conveyor_jobs_final_rare_idx,
 * oldest first, so a batch costs O(limit) however large the history.
 * Completed jobs have no index of their own (migration 0004: it cost every
 * completion an index entry); see pruneCompleted.
 */
export async function pruneFinishedJobs(db: Db, opts: PruneOptions): Promise<number> {
  if (opts.state === "completed") return pruneCompleted(db, opts);
  const now = opts.now ?? null;
  // The state as a literal, not a parameter: only then can the planner prove
  // that the rare states' partial index covers the query, in every plan.
  const state = opts.state === "cancelled" ? db`'cancelled'` : db`'discarded'`;
  const rows = await db`
    with old as (
      select id from conveyor_jobs
       where state = ${state} and finalized_at is not null
         and finalized_at < coalesce(${now}::timestamptz, now()) - ${opts.olderThanMs}::float8 * interval '1 millisecond'
       order by finalized_at
       limit ${opts.limit}
       for update skip locked
    )
    delete from conveyor_jobs j using old where j.id = old.id
    returning j.id`;
  return rows.length;
}

/**
 * Completed jobs, found by walking the primary key from the oldest id in
 * steps of `scanRows`, each step one statement. A job is finalized after it
 * is created, and ids grow with creation, so the walk ends at the first step
 * that reaches a job created after the cutoff: nothing much further can be
 * old enough. (A job whose transaction began before the cutoff but took its
 * id after such a job's is found by a later run, once the cutoff has passed
 * that job too.)
 *
 * The cost of a walk is the rows before the cutoff: the old completed jobs
 * it deletes, plus the old rows it must leave (discarded jobs kept longer,
 * jobs scheduled far ahead, running ones), which every walk reads again.
 * Each delete re-checks state and age on the row it deletes, so a job
 * retried in the meantime stays.
 */
async function pruneCompleted(db: Db, opts: PruneOptions): Promise<number> {
  return (await pruneCompletedFrom(db, "0", opts)).deleted;
}

/**
 * One call of the completed walk from id `after` (exclusive): deletes up to
 * `limit` jobs and returns where the next call goes on, or null where the
 * walk is over. The pruner carries `next` from call to call, so that its
 * batches do not each walk again over the rows the ones before deleted
 * (dead until vacuumed).
 */
export async function pruneCompletedFrom(
  db: Db,
  after: string,
  opts: Omit<PruneOptions, "state">,
): Promise<{ deleted: number; next: string | null }> {
  const now = opts.now ?? null;
  const scanRows = opts.scanRows ?? PRUNE_SCAN_ROWS;
  if (opts.limit <= 0) return { deleted: 0, next: after };
  let deleted = 0;
  let from = after;
  for (;;) {
    const room = opts.limit - deleted;
    const [r] = await db`
      with c as (
        select coalesce(${now}::timestamptz, now()) - ${opts.olderThanMs}::float8 * interval '1 millisecond' as cutoff
      ), scan as materialized (
        select id, state, finalized_at, created_at from conveyor_jobs
         where id > ${from}::bigint
         order by id
         limit ${scanRows}
      ), old as materialized (
        select s.id from scan s, c
         where s.state = 'completed' and s.finalized_at < c.cutoff
         order by s.id
         limit ${room}
      ), gone as (
        delete from conveyor_jobs j using old, c
         where j.id = old.id and j.state = 'completed' and j.finalized_at < c.cutoff
        returning j.id
      )
      select (select count(*) from gone)::int as deleted,
             (select count(*) from scan)::int as scanned,
             (select count(*) from old)::int as taken,
             (select max(id) from old)::text as last_taken,
             (select max(id) from scan)::text as last,
             coalesce((select bool_or(s.created_at >= c.cutoff) from scan s, c), false) as reached`;
    if (!r) return { deleted, next: null };
    deleted += Number(r.deleted);
    // Stopped by the limit inside this step: the rest of it comes next call.
    if (Number(r.taken) === room && room > 0) return { deleted, next: String(r.last_taken) };
    if (r.reached || Number(r.scanned) < scanRows || r.last === null) {
      return { deleted, next: null };
    }
    from = String(r.last);
  }
}
