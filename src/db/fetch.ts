import type { JobRow } from "../job.ts";
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
 * Leases up to `limit` runnable jobs of one queue in one statement (spec: Dequeue).
 *
 * SKIP LOCKED lets concurrent fetchers take disjoint rows without waiting.
 * Each leased row gets lease_version + 1: the new fencing token. Expiry comes
 * from Postgres's clock, never the worker's. A paused queue yields nothing.
 * The inner select reads only conveyor_jobs_dequeue_idx (state = 'available'),
 * so finished rows do not slow it down.
 */
export async function fetchJobs(db: Db, p: FetchParams): Promise<JobRow[]> {
  return (await db`
    with next as (
      select id from conveyor_jobs
       where state = 'available' and queue = ${p.queue} and run_at <= now()
         and kind = any(${p.kinds}::text[])
         and not exists (select 1 from conveyor_queues q where q.name = ${p.queue} and q.paused)
       order by priority, run_at, id
       limit ${p.limit}
       for update skip locked
    )
    update conveyor_jobs j
       set state = 'running',
           attempts = j.attempts + 1,
           lease_owner = ${p.owner},
           lease_version = j.lease_version + 1,
           lease_expires_at = now() + ${p.leaseMs}::float8 * interval '1 millisecond',
           attempted_at = now()
      from next
     where j.id = next.id
    returning j.*`) as unknown as JobRow[];
}
