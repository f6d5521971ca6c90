// `npm run bench` (full profile) and `npm run bench:quick` (small sizes, one
// repetition). Starts its own PostgreSQL cluster, runs every measurement in
// its own process with a hard time limit against a freshly created database
// (and a flushed Redis db), and writes every raw result to
// results/benchmarks-<date>.json. The full profile then renders the tables
// into bench/README.md (bench/render.ts does the same from any results file).
//
// Options: --quick, --reps N, --only sys1,sys2, --phases throughput,latency,...,
//          --sizes 500,10000 (no-op throughput sizes), --ledger-sizes 10000,
//          --rss-backlog N, --setting NAME,SYSTEM=NAME (Conveyor's setting,
//          and other systems', for the latency, scale and rss phases instead
//          of each one's best no-op one),
//          --out FILE, --render / --no-render, --profile (Bun CPU profiles of
//          Conveyor runs into bench/.profiles/), --redis-url URL, --dry-run
//          (print what would run, as JSON, and run nothing).
import { existsSync, mkdirSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { parseArgs } from "node:util";
import { RUNTIME_ENV, withRuntimeEnv } from "../src/runtime.ts";
import { choices, positiveInt, positiveInts } from "./lib/args.ts";
import { extraJscOptions, findNode, machine, ROOT, versions } from "./lib/environment.ts";
import { RESULT_PREFIX, type Result, type SettingValues, type Task } from "./lib/protocol.ts";
import {
  type BenchPostgres,
  type BenchRedis,
  connectRedis,
  PG_SETTINGS,
  startBenchPostgres,
  startDurableRedis,
} from "./lib/services.ts";
import { bestSetting, type RunRecord } from "./lib/summary.ts";
import { FULL, type Profile, QUICK, SYSTEMS, type SystemSpec, timeLimitMs } from "./plan.ts";
import { renderMarkdown, writeReadme } from "./render.ts";

/** Bun children's environment: the daemon's runtime settings, unless ours sets them. */
const BUN_CHILD_ENV = withRuntimeEnv(process.env);

const PHASES = ["throughput", "ledger", "latency", "enqueue", "scale", "rss"] as const;
type Phase = (typeof PHASES)[number];

const { values: opt } = parseArgs({
  options: {
    quick: { type: "boolean", default: false },
    reps: { type: "string" },
    only: { type: "string" },
    sizes: { type: "string" },
    "ledger-sizes": { type: "string" },
    "rss-backlog": { type: "string" },
    setting: { type: "string" },
    phases: { type: "string" },
    out: { type: "string" },
    render: { type: "boolean" },
    profile: { type: "boolean", default: false },
    "dry-run": { type: "boolean", default: false },
    "redis-url": {
      type: "string",
      default: process.env.BENCH_REDIS_URL ?? "redis://127.0.0.1:6379/5",
    },
  },
  allowNegative: true,
});

const profile: Profile = { ...(opt.quick ? QUICK : FULL) };
if (opt.reps !== undefined) profile.reps = positiveInt("reps", opt.reps);
if (opt.sizes !== undefined) profile.throughputN = positiveInts("sizes", opt.sizes);
if (opt["ledger-sizes"] !== undefined) {
  profile.ledgerN = positiveInts("ledger-sizes", opt["ledger-sizes"]);
}
if (opt["rss-backlog"] !== undefined) {
  profile.rssBacklog = positiveInt("rss-backlog", opt["rss-backlog"]);
}
// A misspelt system or phase stops the run with the name, instead of
// leaving it out and measuring the rest as if nothing were missing.
const only =
  opt.only !== undefined
    ? new Set(
        choices(
          "only",
          opt.only,
          SYSTEMS.map((s) => s.id),
        ),
      )
    : undefined;
const phases = new Set<Phase>(
  opt.phases !== undefined ? choices("phases", opt.phases, PHASES) : PHASES,
);
const systems = SYSTEMS.filter((s) => !only || only.has(s.id));
const givenSettings =
  opt.setting !== undefined ? parseSettings(opt.setting) : new Map<string, string>();
// The latency phase runs every system, and scale and memory run Conveyor, at
// its best throughput setting at profile.referenceN (reference(), below):
// the configuration the targets are about, and the one the peers' figures
// stand for. With no throughput run at that size to find it, it would
// silently be the first setting in bench/plan.ts instead, so it must be given.
const findsBest = phases.has("throughput") && profile.throughputN.includes(profile.referenceN);
if (!findsBest) {
  const needing = systems.filter(
    (s) =>
      !givenSettings.has(s.id) &&
      ((phases.has("latency") && s.latency) ||
        (s.id === "conveyor" && (phases.has("scale") || phases.has("rss")))),
  );
  if (needing.length > 0) {
    throw new Error(
      `--setting: required for ${needing.map((s) => `${s.id} (${Object.keys(s.settings).join(", ")})`).join("; ")}: ${[...phases].filter((p) => ["latency", "scale", "rss"].includes(p)).join(", ")} without a throughput run at N = ${profile.referenceN}, which would pick each one's best setting; e.g. --setting c4000-b2000,bullmq-redis=c200`,
    );
  }
}

/**
 * `--setting`: a comma-separated list of `system=setting`, or a bare setting
 * for Conveyor. Each must be one of that system's settings in bench/plan.ts.
 */
function parseSettings(value: string): Map<string, string> {
  const out = new Map<string, string>();
  for (const part of value.split(",")) {
    const item = part.trim();
    const eq = item.indexOf("=");
    const id = eq < 0 ? "conveyor" : item.slice(0, eq);
    const name = eq < 0 ? item : item.slice(eq + 1);
    const spec = SYSTEMS.find((s) => s.id === id);
    if (spec === undefined) {
      throw new Error(
        `--setting ${value}: ${id} is not one of ${SYSTEMS.map((s) => s.id).join(", ")}`,
      );
    }
    if (!(name in spec.settings)) {
      throw new Error(
        `--setting ${value}: ${id} has no setting ${name} (bench/plan.ts: ${Object.keys(spec.settings).join(", ")})`,
      );
    }
    out.set(id, name);
  }
  return out;
}
const render = opt.render ?? profile.name === "full";

function resultsPath(): string {
  if (opt.out) return path.resolve(opt.out);
  const date = new Date().toISOString().slice(0, 10);
  // Quick runs are for development and never committed: they go to an ignored folder.
  const dir =
    profile.name === "quick" ? path.join(ROOT, "bench", ".results") : path.join(ROOT, "results");
  const base = `benchmarks-${date}${profile.name === "quick" ? "-quick" : ""}`;
  let file = path.join(dir, `${base}.json`);
  for (let i = 2; existsSync(file); i++) file = path.join(dir, `${base}-${i}.json`);
  return file;
}

const log = (line: string) => process.stderr.write(`${line}\n`);
const fmt = (v: number | undefined) =>
  v === undefined || !Number.isFinite(v) ? "n/a" : Math.round(v).toLocaleString("en-US");

/** The durable-commit floor at each latency phase's rate (only if that phase runs). */
async function commitsAtRates(pg: BenchPostgres, p: Profile) {
  const out: Record<string, { p50: number; p99: number }> = {};
  if (!phases.has("latency")) return out;
  for (const { rate, n } of p.latency) out[String(rate)] = await pg.commitLatencyAt(rate, n);
  return out;
}

async function main() {
  const node = findNode();
  const file = resultsPath();
  mkdirSync(path.dirname(file), { recursive: true });
  log(
    `bench: ${profile.name} profile, ${profile.reps} repetition(s) -> ${path.relative(ROOT, file)}`,
  );
  const load = os.loadavg()[0] ?? 0;
  if (load > 0.5) {
    log(`warning: load average ${load.toFixed(2)} before starting; figures will be noisy`);
  }

  const pg = await startBenchPostgres();
  const notes: string[] = [];
  let machineRedis: BenchRedis | undefined;
  let durableRedis: BenchRedis | undefined;
  try {
    machineRedis = await connectRedis(opt["redis-url"] as string);
  } catch (error) {
    notes.push(`machine Redis at ${opt["redis-url"]} unavailable: ${String(error)}`);
  }
  try {
    durableRedis = await startDurableRedis();
    if (!durableRedis)
      notes.push("redis-server not installed: no BullMQ run with appendfsync always");
  } catch (error) {
    notes.push(`could not start a private redis-server: ${String(error)}`);
  }
  if (!node) notes.push("no Node >= 22.18 found: peers were not run");

  const doc = {
    schema: 1,
    date: new Date().toISOString(),
    profile: profile.name,
    reps: profile.reps,
    plan: profile,
    // Settings chosen with --setting instead of each system's best no-op one.
    ...(givenSettings.size > 0 ? { givenSettings: Object.fromEntries(givenSettings) } : {}),
    machine: machine(),
    versions: versions(node?.version),
    postgres: {
      version: await pg.version(),
      settings: PG_SETTINGS,
      commitLatencyMs: await pg.commitLatency(),
      commitLatencyAtRateMs: await commitsAtRates(pg, profile),
    },
    redis: {
      machine: machineRedis ? { url: machineRedis.url, ...(await machineRedis.describe()) } : null,
      durable: durableRedis ? { ...(await durableRedis.describe()) } : null,
    },
    // Environment added to every Bun child (Conveyor and the bare loops), as
    // the daemon sets it for itself; a value in our own environment wins.
    bunEnv: Object.fromEntries(
      Object.keys(RUNTIME_ENV).map((k) => [k, BUN_CHILD_ENV[k] as string]),
    ),
    // JavaScriptCore options our own environment passes on to the Bun
    // children (BUN_JSC_*) beyond what the daemon sets itself: none in a
    // plain run; a run made with some is not one of the engine as it
    // ships, and says so.
    jscOptions: extraJscOptions(BUN_CHILD_ENV, RUNTIME_ENV),
    notes,
    runs: [] as RunRecord[],
  };
  const save = () => writeFileSync(file, `${JSON.stringify(doc, null, 2)}\n`);
  save();

  const redisFor = (spec: SystemSpec) =>
    spec.redis === "machine" ? machineRedis : spec.redis === "durable" ? durableRedis : undefined;

  async function measure(
    spec: SystemSpec,
    phase: Phase,
    scenario: Task["scenario"],
    setting: string,
    settings: SettingValues,
    params: RunRecord["params"],
    rep: number,
    label: string,
  ): Promise<RunRecord> {
    const base = {
      phase,
      scenario,
      system: spec.id,
      setting,
      settings,
      params,
      rep,
      loadavgBefore: os.loadavg()[0] ?? 0,
    };
    const redis = redisFor(spec);
    const record = (r: Omit<RunRecord, keyof typeof base>): RunRecord => {
      const rec = { ...base, ...r } as RunRecord;
      doc.runs.push(rec);
      save();
      return rec;
    };
    if (spec.redis && !redis)
      return record({ status: "error", error: "Redis unavailable", wallMs: 0 });
    if (spec.runtime === "node" && !node) {
      return record({ status: "error", error: "no Node >= 22.18", wallMs: 0 });
    }
    await pg.reset();
    await redis?.reset();
    const task: Task = {
      system: spec.id,
      scenario,
      setting,
      settings,
      databaseUrl: pg.url,
      ...(redis ? { redisUrl: redis.url } : {}),
      ...params,
    };
    const script = path.join(ROOT, "bench", "systems", spec.file);
    const cmd =
      spec.runtime === "bun"
        ? [
            process.execPath,
            ...(opt.profile && spec.id === "conveyor"
              ? [
                  "--cpu-prof",
                  "--cpu-prof-md",
                  `--cpu-prof-dir=${path.join(ROOT, "bench", ".profiles", `${phase}-${setting}-n${params.n}${params.rate ? `-r${params.rate}` : ""}`)}`,
                ]
              : []),
            script,
          ]
        : [(node as { bin: string }).bin, "--disable-warning=ExperimentalWarning", script];
    const limit = timeLimitMs(params.n);
    const started = performance.now();
    const proc = Bun.spawn(cmd, {
      cwd: ROOT,
      env: {
        ...(spec.runtime === "bun" ? BUN_CHILD_ENV : process.env),
        BENCH_TASK: JSON.stringify(task),
      },
      stdout: "pipe",
      stderr: "pipe",
      timeout: limit,
      killSignal: "SIGKILL",
    });
    const [stdout, stderr] = await Promise.all([
      new Response(proc.stdout).text(),
      new Response(proc.stderr).text(),
      proc.exited,
    ]);
    const wallMs = Math.round(performance.now() - started);
    const usage = proc.resourceUsage();
    const childCpuMs = usage
      ? Math.round(Number(usage.cpuTime.user + usage.cpuTime.system) / 1000)
      : undefined;
    const line = stdout.split("\n").find((l) => l.startsWith(RESULT_PREFIX));
    let rec: RunRecord;
    if (proc.signalCode === "SIGKILL" && wallMs >= limit) {
      rec = record({ status: "timeout", error: `killed after ${limit} ms`, wallMs, childCpuMs });
    } else if (proc.exitCode !== 0 || !line) {
      const tail = stderr.trim().split("\n").slice(-15).join("\n");
      rec = record({ status: "error", error: tail || `exit ${proc.exitCode}`, wallMs, childCpuMs });
    } else {
      const result = JSON.parse(line.slice(RESULT_PREFIX.length)) as Result;
      rec = record({ status: "ok", result, wallMs, childCpuMs });
    }
    const r = rec.result;
    const what =
      rec.status !== "ok"
        ? `${rec.status.toUpperCase()}: ${(rec.error ?? "").split("\n").slice(-1)[0]}`
        : scenario === "latency"
          ? `p50 ${r?.p50?.toFixed(2)} ms, p99 ${r?.p99?.toFixed(2)} ms`
          : scenario === "rss"
            ? `${fmt(r?.jobsPerSec)} jobs/s, max RSS ${r?.maxRssMb} MB`
            : `${fmt(r?.jobsPerSec)} jobs/s`;
    log(`  ${label} ${spec.id} [${setting}] rep ${rep}: ${what} (${(wallMs / 1000).toFixed(1)} s)`);
    return rec;
  }

  const reps = Array.from({ length: profile.reps }, (_, i) => i + 1);
  /** Seconds a run of `n` would take at the best rate this setting reached at a smaller N. */
  const predictedSeconds = (system: string, setting: string, n: number): number | undefined => {
    const rates = doc.runs
      .filter(
        (r) =>
          r.phase === "throughput" &&
          r.system === system &&
          r.setting === setting &&
          r.status === "ok" &&
          (r.params.n ?? 0) < n &&
          (r.params.n ?? 0) >= 5_000,
      )
      .map((r) => r.result?.jobsPerSec ?? 0);
    return rates.length > 0 ? n / Math.max(...rates) : undefined;
  };
  const conveyor = systems.find((s) => s.id === "conveyor");
  const reference = (spec: SystemSpec) =>
    givenSettings.get(spec.id) ??
    bestSetting(doc.runs, spec.id, profile.referenceN) ??
    Object.keys(spec.settings)[0] ??
    "";

  // Repetitions are the outer loop, so drift on the machine spreads over
  // every system instead of landing on one.
  if (phases.has("throughput")) {
    log("throughput: no-op jobs, pre-enqueued");
    for (const rep of reps)
      for (const n of profile.throughputN)
        for (const spec of systems.filter((s) => s.throughput !== false))
          for (const [name, values] of Object.entries(spec.settings)) {
            // A setting that managed only a few hundred jobs/s at a smaller N
            // would spend minutes per repetition at 100,000; its rate is known.
            const predicted = predictedSeconds(spec.id, name, n);
            if (predicted !== undefined && predicted > SLOW_RUN_BUDGET_S) {
              doc.runs.push({
                phase: "throughput",
                scenario: "throughput",
                system: spec.id,
                setting: name,
                settings: values,
                params: { n },
                rep,
                loadavgBefore: os.loadavg()[0] ?? 0,
                status: "skipped",
                error: `predicted ${Math.round(predicted)} s from its rate at a smaller N (budget ${SLOW_RUN_BUDGET_S} s)`,
                wallMs: 0,
              } as RunRecord);
              save();
              log(
                `  n=${n} ${spec.id} [${name}] rep ${rep}: SKIPPED (predicted ${Math.round(predicted)} s)`,
              );
              continue;
            }
            await measure(spec, "throughput", "throughput", name, values, { n }, rep, `n=${n}`);
          }
  }
  if (phases.has("ledger")) {
    log("ledger: one ledger insert per job in the job's completion transaction");
    for (const rep of reps)
      for (const n of profile.ledgerN)
        for (const spec of systems.filter((s) => s.ledgerSettings))
          for (const [name, values] of Object.entries(spec.ledgerSettings ?? {}))
            await measure(
              spec,
              "ledger",
              "throughput",
              name,
              values,
              { n, ledger: true },
              rep,
              `n=${n}`,
            );
  }
  if (phases.has("latency")) {
    log(
      `latency: enqueue-to-start, each system at its best setting for n=${profile.referenceN}${givenSettings.size > 0 ? ` or as --setting gives it` : ""}`,
    );
    for (const rep of reps)
      for (const l of profile.latency)
        for (const spec of systems.filter((s) => s.latency)) {
          const name = reference(spec);
          await measure(
            spec,
            "latency",
            "latency",
            name,
            spec.settings[name] ?? {},
            { n: l.n, rate: l.rate, warmup: l.warmup },
            rep,
            `${l.rate}/s`,
          );
        }
  }
  if (phases.has("enqueue")) {
    log("enqueue: direct client inserts");
    for (const rep of reps)
      for (const mode of ["single", "batched"] as const)
        for (const spec of systems.filter((s) => s.enqueue)) {
          const n = mode === "single" ? profile.enqueueSingleN : profile.enqueueBatched.n;
          const first = Object.entries(spec.settings)[0] ?? ["default", {}];
          await measure(
            spec,
            "enqueue",
            "enqueue",
            first[0],
            first[1],
            {
              n,
              enqueueMode: mode,
              ...(mode === "batched" ? { batchSize: profile.enqueueBatched.batchSize } : {}),
            },
            rep,
            mode,
          );
        }
  }
  if (conveyor && phases.has("scale")) {
    const name = reference(conveyor);
    const { n, finishedRows } = profile.scale;
    log(`scale: Conveyor at n=${n} with ${finishedRows} completed rows in the table, and without`);
    for (const rep of reps)
      for (const rows of [finishedRows, 0])
        await measure(
          conveyor,
          "scale",
          "throughput",
          name,
          conveyor.settings[name] ?? {},
          { n, ...(rows ? { finishedRows: rows } : {}) },
          rep,
          `rows=${rows}`,
        );
  }
  if (conveyor && phases.has("rss")) {
    const name = reference(conveyor);
    log(`rss: one Conveyor worker through a ${profile.rssBacklog}-job backlog`);
    for (const rep of reps)
      await measure(
        conveyor,
        "rss",
        "rss",
        name,
        conveyor.settings[name] ?? {},
        { n: profile.rssBacklog },
        rep,
        `backlog=${profile.rssBacklog}`,
      );
  }

  await machineRedis?.stop();
  await durableRedis?.stop();
  await pg.stop();
  log(`raw results: ${path.relative(ROOT, file)}`);
  const md = renderMarkdown(doc);
  if (render) {
    writeReadme(doc, path.relative(path.join(ROOT, "bench"), file));
    log("rendered into bench/README.md and bench/throughput.svg");
  } else {
    process.stdout.write(`${md}\n`);
  }
}

// Ctrl-C: exit through the exit handlers, which stop Postgres and the private Redis.
/** A throughput run predicted to take longer than this is skipped and recorded as such. */
const SLOW_RUN_BUDGET_S = 60;

for (const signal of ["SIGINT", "SIGTERM"] as const) process.on(signal, () => process.exit(130));
if (opt["dry-run"]) {
  // What this command would measure, after every check above, and nothing run.
  console.log(
    JSON.stringify({
      profile,
      systems: systems.map((s) => s.id),
      phases: [...phases],
      givenSettings: Object.fromEntries(givenSettings),
    }),
  );
} else {
  await main();
}
process.exit(0);
