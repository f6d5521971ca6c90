// The `conveyor` command: start, migrate, enqueue, check. Each command parses
// its flags, loads conveyor.toml once, and hands components their slice.
import { parseArgs } from "node:util";
import pkg from "../package.json" with { type: "json" };
import { type DaemonConfig, loadConfig } from "./config/load.ts";
import { DEFAULT_CONFIG_FILE } from "./config/schema.ts";
import { openDatabase } from "./daemon/database.ts";
import { daemonLogger, LOG_LEVELS } from "./daemon/log.ts";
import type { Plan } from "./daemon/plan.ts";
import { queueSettings } from "./daemon/plan.ts";
import { planFor, ROLES, type Role, startDaemon } from "./daemon/start.ts";
import { migrate } from "./db/migrate.ts";
import { enqueue } from "./enqueue.ts";
import { ConfigError, ConveyorError, PluginLoadError } from "./errors.ts";
import type { JsonValue } from "./json.ts";
import type { LogLevel } from "./logger.ts";
import { fetchBatchOf } from "./worker/worker.ts";

export const VERSION: string = pkg.version;

/** Exit codes: 64 and 78 as in sysexits.h, so supervisors can tell "fix the config" from a crash. */
export const EXIT_OK = 0;
export const EXIT_FAILURE = 1;
export const EXIT_USAGE = 64;
export const EXIT_CONFIG = 78;

/**
 * The same signal again within this long is the first one delivered twice
 * (a terminal and npm both send Ctrl-C's SIGINT), not a second request: it
 * does not cut the drain short. npm forwards within milliseconds.
 */
export const REPEATED_SIGNAL_MS = 1_000;

class UsageError extends ConveyorError {
  override readonly name = "UsageError";
}

const HELP = `conveyor ${VERSION}: durable job queue on PostgreSQL

Usage:
  conveyor start   [--config <path>] [--roles api,worker,cron,reaper]
  conveyor migrate [--config <path>]
  conveyor enqueue <queue> <kind> <json> [--idempotency-key <key>] [--config <path>]
  conveyor check   [--config <path>] [--roles ...] [--json]
  conveyor --help | --version

Commands:
  start    Run the daemon: migrate (advisory-locked), then the HTTP API, the
           workers (one handler per plugin file), the reaper and cron, over one
           Postgres pool. SIGTERM or SIGINT drains running jobs (worker.grace_ms)
           and exits 0; another signal (not the same one repeated within 1 s)
           exits at once. --roles runs only some of them, e.g. --roles worker on
           extra machines.
  migrate  Apply pending schema migrations and exit.
  enqueue  Add one job; prints it as JSON. The payload is a JSON document.
  check    Validate the config and load the plugins; print the queues, kinds
           and cron entries that start would run. Touches no database.

Options:
  --config <path>     Config file (default ./${DEFAULT_CONFIG_FILE}; without one, defaults apply)
  --log-level <lvl>   debug, info, warn or error (default info; env CONVEYOR_LOG_LEVEL)
  -h, --help          This help
  -v, --version       Print the version

Without database.url (or CONVEYOR_DATABASE_URL / DATABASE_URL) Conveyor runs
an embedded PostgreSQL in [embedded] data_dir, default .conveyor/pgdata next
to the config file. See docs/config.md and docs/plugins.md.
`;

const COMMON = {
  config: { type: "string" },
  "log-level": { type: "string" },
  help: { type: "boolean", short: "h" },
} as const;

interface Io {
  out: (s: string) => void;
  err: (s: string) => void;
  env: Record<string, string | undefined>;
}

const defaultIo: Io = {
  out: (s) => process.stdout.write(s),
  err: (s) => process.stderr.write(s),
  env: process.env,
};

function logLevel(flag: string | undefined, env: Io["env"]): LogLevel {
  const v = flag ?? env.CONVEYOR_LOG_LEVEL ?? "info";
  if (!(LOG_LEVELS as readonly string[]).includes(v)) {
    throw new UsageError(
      `--log-level: got ${JSON.stringify(v)}, expected ${LOG_LEVELS.join(", ")}`,
    );
  }
  return v as LogLevel;
}

function parseRoles(v: string | undefined): Set<Role> {
  if (v === undefined) return new Set(ROLES);
  const roles = v
    .split(",")
    .map((r) => r.trim())
    .filter(Boolean);
  const bad = roles.filter((r) => !(ROLES as readonly string[]).includes(r));
  if (bad.length > 0 || roles.length === 0) {
    throw new UsageError(
      `--roles: got ${JSON.stringify(v)}, expected a comma-separated list of ${ROLES.join(", ")}`,
    );
  }
  return new Set(roles as Role[]);
}

function config(flag: string | undefined, env: Io["env"], secrets = true): DaemonConfig {
  return loadConfig(flag ?? DEFAULT_CONFIG_FILE, { required: flag !== undefined, env, secrets });
}

function exitCodeOf(error: unknown): number {
  if (error instanceof UsageError) return EXIT_USAGE;
  if (error instanceof ConfigError || error instanceof PluginLoadError) return EXIT_CONFIG;
  return EXIT_FAILURE;
}

function describeError(error: unknown): string {
  if (!(error instanceof Error)) return String(error);
  let text = error.message;
  let cause = error.cause;
  // Plugin and embedded-database failures carry the detail in their cause.
  for (let depth = 0; cause instanceof Error && depth < 3; depth++) {
    if (!text.includes(cause.message)) text += `\n  caused by: ${cause.message}`;
    cause = cause.cause;
  }
  return text;
}

async function cmdStart(args: string[], io: Io): Promise<number> {
  const { values } = parseArgs({
    args,
    options: { ...COMMON, roles: { type: "string" } },
    allowPositionals: false,
  });
  if (values.help) {
    io.out(HELP);
    return EXIT_OK;
  }
  const logger = daemonLogger({ level: logLevel(values["log-level"], io.env) });
  const log = logger.child({ component: "daemon" });
  let stopRequested: string | undefined;
  let stopRequestedAt = 0;
  let stopNow: (() => void) | undefined;
  const onSignal = (signal: string) => {
    if (stopRequested) {
      // One Ctrl-C under `npm start` arrives twice: from the terminal and
      // forwarded by npm, milliseconds apart (as does a service manager's
      // SIGTERM to the whole group). That is one request to stop, not two.
      if (signal === stopRequested && performance.now() - stopRequestedAt < REPEATED_SIGNAL_MS) {
        log.info("the same signal again: still draining", { signal });
        return;
      }
      log.warn("second signal: exiting without waiting for jobs", { signal });
      process.exit(EXIT_FAILURE);
    }
    stopRequested = signal;
    stopRequestedAt = performance.now();
    log.info("signal received", { signal });
    stopNow?.();
  };
  process.on("SIGTERM", () => onSignal("SIGTERM"));
  process.on("SIGINT", () => onSignal("SIGINT"));
  // A plugin's stray promise must not take the daemon (and every other job) down.
  process.on("unhandledRejection", (error) =>
    log.error("unhandled promise rejection (a plugin bug?)", { error }),
  );
  try {
    const roles = parseRoles(values.roles);
    const cfg = config(values.config, io.env, roles.has("api"));
    log.info("config loaded", { file: cfg.file ?? "(none: defaults)" });
    const daemon = await startDaemon({ config: cfg, roles, logger, version: VERSION });
    await new Promise<void>((resolve) => {
      stopNow = resolve;
      if (stopRequested) resolve();
    });
    await daemon.stop();
    return EXIT_OK;
  } catch (error) {
    log.error(`start failed: ${describeError(error)}`, { error });
    return exitCodeOf(error);
  }
}

async function cmdMigrate(args: string[], io: Io): Promise<number> {
  const { values } = parseArgs({ args, options: COMMON, allowPositionals: false });
  if (values.help) {
    io.out(HELP);
    return EXIT_OK;
  }
  const logger = daemonLogger({ level: logLevel(values["log-level"], io.env) });
  const db = await openDatabase(config(values.config, io.env, false), logger, "attach");
  try {
    const applied = await migrate(db.sql);
    io.out(`${applied.length === 0 ? "schema up to date" : `applied ${applied.join(", ")}`}\n`);
    return EXIT_OK;
  } finally {
    await db.close();
  }
}

async function cmdEnqueue(args: string[], io: Io): Promise<number> {
  const { values, positionals } = parseArgs({
    args,
    options: { ...COMMON, "idempotency-key": { type: "string" } },
    allowPositionals: true,
  });
  if (values.help) {
    io.out(HELP);
    return EXIT_OK;
  }
  if (positionals.length !== 3) {
    throw new UsageError("enqueue: expected <queue> <kind> <json>");
  }
  const [queue, kind, json] = positionals as [string, string, string];
  let payload: JsonValue;
  try {
    payload = JSON.parse(json);
  } catch (cause) {
    throw new UsageError(`enqueue: <json> is not valid JSON: ${describeError(cause)}`);
  }
  const cfg = config(values.config, io.env, false);
  const q = queueSettings(cfg, queue);
  const logger = daemonLogger({ level: logLevel(values["log-level"] ?? "warn", io.env) });
  const db = await openDatabase(cfg, logger, "attach");
  try {
    await migrate(db.sql);
    const key = values["idempotency-key"];
    const { job, duplicate } = await enqueue(db.sql, {
      queue,
      kind,
      payload,
      priority: q.priority,
      maxAttempts: q.maxAttempts,
      ...(key === undefined ? {} : { idempotencyKey: key }),
    });
    io.out(
      `${JSON.stringify({ id: job.id, queue: job.queue, kind: job.kind, state: job.state, runAt: job.runAt, idempotencyKey: job.idempotencyKey, duplicate })}\n`,
    );
    return EXIT_OK;
  } finally {
    await db.close();
  }
}

function table(rows: string[][]): string {
  const widths = rows[0]?.map((_, i) => Math.max(...rows.map((r) => (r[i] ?? "").length))) ?? [];
  return rows
    .map((r) => `  ${r.map((c, i) => c.padEnd(widths[i] ?? 0)).join("  ")}`.trimEnd())
    .join("\n");
}

export function describePlan(cfg: DaemonConfig, plan: Plan, roles: ReadonlySet<Role>): string {
  const db = cfg.database.url
    ? `${new URL(cfg.database.url).host} (from ${cfg.database.source})`
    : `embedded PostgreSQL in ${cfg.embedded.dataDir} (port ${cfg.embedded.port || "chosen at start"})`;
  const lines = [
    `config    ${cfg.file ?? "(none: defaults)"}`,
    `roles     ${[...roles].join(", ")}`,
    `database  ${db}`,
    `api       ${cfg.api.host}:${cfg.api.port}, ${cfg.api.tokens.length > 0 ? `${cfg.api.tokens.length} token(s)` : "no tokens (loopback only)"}`,
    `plugins   ${cfg.plugins.dir}`,
    "",
    `kinds (${plan.plugins.length})`,
  ];
  if (plan.plugins.length > 0) {
    lines.push(
      table([
        ["kind", "file", "queue", "timeout_ms", "schema"],
        ...plan.plugins.map((p) => [
          p.kind,
          p.file,
          p.queue ?? "-",
          String(p.spec.timeoutMs ?? "-"),
          p.hasSchema ? "yes" : "no",
        ]),
      ]),
    );
  }
  lines.push("", `queues (${plan.queues.length})`);
  lines.push(
    table([
      [
        "queue",
        "concurrency",
        "fetch_batch",
        "lease_ms",
        "max_attempts",
        "priority",
        "paused",
        "from",
      ],
      ...plan.queues.map((q) => [
        q.name,
        String(q.concurrency),
        String(fetchBatchOf(q)),
        String(q.leaseMs),
        String(q.maxAttempts),
        String(q.priority),
        q.paused === undefined ? "-" : String(q.paused),
        q.from,
      ]),
    ]),
  );
  lines.push("", `cron (${plan.cron.length})`);
  if (plan.cron.length > 0) {
    lines.push(
      table([
        ["name", "schedule", "timezone", "queue", "kind", "missed"],
        ...plan.cron.map((c) => [c.name, c.schedule, c.timezone, c.queue, c.kind, c.missed]),
      ]),
    );
  }
  return `${lines.join("\n")}\n`;
}

async function cmdCheck(args: string[], io: Io): Promise<number> {
  const { values } = parseArgs({
    args,
    options: { ...COMMON, roles: { type: "string" }, json: { type: "boolean" } },
    allowPositionals: false,
  });
  if (values.help) {
    io.out(HELP);
    return EXIT_OK;
  }
  const roles = parseRoles(values.roles);
  const cfg = config(values.config, io.env, roles.has("api"));
  const logger = daemonLogger({ level: logLevel(values["log-level"] ?? "warn", io.env) });
  const plan = await planFor(cfg, roles, logger);
  if (values.json) {
    io.out(
      `${JSON.stringify(
        {
          config: cfg.file ?? null,
          roles: [...roles],
          database: cfg.database.url ? { from: cfg.database.source } : { embedded: cfg.embedded },
          api: { host: cfg.api.host, port: cfg.api.port, tokens: cfg.api.tokens.length },
          kinds: plan.plugins.map((p) => ({ kind: p.kind, file: p.file, queue: p.queue ?? null })),
          queues: plan.queues.map((q) => ({ ...q, fetchBatch: fetchBatchOf(q) })),
          cron: plan.cron,
        },
        null,
        2,
      )}\n`,
    );
  } else {
    io.out(describePlan(cfg, plan, roles));
  }
  return EXIT_OK;
}

const COMMANDS: Record<string, (args: string[], io: Io) => Promise<number>> = {
  start: cmdStart,
  migrate: cmdMigrate,
  enqueue: cmdEnqueue,
  check: cmdCheck,
};

/** Runs the CLI; resolves to the process exit code. */
export async function runCli(argv: string[], io: Io = defaultIo): Promise<number> {
  const [command, ...rest] = argv;
  if (command === "--version" || command === "-v" || command === "version") {
    io.out(`${VERSION}\n`);
    return EXIT_OK;
  }
  if (command === undefined || command === "--help" || command === "-h" || command === "help") {
    io.out(HELP);
    return command === undefined ? EXIT_USAGE : EXIT_OK;
  }
  const run = COMMANDS[command];
  if (!run) {
    io.err(`conveyor: unknown command ${JSON.stringify(command)}\n\n${HELP}`);
    return EXIT_USAGE;
  }
  try {
    return await run(rest, io);
  } catch (error) {
    const usage = error instanceof TypeError && "code" in error; // parseArgs: unknown or malformed flag
    io.err(`conveyor ${command}: ${describeError(error)}\n`);
    return usage ? EXIT_USAGE : exitCodeOf(error);
  }
}
