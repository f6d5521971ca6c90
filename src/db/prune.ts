import type { JobState } from "../job.ts";
import type { Db } from "./db.ts";

export type FinalState = Extract<JobState, "completed" | "cancelled" | "discarded">;

/**
 * Deletes up to `limit` jobs that reached `state` more than `olderThanMs` ago
 * (spec: not modelled; finished jobs take no part in the lease protocol).
 * Reads conveyor_jobs_state_finalized_idx from its oldest end, so each batch
 * costs O(limit) however large the history. Deleting frees the job's
 * idempotency key: a retention shorter than a client's retry window would
 * let a late retry enqueue the job again.
 */
export async function pruneFinishedJobs(
  db: Db,
  opts: { state: FinalState; olderThanMs: number; limit: number; now?: Date | undefined },
): Promise<number> {
  const now = opts.now ?? null;
  const rows = await db`
    with old as (
      select id from conveyor_jobs
       where state = ${opts.state}::conveyor_job_state and finalized_at is not null
         and finalized_at < coalesce(${now}::timestamptz, now()) - ${opts.olderThanMs}::float8 * interval '1 millisecond'
       order by finalized_at
       limit ${opts.limit}
       for update skip locked
    )
    delete from conveyor_jobs j using old where j.id = old.id
    returning j.id`;
  return rows.length;
}
