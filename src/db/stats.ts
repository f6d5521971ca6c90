import type { Db } from "./db.ts";

// Planner statistics of conveyor_jobs while it is small (spec: not modelled;
// no job's state changes here).
//
// Postgres caches a connection's plan for a statement from its sixth run. A
// statement first planned while the table held a handful of rows can keep
// its sequential scan as the table grows, until something invalidates the
// plan: on a new installation, autovacuum's first ANALYZE, which can take a
// minute or more (autovacuum_naptime). In a run of 1,000 one-job enqueues a
// second on a new database, completions (whose batch was then a jsonb
// document) scanned the whole table: 1,373 scans read 3.1 million rows for
// 5,000 jobs, about 1 ms per completion statement where a primary-key probe
// takes 0.15 ms. Fenced writes now unnest arrays and are planned as probes
// even so; a jsonb batch (setResultsLocked) still scans. ANALYZE invalidates
// every connection's plans for the table and gives the planner its size;
// with statistics of a few thousand rows the cached plans probe the primary
// key (test/reaper.test.ts).

/** Statistics of at least this many rows are left to autovacuum. */
export const STATS_SMALL_ROWS = 10_000;
/** Below this many rows a scan costs about what a probe does. */
export const STATS_MIN_ROWS = 1_000;

/**
 * Analyzes conveyor_jobs when its statistics describe a small table (fewer
 * than STATS_SMALL_ROWS rows, or none yet) and it now holds at least twice as
 * many live rows (and STATS_MIN_ROWS): a few ANALYZEs of a small table while
 * a new one grows, none once it is large. Does nothing for a role that may
 * not analyze the table (not a member of its owner's role): Postgres would
 * only warn and skip. Returns whether it analyzed.
 */
export async function analyzeIfOutgrown(db: Db): Promise<boolean> {
  const [row] = await db`
    select c.reltuples::float8 as analyzed, s.n_live_tup::float8 as live,
           pg_has_role(c.relowner, 'USAGE') as may
      from pg_class c join pg_stat_user_tables s on s.relid = c.oid
     where c.oid = to_regclass('conveyor_jobs')`;
  if (!row?.may) return false;
  // reltuples is -1 before the first ANALYZE or VACUUM.
  const analyzed = Math.max(Number(row.analyzed), 0);
  if (analyzed >= STATS_SMALL_ROWS) return false;
  if (Number(row.live) < Math.max(STATS_MIN_ROWS, 2 * analyzed)) return false;
  await db`analyze conveyor_jobs`;
  return true;
}
