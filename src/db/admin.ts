// Operator statements behind the HTTP API: read, list, cancel and retry jobs;
// pause and resume queues; count jobs per queue. None of them touches a lease:
// a running job is never changed here (the worker holding it owns it), which
// is why cancel and retry exclude 'running' in their WHERE clauses rather than
// checking first and writing second.
import type { JobRow, JobState } from "../job.ts";
import type { Db } from "./db.ts";

export async function selectJobsById(db: Db, ids: string[]): Promise<JobRow[]> {
  if (ids.length === 0) return [];
  return (await db`
    select * from conveyor_jobs where id = any(${ids}::bigint[])`) as unknown as JobRow[];
}

export interface JobFilter {
  queue?: string | undefined;
  state?: JobState | undefined;
  kind?: string | undefined;
  /** Keyset cursor: only ids below this one. */
  beforeId?: string | undefined;
  limit: number;
}

const FINAL: ReadonlySet<JobState> = new Set(["completed", "cancelled", "discarded"]);

/**
 * One page of jobs, newest id first. Keyset pagination on the primary key, so
 * page N costs the same as page 1: the planner walks the primary key backwards
 * and stops after `limit` matches, or, for a rare state, reads that state's
 * partial index and sorts. Final states always have finalized_at set; saying
 * so lets the planner use conveyor_jobs_state_finalized_idx (measured on 330k
 * rows: 50 discarded jobs listed in 0.1 ms instead of a 105 ms seq scan).
 * A filter on a queue that is rare among millions of rows has no index of its
 * own (there is no (queue, state, id) index) and can scan far.
 */
export async function listJobs(db: Db, f: JobFilter): Promise<JobRow[]> {
  return (await db`
    select * from conveyor_jobs
     where true
       ${f.beforeId === undefined ? db`` : db`and id < ${f.beforeId}::bigint`}
       ${f.queue === undefined ? db`` : db`and queue = ${f.queue}`}
       ${f.state === undefined ? db`` : db`and state = ${f.state}::conveyor_job_state`}
       ${f.state !== undefined && FINAL.has(f.state) ? db`and finalized_at is not null` : db``}
       ${f.kind === undefined ? db`` : db`and kind = ${f.kind}`}
     order by id desc
     limit ${f.limit}`) as unknown as JobRow[];
}

/**
 * Cancels jobs that no worker holds (pending or available, which includes
 * scheduled and retrying ones), recording the reason as the last attempt
 * error. Running and finished jobs are left alone and absent from the result.
 * A dequeue racing with this waits on the row lock and the loser re-checks
 * the state, so a job is either cancelled here or leased, never both.
 */
export async function cancelJobs(db: Db, ids: string[], reason: string): Promise<JobRow[]> {
  if (ids.length === 0) return [];
  return (await db`
    update conveyor_jobs
       set state = 'cancelled', finalized_at = now(),
           errors = errors || jsonb_build_array(jsonb_build_object(
             'attempt', attempts, 'at', now(), 'name', 'Cancelled', 'message', ${reason}::text))
     where id = any(${ids}::bigint[]) and state in ('pending', 'available')
    returning *`) as unknown as JobRow[];
}

/**
 * Makes jobs run again as River's JobRetry does: finished jobs (completed,
 * cancelled, discarded) go back to 'available' now with one more attempt
 * allowed if they had used them all; an available (possibly scheduled) job
 * is moved up to now. Attempts and the error history are kept; a completed
 * job's result is cleared, since the job is no longer complete. Running and
 * pending jobs are left alone and absent from the result.
 */
export async function retryJobs(db: Db, ids: string[]): Promise<JobRow[]> {
  if (ids.length === 0) return [];
  return (await db`
    update conveyor_jobs
       set run_at = case when state = 'available' then least(run_at, now()) else now() end,
           max_attempts = greatest(max_attempts, attempts + 1),
           result = case when state = 'completed' then null else result end,
           state = 'available', finalized_at = null
     where id = any(${ids}::bigint[])
       and state in ('available', 'completed', 'cancelled', 'discarded')
    returning *`) as unknown as JobRow[];
}

export interface QueueRow {
  name: string;
  paused: boolean;
  created_at: Date;
  updated_at: Date;
}

/** Pauses or resumes queues, creating their conveyor_queues rows as needed. */
export async function setQueuesPaused(
  db: Db,
  names: string[],
  paused: boolean,
): Promise<QueueRow[]> {
  if (names.length === 0) return [];
  return (await db`
    insert into conveyor_queues (name, paused)
    select n, ${paused} from unnest(${names}::text[]) as n
    on conflict (name) do update set paused = excluded.paused, updated_at = now()
    returning name, paused, created_at, updated_at`) as unknown as QueueRow[];
}

export async function selectQueues(db: Db): Promise<QueueRow[]> {
  return (await db`
    select name, paused, created_at, updated_at from conveyor_queues
     order by name`) as unknown as QueueRow[];
}

export interface LiveCountRow {
  queue: string;
  available: number;
  scheduled: number;
  running: number;
}

/**
 * Exact counts of the states a worker acts on, per queue. Each half reads only
 * its partial index: 'available' through conveyor_jobs_dequeue_idx, 'running'
 * through conveyor_jobs_lease_expiry_idx, which holds at most the workers'
 * total concurrency. Finished rows are never visited, so the cost follows the
 * backlog, not the table (measured: 30k available among 330k rows, 17 ms).
 * 'pending' has no index, so counting it would scan the table; it is left
 * out until workflows give it one.
 */
export async function countLiveJobsByQueue(db: Db): Promise<LiveCountRow[]> {
  return (await db`
    select queue, sum(available)::int as available, sum(scheduled)::int as scheduled,
           sum(running)::int as running
      from (
        select queue, count(*) filter (where run_at <= now()) as available,
               count(*) filter (where run_at > now()) as scheduled, 0 as running
          from conveyor_jobs where state = 'available' group by queue
        union all
        select queue, 0, 0, count(*) from conveyor_jobs where state = 'running' group by queue
      ) c
     group by queue`) as unknown as LiveCountRow[];
}

export interface FinalCountRow {
  queue: string;
  state: "completed" | "cancelled" | "discarded";
  n: number;
}

/**
 * Counts finished jobs per queue among the `window` most recently finalized
 * jobs of each final state. Each branch is a backward scan of
 * conveyor_jobs_state_finalized_idx that stops after `window` entries, so the
 * cost is bounded however many finished rows the table keeps (measured with
 * window 10,000 over 300k completed rows: 10 ms). An exact count
 * per queue would need an index on (queue, state) that every write would pay
 * for; when a state's total reaches `window` the caller reports that state's
 * counts as lower bounds.
 */
export async function countRecentFinalJobsByQueue(
  db: Db,
  window: number,
): Promise<FinalCountRow[]> {
  return (await db`
    select queue, state::text as state, count(*)::int as n
      from (
        (select queue, state from conveyor_jobs
          where state = 'completed' and finalized_at is not null
          order by finalized_at desc limit ${window})
        union all
        (select queue, state from conveyor_jobs
          where state = 'cancelled' and finalized_at is not null
          order by finalized_at desc limit ${window})
        union all
        (select queue, state from conveyor_jobs
          where state = 'discarded' and finalized_at is not null
          order by finalized_at desc limit ${window})
      ) f
     group by queue, state`) as unknown as FinalCountRow[];
}

/** Readiness probe: one round trip. */
export async function ping(db: Db): Promise<void> {
  await db`select 1`;
}
