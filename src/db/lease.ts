import { type Db, fenced, type Lease } from "./db.ts";

/**
 * Extends the leases this owner still holds (spec: Heartbeat). A lease whose
 * version moved on, whose owner changed, or whose job left 'running' is not
 * extended and its id is absent from the result: the caller aborts that job.
 */
export async function extendLeases(
  db: Db,
  owner: string,
  leases: Lease[],
  leaseMs: number,
): Promise<Set<string>> {
  if (leases.length === 0) return new Set();
  const rows = await db`
    update conveyor_jobs j
       set lease_expires_at = now() + ${leaseMs}::float8 * interval '1 millisecond'
      from jsonb_to_recordset(${fenced(owner, leases)}::text::jsonb) as t(id bigint, version bigint, owner text, state conveyor_job_state)
     where j.id = t.id and j.lease_version = t.version
       and j.lease_owner = t.owner and j.state = t.state
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
      from jsonb_to_recordset(${fenced(owner, leases)}::text::jsonb) as t(id bigint, version bigint, owner text, state conveyor_job_state)
     where j.id = t.id and j.lease_version = t.version
       and j.lease_owner = t.owner and j.state = t.state
    returning j.id`;
  return new Set(rows.map((r) => String(r.id)));
}
