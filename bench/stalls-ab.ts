// Two versions of the engine through bench/stalls.ts, in pairs: what a
// change is worth to the 1,000/s enqueue-to-start latency, where a host's
// drift between runs is as large as most changes.
//
//   bun bench/stalls-ab.ts [--base REV] [--head REV] [--pairs 12]
//                          [--variants handoff] [--label NAME] [--out FILE]
//
// `base` and `head` are git revisions (default: HEAD~1 and HEAD), each a
// `git archive` in a temporary folder with this checkout's node_modules
// (bench/lib/checkout.ts), so uncommitted changes are not measured. Each
// pair runs `bench/stalls.ts --rounds 1` once per version, the order
// swapped every pair, and compares their p50 and p99 per variant: from the
// call to the handler's start where a worker runs, else to the
// acknowledgement. Writes results/stalls-<date>-<label>.json with both
// revisions, the summary and every raw run.
import { readFileSync, writeFileSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { parseArgs } from "node:util";
import { choices, positiveInt } from "./lib/args.ts";
import { checkout, revision, run } from "./lib/checkout.ts";
import { machine, ROOT } from "./lib/environment.ts";
import { median } from "./lib/stats.ts";

const { values: opt } = parseArgs({
  options: {
    base: { type: "string", default: "HEAD~1" },
    head: { type: "string", default: "HEAD" },
    pairs: { type: "string", default: "12" },
    variants: { type: "string", default: "handoff" },
    label: { type: "string" },
    out: { type: "string" },
  },
});
const PAIRS = positiveInt("pairs", String(opt.pairs));
const VARIANTS = choices("variants", String(opt.variants), ["bare", "enqueue", "handoff"]);
const SIDES = ["base", "head"] as const;
type Side = (typeof SIDES)[number];

interface Percentiles {
  p50: number;
  p99: number;
}
interface StallsRun {
  variant: string;
  ack: Percentiles;
  start?: Percentiles;
}

const shas: Record<Side, string> = { base: revision(opt.base), head: revision(opt.head) };
const work = await mkdtemp(path.join(tmpdir(), "conveyor-bench-stalls-ab-"));
const runs: { pair: number; side: Side; first: Side; doc: { runs: StallsRun[] } }[] = [];
try {
  for (const side of SIDES) checkout(path.join(work, side), shas[side]);
  for (let pair = 1; pair <= PAIRS; pair++) {
    const order = pair % 2 === 1 ? SIDES : [...SIDES].reverse();
    for (const side of order) {
      const file = path.join(work, `p${pair}-${side}.json`);
      const args = ["bench/stalls.ts", "--variants", VARIANTS.join(","), "--rounds", "1"];
      run([process.execPath, ...args, "--out", file], path.join(work, side));
      const doc = JSON.parse(readFileSync(file, "utf8")) as { runs: StallsRun[] };
      runs.push({ pair, side, first: order[0] as Side, doc });
      const seen = doc.runs.map((r) => `${r.variant} p50 ${(r.start ?? r.ack).p50}`).join(", ");
      console.log(`pair ${pair} ${side}: ${seen}`);
    }
  }
} finally {
  await rm(work, { recursive: true, force: true });
}

const figure = (side: Side, variant: string, key: keyof Percentiles) =>
  runs
    .filter((r) => r.side === side)
    .map((r) => {
      const v = r.doc.runs.find((x) => x.variant === variant);
      if (!v) throw new Error(`pair ${r.pair} ${side}: no ${variant} run`);
      return (v.start ?? v.ack)[key];
    });
const summary = VARIANTS.map((variant) => {
  const out: Record<string, unknown> = { variant };
  for (const key of ["p50", "p99"] as const) {
    const base = figure("base", variant, key);
    const head = figure("head", variant, key);
    Object.assign(out, {
      [`${key}Base`]: base,
      [`${key}Head`]: head,
      [`${key}MedianBase`]: median(base),
      [`${key}MedianHead`]: median(head),
      [`${key}HeadLowerInPairs`]: head.filter((h, i) => h < (base[i] as number)).length,
    });
  }
  return out;
});

const date = new Date().toISOString().slice(0, 10);
const label = opt.label ?? `${shas.base.slice(0, 7)}-${shas.head.slice(0, 7)}`;
const out = opt.out ?? path.join(ROOT, "results", `stalls-${date}-${label}.json`);
writeFileSync(
  out,
  `${JSON.stringify(
    {
      schema: 1,
      tool: `bench/stalls-ab.ts --pairs ${PAIRS} --variants ${VARIANTS.join(",")}`,
      date: new Date().toISOString(),
      base: shas.base,
      head: shas.head,
      machine: machine(),
      summary,
      runs,
    },
    null,
    2,
  )}\n`,
);
for (const s of summary) console.log(JSON.stringify(s));
console.log(`wrote ${path.relative(ROOT, out)}`);
