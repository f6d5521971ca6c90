// `bun bench/pool-vs-loop.ts [--n 100000] [--rounds 3] [--variants pool,loop]
// [--preloads plain] [--out FILE]`: what
// Conveyor's worker pool costs the server per job against the bare loop on
// the same statements, with nothing else different. One cluster with the
// bench's settings and pg_stat_statements, in alternating rounds, each on a
// fresh database of N preloaded no-op jobs, settled by the bench's own settle()
// (a checkpoint, then vacuum analyze):
//   pool  a worker of c4000-b2000, the bench's best Conveyor setting;
//   loop  two loops of fetchJobs(1,000) and completeJobsIdempotent, as
//         bench/systems/bare-sql.ts drives Conveyor's schema (l2-b1000).
// --preloads: how the N jobs are stored before the drain, each preload run
// with each variant in every round:
//   plain   queue, kind and payload, as the bench's preload stores them;
//   traced  the same with a random W3C traceparent per row, as enqueue()
//           stored one for every job enqueued outside a trace before it
//           derived it from the job's id instead (src/trace.ts).
// Per round: jobs/s, the cluster's CPU per job, the WAL written per job, and
// per statement its calls, rows and execution time. The throughput bench
// runs each in a process and a cluster state of its own; this takes those
// away.
// Writes results/pool-vs-loop-<date>.json.
import { mkdirSync, writeFileSync } from "node:fs";
import path from "node:path";
import { parseArgs } from "node:util";
import postgres from "postgres";
import { fetchJobs } from "../src/db/fetch.ts";
import { migrate } from "../src/db/migrate.ts";
import { completeJobsIdempotent } from "../src/db/outcome.ts";
import { silentLogger } from "../src/logger.ts";
import { execWithRuntimeSettings } from "../src/runtime.ts";
import { createWorker } from "../src/worker/worker.ts";
import { choices, positiveInt } from "./lib/args.ts";
import { settle } from "./lib/driver.ts";
import { machine, ROOT, versions } from "./lib/environment.ts";
import { PG_SETTINGS, startBenchPostgres } from "./lib/services.ts";
import { round } from "./lib/stats.ts";

// The daemon's runtime settings, as the bench's Bun children get them.
execWithRuntimeSettings();

const { values: opt } = parseArgs({
  options: {
    n: { type: "string", default: "100000" },
    rounds: { type: "string", default: "3" },
    variants: { type: "string", default: "pool,loop" },
    preloads: { type: "string", default: "plain" },
    out: { type: "string" },
  },
});
const N = positiveInt("n", opt.n);
const ROUNDS = positiveInt("rounds", opt.rounds);
const QUEUE = "bench";
const KIND = "noop";
const VARIANTS = ["pool", "loop"] as const;
const PRELOADS = ["plain", "traced"] as const;
const variants = choices("variants", opt.variants, VARIANTS);
const preloads = choices("preloads", opt.preloads, PRELOADS);

async function drain(sql: postgres.Sql, variant: (typeof VARIANTS)[number]): Promise<void> {
  if (variant === "pool") {
    let done = 0;
    let all!: () => void;
    const finished = new Promise<void>((resolve) => {
      all = resolve;
    });
    const worker = createWorker({
      sql,
      queues: { [QUEUE]: { concurrency: 4000, fetchBatch: 2000, leaseMs: 30_000 } },
      handlers: { [KIND]: () => {} },
      listen: true,
      logger: silentLogger,
    });
    worker.events.on("job:completed", () => {
      if (++done === N) all();
    });
    await worker.start();
    await finished;
    await worker.stop({ graceMs: 2_000 });
    return;
  }
  const loop = async (owner: string) => {
    for (;;) {
      const rows = await fetchJobs(sql, {
        queue: QUEUE,
        owner,
        limit: 1000,
        leaseMs: 30_000,
        kinds: [KIND],
      });
      if (rows.length === 0) return;
      const leases = rows.map((r) => ({ id: r.id, version: Number(r.lease_version) }));
      await completeJobsIdempotent(sql, owner, leases);
    }
  };
  await Promise.all([loop("loop-a"), loop("loop-b")]);
}

const EXTRA = { shared_preload_libraries: "pg_stat_statements" };
const pg = await startBenchPostgres(EXTRA);
const runs: Record<string, unknown>[] = [];
try {
  for (let rnd = 1; rnd <= ROUNDS; rnd++) {
    for (const [variant, preload] of variants.flatMap((v) =>
      preloads.map((p) => [v, p] as const),
    )) {
      await pg.reset();
      const sql = postgres(pg.url, { max: 20, onnotice: () => {} });
      try {
        await migrate(sql);
        await sql`create extension pg_stat_statements`;
        await sql`
          insert into conveyor_jobs (queue, kind, payload, traceparent)
          select ${QUEUE}, ${KIND}, jsonb_build_object('i', g - 1),
                 case when ${preload === "traced"}
                      then '00-' || md5(random()::text) || '-' || left(md5(random()::text), 16) || '-01'
                 end
            from generate_series(1, ${N}::int) g`;
        const cpu = await settle(pg.url);
        await sql`select pg_stat_statements_reset()`;
        const cpu0 = cpu?.sample();
        const [lsn0] = await sql`select pg_current_wal_lsn()::text as lsn`;
        const t0 = performance.now();
        await drain(sql, variant);
        const ms = performance.now() - t0;
        const [wal] = await sql`
          select pg_wal_lsn_diff(pg_current_wal_lsn(), ${lsn0?.lsn}::pg_lsn)::float8 as bytes`;
        const serverMs = cpu && cpu0 !== undefined ? cpu.sample() - cpu0 : undefined;
        const statements = await sql`
          select left(regexp_replace(query, '\\s+', ' ', 'g'), 60) as query, calls::int, rows::int,
                 round(total_exec_time::numeric, 1)::float8 as exec_ms
            from pg_stat_statements where calls > 0 and total_exec_time > 1
           order by total_exec_time desc`;
        const r = {
          round: rnd,
          variant,
          preload,
          jobsPerSec: Math.round(N / (ms / 1000)),
          serverCpuUsPerJob: serverMs === undefined ? null : round((serverMs * 1000) / N, 2),
          walBytesPerJob: Math.round(Number(wal?.bytes) / N),
          statements: [...statements],
        };
        console.log(
          `round ${rnd} ${variant} ${preload}: ${r.jobsPerSec} jobs/s, server ${r.serverCpuUsPerJob} µs/job, ` +
            `WAL ${r.walBytesPerJob} B/job; ` +
            statements.map((s) => `${s.calls} calls ${s.rows} rows ${s.exec_ms} ms`).join(", "),
        );
        runs.push(r);
      } finally {
        await sql.end({ timeout: 5 });
      }
    }
  }
} finally {
  await pg.stop();
}
const date = new Date().toISOString();
const file = opt.out
  ? path.resolve(opt.out)
  : path.join(ROOT, "results", `pool-vs-loop-${date.slice(0, 10)}.json`);
mkdirSync(path.dirname(file), { recursive: true });
writeFileSync(
  file,
  `${JSON.stringify({ date, machine: machine(), versions: versions(), postgres: { ...PG_SETTINGS, ...EXTRA }, settings: { n: N, rounds: ROUNDS, variants, preloads }, runs }, null, 1)}\n`,
);
console.log(`raw results: ${path.relative(ROOT, file)}`);
