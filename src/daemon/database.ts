// The database a daemon command works on: the configured URL, or the embedded
// cluster in [embedded] data_dir (started here, or, for one-shot commands
// such as `conveyor enqueue`, the one a running daemon already started).
import { execFileSync } from "node:child_process";
import { existsSync, readFileSync, statSync } from "node:fs";
import { mkdir } from "node:fs/promises";
import path from "node:path";
import postgres from "postgres";
import type { DaemonConfig } from "../config/load.ts";
import type { Pool } from "../db/db.ts";
import { type EmbeddedCluster, startEmbeddedPostgres } from "../embedded-postgres.ts";
import { ConveyorError } from "../errors.ts";
import type { Logger } from "../logger.ts";

/** The database Conveyor uses inside its embedded cluster. */
export const EMBEDDED_DATABASE = "conveyor";

export interface Database {
  sql: Pool;
  /** The URL without its password, for logs. */
  display: string;
  /** Set when this process started the embedded cluster and must stop it. */
  cluster: EmbeddedCluster | undefined;
  close(): Promise<void>;
}

export function redact(url: string): string {
  try {
    const u = new URL(url);
    u.password = "";
    return u.toString();
  } catch {
    return "(unparseable URL)";
  }
}

function postgresIds(): { uid: number; gid: number } | undefined {
  try {
    const id = (flag: string) => Number(execFileSync("id", [flag, "postgres"]).toString().trim());
    return { uid: id("-u"), gid: id("-g") };
  } catch {
    return undefined; // not created yet; only "others" permissions will apply to it
  }
}

/**
 * As root, the embedded server runs as user `postgres`, which must be able to
 * enter every folder above the data folder. initdb's own error for that case
 * ("could not change directory") does not say why, so check first.
 */
export function assertReachableByPostgres(dataDir: string): void {
  if (typeof process.getuid !== "function" || process.getuid() !== 0) return;
  const ids = postgresIds();
  let dir = path.dirname(path.resolve(dataDir));
  const blocked: string[] = [];
  for (;;) {
    if (existsSync(dir)) {
      const st = statSync(dir);
      const ok =
        (st.mode & 0o001) !== 0 ||
        (ids !== undefined && st.gid === ids.gid && (st.mode & 0o010) !== 0) ||
        (ids !== undefined && st.uid === ids.uid && (st.mode & 0o100) !== 0);
      if (!ok) blocked.push(`${dir} (mode ${(st.mode & 0o777).toString(8)})`);
    }
    const parent = path.dirname(dir);
    if (parent === dir) break;
    dir = parent;
  }
  if (blocked.length > 0) {
    throw new ConveyorError(
      `embedded PostgreSQL data folder ${dataDir} is unusable: running as root, Conveyor runs PostgreSQL as user postgres, which cannot enter ${blocked.reverse().join(", ")}. Set [embedded] data_dir to a folder postgres can reach (e.g. /var/lib/conveyor/pgdata), allow it in (chmod o+x), run as a non-root user, or set database.url`,
    );
  }
}

/**
 * A placeholder setting on the postmaster's command line naming the process
 * that started it, which stays its parent for as long as it lives. Read back
 * from /proc/<pid>/cmdline: set at the spawn itself, so no window exists in
 * which a cluster runs with an owner not yet recorded.
 */
const OWNER_SETTING = "conveyor.owner_pid";

/** The owner pid on a postmaster's command line, if it has one. */
function ownerOf(pid: number): number | undefined {
  try {
    const args = readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0");
    const arg = args.find((a) => a.startsWith(`${OWNER_SETTING}=`));
    return arg === undefined ? undefined : Number(arg.slice(OWNER_SETTING.length + 1));
  } catch {
    return undefined;
  }
}

/** A process's parent pid, from /proc; undefined when it has gone (or no /proc). */
function parentOf(pid: number): number | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    // Field 4 is the parent pid; the command name (field 2) may contain spaces.
    return Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
  } catch {
    return undefined;
  }
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    // EPERM: it exists, under a user we may not signal.
    return (error as NodeJS.ErrnoException).code === "EPERM";
  }
}

/**
 * The port and password of a cluster a live postmaster already serves from
 * `dataDir`. `orphaned`: the process that started it is gone (killed with
 * SIGKILL, say), so nobody will stop it; a postmaster outlives its parent.
 */
export function runningCluster(
  dataDir: string,
): { pid: number; port: number; password: string; orphaned: boolean } | undefined {
  const pidFile = path.join(dataDir, "postmaster.pid");
  if (!existsSync(pidFile)) return undefined;
  const lines = readFileSync(pidFile, "utf8").split("\n");
  const pid = Number(lines[0]);
  const port = Number(lines[3]);
  if (!Number.isInteger(pid) || !Number.isInteger(port) || pid <= 0) return undefined;
  if (!alive(pid)) return undefined; // stale file from a crash; the server cleans it up on start
  const password = readFileSync(path.join(dataDir, "conveyor.password"), "utf8").trim();
  const owner = ownerOf(pid);
  const parent = parentOf(pid);
  // Without an owner on its command line (a cluster started by an earlier
  // version) or without /proc, assume its owner lives, as before.
  const orphaned = owner !== undefined && parent !== undefined && parent !== owner;
  return { pid, port, password, orphaned };
}

/**
 * Stops a postmaster nobody owns: fast shutdown (running transactions roll
 * back, which no job's outcome can depend on: its owner is gone), then an
 * immediate one if it does not go within 30 s.
 */
async function stopOrphan(pid: number): Promise<void> {
  for (const [signal, ms] of [
    ["SIGINT", 30_000],
    ["SIGQUIT", 10_000],
  ] as const) {
    try {
      process.kill(pid, signal);
    } catch {
      return; // gone already
    }
    const deadline = Date.now() + ms;
    while (alive(pid) && Date.now() < deadline) await Bun.sleep(50);
    if (!alive(pid)) return;
  }
  throw new ConveyorError(`the orphaned embedded PostgreSQL (pid ${pid}) did not stop`);
}

function pool(url: string, max: number): Pool {
  return postgres(url, {
    max,
    onnotice: () => {},
    connection: { application_name: "conveyor" },
  });
}

async function ensureDatabase(adminUrl: string, name: string): Promise<void> {
  const admin = postgres(adminUrl, { max: 1, onnotice: () => {} });
  try {
    const [found] = await admin`select 1 from pg_database where datname = ${name}`;
    if (!found) await admin.unsafe(`create database "${name}"`).catch(() => {}); // a racing start made it
  } finally {
    await admin.end({ timeout: 5 });
  }
}

function withDatabase(url: string, db: string): string {
  const u = new URL(url);
  u.pathname = `/${db}`;
  return u.toString();
}

/**
 * Opens the configured database. With no URL: `own` starts the embedded
 * cluster (refusing when another process already runs it), `attach` uses the
 * running one if any and starts it otherwise.
 */
export async function openDatabase(
  config: DaemonConfig,
  logger: Logger,
  mode: "own" | "attach",
): Promise<Database> {
  const { url, source, poolSize } = config.database;
  if (url) {
    const sql = pool(url, poolSize);
    logger.info("using database", { url: redact(url), from: source });
    return { sql, display: redact(url), cluster: undefined, close: () => sql.end({ timeout: 5 }) };
  }
  const { dataDir, port } = config.embedded;
  let live = runningCluster(dataDir);
  if (live?.orphaned && mode === "own") {
    logger.warn(
      "embedded PostgreSQL left running by a process that is gone: stopping it to start our own",
      { pid: live.pid, dataDir },
    );
    await stopOrphan(live.pid);
    live = undefined;
  }
  if (live) {
    if (mode === "own") {
      throw new ConveyorError(
        `embedded PostgreSQL in ${dataDir} is already running (pid ${live.pid}, port ${live.port}), probably under another conveyor start; to run several daemons on one database, give them all database.url`,
      );
    }
    const dbUrl = `postgres://postgres:${encodeURIComponent(live.password)}@127.0.0.1:${live.port}/${EMBEDDED_DATABASE}`;
    const sql = pool(dbUrl, poolSize);
    logger.info("using the running embedded PostgreSQL", { url: redact(dbUrl), dataDir });
    return {
      sql,
      display: redact(dbUrl),
      cluster: undefined,
      close: () => sql.end({ timeout: 5 }),
    };
  }
  assertReachableByPostgres(dataDir);
  // Created 0755 here: the engine creates missing parents 0700, which user
  // postgres could not enter when we are root.
  await mkdir(path.dirname(dataDir), { recursive: true, mode: 0o755 });
  const fresh = !existsSync(path.join(dataDir, "PG_VERSION"));
  logger.info(fresh ? "creating embedded PostgreSQL" : "starting embedded PostgreSQL", {
    dataDir,
  });
  let cluster: EmbeddedCluster;
  try {
    cluster = await startEmbeddedPostgres({
      dataDir,
      port,
      ownSession: true,
      // Whoever finds the cluster running can tell whether we still own it.
      settings: { [OWNER_SETTING]: process.pid },
      onLog: (line) => logger.debug(line, { component: "postgres" }),
    });
  } catch (cause) {
    const hint = import.meta.url.includes("$bunfs")
      ? " (the compiled binary does not carry PostgreSQL; set database.url or DATABASE_URL)"
      : "";
    throw new ConveyorError(`could not start embedded PostgreSQL in ${dataDir}${hint}`, { cause });
  }
  await ensureDatabase(cluster.url, EMBEDDED_DATABASE);
  const dbUrl = withDatabase(cluster.url, EMBEDDED_DATABASE);
  const sql = pool(dbUrl, poolSize);
  logger.info("using embedded PostgreSQL", { url: redact(dbUrl), dataDir, pid: cluster.pid });
  const supervisor = superviseEmbedded(cluster, logger);
  return {
    sql,
    display: redact(dbUrl),
    cluster,
    async close() {
      supervisor.stop();
      await sql.end({ timeout: 5 });
      await cluster.stop("fast");
      logger.info("embedded PostgreSQL stopped", { dataDir });
    },
  };
}

/** Waits before the nth try to start the server again: 0.5 s, 1 s, 2 s, ... at most 10 s. */
function embeddedRestartDelayMs(attempt: number): number {
  return Math.min(500 * 2 ** (attempt - 1), 10_000);
}

/**
 * Restarts the embedded server whenever it exits while we still need it
 * (killed, out of memory, a crash of the postmaster itself): we are its only
 * supervisor, and our loops, which survive a restart of any PostgreSQL,
 * would otherwise retry against nothing until someone restarted the daemon.
 * Same folder and port, so the pool's URL still holds. After a SIGKILL of
 * the postmaster its backends may hold the shared memory for a moment; the
 * server then refuses to start, and we try again.
 */
function superviseEmbedded(cluster: EmbeddedCluster, logger: Logger): { stop(): void } {
  let stopped = false;
  const run = async () => {
    for (;;) {
      await cluster.exited();
      if (stopped) return;
      logger.error("embedded PostgreSQL exited unexpectedly; restarting it", {
        dataDir: cluster.dataDir,
      });
      for (let attempt = 1; ; attempt++) {
        await Bun.sleep(embeddedRestartDelayMs(attempt));
        if (stopped) return;
        try {
          await cluster.start();
          logger.info("embedded PostgreSQL restarted", { pid: cluster.pid, attempt });
          break;
        } catch (error) {
          logger.warn("could not restart embedded PostgreSQL; retrying", { error, attempt });
        }
      }
    }
  };
  void run();
  return {
    stop() {
      stopped = true;
    },
  };
}
