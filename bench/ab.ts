// Two versions of the engine through the bench's Conveyor throughput cells,
// in alternating order: what a change is worth end to end, on a host whose
// speed drifts between runs by as much as most changes are worth.
//
//   bun bench/ab.ts [--base REV] [--head REV] [--patch FILE] [--head-env K=V]
//                   [--rounds 8] [--sizes 10000,100000] [--label NAME] [--out FILE]
//
// `base` and `head` are git revisions (default: HEAD~1 and HEAD); `--patch`
// applies a patch to head's copy (an experiment that is not committed, as
// bench/experiments/hot-fetch.patch on HEAD), and `--head-env` (repeatable)
// sets an environment variable for head's runs only (a runtime option, say;
// run.ts passes it to its children and records BUN_JSC_* ones). Each is `git archive` of its
// revision in a temporary folder with this checkout's node_modules, so
// uncommitted changes are not measured. Each round runs
// `bench/run.ts --only conveyor --phases throughput` once per version, the
// order alternating between rounds, and compares each version's best setting
// per size. Prints a Markdown table of medians and writes
// results/ab-<date>-<label>.json with both revisions, every cell and every
// raw run.
import { readFileSync, writeFileSync } from "node:fs";
import path from "node:path";
import { parseArgs } from "node:util";
import { positiveInt, positiveInts } from "./lib/args.ts";
import { alternate, comparisonOut, run, type Side } from "./lib/checkout.ts";
import { machine, ROOT, versions } from "./lib/environment.ts";
import { median, round } from "./lib/stats.ts";
import { type RunRecord, throughputTable } from "./lib/summary.ts";

const { values: opt } = parseArgs({
  options: {
    base: { type: "string", default: "HEAD~1" },
    head: { type: "string", default: "HEAD" },
    patch: { type: "string" },
    "head-env": { type: "string", multiple: true },
    rounds: { type: "string", default: "8" },
    sizes: { type: "string", default: "10000,100000" },
    label: { type: "string" },
    out: { type: "string" },
  },
});
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

interface Cell {
  round: number;
  variant: Side;
  n: number;
  setting: string;
  jobsPerSec: number;
  serverUsPerJob: number | undefined;
  workerUsPerJob: number;
}

const raw: { round: number; variant: Side; runs: RunRecord[] }[] = [];
const cells: Cell[] = [];
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
        "throughput",
        "--sizes",
        SIZES.join(","),
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
    for (const n of SIZES) {
      const best = throughputTable(runs, "throughput", n).get("conveyor")?.best;
      if (!best) throw new Error(`round ${r} ${variant} N=${n}: no setting ran`);
      const cell: Cell = {
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
      cells.push(cell);
      console.log(JSON.stringify(cell));
    }
  },
);

const cellOf = (r: number, v: Side, n: number) =>
  cells.find((c) => c.round === r && c.variant === v && c.n === n) as Cell;
const rounds = Array.from({ length: ROUNDS }, (_, i) => i + 1);
const summary = SIZES.map((n) => {
  const pairs = rounds.map((r) => [cellOf(r, "base", n), cellOf(r, "head", n)] as const);
  const diffs = (f: (c: Cell) => number | undefined) =>
    pairs.flatMap(([a, b]) => {
      const x = f(a);
      const y = f(b);
      return x === undefined || y === undefined ? [] : [y - x];
    });
  const ratios = pairs.map(([a, b]) => b.jobsPerSec / a.jobsPerSec);
  const serverDiffs = diffs((c) => c.serverUsPerJob);
  const workerDiffs = diffs((c) => c.workerUsPerJob);
  return {
    n,
    baseJobsPerSec: median(pairs.map(([a]) => a.jobsPerSec)),
    headJobsPerSec: median(pairs.map(([, b]) => b.jobsPerSec)),
    ratioPerRound: ratios.map((x) => round(x, 3)),
    ratioMedian: round(median(ratios), 3),
    roundsFaster: ratios.filter((x) => x > 1).length,
    serverUsDiffMedian: serverDiffs.length > 0 ? round(median(serverDiffs), 2) : undefined,
    workerUsDiffMedian: round(median(workerDiffs), 2),
    roundsWorkerLower: workerDiffs.filter((x) => x < 0).length,
  };
});

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
      rounds: ROUNDS,
      sizes: SIZES,
      summary,
      cells,
      raw,
    },
    null,
    2,
  )}\n`,
);

console.log(
  "\n| N | base jobs/s | head jobs/s | × per round (median) | faster rounds | server µs/job | worker µs/job | worker lower |",
);
console.log("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
for (const s of summary) {
  console.log(
    `| ${s.n.toLocaleString("en-US")} | ${s.baseJobsPerSec.toLocaleString("en-US")} | ${s.headJobsPerSec.toLocaleString("en-US")} | ${s.ratioMedian} | ${s.roundsFaster} of ${ROUNDS} | ${s.serverUsDiffMedian ?? "n/a"} | ${s.workerUsDiffMedian} | ${s.roundsWorkerLower} of ${ROUNDS} |`,
  );
}
console.log(`wrote ${path.relative(ROOT, out)}`);
