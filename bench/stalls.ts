// `bun bench/stalls.ts [--rate 1000] [--n 5000] [--rounds 3] [--variants bare,enqueue,handoff]
//  [--out FILE]`:
// where the tail of enqueue-to-start latency comes from. On a bench cluster
// (the same settings as `npm run bench`), in alternating rounds, jobs are
// issued one at a time on an open-loop schedule as the latency phase issues
// them, in these ways (the default runs bare, enqueue and handoff):
//   bare     a one-row jsonb insert into a table with only a primary key;
//   row      a one-row insert into Conveyor's table (queue, kind, payload;
//            the rest its defaults), as plain SQL: what the table and its
//            indexes add to bare;
//   row-returning  the same with `returning *`, as the enqueue's statement
//            returns the whole row: what sending and decoding it add;
//   enqueue  enqueue() with no worker (an insert, and its debounced NOTIFY);
//   handoff  enqueue() with a worker of this process idle (c4000-b2000), so
//            the insert itself leases the job (src/db/handoff.ts) and the
//            worker then completes it: two commits per job.
// Per variant: call-to-ack (and call-to-start with a worker) percentiles;
// the slowest 1% as "ms@s" (latency @ seconds into the run), which shows
// whether slow jobs come one by one or in bursts that queue behind one
// stall; and the event loop's lags over 5 ms, measured by a 1 ms timer,
// which shows whether a burst was this process being busy (GC, a batch of
// callbacks) or the database. Each run records its schedule's wall-clock
// start, so a trace taken beside it can be lined up with the slowest jobs.
// Writes results/stalls-<date>.json.
import { mkdirSync, writeFileSync } from "node:fs";
import path from "node:path";
import { parseArgs } from "node:util";
import postgres from "postgres";
import { migrate } from "../src/db/migrate.ts";
import { enqueue } from "../src/enqueue.ts";
import { silentLogger } from "../src/logger.ts";
import { execWithRuntimeSettings, RUNTIME_ENV } from "../src/runtime.ts";
import { createWorker } from "../src/worker/worker.ts";
import { choices, positiveInt } from "./lib/args.ts";
import { ENQUEUE_POOL, nowMs, openLoop, pollUntil, STALLS_VARIANTS, sleep } from "./lib/driver.ts";
import { machine, ROOT, versions } from "./lib/environment.ts";
import { PG_SETTINGS, startBenchPostgres } from "./lib/services.ts";
import { round, roundAll, summarize } from "./lib/stats.ts";

// The daemon's runtime settings, as the bench's Bun children get them.
execWithRuntimeSettings();

const { values: opt } = parseArgs({
  options: {
    rate: { type: "string", default: "1000" },
    n: { type: "string", default: "5000" },
    rounds: { type: "string", default: "3" },
    variants: { type: "string", default: "bare,enqueue,handoff" },
    out: { type: "string" },
  },
});
const RATE = positiveInt("rate", opt.rate);
const N = positiveInt("n", opt.n);
const ROUNDS = positiveInt("rounds", opt.rounds);
const WARMUP = Math.round(N / 10);
type Variant = (typeof STALLS_VARIANTS)[number];
const variants = choices("variants", opt.variants, STALLS_VARIANTS);

const pct = (values: number[]) => {
  const { p50, p95, p99, max } = roundAll(summarize(values), 2);
  return { p50, p95, p99, max };
};

async function measure(url: string, variant: Variant) {
  const sql = postgres(url, { max: 10, onnotice: () => {} });
  const client = postgres(url, { max: ENQUEUE_POOL, onnotice: () => {} });
  await migrate(sql);
  await sql`create table if not exists bare (id bigserial primary key, v jsonb)`;
  await sql`checkpoint`;
  const total = WARMUP + N;
  const call = new Float64Array(total);
  const ack = new Float64Array(total);
  const start = new Float64Array(total).fill(Number.NaN);
  let started = 0;
  const worker =
    variant === "handoff"
      ? createWorker({
          sql,
          queues: { q: { concurrency: 4000, fetchBatch: 2000, leaseMs: 30_000 } },
          handlers: {
            k: (p: { i: number }) => {
              if (p.i >= 0) start[p.i] = nowMs();
              started++;
            },
          },
          logger: silentLogger,
        })
      : undefined;
  await worker?.start();
  await sleep(1_000);
  const one = (i: number): Promise<unknown> => {
    const payload = JSON.stringify({ i });
    switch (variant) {
      case "bare":
        return client`insert into bare (v) values (${payload}::jsonb)`;
      case "row":
        return client`insert into conveyor_jobs (queue, kind, payload) values ('q', 'k', ${payload}::jsonb)`;
      case "row-returning":
        return client`insert into conveyor_jobs (queue, kind, payload) values ('q', 'k', ${payload}::jsonb) returning *`;
      default:
        return enqueue(client, { queue: "q", kind: "k", payload: { i } });
    }
  };
  // The enqueue pool's connections opened before the clock, as in the bench.
  await Promise.all(Array.from({ length: ENQUEUE_POOL }, () => one(-1)));
  await sleep(200);
  const lags: [number, number][] = [];
  const t0 = nowMs();
  // Wall-clock time of the schedule's start, to line the slowest jobs up
  // with a trace of the server taken beside this tool (perf trace, say).
  const startedAtMs = Date.now();
  let last = t0;
  const timer = setInterval(() => {
    const now = nowMs();
    if (now - last > 5) lags.push([round(now - last, 2), round((now - t0) / 1000, 2)]);
    last = now;
  }, 1);
  await openLoop(RATE, total, (i, at) => {
    call[i] = at;
    return one(i).then(() => {
      ack[i] = nowMs();
    });
  });
  clearInterval(timer);
  if (worker) {
    // Every job started, or the run fails: a missing start is not a latency.
    await pollUntil(() => started >= total + ENQUEUE_POOL, 5, 10_000);
    await worker.stop();
  }
  await sql.end();
  await client.end();
  const toAck: number[] = [];
  const toStart: number[] = [];
  for (let i = WARMUP; i < total; i++) {
    toAck.push((ack[i] as number) - (call[i] as number));
    if (worker) toStart.push((start[i] as number) - (call[i] as number));
  }
  const series = worker ? toStart : toAck;
  const slowest = series
    .map(
      (ms, k) =>
        [round(ms, 2), round(((call[k + WARMUP] as number) - t0) / 1000, 2)] as [number, number],
    )
    .sort((a, b) => b[0] - a[0])
    .slice(0, Math.ceil(series.length / 100))
    .sort((a, b) => a[1] - b[1]);
  return {
    startedAtMs,
    ack: pct(toAck),
    ...(worker ? { start: pct(toStart) } : {}),
    slowest,
    loopLags: lags,
  };
}

const pg = await startBenchPostgres();
const runs: Record<string, unknown>[] = [];
try {
  for (let rnd = 1; rnd <= ROUNDS; rnd++) {
    for (const variant of variants) {
      await pg.reset();
      const r = await measure(pg.url, variant);
      const s = r.start ?? r.ack;
      console.log(
        `round ${rnd} ${variant.padEnd(8)} p50 ${s.p50} p95 ${s.p95} p99 ${s.p99} max ${s.max} ms; ` +
          `loop lags > 5 ms: ${r.loopLags.length}, longest ${Math.max(0, ...r.loopLags.map((l) => l[0]))} ms`,
      );
      console.log(`  slowest 1% (ms@s): ${r.slowest.map(([ms, s]) => `${ms}@${s}`).join(" ")}`);
      runs.push({ round: rnd, variant, ...r });
    }
  }
} finally {
  await pg.stop();
}
const date = new Date().toISOString();
const file = opt.out
  ? path.resolve(opt.out)
  : path.join(ROOT, "results", `stalls-${date.slice(0, 10)}.json`);
mkdirSync(path.dirname(file), { recursive: true });
writeFileSync(
  file,
  `${JSON.stringify(
    {
      date,
      machine: machine(),
      versions: versions(),
      postgres: PG_SETTINGS,
      bunEnv: Object.fromEntries(Object.keys(RUNTIME_ENV).map((k) => [k, process.env[k]])),
      settings: { rate: RATE, n: N, warmup: WARMUP, rounds: ROUNDS, variants },
      runs,
    },
    null,
    1,
  )}\n`,
);
console.log(`raw results: ${path.relative(ROOT, file)}`);
