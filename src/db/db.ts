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
 * The batch of a fenced write is a row source `t` of id, version, owner and
 * state ('running') beside any extra columns, so the guard is
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
export interface BatchColumn<T> {
  name: string;
  type: "jsonb" | "float8" | "boolean";
  /** undefined and null are SQL NULL. */
  value: (item: T) => unknown;
}

/**
 * Rows are locked in the order the batch lists them (the batch drives the
 * join). Sorted by id, two batches of one worker (a heartbeat and a
 * completion, say) lock common rows in one order and cannot deadlock.
 */
function byId<T extends Lease>(items: T[]): T[] {
  return [...items].sort((a, b) =>
    a.id.length !== b.id.length
      ? a.id.length - b.id.length
      : a.id < b.id
        ? -1
        : a.id > b.id
          ? 1
          : 0,
  );
}

function columnValues<T>(c: BatchColumn<T>, items: T[]): (string | null)[] | undefined {
  let any = false;
  const values = items.map((item) => {
    const v = c.value(item);
    if (v === undefined || v === null) return null;
    any = true;
    return c.type === "jsonb" ? JSON.stringify(v) : String(v);
  });
  return any ? values : undefined;
}

/**
 * The batch of a fenced write as the row source `t`: id, version, owner,
 * state, then `columns`, each column one array parameter, unnested together
 * ('running' and the owner repeated by the server, not sent per row).
 *
 * Typed arrays instead of one jsonb document of objects (as before) cost the
 * server less per row: it no longer parses every row's keys and the owner
 * string, nor converts each field from jsonb. In a bare fetch-and-complete
 * loop of 100,000 jobs (2 loops, batches of 1,000, 4 interleaved rounds on
 * 2 cores, fsync on) the cluster's CPU per job went from 27.1-29.4 to
 * 24.2-25.6 µs and the loop's own from 5.9-7.5 to 5.2-6.0 µs.
 *
 * Ids and versions go as array literals made by one join: they are digits,
 * which need no quoting, where postgres.js's array parameter quotes and
 * escapes every element with two regular expressions, and the server casts
 * the literal to bigint[] at once instead of through text[]. A column with
 * no value in the batch (the result of most completions) is nulls the
 * server makes itself. In a fetch-and-complete loop of 100,000 jobs on
 * PostgreSQL 18 (2 loops, batches of 1,000, 4 alternating rounds, 2 cores,
 * fsync on) the loop's CPU per job went from 3.2-4.0 to 2.8-3.1 µs and the
 * server's from 24.4-29.4 to 22.1-25.7 µs.
 *
 * Wrapped in LIMIT so that the planner does not take its fixed guess for a
 * set-returning function over a parameter. Against that guess a hash join
 * over a sequential scan of conveyor_jobs looked cheaper than primary-key
 * probes until the table held some 20,000 rows. Every completion and
 * heartbeat then read the whole table: at 1,000 one-job enqueues a second on
 * a fresh table, 2,714 scans read 7.2 million rows in a 5,500-job run
 * (pg_stat_user_tables), and one completion on 5,000 rows took 0.8-1.0 ms
 * instead of 0.02-0.04 ms (EXPLAIN ANALYZE). With the LIMIT the plan is the
 * probes (test/plans.test.ts).
 *
 * The LIMIT's count is a scalar subquery, which the planner cannot read, so
 * it guesses a tenth of the batch. With the whole count in sight, a batch of
 * thousands priced as probes (about 8 cost units each) above a hash join
 * over a sequential scan of the table, up to some 250,000 rows by the
 * planner's own costs, or above a merge join that walks the primary key
 * from its first entry to the batch's last. Either can read the whole table.
 * In a 100,000-job drain in batches of 2,000 (auto_explain with analyze),
 * completions took those plans until their connection cached a generic
 * plan: 45-95 ms each, against 9-20 ms as probes. With a tenth, a batch of
 * one job is still probes, and a scan wins only on tables of under about
 * twelve rows per job of the batch, near where a scan of cached rows does
 * beat the probes.
 *
 * A generic plan a connection caches (from a statement's sixth run) while
 * the table is nearly empty probes the primary key too, once the table has
 * grown (test/reaper.test.ts); the jsonb document this replaced was planned
 * as a scan there, kept until an ANALYZE (src/db/stats.ts, docs/runbook.md).
 */
export function fencedBatch<T extends Lease>(
  db: Db,
  owner: string,
  items: T[],
  columns: BatchColumn<T>[] = [],
) {
  const sorted = byId(items);
  const n = sorted.length;
  let arrays = db``;
  let names = db``;
  for (const c of columns) {
    const values = columnValues(c, sorted);
    const typed =
      values === undefined
        ? db`array_fill(null::${db.unsafe(c.type)}, array[${n}::int])`
        : c.type === "jsonb"
          ? db`${values}::text[]::jsonb[]`
          : c.type === "float8"
            ? db`${values}::text[]::float8[]`
            : db`${values}::text[]::boolean[]`;
    arrays = db`${arrays}, ${typed}`;
    names = db`${names}, ${db(c.name)}`;
  }
  // Anything but digits (a caller's bug) fails the cast on the server.
  const ids = `{${sorted.map((i) => i.id).join(",")}}`;
  const versions = `{${sorted.map((i) => i.version).join(",")}}`;
  return db`(select * from unnest(${ids}::bigint[], ${versions}::bigint[],
                                  array_fill(${owner}::text, array[${n}::int]),
                                  array_fill('running'::conveyor_job_state, array[${n}::int])${arrays})
               as r(id, version, owner, state${names})
              limit (select ${n}::int)) t`;
}

/** Errors that mean "the server is not reachable now", worth waiting out. */
export function isConnectionError(error: unknown): boolean {
  const e = error as { code?: string; errno?: string } | undefined;
  const code = String(e?.code ?? e?.errno ?? "");
  return (
    /^(ECONNREFUSED|ECONNRESET|EPIPE|ETIMEDOUT|EHOSTUNREACH|ENOTFOUND|CONNECTION_|CONNECT_TIMEOUT)/.test(
      code,
    ) ||
    code.startsWith("08") || // connection_exception
    code === "57P01" || // admin_shutdown
    code === "57P02" || // crash_shutdown
    code === "57P03" // cannot_connect_now (starting up, in recovery)
  );
}
