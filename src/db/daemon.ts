// Statements the daemon runs at start, outside any lease.
import type { Db } from "./db.ts";

export interface WaitingJobsRow {
  queue: string;
  kind: string;
  available: number;
}

/**
 * Available jobs this daemon's workers will never fetch: their kind has no
 * handler here, or their queue is not consumed here. Grouped, so one row per
 * (queue, kind); it reads the available-jobs partial index, once per start.
 */
export async function selectUnservedJobs(
  db: Db,
  kinds: string[],
  queues: string[],
  limit = 50,
): Promise<WaitingJobsRow[]> {
  return (await db`
    select queue, kind, count(*)::int as available
      from conveyor_jobs
     where state = 'available'
       and (kind <> all(${kinds}::text[]) or queue <> all(${queues}::text[]))
     group by queue, kind
     order by available desc, queue, kind
     limit ${limit}`) as unknown as WaitingJobsRow[];
}
