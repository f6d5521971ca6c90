// Two versions of the engine through bench/stalls.ts, in pairs: what a
// change is worth to the 1,000/s enqueue-to-start latency, where a host's
// drift between runs is as large as most changes.
//
//   bun bench/stalls-ab.ts [--base REV] [--head REV] [--patch FILE] [--pairs 12]
//                          [--variants handoff] [--label NAME] [--out FILE]
//
// `base` and `head` are git revisions (default: HEAD~1 and HEAD), each a
// `git archive` in a temporary folder with this checkout's node_modules
// (bench/lib/checkout.ts), so uncommitted changes are not measured;
// `--patch` applies a patch to head's copy, as in bench/ab.ts. Each
// pair runs `bench/stalls.ts --rounds 1` once per version, the order
// swapped every pair, and compares their p50 and p99 per variant: from the
// call to the handler's start where a worker runs, else to the
// acknowledgement. Writes results/stalls-<date>-<label>.json with both
// revisions, the summary and every raw run.
import { readFileSync, writeFileSync } from "node:fs";
import path from "node:path";
import { parseArgs } from "node:util";
import { choices, positiveInt } from "./lib/args.ts";
import { alternate, comparisonOut, run, type Side } from "./lib/checkout.ts";
import { STALLS_VARIANTS } from "./lib/driver.ts";
import { machine, ROOT } from "./lib/environment.ts";
import { median } from "./lib/stats.ts";

const { values: opt } = parseArgs({
  options: {
    base: { type: "string", default: "HEAD~1" },
    head: { type: "string", default: "HEAD" },
    patch: { type: "string" },
    pairs: { type: "string", default: "12" },
    variants: { type: "string", default: "handoff" },
    label: { type: "string" },
    out: { type: "string" },
  },
});
const PAIRS = positiveInt("pairs", String(opt.pairs));
const PATCH = opt.patch ? path.resolve(opt.patch) : undefined;
const VARIANTS = choices("variants", String(opt.variants), STALLS_VARIANTS);

interface Percentiles {
  p50: number;
  p99: number;
}
interface StallsRun {
  variant: string;
  ack: Percentiles;
  start?: Percentiles;
}

const runs: { pair: number; side: Side; first: Side; doc: { runs: StallsRun[] } }[] = [];
const shas = await alternate(
  { base: opt.base, head: opt.head },
  PATCH,
  PAIRS,
  (pair, side, dir, file, first) => {
    const args = ["bench/stalls.ts", "--variants", VARIANTS.join(","), "--rounds", "1"];
    run([process.execPath, ...args, "--out", file], dir);
    const doc = JSON.parse(readFileSync(file, "utf8")) as { runs: StallsRun[] };
    runs.push({ pair, side, first, doc });
    const seen = doc.runs.map((r) => `${r.variant} p50 ${(r.start ?? r.ack).p50}`).join(", ");
    console.log(`pair ${pair} ${side}: ${seen}`);
  },
);

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

const out = comparisonOut("stalls", shas, opt.label, opt.out);
writeFileSync(
  out,
  `${JSON.stringify(
    {
      schema: 1,
      tool: `bench/stalls-ab.ts --pairs ${PAIRS} --variants ${VARIANTS.join(",")}`,
      date: new Date().toISOString(),
      base: shas.base,
      head: shas.head,
      ...(PATCH
        ? {
            patch: path.relative(ROOT, PATCH),
            patchSha256: new Bun.CryptoHasher("sha256").update(readFileSync(PATCH)).digest("hex"),
          }
        : {}),
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
