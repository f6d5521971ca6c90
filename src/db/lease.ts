import { type Db, fencedBatch, type Lease } from "./db.ts";

/**
 * Extends the leases this owner still holds (spec: Heartbeat). A lease whose
 * version moved on, whose owner changed, or whose job left 'running' is not
 * extended and its id is absent from the result: the caller aborts that job.
 *
 * Rows locked by another transaction are skipped, not waited for: the lock is
 * this worker's own guarded transaction or outcome write for that job (which
 * the caller knows about and does not report), or the reaper taking a lease
 * that has expired. Waiting would hold every other job's heartbeat behind a
 * long effect transaction until their leases ran out.
 */
export async function extendLeases(
  db: Db,
  owner: string,
  leases: Lease[],
  leaseMs: number,
): Promise<Set<string>> {
  if (leases.length === 0) return new Set();
  const rows = await db`
    with held as (
      select j.id from conveyor_jobs j
        join ${fencedBatch(db, owner, leases)}
          on j.id = t.id and j.lease_version = t.version
         and j.lease_owner = t.owner and j.state = t.state
       for update of j skip locked
    )
    update conveyor_jobs j
       set lease_expires_at = now() + ${leaseMs}::float8 * interval '1 millisecond'
      from held
     where j.id = held.id
    returning j.id`;
  return new Set(rows.map((r) => String(r.id)));
}

/**
 * Gives leases back without counting the attempt (spec: Release), used on
 * shutdown for jobs whose handlers were aborted, so they run again promptly
 * instead of waiting for the reaper. Fenced like every lease write.
 */
export async function releaseJobs(db: Db, owner: string, leases: Lease[]): Promise<Set<string>> {
  if (leases.length === 0) return new Set();
  const rows = await db`
    update conveyor_jobs j
       set state = 'available', attempts = greatest(j.attempts - 1, 0),
           run_at = now(), lease_expires_at = null
      from ${fencedBatch(db, owner, leases)}
     where j.id = t.id and j.lease_version = t.version
       and j.lease_owner = t.owner and j.state = t.state
    returning j.id`;
  return new Set(rows.map((r) => String(r.id)));
}
