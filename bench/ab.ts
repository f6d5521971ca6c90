// Two versions of the engine through the bench's Conveyor cells, in
// alternating order: what a change is worth end to end, on a host whose
// speed drifts between runs by as much as most changes are worth.
//
//   bun bench/ab.ts [--base REV] [--head REV] [--patch FILE] [--head-env K=V]
//                   [--phase throughput|latency] [--rounds 8]
//                   [--sizes 10000,100000] [--setting c4000-b2000]
//                   [--label NAME] [--out FILE]
//
// `base` and `head` are git revisions (default: HEAD~1 and HEAD); `--patch`
// applies a patch to head's copy (an experiment that is not committed, as
// bench/experiments/hot-fetch.patch on HEAD), and `--head-env` (repeatable)
// sets an environment variable for head's runs only (a runtime option, say;
// run.ts passes it to its children and records BUN_JSC_* ones). Each is `git archive` of its
// revision in a temporary folder with this checkout's node_modules, so
// uncommitted changes are not measured. Each round runs
// `bench/run.ts --only conveyor --phases <phase> --reps 1` once per
// version, the order alternating between rounds. Throughput compares each
// version's best setting per size; latency runs one setting (`--setting`,
// the one the full run's latency cells use) and compares the
// enqueue-to-start p50 and p99 at each rate. Prints a Markdown table of
// medians and writes results/ab-<date>-<label>.json with both revisions,
// every cell and every raw run.
import { readFileSync, writeFileSync } from "node:fs";
import path from "node:path";
import { parseArgs } from "node:util";
import { choices, positiveInt, positiveInts } from "./lib/args.ts";
import { alternate, comparisonOut, run, type Side } from "./lib/checkout.ts";
import { machine, ROOT, versions } from "./lib/environment.ts";
import { median, round } from "./lib/stats.ts";
import { latencyTable, type RunRecord, throughputTable } from "./lib/summary.ts";
import { FULL } from "./plan.ts";

const { values: opt } = parseArgs({
  options: {
    base: { type: "string", default: "HEAD~1" },
    head: { type: "string", default: "HEAD" },
    patch: { type: "string" },
    "head-env": { type: "string", multiple: true },
    phase: { type: "string", default: "throughput" },
    rounds: { type: "string", default: "8" },
    sizes: { type: "string", default: "10000,100000" },
    setting: { type: "string", default: "c4000-b2000" },
    label: { type: "string" },
    out: { type: "string" },
  },
});
const PHASES = ["throughput", "latency"] as const;
if (String(opt.phase).includes(",")) throw new Error(`--phase ${opt.phase}: one phase per run`);
const PHASE = choices("phase", String(opt.phase), PHASES)[0] as (typeof PHASES)[number];
const ROUNDS = positiveInt("rounds", String(opt.rounds));
const SIZES = positiveInts("sizes", String(opt.sizes));
const PATCH = opt.patch ? path.resolve(opt.patch) : undefined;
const HEAD_ENV = Object.fromEntries(
  (opt["head-env"] ?? []).map((kv) => {
    const i = kv.indexOf("=");
    if (i <= 0) throw new Error(`--head-env ${kv}: expected NAME=VALUE`);
    return [kv.slice(0, i), kv.slice(i + 1)];
  }),
);

/** The latency phase's rates (the full profile run.ts uses), each compared on its own. */
const RATES = FULL.latency.map((l) => l.rate);

interface ThroughputCell {
  round: number;
  variant: Side;
  n: number;
  setting: string;
  jobsPerSec: number;
  serverUsPerJob: number | undefined;
  workerUsPerJob: number;
}

interface LatencyCell {
  round: number;
  variant: Side;
  rate: number;
  /** Enqueue call to the handler's start, ms. */
  p50: number;
  p99: number;
  achievedRate: number;
}

const raw: { round: number; variant: Side; runs: RunRecord[] }[] = [];
const throughputCells: ThroughputCell[] = [];
const latencyCells: LatencyCell[] = [];
const phaseArgs =
  PHASE === "throughput" ? ["--sizes", SIZES.join(",")] : ["--setting", String(opt.setting)];
const shas = await alternate(
  { base: opt.base, head: opt.head },
  PATCH,
  ROUNDS,
  (r, variant, dir, file) => {
    run(
      [
        process.execPath,
        "bench/run.ts",
        "--only",
        "conveyor",
        "--phases",
        PHASE,
        ...phaseArgs,
        "--reps",
        "1",
        "--no-render",
        "--out",
        file,
      ],
      dir,
      variant === "head" ? HEAD_ENV : {},
    );
    const runs = (JSON.parse(readFileSync(file, "utf8")) as { runs: RunRecord[] }).runs;
    raw.push({ round: r, variant, runs });
    const cells =
      PHASE === "throughput" ? throughputOf(r, variant, runs) : latencyOf(r, variant, runs);
    for (const cell of cells) console.log(JSON.stringify(cell));
  },
);

function throughputOf(r: number, variant: Side, runs: RunRecord[]): ThroughputCell[] {
  return SIZES.map((n) => {
    const best = throughputTable(runs, "throughput", n).get("conveyor")?.best;
    if (!best) throw new Error(`round ${r} ${variant} N=${n}: no setting ran`);
    const cell: ThroughputCell = {
      round: r,
      variant,
      n,
      setting: best.setting,
      jobsPerSec: best.median,
      serverUsPerJob: Number.isFinite(best.serverCpuUsPerJob)
        ? round(best.serverCpuUsPerJob, 2)
        : undefined,
      workerUsPerJob: round(best.cpuUsPerJob, 2),
    };
    throughputCells.push(cell);
    return cell;
  });
}

function latencyOf(r: number, variant: Side, runs: RunRecord[]): LatencyCell[] {
  return RATES.map((rate) => {
    const fig = latencyTable(runs, rate).get("conveyor");
    // A failed repetition is no latency: the round stops the tool.
    if (fig?.reps !== 1) throw new Error(`round ${r} ${variant} ${rate}/s: no latency`);
    const cell: LatencyCell = {
      round: r,
      variant,
      rate,
      p50: fig.p50,
      p99: fig.p99,
      achievedRate: fig.achievedRate,
    };
    latencyCells.push(cell);
    return cell;
  });
}

const rounds = Array.from({ length: ROUNDS }, (_, i) => i + 1);
/** Per round, head minus base of `f`, where both have it. */
function diffs<C extends { round: number; variant: Side }>(
  cells: C[],
  f: (c: C) => number | undefined,
): number[] {
  return rounds.flatMap((r) => {
    const of = (v: Side) => cells.find((c) => c.round === r && c.variant === v);
    const a = of("base");
    const b = of("head");
    const x = a && f(a);
    const y = b && f(b);
    return x === undefined || y === undefined ? [] : [y - x];
  });
}
const side = <C extends { variant: Side }>(cells: C[], v: Side, f: (c: C) => number) =>
  median(cells.filter((c) => c.variant === v).map(f));

const throughputSummary = () =>
  SIZES.map((n) => {
    const cells = throughputCells.filter((c) => c.n === n);
    const at = (r: number, v: Side) =>
      cells.find((c) => c.round === r && c.variant === v) as ThroughputCell;
    const ratios = rounds.map((r) => at(r, "head").jobsPerSec / at(r, "base").jobsPerSec);
    const serverDiffs = diffs(cells, (c) => c.serverUsPerJob);
    const workerDiffs = diffs(cells, (c) => c.workerUsPerJob);
    return {
      n,
      baseJobsPerSec: side(cells, "base", (c) => c.jobsPerSec),
      headJobsPerSec: side(cells, "head", (c) => c.jobsPerSec),
      ratioPerRound: ratios.map((x) => round(x, 3)),
      ratioMedian: round(median(ratios), 3),
      roundsFaster: ratios.filter((x) => x > 1).length,
      serverUsDiffMedian: serverDiffs.length > 0 ? round(median(serverDiffs), 2) : undefined,
      workerUsDiffMedian: round(median(workerDiffs), 2),
      roundsWorkerLower: workerDiffs.filter((x) => x < 0).length,
    };
  });

const latencySummary = () =>
  RATES.map((rate) => {
    const cells = latencyCells.filter((c) => c.rate === rate);
    const p50Diffs = diffs(cells, (c) => c.p50);
    const p99Diffs = diffs(cells, (c) => c.p99);
    return {
      rate,
      baseP50: round(
        side(cells, "base", (c) => c.p50),
        3,
      ),
      headP50: round(
        side(cells, "head", (c) => c.p50),
        3,
      ),
      p50DiffPerRound: p50Diffs.map((x) => round(x, 3)),
      p50DiffMedian: round(median(p50Diffs), 3),
      roundsP50Lower: p50Diffs.filter((x) => x < 0).length,
      baseP99: round(
        side(cells, "base", (c) => c.p99),
        2,
      ),
      headP99: round(
        side(cells, "head", (c) => c.p99),
        2,
      ),
      p99DiffPerRound: p99Diffs.map((x) => round(x, 2)),
      p99DiffMedian: round(median(p99Diffs), 2),
      roundsP99Lower: p99Diffs.filter((x) => x < 0).length,
    };
  });

const summary = PHASE === "throughput" ? throughputSummary() : latencySummary();
const out = comparisonOut("ab", shas, opt.label, opt.out);
writeFileSync(
  out,
  `${JSON.stringify(
    {
      schema: 1,
      date: new Date().toISOString(),
      base: shas.base,
      head: shas.head,
      headEnv: HEAD_ENV,
      ...(PATCH
        ? {
            patch: path.relative(ROOT, PATCH),
            patchSha256: new Bun.CryptoHasher("sha256").update(readFileSync(PATCH)).digest("hex"),
          }
        : {}),
      machine: machine(),
      versions: versions(),
      phase: PHASE,
      rounds: ROUNDS,
      ...(PHASE === "throughput" ? { sizes: SIZES } : { setting: opt.setting, rates: RATES }),
      summary,
      cells: PHASE === "throughput" ? throughputCells : latencyCells,
      raw,
    },
    null,
    2,
  )}\n`,
);

if (PHASE === "throughput") {
  console.log(
    "\n| N | base jobs/s | head jobs/s | × per round (median) | faster rounds | server µs/job | worker µs/job | worker lower |",
  );
  console.log("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
  for (const s of throughputSummary()) {
    console.log(
      `| ${s.n.toLocaleString("en-US")} | ${s.baseJobsPerSec.toLocaleString("en-US")} | ${s.headJobsPerSec.toLocaleString("en-US")} | ${s.ratioMedian} | ${s.roundsFaster} of ${ROUNDS} | ${s.serverUsDiffMedian ?? "n/a"} | ${s.workerUsDiffMedian} | ${s.roundsWorkerLower} of ${ROUNDS} |`,
    );
  }
} else {
  console.log(
    "\n| rate | base p50 | head p50 | p50 diff (median) | p50 lower | base p99 | head p99 | p99 diff (median) | p99 lower |",
  );
  console.log("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
  for (const s of latencySummary()) {
    console.log(
      `| ${s.rate.toLocaleString("en-US")}/s | ${s.baseP50} | ${s.headP50} | ${s.p50DiffMedian} | ${s.roundsP50Lower} of ${ROUNDS} | ${s.baseP99} | ${s.headP99} | ${s.p99DiffMedian} | ${s.roundsP99Lower} of ${ROUNDS} |`,
    );
  }
}
console.log(`wrote ${path.relative(ROOT, out)}`);
