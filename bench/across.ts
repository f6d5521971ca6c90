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
//
// `--latency`: instead, the 1,000/s enqueue-to-start target across files:
// Conveyor's p50 and p99 against the best peer's (medians of that file),
// and in how many repetitions Conveyor's was lower than that peer's of the
// same repetition. Files without that cell for Conveyor and a peer are left
// out.
// Prints Markdown.
import { readFileSync } from "node:fs";
import path from "node:path";
import { parseArgs } from "node:util";
import { positiveInts } from "./lib/args.ts";
import type { SystemId } from "./lib/protocol.ts";
import { median } from "./lib/stats.ts";
import {
  CEILING_RATIO_GOAL,
  CEILING_RATIO_LABEL,
  fastestPeer,
  fmtDown,
  latencyTable,
  noopFigures,
  ok,
  PEER_RATIO_GOAL,
  PEER_RATIO_LABEL,
  PEERS,
  type RunRecord,
} from "./lib/summary.ts";
import { type ResultsDoc, resultsFiles } from "./render.ts";

const { values: opt, positionals } = parseArgs({
  options: {
    sizes: { type: "string", default: "10000,100000" },
    since: { type: "string", default: "" },
    latency: { type: "boolean", default: false },
  },
  allowPositionals: true,
});
const SIZES = positiveInts("sizes", String(opt.sizes));

const files = positionals.length ? positionals.map((f) => path.resolve(f)) : resultsFiles();

/**
 * The machine model a file's figures belong to. Files before the CPU's
 * family and model were recorded carry only its name, which a hypervisor
 * may give two generations alike.
 */
function cpuLabel(m: ResultsDoc["machine"]): string {
  const name = m.cpuModel.replace(/\(R\)|\(TM\)|CPU|Processor/g, "").trim();
  return m.cpuId ? `${name} (${m.cpuId.replace(/ stepping .*/, "")})` : name;
}

/** Where a row's figures come from: the file, its machine model and when it ran. */
interface Source {
  file: string;
  cpu: string;
  date: string;
}

function sourceOf(file: string, doc: ResultsDoc): Source {
  return {
    file: path.basename(file),
    cpu: cpuLabel(doc.machine),
    date: doc.date.slice(0, 16).replace("T", " "),
  };
}

/** The results files to read, parsed, from `--since` on. */
const docs = () =>
  files
    .map((file) => ({ file, doc: JSON.parse(readFileSync(file, "utf8")) as ResultsDoc }))
    .filter(({ doc }) => doc.date >= String(opt.since));

function throughput() {
  interface Row extends Source {
    n: number;
    ceiling: number;
    statements: number;
    conveyor: number;
    peer: number;
    peerId: string;
  }

  const rows: Row[] = [];
  for (const { file, doc } of docs()) {
    for (const n of SIZES) {
      const f = noopFigures(doc.runs as RunRecord[], n);
      if (![f.ceiling, f.statements, f.conveyor].every(Number.isFinite)) continue;
      rows.push({
        ...sourceOf(file, doc),
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
}

/** Enqueue-to-start latency at 1,000/s of one system in one file, per repetition. */
function perRep(runs: RunRecord[], system: SystemId, q: "p50" | "p99"): Map<number, number> {
  const out = new Map<number, number>();
  for (const r of runs) {
    const v = r.result?.[q];
    if (r.phase !== "latency" || r.params.rate !== 1_000 || r.system !== system) continue;
    if (ok(r) && typeof v === "number") out.set(r.rep, v);
  }
  return out;
}

function latency() {
  interface LatencyRow extends Source {
    q: "p50" | "p99";
    conveyor: number;
    peer: number;
    peerId: string;
    /** Repetitions where Conveyor's figure was lower than the peer's of the same repetition. */
    repsLower: number;
    reps: number;
  }
  const rows: LatencyRow[] = [];
  for (const { file, doc } of docs()) {
    const runs = doc.runs as RunRecord[];
    const t = latencyTable(runs, 1_000);
    const ours = t.get("conveyor");
    if (!ours) continue;
    for (const q of ["p50", "p99"] as const) {
      const peer = fastestPeer(t, q, PEERS);
      if (!peer || !Number.isFinite(ours[q])) continue;
      const a = perRep(runs, "conveyor", q);
      const b = perRep(runs, peer.p, q);
      const paired = [...a.keys()].filter((rep) => b.has(rep));
      rows.push({
        ...sourceOf(file, doc),
        q,
        conveyor: ours[q],
        peer: peer.v,
        peerId: peer.p,
        repsLower: paired.filter((rep) => (a.get(rep) as number) < (b.get(rep) as number)).length,
        reps: paired.length,
      });
    }
  }
  // A difference that rounds to zero prints as 0.00, not -0.00.
  const ms = (v: number) => (Math.abs(v) < 0.005 ? 0 : v).toFixed(2);
  console.log(
    "| file | CPU | date (UTC) | quantile | Conveyor ms | best peer ms | met | reps lower |",
  );
  console.log("| --- | --- | --- | --- | --: | --- | --- | --: |");
  for (const r of rows) {
    console.log(
      `| ${r.file} | ${r.cpu} | ${r.date} | ${r.q} | ${ms(r.conveyor)} | ${ms(r.peer)} (${r.peerId}) | ${r.conveyor <= r.peer ? "yes" : "no"} | ${r.repsLower} of ${r.reps} |`,
    );
  }
  console.log();
  for (const cpu of new Set(rows.map((r) => r.cpu))) {
    for (const q of ["p50", "p99"] as const) {
      const at = rows.filter((r) => r.cpu === cpu && r.q === q);
      if (at.length === 0) continue;
      const sum = (f: (r: LatencyRow) => number) => at.reduce((n, r) => n + f(r), 0);
      const diff = at.map((r) => r.conveyor - r.peer);
      console.log(
        `- ${cpu}, 1,000/s ${q}, ${at.length} files: met in ${at.filter((r) => r.conveyor <= r.peer).length}; ` +
          `Conveyor lower in ${sum((r) => r.repsLower)} of ${sum((r) => r.reps)} repetitions; ` +
          `Conveyor − best peer ${ms(Math.min(...diff))} to ${ms(Math.max(...diff))} ms (median ${ms(median(diff))}).`,
      );
    }
  }
}

if (opt.latency) latency();
else throughput();
