// The no-op throughput targets across results files: for each file, at each
// size, Conveyor, the bare loop on Conveyor's own statements
// (`bare-sql-conveyor-schema`), the ceiling and the best peer, each at its
// best setting (medians of that file, as the README's tables take them).
//
//   bun bench/across.ts [results/benchmarks-….json …] [--sizes 10000,100000]
//                       [--since 2026-12-04T23:00]
//
// Without files: every results/benchmarks-*.json holding all three of
// conveyor, bare-sql and bare-sql-conveyor-schema, run at `--since` (UTC,
// compared with the file's own date) or later: ceilings of files from
// before a change to the bare loop are not comparable with later ones.
//
// The bare loop on Conveyor's statements runs no worker pool, so it is
// about the best an engine could do with those statements (up to the
// host's drift between cells: Conveyor has run up to 1.17x the loop).
// Where the loop itself is under a target, the statements miss it, not
// the worker pool. The last column is the share of the ceiling that the
// peer target asks for: near 100%, no engine could meet it in that file.
// Prints Markdown.
import { readFileSync } from "node:fs";
import path from "node:path";
import { parseArgs } from "node:util";
import { positiveInts } from "./lib/args.ts";
import { median } from "./lib/stats.ts";
import {
  CEILING_RATIO_GOAL,
  CEILING_RATIO_LABEL,
  fmtDown,
  noopFigures,
  PEER_RATIO_GOAL,
  PEER_RATIO_LABEL,
  type RunRecord,
} from "./lib/summary.ts";
import { type ResultsDoc, resultsFiles } from "./render.ts";

const { values: opt, positionals } = parseArgs({
  options: {
    sizes: { type: "string", default: "10000,100000" },
    since: { type: "string", default: "" },
  },
  allowPositionals: true,
});
const SIZES = positiveInts("sizes", String(opt.sizes));

const files = positionals.length ? positionals.map((f) => path.resolve(f)) : resultsFiles();

interface Row {
  file: string;
  cpu: string;
  date: string;
  n: number;
  ceiling: number;
  statements: number;
  conveyor: number;
  peer: number;
  peerId: string;
}

/**
 * The machine model a file's figures belong to. Files before the CPU's
 * family and model were recorded carry only its name, which a hypervisor
 * may give two generations alike.
 */
function cpuLabel(m: ResultsDoc["machine"]): string {
  const name = m.cpuModel.replace(/\(R\)|\(TM\)|CPU|Processor/g, "").trim();
  return m.cpuId ? `${name} (${m.cpuId.replace(/ stepping .*/, "")})` : name;
}

const rows: Row[] = [];
for (const file of files) {
  const doc = JSON.parse(readFileSync(file, "utf8")) as ResultsDoc;
  if (doc.date < String(opt.since)) continue;
  for (const n of SIZES) {
    const f = noopFigures(doc.runs as RunRecord[], n);
    if (![f.ceiling, f.statements, f.conveyor].every(Number.isFinite)) continue;
    rows.push({
      file: path.basename(file),
      cpu: cpuLabel(doc.machine),
      date: doc.date.slice(0, 16).replace("T", " "),
      n,
      ceiling: f.ceiling,
      statements: f.statements,
      conveyor: f.conveyor,
      peer: f.bestPeer?.v ?? Number.NaN,
      peerId: f.bestPeer?.p ?? "–",
    });
  }
}

const pct = (v: number) => (Number.isFinite(v) ? `${fmtDown(v * 100, 1)}%` : "–");
/**
 * The share of the ceiling that the peer target asks of Conveyor in this
 * file: Conveyor can't pass the ceiling (the same work with nothing
 * around it) but by the host's drift, so where this nears 100% no engine
 * could meet that target, whatever its own cost.
 */
const demanded = (r: Row) => (PEER_RATIO_GOAL * r.peer) / r.ceiling;
const x = (v: number) => (Number.isFinite(v) ? `${fmtDown(v, 2)}×` : "–");
const k = (v: number) => (Number.isFinite(v) ? Math.round(v).toLocaleString("en-US") : "–");

console.log(
  `| file | CPU | date (UTC) | N | ceiling | bare loop on Conveyor's statements | Conveyor | best peer | statements ÷ ceiling | Conveyor ÷ ceiling | Conveyor ÷ statements | statements ÷ peer | Conveyor ÷ peer | ${PEER_RATIO_LABEL} peer ÷ ceiling |`,
);
console.log(
  "| --- | --- | --- | --: | --: | --: | --: | --- | --: | --: | --: | --: | --: | --: |",
);
for (const r of rows) {
  console.log(
    `| ${r.file} | ${r.cpu} | ${r.date} | ${k(r.n)} | ${k(r.ceiling)} | ${k(r.statements)} | ${k(r.conveyor)} | ${k(r.peer)} (${r.peerId}) | ${pct(r.statements / r.ceiling)} | ${pct(r.conveyor / r.ceiling)} | ${x(r.conveyor / r.statements)} | ${x(r.statements / r.peer)} | ${x(r.conveyor / r.peer)} | ${pct(demanded(r))} |`,
  );
}

console.log();
// Per machine model and size: the figures of one file compare only within it,
// but how often each target was met is comparable across files.
for (const cpu of new Set(rows.map((r) => r.cpu))) {
  for (const n of SIZES) {
    const at = rows.filter((r) => r.cpu === cpu && r.n === n);
    if (at.length === 0) continue;
    const count = (f: (r: Row) => boolean) => at.filter(f).length;
    const engine = at.map((r) => r.conveyor / r.statements);
    const asked = at.map(demanded).filter(Number.isFinite);
    const share = at.map((r) => r.conveyor / r.ceiling);
    console.log(
      `- ${cpu}, N = ${k(n)}, ${at.length} files: Conveyor met ${CEILING_RATIO_LABEL} of the ceiling in ` +
        `${count((r) => r.conveyor / r.ceiling >= CEILING_RATIO_GOAL)} and ${PEER_RATIO_LABEL} the best peer in ` +
        `${count((r) => r.conveyor / r.peer >= PEER_RATIO_GOAL)}; the bare loop on its statements in ` +
        `${count((r) => r.statements / r.ceiling >= CEILING_RATIO_GOAL)} and ${count((r) => r.statements / r.peer >= PEER_RATIO_GOAL)}. ` +
        `Conveyor ÷ that loop ${x(Math.min(...engine))}-${x(Math.max(...engine))} (median ${x(median(engine))}). ` +
        `${PEER_RATIO_LABEL} the best peer asked for ${pct(Math.min(...asked))}-${pct(Math.max(...asked))} of the ceiling ` +
        `(median ${pct(median(asked))}; over 90% in ${asked.filter((a) => a > 0.9).length}); Conveyor ran at ` +
        `${pct(Math.min(...share))}-${pct(Math.max(...share))} of it (median ${pct(median(share))}).`,
    );
  }
}
