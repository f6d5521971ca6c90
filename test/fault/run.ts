// The fault-injection suite: real daemon processes (main.ts start) over a
// Postgres cluster this suite owns, a workload with a database effect and an
// external effect, a nemesis that crashes, pauses, restarts and partitions,
// and a checker that reads the final state.
//
//   bun test/fault/run.ts [--profile ci|full] [--scenario NAME] [--seed N]
//
// Exits non-zero when any scenario loses a job, applies an effect twice,
// applies a stale write, or (for SIGSTOP) never exercised the fence.

import { chmod, mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { cpus, tmpdir, totalmem } from "node:os";
import path from "node:path";
import { parseArgs } from "node:util";
import { type Subprocess, spawn } from "bun";
import postgres from "postgres";
import pkg from "../../package.json" with { type: "json" };
import type { Pool } from "../../src/db/db.ts";
import { migrate } from "../../src/db/migrate.ts";
import { type EmbeddedCluster, startEmbeddedPostgres } from "../../src/embedded-postgres.ts";
import { type EnqueueInput, enqueueMany } from "../../src/enqueue.ts";
import { drain } from "../daemon-process.ts";
import { check, MUST_BE_ZERO, type Verdict } from "./checker.ts";
import { type FaultProxy, startProxy } from "./proxy.ts";
import { type Rng, rng } from "./rng.ts";
import { type Sink, startSink } from "./sink.ts";

const ROOT = path.resolve(import.meta.dir, "../..");
const DAEMONS = 3;
const LEASE_MS = 2_000;

interface Profile {
  jobs: number;
  /** How long the nemesis runs, at least; it also runs until every job was enqueued. */
  faultMs: number;
  settleMs: number;
}
const PROFILES: Record<string, Profile> = {
  ci: { jobs: 2_000, faultMs: 15_000, settleMs: 120_000 },
  full: { jobs: 10_000, faultMs: 45_000, settleMs: 300_000 },
};

type FaultName = "kill9" | "sigstop" | "pgRestart" | "pgKill9" | "terminate" | "network";
const SCENARIOS: Record<string, FaultName[]> = {
  "kill-9": ["kill9"],
  sigstop: ["sigstop"],
  "pg-restart": ["pgRestart", "pgKill9"],
  "pg-terminate": ["terminate"],
  network: ["network"],
  combined: ["kill9", "sigstop", "pgRestart", "pgKill9", "terminate", "network"],
};

interface Daemon {
  index: number;
  proc: Subprocess<"ignore", "ignore", "pipe"> | undefined;
  stopped: boolean;
  /** The current process's last log lines, printed if it does not stop when told. */
  tail: string[];
}

const TAIL_LINES = 20;

interface Counters {
  staleRejected: number;
  leaseLost: number;
  faults: Record<string, number>;
}

const log = (msg: string) => process.stderr.write(`[fault] ${msg}\n`);

/** The commit the run measured, with "+dirty" when the tree had changes. */
function gitCommit(): string | undefined {
  const rev = Bun.spawnSync(["git", "rev-parse", "HEAD"], { cwd: ROOT });
  if (rev.exitCode !== 0) return undefined;
  const dirty = Bun.spawnSync(["git", "status", "--porcelain", "--untracked-files=no"], {
    cwd: ROOT,
  });
  return `${rev.stdout.toString().trim()}${dirty.stdout.toString().trim() ? "+dirty" : ""}`;
}

async function runScenario(name: string, faults: FaultName[], profile: Profile, seed: number) {
  const random = rng(seed);
  log(`scenario ${name}: seed ${seed}, ${profile.jobs} jobs, faults ${faults.join(",")}`);
  const started = performance.now();
  const dir = await mkdtemp(path.join(tmpdir(), `conveyor-fault-${name}-`));
  await chmod(dir, 0o755);
  const cluster: EmbeddedCluster = await startEmbeddedPostgres({
    dataDir: path.join(dir, "pg"),
    settings: { max_connections: 300 },
  });
  const admin = postgres(cluster.url, { max: 1, onnotice: () => {} });
  await admin`create database fault`;
  await admin.end();
  const direct: Pool = postgres(cluster.urlFor("fault"), { max: 4, onnotice: () => {} });
  await migrate(direct);
  await direct`create table ledger (job_id bigint not null, token bigint not null, owner text, at timestamptz not null default now())`;
  const proxy: FaultProxy = await startProxy({ host: "127.0.0.1", port: cluster.port }, random);
  const sink: Sink = startSink();
  const proxied = cluster.urlFor("fault").replace(`:${cluster.port}/`, `:${proxy.port}/`);
  const config = path.join(dir, "conveyor.toml");
  await writeFile(
    config,
    `# written by test/fault/run.ts
plugins = ${JSON.stringify(path.join(import.meta.dir, "plugins"))}

[database]
url = ${JSON.stringify(proxied)}
pool_size = 8

[worker]
poll_interval_ms = 250
grace_ms = 1000
heartbeat_ms = 500

[queues.default]
concurrency = 32
lease_ms = ${LEASE_MS}
max_attempts = 1000
backoff_base_ms = 20
backoff_max_ms = 1000
`,
  );
  const counters: Counters = { staleRejected: 0, leaseLost: 0, faults: {} };
  let shuttingDown = false;
  const logFile = Bun.file(path.join(dir, "daemons.log")).writer();
  const daemons: Daemon[] = Array.from({ length: DAEMONS }, (_, index) => ({
    index,
    proc: undefined,
    stopped: false,
    tail: [],
  }));
  const startDaemon = (d: Daemon) => {
    const proc = spawn({
      cmd: [
        process.execPath,
        path.join(ROOT, "main.ts"),
        "start",
        "--config",
        config,
        "--roles",
        "worker,reaper",
      ],
      cwd: dir,
      stdin: "ignore",
      stdout: "ignore",
      stderr: "pipe",
      env: { ...process.env, CONVEYOR_LOG_LEVEL: "info" },
    });
    d.proc = proc;
    d.stopped = false;
    const tail: string[] = [];
    d.tail = tail;
    void drain(proc.stderr, (line) => {
      tail.push(line);
      if (tail.length > TAIL_LINES) tail.shift();
      if (line.includes("stale write rejected by fence")) counters.staleRejected++;
      if (line.includes("lease lost; aborting handler")) counters.leaseLost++;
      logFile.write(`d${d.index} ${line}\n`);
    });
    // Like systemd's Restart=always: a daemon that exits on its own is started
    // again (the nemesis restarts the ones it kills itself).
    void proc.exited.then((code) => {
      if (d.proc !== proc || proc.signalCode !== null || shuttingDown) return;
      bump(`selfExit(code ${code})`);
      setTimeout(() => {
        if (d.proc === proc && !shuttingDown) startDaemon(d);
      }, 1_000);
    });
  };
  for (const d of daemons) startDaemon(d);
  const bump = (f: string) => {
    counters.faults[f] = (counters.faults[f] ?? 0) + 1;
  };

  // The workload: half enqueued up front, half while the nemesis runs.
  const accepted = new Map<string, { kind: string; key: string }>();
  const makeJob = (i: number): EnqueueInput => {
    const external = i % 2 === 1;
    const key = `${name}-${seed}-${i}`;
    return {
      kind: external ? "fault/external" : "fault/ledger",
      idempotencyKey: key,
      maxAttempts: 1000,
      payload: external
        ? { before: random.int(0, 300), sink: sink.url }
        : { before: random.int(0, 300), inside: random.int(0, 20) },
    };
  };
  const enqueueBatch = async (from: number, to: number) => {
    const inputs = Array.from({ length: to - from }, (_, k) => makeJob(from + k));
    // An enqueue retried after an error is harmless: same idempotency keys.
    for (let attempt = 0; ; attempt++) {
      try {
        const results = await enqueueMany(direct, inputs);
        results.forEach((r, k) => {
          const input = inputs[k] as EnqueueInput;
          accepted.set(r.job.id, { kind: input.kind, key: input.idempotencyKey as string });
        });
        return;
      } catch (error) {
        if (attempt > 200) throw error;
        await Bun.sleep(250);
      }
    }
  };
  // A tenth up front, the rest spread over the fault window, so faults land
  // while jobs are mid-handler, mid-heartbeat and mid-commit.
  const upfront = Math.floor(profile.jobs / 10);
  await enqueueBatch(0, upfront);
  let enqueued = upfront;
  const step = 20;
  const pause = profile.faultMs / Math.max(1, (profile.jobs - upfront) / step);
  const feeder = (async () => {
    while (enqueued < profile.jobs) {
      const next = Math.min(profile.jobs, enqueued + step);
      await enqueueBatch(enqueued, next);
      enqueued = next;
      await Bun.sleep(pause);
    }
  })();

  // The nemesis.
  const faultEnd = Date.now() + profile.faultMs;
  let pgDown = false;
  const pgStart = async () => {
    for (let i = 0; ; i++) {
      try {
        await cluster.start();
        pgDown = false;
        return;
      } catch (error) {
        // After kill -9 of the postmaster, orphaned backends may hold shared memory briefly.
        if (i > 60) throw error;
        await Bun.sleep(500);
      }
    }
  };
  const act: Record<FaultName, (r: Rng) => Promise<void>> = {
    async kill9(r) {
      const d = r.pick(daemons.filter((x) => x.proc && !x.stopped));
      if (!d?.proc) return;
      d.proc.kill("SIGKILL");
      await d.proc.exited;
      bump("kill9");
      await Bun.sleep(r.int(200, 1500));
      startDaemon(d);
    },
    async sigstop(r) {
      // Stop the daemon holding the most leases: a daemon that happens to be
      // idle would make no zombie, and the scenario would test nothing.
      const live = daemons.filter((x) => x.proc && !x.stopped);
      const holders = await direct`select lease_owner, count(*)::int as n from conveyor_jobs
          where state = 'running' group by lease_owner order by n desc`.catch(() => []);
      const pids = holders.map((h) => Number(String(h.lease_owner).split(":")[1]));
      const d =
        pids.map((pid) => live.find((x) => x.proc?.pid === pid)).find((x) => x !== undefined) ??
        r.pick(live);
      if (!d?.proc) return;
      d.proc.kill("SIGSTOP");
      d.stopped = true;
      bump("sigstop");
      // Past the lease: the reaper takes its jobs, others run them, then it wakes as a zombie.
      await Bun.sleep(r.int(LEASE_MS + 1_000, LEASE_MS * 3));
      d.proc.kill("SIGCONT");
      d.stopped = false;
    },
    async pgRestart(r) {
      if (pgDown) return;
      pgDown = true;
      await cluster.stop("fast");
      bump("pgRestart");
      await Bun.sleep(r.int(200, 2000));
      await pgStart();
    },
    async pgKill9(r) {
      if (pgDown) return;
      pgDown = true;
      await cluster.stop("kill");
      bump("pgKill9");
      await Bun.sleep(r.int(200, 1000));
      await pgStart();
    },
    async terminate() {
      if (pgDown) return;
      try {
        const killed =
          await direct`select count(pg_terminate_backend(pid))::int as n from pg_stat_activity
           where datname = current_database() and pid <> pg_backend_pid() and backend_type = 'client backend'`;
        if ((killed[0]?.n ?? 0) > 0) bump("terminate");
      } catch {
        // the database may be restarting
      }
    },
    async network(r) {
      proxy.set({ latencyMs: 30, dropPerSecond: 0.05 });
      bump("network");
      await Bun.sleep(r.int(1_000, 3_000));
      if (r.chance(0.3)) proxy.dropAll();
    },
  };
  const gaps: Record<FaultName, [number, number]> = {
    kill9: [1_000, 3_000],
    sigstop: [500, 2_000],
    pgRestart: [3_000, 6_000],
    pgKill9: [4_000, 8_000],
    terminate: [500, 2_000],
    network: [0, 500],
  };
  // One independent schedule per fault, each from its own seeded stream.
  await Promise.all(
    faults.map(async (f, k) => {
      const r = rng(seed + 1 + k);
      while (Date.now() < faultEnd || enqueued < profile.jobs) {
        await Bun.sleep(r.int(...gaps[f]));
        if (Date.now() >= faultEnd && enqueued >= profile.jobs) break;
        await act[f](r);
      }
    }),
  );
  await feeder;
  // Heal: every daemon running, the network clean, Postgres up.
  proxy.set({ latencyMs: 0, dropPerSecond: 0 });
  if (pgDown) await pgStart();
  for (const d of daemons) {
    if (d.stopped) d.proc?.kill("SIGCONT");
    if (!d.proc || d.proc.exitCode !== null || d.proc.signalCode !== null) startDaemon(d);
  }
  log(`${name}: faults stopped (${JSON.stringify(counters.faults)}); settling`);
  const settleEnd = Date.now() + profile.settleMs;
  for (;;) {
    const [row] =
      await direct`select count(*)::int as n from conveyor_jobs where state not in ('completed', 'discarded', 'cancelled')`.catch(
        () => [{ n: -1 }],
      );
    if (row?.n === 0 || Date.now() > settleEnd) break;
    await Bun.sleep(500);
  }
  const verdict: Verdict = await check(direct, accepted, sink.deliveries);
  const durationMs = Math.round(performance.now() - started);
  shuttingDown = true;
  for (const d of daemons) d.proc?.kill("SIGTERM");
  // Waits at most `ms`; says so only when the step really ran out of time.
  const settled = async (label: string, p: Promise<unknown> | undefined, ms = 15_000) => {
    let timer: ReturnType<typeof setTimeout> | undefined;
    await Promise.race([
      Promise.resolve(p).catch((error) => log(`${name}: teardown ${label} failed: ${error}`)),
      new Promise<void>((resolve) => {
        timer = setTimeout(() => {
          log(`${name}: teardown ${label} timed out after ${ms} ms`);
          resolve();
        }, ms);
      }),
    ]);
    clearTimeout(timer);
  };
  await settled("daemons", Promise.all(daemons.map((d) => d.proc?.exited)));
  // Where a daemon's shutdown hung is in its last lines: print them, as the
  // folder with the full log is removed when the scenario passes.
  for (const d of daemons) {
    if (!d.proc || d.proc.exitCode !== null || d.proc.signalCode !== null) continue;
    log(`${name}: d${d.index} still running after SIGTERM; its last ${d.tail.length} log lines:`);
    for (const line of d.tail) log(`  d${d.index} ${line}`);
  }
  for (const d of daemons) d.proc?.kill("SIGKILL");
  await settled("log", Promise.resolve(logFile.end()));
  const [ver] = await direct`show server_version`;
  const pgVersion = ver?.server_version as string;
  await settled("pool", direct.end({ timeout: 5 }));
  await settled("proxy", proxy.close(), 3_000);
  await settled("sink", sink.stop(), 3_000);
  await settled("postgres", cluster.stop("fast"));
  const failures: string[] = MUST_BE_ZERO.filter((k) => verdict[k] !== 0).map(
    (k) => `${k}=${verdict[k]}`,
  );
  const fenceExercised =
    counters.staleRejected + counters.leaseLost + verdict.externalStaleRejected;
  // The SIGSTOP scenario must make zombies whose late writes reach the fence.
  // Not required of the combined one: there, connection kills (every 0.5-2 s)
  // and Postgres restarts usually close a stopped daemon's connections, so its
  // late writes fail on the socket before reaching the fence. In five runs of
  // the CI profile (2,000 jobs), combined counted 0, 2, 3, 13 and 28.
  if (
    faults.length === 1 &&
    faults[0] === "sigstop" &&
    counters.staleRejected + verdict.externalStaleRejected === 0
  ) {
    failures.push("SIGSTOP scenario rejected no stale write: the fence was never exercised");
  }
  const result = {
    scenario: name,
    seed,
    profile: values.profile,
    faultMs: profile.faultMs,
    ...verdict,
    staleWritesRejected: counters.staleRejected,
    leasesLostOnHeartbeat: counters.leaseLost,
    fenceExercised,
    faultsInjected: counters.faults,
    connectionsDropped: proxy.dropped,
    daemons: DAEMONS,
    leaseMs: LEASE_MS,
    durationMs,
    passed: failures.length === 0,
    failures,
    date: new Date().toISOString(),
    versions: { conveyor: pkg.version, commit: gitCommit(), bun: Bun.version, postgres: pgVersion },
    machine: { cpus: cpus().length, cpu: cpus()[0]?.model, memoryBytes: totalmem() },
  };
  if (failures.length === 0) await rm(dir, { recursive: true, force: true });
  else log(`${name}: FAILED (${failures.join("; ")}); logs kept in ${dir}`);
  return result;
}

const { values } = parseArgs({
  options: {
    profile: { type: "string", default: "ci" },
    scenario: { type: "string" },
    seed: { type: "string" },
    jobs: { type: "string" },
    "fault-ms": { type: "string" },
    // Full runs write the committed results; CI-profile runs write to a temp folder.
    out: { type: "string" },
  },
});
const base = PROFILES[values.profile as string];
if (!base) throw new Error(`--profile must be one of ${Object.keys(PROFILES).join(", ")}`);
const profile: Profile = {
  ...base,
  jobs: values.jobs ? Number(values.jobs) : base.jobs,
  faultMs: values["fault-ms"] ? Number(values["fault-ms"]) : base.faultMs,
};
const names = values.scenario ? [values.scenario] : Object.keys(SCENARIOS);
const baseSeed = values.seed ? Number(values.seed) : Math.floor(Math.random() * 2 ** 31);
let failed = 0;
const rows: string[] = [];
const outDir =
  values.out ??
  (values.profile === "full"
    ? path.join(ROOT, "results")
    : path.join(tmpdir(), "conveyor-fault-results"));
await mkdir(outDir, { recursive: true });
for (const [i, name] of names.entries()) {
  const faults = SCENARIOS[name];
  if (!faults)
    throw new Error(`unknown scenario ${name}; one of ${Object.keys(SCENARIOS).join(", ")}`);
  const result = await runScenario(name, faults, profile, baseSeed + i * 1000);
  await writeFile(path.join(outDir, `fault-${name}.json`), `${JSON.stringify(result, null, 2)}\n`);
  if (!result.passed) failed++;
  rows.push(
    `${name.padEnd(13)} seed=${result.seed} jobs=${result.jobs} completed=${result.completed} discarded=${result.discarded} lost=${result.lost} dupEffects=${result.duplicateEffects} staleApplied=${result.staleWritesApplied} staleRejected=${result.staleWritesRejected} hbLost=${result.leasesLostOnHeartbeat} extRedeliv=${result.externalRedeliveries} extStale=${result.externalStaleRejected} ${result.passed ? "PASS" : "FAIL"}`,
  );
  log(rows[rows.length - 1] as string);
}
console.log(rows.join("\n"));
console.log(`${names.length - failed} passed, ${failed} failed`);
process.exit(failed === 0 ? 0 : 1);
