// What a HOT fetch would be worth end to end: Conveyor's real worker pool on
// the committed engine against the same engine with
// bench/experiments/hot-fetch.patch applied, in alternating order.
//
//   bun bench/hot-fetch.ts [--rounds 10] [--sizes 10000,100000] [--out FILE]
//
// Writes results/hot-fetch-<date>.json and prints a Markdown table of medians.
//
// The patch is the visibility-timeout fetch of bench/dissect.ts's hot-fetch
// variant, in the engine: a leased job stays 'available' with a live lease,
// the dequeue skips live leases by a heap filter, fenced writes guard on
// 'available', and the reaper's lease-expiry index is dropped, so the
// fetch's update changes no indexed column and can be HOT. It keeps the
// fetch's full return. It is an upper bound, not a design: nothing takes
// back an expired lease (the reaper looks for 'running'), exhausts attempts
// or counts running jobs, and the formal model is not changed. The bench's
// throughput cells never need any of that.
//
// Both variants are `git archive HEAD` in a temporary folder (the patch
// applied to one), with this checkout's node_modules, each round one
// `bench/run.ts --only conveyor --phases throughput` per variant; a round
// compares each variant's best setting per size. Uncommitted changes are
// not measured.
import { spawnSync } from "node:child_process";
import { mkdirSync, readFileSync, symlinkSync, writeFileSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { parseArgs } from "node:util";
import { machine, ROOT, versions } from "./lib/environment.ts";
import { median, round } from "./lib/stats.ts";
import { type RunRecord, throughputTable } from "./lib/summary.ts";

const { values: opt } = parseArgs({
  options: {
    rounds: { type: "string", default: "10" },
    sizes: { type: "string", default: "10000,100000" },
    out: { type: "string" },
  },
});
const ROUNDS = Number(opt.rounds);
const SIZES = String(opt.sizes).split(",").map(Number);
const PATCH = path.join(ROOT, "bench", "experiments", "hot-fetch.patch");
const VARIANTS = ["committed", "hot-fetch"] as const;
type Variant = (typeof VARIANTS)[number];

function run(cmd: string[], cwd: string, timeoutMs = 600_000): string {
  const r = spawnSync(cmd[0] as string, cmd.slice(1), {
    cwd,
    encoding: "utf8",
    timeout: timeoutMs,
    maxBuffer: 64 * 1024 * 1024,
  });
  if (r.status !== 0) {
    throw new Error(`${cmd.join(" ")} (in ${cwd}) exited ${r.status}: ${r.stderr}${r.stdout}`);
  }
  return r.stdout;
}

/** HEAD of this checkout in `dir`, with our node_modules; the patch applied if asked. */
function checkout(dir: string, patched: boolean) {
  mkdirSync(dir, { recursive: true });
  const tar = spawnSync("git", ["archive", "HEAD"], { cwd: ROOT, maxBuffer: 1024 ** 3 });
  if (tar.status !== 0) throw new Error(`git archive: ${tar.stderr}`);
  const x = spawnSync("tar", ["-x", "-C", dir], { input: tar.stdout });
  if (x.status !== 0) throw new Error(`tar: ${x.stderr}`);
  symlinkSync(path.join(ROOT, "node_modules"), path.join(dir, "node_modules"));
  // git apply works outside a repository; it refuses a patch that no longer fits.
  if (patched) run(["git", "apply", PATCH], dir);
}

interface Cell {
  round: number;
  variant: Variant;
  n: number;
  setting: string;
  jobsPerSec: number;
  serverUsPerJob: number | undefined;
  workerUsPerJob: number;
}

const work = await mkdtemp(path.join(tmpdir(), "conveyor-bench-hotfetch-"));
const dirs: Record<Variant, string> = {
  committed: path.join(work, "committed"),
  "hot-fetch": path.join(work, "hot-fetch"),
};
const raw: { round: number; variant: Variant; runs: RunRecord[] }[] = [];
const cells: Cell[] = [];
const commit = run(["git", "rev-parse", "HEAD"], ROOT).trim();
try {
  checkout(dirs.committed, false);
  checkout(dirs["hot-fetch"], true);
  for (let r = 1; r <= ROUNDS; r++) {
    const order = r % 2 === 1 ? VARIANTS : [...VARIANTS].reverse();
    for (const variant of order) {
      const file = path.join(work, `r${r}-${variant}.json`);
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
        dirs[variant],
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
    }
  }
} finally {
  await rm(work, { recursive: true, force: true });
}

const cellOf = (r: number, v: Variant, n: number) =>
  cells.find((c) => c.round === r && c.variant === v && c.n === n) as Cell;
const rounds = Array.from({ length: ROUNDS }, (_, i) => i + 1);
const summary = SIZES.map((n) => {
  const pairs = rounds.map((r) => [cellOf(r, "committed", n), cellOf(r, "hot-fetch", n)] as const);
  const diffs = (f: (c: Cell) => number | undefined) =>
    pairs.flatMap(([a, b]) => {
      const x = f(a);
      const y = f(b);
      return x === undefined || y === undefined ? [] : [y - x];
    });
  const ratios = pairs.map(([a, b]) => b.jobsPerSec / a.jobsPerSec);
  const serverDiffs = diffs((c) => c.serverUsPerJob);
  return {
    n,
    committedJobsPerSec: median(pairs.map(([a]) => a.jobsPerSec)),
    hotFetchJobsPerSec: median(pairs.map(([, b]) => b.jobsPerSec)),
    ratioPerRound: ratios.map((x) => round(x, 3)),
    ratioMedian: round(median(ratios), 3),
    roundsFaster: ratios.filter((x) => x > 1).length,
    serverUsDiffMedian: serverDiffs.length > 0 ? round(median(serverDiffs), 2) : undefined,
    workerUsDiffMedian: round(median(diffs((c) => c.workerUsPerJob)), 2),
  };
});

const date = new Date().toISOString().slice(0, 10);
const out = opt.out ?? path.join(ROOT, "results", `hot-fetch-${date}.json`);
writeFileSync(
  out,
  `${JSON.stringify(
    {
      schema: 1,
      date: new Date().toISOString(),
      commit,
      patch: path.relative(ROOT, PATCH),
      patchSha256: new Bun.CryptoHasher("sha256").update(readFileSync(PATCH)).digest("hex"),
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
  "\n| N | committed jobs/s | hot-fetch jobs/s | × per round (median) | faster rounds | server µs/job | worker µs/job |",
);
console.log("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
for (const s of summary) {
  console.log(
    `| ${s.n.toLocaleString("en-US")} | ${s.committedJobsPerSec.toLocaleString("en-US")} | ${s.hotFetchJobsPerSec.toLocaleString("en-US")} | ${s.ratioMedian} | ${s.roundsFaster} of ${ROUNDS} | ${s.serverUsDiffMedian ?? "n/a"} | ${s.workerUsDiffMedian} |`,
  );
}
console.log(`wrote ${path.relative(ROOT, out)}`);
