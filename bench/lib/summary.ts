// From the raw runs of a results file to the figures the README shows:
// medians over repetitions, each system's best setting per size, ratios
// between systems of the same run, and the project's targets.
import type { Result, RssSample, Scenario, SettingValues, SystemId } from "./protocol.ts";
import { median, round } from "./stats.ts";

export interface RunRecord {
  phase: "throughput" | "ledger" | "latency" | "enqueue" | "scale" | "rss";
  scenario: Scenario;
  system: SystemId;
  setting: string;
  settings: SettingValues;
  params: {
    n: number;
    ledger?: boolean;
    finishedRows?: number;
    rate?: number;
    warmup?: number;
    enqueueMode?: "single" | "batched";
    batchSize?: number;
  };
  rep: number;
  /** skipped: a smaller N of the same setting predicted a run longer than the budget. */
  status: "ok" | "error" | "timeout" | "skipped";
  result?: Result;
  error?: string;
  wallMs: number;
  childCpuMs?: number;
  loadavgBefore: number;
}

export interface SettingFigure {
  setting: string;
  median: number;
  values: number[];
  /** Median CPU time of the measuring process per job, in µs (throughput runs). */
  cpuUsPerJob: number;
  /** Median CPU time of the PostgreSQL cluster per job, in µs (throughput runs on PostgreSQL). */
  serverCpuUsPerJob: number;
  failed: number;
}

export interface SystemFigure {
  best?: SettingFigure;
  settings: SettingFigure[];
}

/** A run that finished and recorded its figures. */
export const ok = (r: RunRecord) => r.status === "ok" && r.result !== undefined;

function bySetting(runs: RunRecord[], value: (r: Result) => number | undefined): SettingFigure[] {
  const groups = new Map<string, RunRecord[]>();
  for (const r of runs) groups.set(r.setting, [...(groups.get(r.setting) ?? []), r]);
  return [...groups.entries()].map(([setting, rs]) => {
    const values = rs
      .filter(ok)
      .map((r) => value(r.result as Result))
      .filter((v): v is number => typeof v === "number" && Number.isFinite(v));
    const perJob = (ms: (r: Result) => number | undefined) => {
      const us = rs
        .filter(ok)
        .map((r) => (ms(r.result as Result) ?? Number.NaN) * (1000 / r.params.n))
        .filter(Number.isFinite);
      return us.length ? median(us) : Number.NaN;
    };
    return {
      setting,
      median: values.length ? median(values) : Number.NaN,
      values,
      cpuUsPerJob: perJob((r) => r.cpuMs),
      serverCpuUsPerJob: perJob((r) => r.serverCpuMs),
      failed: rs.filter((r) => !ok(r)).length,
    };
  });
}

/** Per system: every setting's median jobs/s and the best one. */
export function throughputTable(
  runs: RunRecord[],
  phase: "throughput" | "ledger",
  n: number,
): Map<SystemId, SystemFigure> {
  const out = new Map<SystemId, SystemFigure>();
  const sel = runs.filter((r) => r.phase === phase && r.params.n === n);
  for (const system of new Set(sel.map((r) => r.system))) {
    const settings = bySetting(
      sel.filter((r) => r.system === system),
      (x) => x.jobsPerSec,
    );
    const best = settings
      .filter((s) => Number.isFinite(s.median))
      .sort((a, b) => b.median - a.median)[0];
    out.set(system, { best, settings });
  }
  return out;
}

export function bestSetting(runs: RunRecord[], system: SystemId, n: number): string | undefined {
  return throughputTable(runs, "throughput", n).get(system)?.best?.setting;
}

export interface LatencyFigure {
  setting: string;
  p50: number;
  p95: number;
  p99: number;
  max: number;
  /** From the enqueue call's return (commit acknowledged). */
  ackP50: number;
  ackP99: number;
  achievedRate: number;
  reps: number;
  failed: number;
}

export function latencyTable(runs: RunRecord[], rate: number): Map<SystemId, LatencyFigure> {
  const out = new Map<SystemId, LatencyFigure>();
  const sel = runs.filter((r) => r.phase === "latency" && r.params.rate === rate);
  for (const system of new Set(sel.map((r) => r.system))) {
    const rs = sel.filter((r) => r.system === system);
    const good = rs.filter(ok).map((r) => r.result as Result);
    const m = (f: (x: Result) => number | undefined) =>
      median(good.map(f).filter((v): v is number => typeof v === "number"));
    out.set(system, {
      setting: rs[0]?.setting ?? "",
      p50: m((x) => x.p50),
      p95: m((x) => x.p95),
      p99: m((x) => x.p99),
      max: m((x) => x.max),
      ackP50: m((x) => x.fromAck?.p50),
      ackP99: m((x) => x.fromAck?.p99),
      achievedRate: m((x) => x.achievedRate),
      reps: good.length,
      failed: rs.length - good.length,
    });
  }
  return out;
}

export interface EnqueueFigure {
  jobsPerSec: number;
  p50?: number;
  p99?: number;
  reps: number;
  failed: number;
}

export function enqueueTable(
  runs: RunRecord[],
  mode: "single" | "batched",
): Map<SystemId, EnqueueFigure> {
  const out = new Map<SystemId, EnqueueFigure>();
  const sel = runs.filter((r) => r.phase === "enqueue" && r.params.enqueueMode === mode);
  for (const system of new Set(sel.map((r) => r.system))) {
    const rs = sel.filter((r) => r.system === system);
    const good = rs.filter(ok).map((r) => r.result as Result);
    const m = (f: (x: Result) => number | undefined) =>
      median(good.map(f).filter((v): v is number => typeof v === "number"));
    out.set(system, {
      jobsPerSec: m((x) => x.jobsPerSec),
      ...(mode === "single" ? { p50: m((x) => x.p50), p99: m((x) => x.p99) } : {}),
      reps: good.length,
      failed: rs.length - good.length,
    });
  }
  return out;
}

export function scaleFigure(runs: RunRecord[]) {
  const sel = runs.filter((r) => r.phase === "scale");
  if (sel.length === 0) return undefined;
  const withRows = sel.filter((r) => (r.params.finishedRows ?? 0) > 0);
  const without = sel.filter((r) => !r.params.finishedRows);
  const m = (rs: RunRecord[]) =>
    median(rs.filter(ok).map((r) => (r.result as Result).jobsPerSec as number));
  const a = m(withRows);
  const b = m(without);
  return {
    setting: sel[0]?.setting ?? "",
    n: sel[0]?.params.n ?? 0,
    finishedRows: withRows[0]?.params.finishedRows ?? 0,
    withFinished: a,
    without: b,
    ratio: a / b,
    failed: sel.filter((r) => !ok(r)).length,
  };
}

export interface RssFigure {
  setting: string;
  backlog: number;
  maxRssMb: number;
  slopeMbPerMin: number;
  slopeMbPer100k: number;
  jobsPerSec: number;
  curve: RssSample[];
  reps: number;
  failed: number;
}

export function rssFigure(runs: RunRecord[]): RssFigure | undefined {
  const sel = runs.filter((r) => r.phase === "rss");
  if (sel.length === 0) return undefined;
  const res = sel.filter(ok).map((r) => r.result as Result);
  const maxes = res.map((x) => x.maxRssMb as number);
  const m = median(maxes);
  // The run whose peak is closest to the median peak, for the curve.
  let representative: Result | undefined;
  for (const x of res) {
    if (
      !representative ||
      Math.abs((x.maxRssMb as number) - m) < Math.abs((representative.maxRssMb as number) - m)
    )
      representative = x;
  }
  return {
    setting: sel[0]?.setting ?? "",
    backlog: sel[0]?.params.n ?? 0,
    maxRssMb: m,
    slopeMbPerMin: median(res.map((x) => x.rssSlopeMbPerMin as number)),
    slopeMbPer100k: median(res.map((x) => x.rssSlopeMbPer100k as number)),
    jobsPerSec: median(res.map((x) => x.jobsPerSec as number)),
    curve: representative?.rss ?? [],
    reps: res.length,
    failed: sel.length - res.length,
  };
}

/**
 * "Flat": the growth the fitted slope projects over the whole backlog is under
 * 10% of the peak, so a larger backlog would not have pushed RSS much higher.
 */
export function rssIsFlat(r: { slopeMbPer100k: number; backlog: number; maxRssMb: number }) {
  return (r.slopeMbPer100k * r.backlog) / 100_000 < 0.1 * r.maxRssMb;
}

export const PEERS: SystemId[] = [
  "graphile-worker",
  "pg-boss",
  "bullmq-redis",
  "bullmq-redis-aof",
  "bullmq-postgres",
];

/** The peers that keep their jobs in PostgreSQL, as Conveyor does. */
export const POSTGRES_PEERS: SystemId[] = ["graphile-worker", "pg-boss", "bullmq-postgres"];

export interface Target {
  name: string;
  goal: string;
  measured: string;
  met: boolean | undefined;
}

const fmt = (v: number, digits = 0) =>
  Number.isFinite(v) ? round(v, digits).toLocaleString("en-US") : "n/a";

/**
 * A measured ratio shown against its goal: rounded down to `digits`, so an
 * unmet target never prints as its goal (0.6964 of a 70% target is 69.6%,
 * not 70%); a met one still prints at least the goal, which these digits
 * hold exactly.
 */
export const fmtDown = (v: number, digits: number) =>
  Number.isFinite(v)
    ? (Math.floor(v * 10 ** digits) / 10 ** digits).toLocaleString("en-US", {
        minimumFractionDigits: digits,
        maximumFractionDigits: digits,
      })
    : "n/a";

/**
 * The no-op throughput figures the targets compare, at one size: each
 * system's best setting's median jobs/s (NaN where the file has none), and
 * the fastest peer.
 */
export function noopFigures(runs: RunRecord[], n: number) {
  const t = throughputTable(runs, "throughput", n);
  const best = (id: SystemId) => t.get(id)?.best?.median ?? Number.NaN;
  const bestPeer = PEERS.map((p) => ({ p, v: best(p) }))
    .filter((x) => Number.isFinite(x.v))
    .sort((a, b) => b.v - a.v)[0];
  return {
    conveyor: best("conveyor"),
    ceiling: best("bare-sql"),
    /** The bare loop on Conveyor's own statements: no worker pool. */
    statements: best("bare-sql-conveyor-schema"),
    bestPeer,
  };
}

/** The no-op throughput targets: Conveyor ÷ the best peer, and ÷ the ceiling. */
export const PEER_RATIO_GOAL = 1.5;
export const CEILING_RATIO_GOAL = 0.7;
/** The same goals as the tables print them: "1.5×" and "70%". */
export const PEER_RATIO_LABEL = `${PEER_RATIO_GOAL}×`;
export const CEILING_RATIO_LABEL = `${Math.round(CEILING_RATIO_GOAL * 100)}%`;

/**
 * The system of `ids` with the lowest `q` in a latency table (one rate), and
 * that figure: what the 1,000/s target compares Conveyor with.
 */
export function fastestPeer(
  table: Map<SystemId, LatencyFigure>,
  q: "p50" | "p99",
  ids: SystemId[],
): { p: SystemId; v: number } | undefined {
  return ids
    .map((p) => ({ p, v: table.get(p)?.[q] ?? Number.NaN }))
    .filter((x) => Number.isFinite(x.v))
    .sort((a, b) => a.v - b.v)[0];
}

/** The targets of the benchmark issue, evaluated on this results file. */
export function targets(runs: RunRecord[], sizes: number[]): Target[] {
  const out: Target[] = [];
  for (const n of sizes.filter((s) => s >= 10_000)) {
    const { conveyor, ceiling, bestPeer } = noopFigures(runs, n);
    const r1 = bestPeer ? conveyor / bestPeer.v : Number.NaN;
    out.push({
      name: `no-op throughput, N=${fmt(n)}, vs best peer`,
      goal: `≥ ${PEER_RATIO_LABEL}`,
      measured: bestPeer ? `${fmtDown(r1, 2)}× (${bestPeer.p})` : "n/a",
      met: Number.isFinite(r1) ? r1 >= PEER_RATIO_GOAL : undefined,
    });
    const r2 = conveyor / ceiling;
    out.push({
      name: `no-op throughput, N=${fmt(n)}, vs bare SQL ceiling`,
      goal: `≥ ${CEILING_RATIO_LABEL}`,
      measured: Number.isFinite(r2) ? `${fmtDown(r2 * 100, 1)}%` : "n/a",
      met: Number.isFinite(r2) ? r2 >= CEILING_RATIO_GOAL : undefined,
    });
  }
  const ledgerSizes = [...new Set(runs.filter((r) => r.phase === "ledger").map((r) => r.params.n))];
  for (const n of ledgerSizes) {
    const v = throughputTable(runs, "ledger", n).get("conveyor")?.best?.median ?? Number.NaN;
    out.push({
      name: `ledger insert per job in ctx.transaction, N=${fmt(n)}`,
      goal: "≥ 8,000 jobs/s",
      measured: `${fmt(v)} jobs/s`,
      met: Number.isFinite(v) ? v >= 8_000 : undefined,
    });
  }
  const lat = latencyTable(runs, 100).get("conveyor");
  if (lat) {
    out.push({
      name: "latency at 100 jobs/s, p50",
      goal: "≤ 2 ms",
      measured: `${fmt(lat.p50, 2)} ms`,
      met: Number.isFinite(lat.p50) ? lat.p50 <= 2 : undefined,
    });
    out.push({
      name: "latency at 100 jobs/s, p99",
      goal: "≤ 10 ms",
      measured: `${fmt(lat.p99, 2)} ms`,
      met: Number.isFinite(lat.p99) ? lat.p99 <= 10 : undefined,
    });
  }
  const fast = latencyTable(runs, 1_000);
  const ours = fast.get("conveyor");
  if (ours) {
    for (const q of ["p50", "p99"] as const) {
      const peer = fastestPeer(fast, q, PEERS);
      const onPostgres = fastestPeer(fast, q, POSTGRES_PEERS);
      out.push({
        name: `latency at 1,000 jobs/s, ${q}, vs best peer`,
        goal: "≤ best peer",
        measured: peer
          ? `${fmt(ours[q], 2)} ms vs ${fmt(peer.v, 2)} ms (${peer.p})` +
            (onPostgres && onPostgres.p !== peer.p
              ? `; best on PostgreSQL ${fmt(onPostgres.v, 2)} ms (${onPostgres.p})`
              : "")
          : "n/a",
        met: peer && Number.isFinite(ours[q]) ? ours[q] <= peer.v : undefined,
      });
    }
  }
  const sc = scaleFigure(runs);
  if (sc) {
    out.push({
      name: `throughput with ${fmt(sc.finishedRows)} finished rows vs without`,
      goal: "≥ 80%",
      measured: `${fmtDown(sc.ratio * 100, 1)}%`,
      met: Number.isFinite(sc.ratio) ? sc.ratio >= 0.8 : undefined,
    });
  }
  const rss = rssFigure(runs);
  if (rss && rss.reps > 0) {
    out.push({
      name: `worker RSS through a ${fmt(rss.backlog)}-job backlog`,
      goal: "flat, < 200 MB",
      measured: `max ${fmt(rss.maxRssMb)} MB, slope ${fmt(rss.slopeMbPer100k, 2)} MB per 100k jobs`,
      met: Number.isFinite(rss.maxRssMb) ? rss.maxRssMb < 200 && rssIsFlat(rss) : undefined,
    });
  }
  return out;
}
