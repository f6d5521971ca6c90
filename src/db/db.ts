import type postgres from "postgres";

/** A postgres.js pool or a transaction on it: every statement accepts either. */
// biome-ignore lint/suspicious/noExplicitAny: postgres.js's custom-type parameter is irrelevant here.
export type Db = postgres.Sql<any> | postgres.TransactionSql<any>;
// biome-ignore lint/suspicious/noExplicitAny: as above.
export type Pool = postgres.Sql<any>;

/** A lease as the worker holds it: the job and the fencing token it was issued. */
export interface Lease {
  id: string;
  version: number;
}

/**
 * The batch parameter of a fenced write: each row carries the guard's values
 * (owner, and state 'running') beside its id and version, so the guard is
 *
 *   j.id = t.id and j.lease_version = t.version
 *   and j.lease_owner = t.owner and j.state = t.state
 *
 * Written as constants (`j.state = 'running'`), the planner estimated from
 * stale statistics that almost no row was running, scanned conveyor_jobs
 * first and joined the batch in a nested loop: 7.9 ms for 200 completions.
 * As join conditions they cannot shrink the table's estimate, so on a large
 * table the plan is the batch driving primary-key probes: 2.7 ms (on a small
 * one, see fencedBatch). The row check is the
 * same, and Postgres re-checks all of it on the newest row version when a
 * concurrent transaction changed the row (EvalPlanQual).
 */
function fenced<T extends Lease>(owner: string, items: T[]): string {
  // Rows are locked in the order the batch lists them (the batch drives the
  // join). Sorted by id, two batches of one worker — a heartbeat and a
  // completion, say — lock common rows in one order and cannot deadlock.
  const sorted = [...items].sort((a, b) =>
    a.id.length !== b.id.length
      ? a.id.length - b.id.length
      : a.id < b.id
        ? -1
        : a.id > b.id
          ? 1
          : 0,
  );
  return JSON.stringify(sorted.map((i) => ({ ...i, owner, state: "running" })));
}

/**
 * The batch of a fenced write as the row source `t`: id, version, owner,
 * state, then `columns` (a fragment such as db`, result jsonb`), read from
 * the one jsonb parameter of `fenced`.
 *
 * Wrapped in LIMIT with the batch's size so that the planner knows how many
 * rows it joins: jsonb_to_recordset is always estimated at 100, and against
 * that a hash join over a sequential scan of conveyor_jobs looked cheaper
 * than primary-key probes until the table held some 20,000 rows. Every
 * completion and heartbeat then read the whole table: at 1,000 one-job
 * enqueues a second on a fresh table, 2,714 scans read 7.2 million rows in a
 * 5,500-job run (pg_stat_user_tables), and one completion on 5,000 rows took
 * 0.8-1.0 ms instead of 0.02-0.04 ms (EXPLAIN ANALYZE). With the LIMIT the
 * plan is the probes (test/plans.test.ts).
 *
 * Not covered: a connection that caches a generic plan (from its sixth run
 * of a statement) while the table is nearly empty keeps its scan as the table
 * grows, until autovacuum's ANALYZE invalidates it (docs/runbook.md).
 */
export function fencedBatch<T extends Lease>(
  db: Db,
  owner: string,
  items: T[],
  columns?: postgres.PendingQuery<postgres.Row[]>,
) {
  return db`(select * from jsonb_to_recordset(${fenced(owner, items)}::text::jsonb)
               as r(id bigint, version bigint, owner text, state conveyor_job_state${columns ?? db``})
              limit ${items.length}) t`;
}
