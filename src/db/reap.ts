import type { JobState } from "../job.ts";
import type { Db } from "./db.ts";

export interface ReapedJob {
  id: string;
  state: JobState;
  lease_owner: string;
  lease_version: string;
}

/**
 * Takes back leases that expired by Postgres's clock (spec: Reap). The job goes
 * back to 'available' (or 'discarded' when it has no attempts left); the
 * version is left as it is, and the next dequeue issues a higher one, so the
 * old holder's writes all match 0 rows from here on.
 *
 * A job whose guarded completion transaction is open holds its row lock and is
 * skipped; `now` lets tests move the clock instead of sleeping.
 */
export async function reapExpiredLeases(
  db: Db,
  opts: { limit: number; now?: Date | undefined },
): Promise<ReapedJob[]> {
  const now = opts.now ?? null;
  return (await db`
    with expired as (
      select id from conveyor_jobs
       where state = 'running' and lease_expires_at < coalesce(${now}::timestamptz, now())
       order by lease_expires_at
       limit ${opts.limit}
       for update skip locked
    )
    update conveyor_jobs j
       set state = case when j.attempts >= j.max_attempts
                        then 'discarded' else 'available' end::conveyor_job_state,
           run_at = now(),
           finalized_at = case when j.attempts >= j.max_attempts then now() end,
           lease_expires_at = null,
           errors = j.errors || jsonb_build_array(jsonb_build_object(
             'attempt', j.attempts, 'at', now(), 'name', 'LeaseExpired',
             'message', 'lease of ' || j.lease_owner || ' (token ' || j.lease_version
                        || ') expired without a heartbeat'))
      from expired
     where j.id = expired.id
    returning j.id, j.state, j.lease_owner, j.lease_version`) as unknown as ReapedJob[];
}
