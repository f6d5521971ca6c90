// Where PostgreSQL's time per job goes: the bare fetch-and-complete loop of
// bench/systems/bare-sql.ts, on variants of Conveyor's schema and statements
// that each take one thing away, measured side by side in one process
// against one cluster with the bench's settings, in alternating order.
//
//   bun bench/dissect.ts [--sizes 10000,100000] [--rounds 7] [--loops 2]
//                        [--batch 500] [--only v1,v2] [--out FILE]
//
// Writes results/dissect-<date>.json and prints a Markdown table of medians.
//
// The throughput bench compares systems; this one explains the gap between
// Conveyor's own statements and the ceiling (bench/README.md, "Where the
// server's time goes"). Its worker CPU is of one warm process and means
// little; the server's CPU per job is the figure.
//
// Variants (each against a fresh database, N jobs preloaded by one insert):
// - ceiling: the bench's minimal table and statements.
// - conveyor: Conveyor's migrations, fetchJobs and completeJobsIdempotent.
// - no-lease-index / no-finalized-index / no-extra-indexes: Conveyor without
//   the reaper's index, the pruner's and listing's index, or both.
// - minimal-return: Conveyor's fetch returning only id, version and payload.
// - minimal-statements: no extra indexes, the ceiling's statements on
//   Conveyor's table, so what is left against the ceiling is the table.
// - hot-fetch: minimal-return's fetch changing no indexed column, as a
//   visibility-timeout design would (a leased job stays 'available' with a
//   live lease, the dequeue skips it by a heap filter, no reaper index), so
//   its update can be HOT. An experiment: the engine does not work this way.
// - ret-*: Conveyor's fetch update with parts of its return taken away, to
//   split what the return costs the server. ret-full is the whole return, a
//   copy of fetch.ts's: against `conveyor` it shows the noise. ret-one-group
//   drops the grouping by size (one row for the batch); ret-no-rare the
//   keyed aggregate of idempotency keys, tracestates and errors; ret-no-epoch
//   the epoch conversions; ret-none-extra all of these and the traceparents.
//   ret-rows returns a row per job (its numbers packed, the rest as columns)
//   with no CTE; ret-cte-rows the id, version and payload rows of
//   minimal-return, through a CTE as the aggregate's input is.
//
// Every completion's row source has `limit (select n)`, as fencedBatch's
// does: without it the planner may hash the batch against the whole table
// (bench/README.md), which is a plan, not a cost of the schema. Even so, at
// N = 1,000 the ceiling and hot-fetch ran at 150-180 µs of server CPU per
// job in a trial run: sizes below 10,000 measure plans, not storage.
import { writeFileSync } from "node:fs";
import path from "node:path";
import { parseArgs } from "node:util";
import postgres from "postgres";
import { fencedBatch } from "../src/db/db.ts";
import { fetchJobs } from "../src/db/fetch.ts";
import { migrate } from "../src/db/migrate.ts";
import { completeJobsIdempotent } from "../src/db/outcome.ts";
import { positiveInt, positiveInts } from "./lib/args.ts";
import { machine, ROOT, versions } from "./lib/environment.ts";
import { MINIMAL_TABLE_DDL } from "./lib/minimal-table.ts";
import { serverCpu } from "./lib/server-cpu.ts";
import { PG_SETTINGS, startBenchPostgres } from "./lib/services.ts";
import { median, round } from "./lib/stats.ts";

const { values: opt } = parseArgs({
  options: {
    sizes: { type: "string", default: "10000,100000" },
    rounds: { type: "string", default: "7" },
    loops: { type: "string", default: "2" },
    batch: { type: "string", default: "500" },
    only: { type: "string" },
    out: { type: "string" },
  },
});
const SIZES = positiveInts("sizes", String(opt.sizes));
const ROUNDS = positiveInt("rounds", String(opt.rounds));
const LOOPS = positiveInt("loops", String(opt.loops));
const BATCH = positiveInt("batch", String(opt.batch));
const TIME_LIMIT_MS = 120_000;
const QUEUE = "bench";
const KIND = "noop";
const LEASE_MS = 30_000;
const OWNER = `dissect:${process.pid}`;

type Sql = postgres.Sql;
interface Leased {
  id: string;
  version: string;
}
interface Variant {
  table: string;
  setup(sql: Sql, n: number): Promise<void>;
  dequeue(sql: Sql): Promise<Leased[]>;
  complete(sql: Sql, jobs: Leased[]): Promise<number>;
}

async function minimalTable(sql: Sql, n: number) {
  await sql.unsafe(MINIMAL_TABLE_DDL);
  await sql`insert into bench_jobs (queue, kind, payload)
    select ${QUEUE}, ${KIND}, jsonb_build_object('i', g - 1) from generate_series(1, ${n}::int) g`;
}

function conveyorTable(...ddl: string[]) {
  return async (sql: Sql, n: number) => {
    await migrate(sql);
    for (const d of ddl) await sql.unsafe(d);
    await sql`insert into conveyor_jobs (queue, kind, payload)
      select ${QUEUE}, ${KIND}, jsonb_build_object('i', g - 1) from generate_series(1, ${n}::int) g`;
  };
}

const DROP_LEASE_INDEX = "drop index conveyor_jobs_lease_expiry_idx";
const DROP_FINALIZED_INDEX = "drop index conveyor_jobs_state_finalized_idx";

/** State values of a table: the minimal one's smallints or Conveyor's enum. */
interface States {
  available: string;
  running: string;
  completed: string;
}
const MINIMAL: States = { available: "0", running: "1", completed: "2" };
const CONVEYOR: States = {
  available: "'available'",
  running: "'running'",
  completed: "'completed'",
};

/** The locked ids of the next batch, for an update to probe by primary key. */
function nextBatch(sql: Sql, table: string, s: States) {
  return sql`array(
    select id from ${sql(table)}
     where state = ${sql.unsafe(s.available)} and queue = ${QUEUE} and run_at <= now()
     order by priority, run_at, id
     limit ${BATCH}
     for update skip locked)`;
}

/** The ceiling's fetch: state to running, attempts, owner, version, expiry; three columns back. */
function minimalFetch(table: string, s: States) {
  return async (sql: Sql) =>
    (await sql`
      update ${sql(table)} j
         set state = ${sql.unsafe(s.running)}, attempts = j.attempts + 1, lease_owner = ${OWNER},
             lease_version = j.lease_version + 1,
             lease_expires_at = now() + ${LEASE_MS}::float8 * interval '1 millisecond'
       where j.id = any(${nextBatch(sql, table, s)})
      returning j.id, j.lease_version as version, j.payload`) as unknown as Leased[];
}

/** The ceiling's completion, fenced on version, owner and `state`. */
function minimalComplete(table: string, s: States) {
  return async (sql: Sql, jobs: Leased[]) => {
    const r = await sql`
      update ${sql(table)} j
         set state = ${sql.unsafe(s.completed)}, finalized_at = now(), lease_expires_at = null
        from (select * from unnest(${jobs.map((j) => j.id)}::bigint[],
                                   ${jobs.map((j) => j.version)}::bigint[]) as r(id, version)
               limit (select ${jobs.length}::int)) t
       where j.id = t.id and j.lease_version = t.version
         and j.lease_owner = ${OWNER} and j.state = ${sql.unsafe(s.running)}`;
    return r.count;
  };
}

async function conveyorFetch(sql: Sql): Promise<Leased[]> {
  const rows = await fetchJobs(sql, {
    queue: QUEUE,
    owner: OWNER,
    limit: BATCH,
    leaseMs: LEASE_MS,
    kinds: [KIND],
  });
  return rows.map((r) => ({ id: r.id, version: r.lease_version }));
}

async function conveyorComplete(sql: Sql, jobs: Leased[]): Promise<number> {
  const done = await completeJobsIdempotent(
    sql,
    OWNER,
    jobs.map((j) => ({ id: j.id, version: Number(j.version) })),
  );
  return done.size;
}

/**
 * Conveyor's fetch update (fetch.ts) without its `returning`; `state` empty
 * for the hot fetch's, which leaves it, and `live` to skip live leases.
 */
function leaseUpdate(sql: Sql, state: string, live: boolean) {
  return sql`
    update conveyor_jobs j
       set ${state === "" ? sql`` : sql`state = ${sql.unsafe(state)},`}
           attempts = j.attempts + 1,
           lease_owner = ${OWNER},
           lease_version = j.lease_version + 1,
           lease_expires_at = now() + ${LEASE_MS}::float8 * interval '1 millisecond',
           attempted_at = now()
     where j.id = any(array(
       select id from conveyor_jobs
        where state = 'available' and queue = ${QUEUE} and run_at <= now()
          ${live ? sql`and (lease_expires_at is null or lease_expires_at <= now())` : sql``}
          and kind = any(${[KIND]}::text[])
          and not exists (select 1 from conveyor_queues q where q.name = ${QUEUE} and q.paused)
        order by priority, run_at, id
        limit ${BATCH}
        for update skip locked))`;
}

/** Conveyor's fetch update with only id, version and payload back. */
function conveyorUpdate(sql: Sql, state: string, live: boolean) {
  return sql`${leaseUpdate(sql, state, live)} returning j.id, j.lease_version as version, j.payload`;
}

/** fetch.ts's update as it is, without its `returning`: the ret-* variants'. */
const fetchUpdate = (sql: Sql) => leaseUpdate(sql, CONVEYOR.running, false);

/** A completion fenced as Conveyor's, on a job the hot fetch left 'available'. */
async function hotComplete(sql: Sql, jobs: Leased[]): Promise<number> {
  const items = jobs.map((j) => ({ id: j.id, version: Number(j.version) }));
  const r = await sql`
    update conveyor_jobs j
       set state = 'completed', finalized_at = now(), lease_expires_at = null
      from ${fencedBatch(sql, OWNER, items)}
     where j.id = t.id and j.lease_version = t.version and j.lease_owner = t.owner
       and j.state = 'available' and j.lease_expires_at > now()`;
  return r.count;
}

/**
 * A leased job's numbers packed into one text, as fetch.ts packs them; without
 * `epoch`, no run_at or created_at (the ret-no-epoch variant's).
 */
function packedNumbers(sql: Sql, epoch: boolean) {
  const kinds = [KIND];
  return epoch
    ? sql`concat_ws(' ', j.id, j.lease_version, j.priority, j.attempts, j.max_attempts,
          floor(round(date_part('epoch', j.run_at) * 1e6) / 1e3)::int8,
          case when j.created_at <> j.run_at
               then floor(round(date_part('epoch', j.created_at) * 1e6) / 1e3)::int8::text
               else '' end,
          array_position(${kinds}::text[], j.kind))`
    : sql`concat_ws(' ', j.id, j.lease_version, j.priority, j.attempts, j.max_attempts,
          array_position(${kinds}::text[], j.kind))`;
}

/** Conveyor's fetch (fetch.ts) with parts of its return taken away. */
function returnVariant(o: { group: boolean; rare: boolean; epoch: boolean; trace: boolean }) {
  return async (sql: Sql): Promise<Leased[]> => {
    const groups = (await sql`
    with leased as (
      ${fetchUpdate(sql)}
      returning j.id,
                ${packedNumbers(sql, o.epoch)} as n,
                j.payload, j.idempotency_key, j.traceparent, j.tracestate, j.errors)
    select string_agg(n, ' ') as n,
           floor(round(date_part('epoch', now() + ${LEASE_MS}::float8 * interval '1 millisecond')
                       * 1e6) / 1e3)::int8::text as lease_expires_at_ms,
           json_agg(payload) as payloads,
           ${o.trace ? sql`json_agg(traceparent)` : sql`null`} as traceparents,
           ${
             o.rare
               ? sql`json_object_agg(id, json_build_array(idempotency_key, tracestate,
                                                case when errors <> '[]'::jsonb then errors end))
             filter (where idempotency_key is not null or tracestate is not null
                        or errors <> '[]'::jsonb)`
               : sql`null`
           } as rare
      from leased
     ${
       o.group
         ? sql`group by case when pg_column_size(payload) + pg_column_size(errors) <= 2000
                        and pg_column_compression(payload) is null
                        and pg_column_compression(errors) is null
                   then null else id end`
         : sql``
     }`) as unknown as { n: string | null }[];
    const out: Leased[] = [];
    for (const g of groups) {
      if (g.n === null) continue;
      const f = g.n.split(" ");
      const step = o.epoch ? 8 : 6;
      for (let k = 0; k < f.length; k += step)
        out.push({ id: f[k] as string, version: f[k + 1] as string });
    }
    return out;
  };
}

/** Conveyor's fetch update returning a row per job: its numbers packed, the rest as columns. */
async function rowsReturn(sql: Sql): Promise<Leased[]> {
  const rows = (await sql`${fetchUpdate(sql)}
    returning ${packedNumbers(sql, true)} as n,
              j.payload, j.idempotency_key, j.traceparent, j.tracestate,
              case when j.errors <> '[]'::jsonb then j.errors end as errors`) as unknown as {
    n: string;
  }[];
  return rows.map((r) => {
    const f = r.n.split(" ");
    return { id: f[0] as string, version: f[1] as string };
  });
}

/** minimal-return's rows, read through a CTE as the aggregate's input is. */
async function cteRows(sql: Sql): Promise<Leased[]> {
  return (await sql`with leased as (${fetchUpdate(sql)}
                      returning j.id, j.lease_version as version, j.payload)
                    select * from leased`) as unknown as Leased[];
}

/** Conveyor's table and completion, with a fetch of its own: the ret-* variants. */
function returnOnly(dequeue: Variant["dequeue"]): Variant {
  return { table: "conveyor_jobs", setup: conveyorTable(), dequeue, complete: conveyorComplete };
}

const VARIANTS: Record<string, Variant> = {
  ceiling: {
    table: "bench_jobs",
    setup: minimalTable,
    dequeue: minimalFetch("bench_jobs", MINIMAL),
    complete: minimalComplete("bench_jobs", MINIMAL),
  },
  conveyor: {
    table: "conveyor_jobs",
    setup: conveyorTable(),
    dequeue: conveyorFetch,
    complete: conveyorComplete,
  },
  "no-lease-index": {
    table: "conveyor_jobs",
    setup: conveyorTable(DROP_LEASE_INDEX),
    dequeue: conveyorFetch,
    complete: conveyorComplete,
  },
  "no-finalized-index": {
    table: "conveyor_jobs",
    setup: conveyorTable(DROP_FINALIZED_INDEX),
    dequeue: conveyorFetch,
    complete: conveyorComplete,
  },
  "no-extra-indexes": {
    table: "conveyor_jobs",
    setup: conveyorTable(DROP_LEASE_INDEX, DROP_FINALIZED_INDEX),
    dequeue: conveyorFetch,
    complete: conveyorComplete,
  },
  "minimal-return": {
    table: "conveyor_jobs",
    setup: conveyorTable(),
    dequeue: async (sql) =>
      (await conveyorUpdate(sql, CONVEYOR.running, false)) as unknown as Leased[],
    complete: conveyorComplete,
  },
  "minimal-statements": {
    table: "conveyor_jobs",
    setup: conveyorTable(DROP_LEASE_INDEX, DROP_FINALIZED_INDEX),
    dequeue: minimalFetch("conveyor_jobs", CONVEYOR),
    complete: minimalComplete("conveyor_jobs", CONVEYOR),
  },
  "hot-fetch": {
    table: "conveyor_jobs",
    setup: conveyorTable(
      DROP_LEASE_INDEX,
      "alter table conveyor_jobs drop constraint conveyor_jobs_running_has_lease",
    ),
    dequeue: async (sql) => (await conveyorUpdate(sql, "", true)) as unknown as Leased[],
    complete: hotComplete,
  },
  "ret-full": returnOnly(returnVariant({ group: true, rare: true, epoch: true, trace: true })),
  "ret-one-group": returnOnly(
    returnVariant({ group: false, rare: true, epoch: true, trace: true }),
  ),
  "ret-no-rare": returnOnly(returnVariant({ group: true, rare: false, epoch: true, trace: true })),
  "ret-no-epoch": returnOnly(returnVariant({ group: true, rare: true, epoch: false, trace: true })),
  "ret-none-extra": returnOnly(
    returnVariant({ group: false, rare: false, epoch: false, trace: false }),
  ),
  "ret-rows": returnOnly(rowsReturn),
  "ret-cte-rows": returnOnly(cteRows),
};

const names = opt.only ? String(opt.only).split(",") : Object.keys(VARIANTS);
for (const n of names) if (!VARIANTS[n]) throw new Error(`--only: no variant ${n}`);

interface Run {
  round: number;
  variant: string;
  n: number;
  jobsPerSec: number;
  workerUsPerJob: number;
  serverUsPerJob: number;
  /** Share of the table's row updates that were HOT (pg_stat_user_tables). */
  hotShare: number;
}

async function measure(url: string, v: Variant, n: number) {
  const sql = postgres(url, { max: LOOPS + 1, onnotice: () => {} });
  let r: Omit<Run, "round" | "variant" | "n" | "hotShare">;
  try {
    await v.setup(sql, n);
    await sql`checkpoint`;
    await sql`vacuum analyze`;
    const server = await serverCpu(sql);
    if (!server) throw new Error("the cluster's CPU is not readable from /proc");
    await Promise.all(Array.from({ length: LOOPS }, () => sql`select 1`));
    let done = 0;
    let stop = false;
    const limit = setTimeout(() => (stop = true), TIME_LIMIT_MS);
    const s0 = server.sample();
    const c0 = process.cpuUsage();
    const t0 = performance.now();
    await Promise.all(
      Array.from({ length: LOOPS }, async () => {
        while (!stop) {
          const jobs = await v.dequeue(sql);
          if (jobs.length === 0) return;
          const k = await v.complete(sql, jobs);
          if (k !== jobs.length) throw new Error(`fence rejected ${jobs.length - k} completions`);
          done += k;
        }
      }),
    );
    const ms = performance.now() - t0;
    const cpu = process.cpuUsage(c0);
    const serverMs = server.sample() - s0;
    clearTimeout(limit);
    if (done !== n) throw new Error(`${done} of ${n} jobs done within ${TIME_LIMIT_MS} ms`);
    r = {
      jobsPerSec: round((n / ms) * 1000),
      workerUsPerJob: round((cpu.user + cpu.system) / n, 2),
      serverUsPerJob: round((serverMs * 1000) / n, 2),
    };
  } finally {
    // Backends report their statistics when they exit.
    await sql.end({ timeout: 5 });
  }
  const stats = postgres(url, { max: 1, onnotice: () => {} });
  try {
    for (let i = 0; i < 50; i++) {
      const [st] = await stats`
        select n_tup_upd::float8 as upd, n_tup_hot_upd::float8 as hot
          from pg_stat_user_tables where relname = ${v.table}`;
      // Every job's row is updated twice: the fetch and the completion.
      if (st && Number(st.upd) >= 2 * n)
        return { ...r, hotShare: round(Number(st.hot) / Number(st.upd), 3) };
      await Bun.sleep(100);
    }
    throw new Error(`pg_stat_user_tables never counted the ${2 * n} updates of ${v.table}`);
  } finally {
    await stats.end({ timeout: 5 });
  }
}

const pg = await startBenchPostgres();
const runs: Run[] = [];
const started = new Date();
try {
  for (let round_ = 1; round_ <= ROUNDS; round_++) {
    for (const n of SIZES) {
      // Alternate the order so no variant always runs right after another.
      const order = round_ % 2 === 0 ? [...names].reverse() : names;
      for (const variant of order) {
        await pg.reset();
        const r = await measure(pg.url, VARIANTS[variant] as Variant, n);
        runs.push({ round: round_, variant, n, ...r });
        console.error(JSON.stringify(runs.at(-1)));
      }
    }
  }
} finally {
  await pg.stop();
}

/**
 * The host's speed drifts by more than some of these differences between
 * rounds minutes apart, so each variant is also compared with `conveyor` of
 * its own round and size: the median of those differences.
 */
function againstConveyor(mine: Run[], pick: (r: Run) => number, ratio: boolean) {
  const diffs = mine.flatMap((r) => {
    const base = runs.find((b) => b.variant === "conveyor" && b.round === r.round && b.n === r.n);
    if (!base) return [];
    return [ratio ? pick(r) / pick(base) : pick(r) - pick(base)];
  });
  return diffs.length === 0 ? undefined : round(median(diffs), ratio ? 3 : 2);
}

const summary = SIZES.flatMap((n) =>
  names.map((variant) => {
    const mine = runs.filter((r) => r.n === n && r.variant === variant);
    return {
      n,
      variant,
      jobsPerSec: median(mine.map((r) => r.jobsPerSec)),
      serverUsPerJob: median(mine.map((r) => r.serverUsPerJob)),
      workerUsPerJob: median(mine.map((r) => r.workerUsPerJob)),
      hotShare: median(mine.map((r) => r.hotShare)),
      /** Median over rounds of this variant's jobs/s ÷ conveyor's in the same round. */
      jobsPerSecVsConveyor: againstConveyor(mine, (r) => r.jobsPerSec, true),
      /** Median over rounds of this variant's server µs/job − conveyor's in the same round. */
      serverUsVsConveyor: againstConveyor(mine, (r) => r.serverUsPerJob, false),
    };
  }),
);

const day = started.toISOString().slice(0, 10);
const out = opt.out ?? path.join(ROOT, "results", `dissect-${day}.json`);
writeFileSync(
  out,
  `${JSON.stringify(
    {
      date: started.toISOString(),
      machine: machine(),
      versions: versions(),
      postgres: { settings: PG_SETTINGS },
      settings: { loops: LOOPS, batch: BATCH, rounds: ROUNDS, sizes: SIZES },
      summary,
      runs,
    },
    null,
    2,
  )}\n`,
);

console.log(
  "| N | variant | jobs/s | × conveyor | server µs/job | vs conveyor | worker µs/job | HOT updates |",
);
console.log("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |");
const signed = (v: number | undefined) => (v === undefined ? "" : v > 0 ? `+${v}` : String(v));
for (const s of summary) {
  console.log(
    `| ${s.n.toLocaleString("en-US")} | ${s.variant} | ${s.jobsPerSec.toLocaleString("en-US")} | ${s.jobsPerSecVsConveyor ?? ""} | ${s.serverUsPerJob} | ${signed(s.serverUsVsConveyor)} | ${s.workerUsPerJob} | ${Math.round(s.hotShare * 100)}% |`,
  );
}
console.error(`wrote ${path.relative(ROOT, out)}`);
