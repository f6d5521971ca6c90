// Runs `conveyor` as a real subprocess for the daemon tests: spawn it, read
// its JSON log lines, wait for readiness or for a log record, signal it.
import { rmSync } from "node:fs";
import { chmod, mkdir, mkdtemp, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import type { Subprocess } from "bun";
import { freePort } from "../src/embedded-postgres.ts";

export const REPO = path.resolve(import.meta.dir, "..");
export const MAIN = path.join(REPO, "main.ts");

/** The environment without anything that would point the daemon at another database. */
export function cleanEnv(extra: Record<string, string> = {}): Record<string, string> {
  const env: Record<string, string> = {};
  for (const [k, v] of Object.entries(process.env)) {
    if (v !== undefined && !/^(CONVEYOR_|DATABASE_URL$|PG)/.test(k)) env[k] = v;
  }
  return { ...env, ...extra };
}

export interface Daemon {
  proc: Subprocess<"ignore", "pipe", "pipe">;
  /** Parsed JSON log records so far (non-JSON lines as {msg: line}). */
  logs: Record<string, unknown>[];
  stderr(): string;
  stdout(): string;
  waitForLog(
    pred: (r: Record<string, unknown>) => boolean,
    ms?: number,
  ): Promise<Record<string, unknown>>;
  exited: Promise<number>;
}

/** Calls `onLine` for every line of a child's output stream, the last one too. */
export async function drain(stream: ReadableStream<Uint8Array>, onLine: (line: string) => void) {
  const decoder = new TextDecoder();
  let buf = "";
  for await (const chunk of stream) {
    buf += decoder.decode(chunk, { stream: true });
    let nl = buf.indexOf("\n");
    while (nl >= 0) {
      onLine(buf.slice(0, nl));
      buf = buf.slice(nl + 1);
      nl = buf.indexOf("\n");
    }
  }
  if (buf) onLine(buf);
}

/** Spawns `bun main.ts <args>` (or `cmd` when given, e.g. the compiled binary). */
export function spawnConveyor(
  args: string[],
  o: { cwd?: string; env?: Record<string, string>; cmd?: string[] } = {},
): Daemon {
  const proc = Bun.spawn([...(o.cmd ?? [process.execPath, MAIN]), ...args], {
    cwd: o.cwd ?? REPO,
    env: o.env ?? cleanEnv(),
    stdin: "ignore",
    stdout: "pipe",
    stderr: "pipe",
  });
  const logs: Record<string, unknown>[] = [];
  const errLines: string[] = [];
  const outLines: string[] = [];
  const waiters = new Set<() => void>();
  const onErr = (line: string) => {
    errLines.push(line);
    try {
      logs.push(JSON.parse(line));
    } catch {
      logs.push({ msg: line });
    }
    for (const w of waiters) w();
  };
  const streams = Promise.all([
    drain(proc.stderr, onErr),
    drain(proc.stdout, (l) => outLines.push(l)),
  ]);
  const exited = proc.exited.then(async (code) => {
    await streams;
    for (const w of waiters) w();
    return code;
  });
  return {
    proc,
    logs,
    exited,
    stderr: () => errLines.join("\n"),
    stdout: () => outLines.join("\n"),
    waitForLog(pred, ms = 30_000) {
      return new Promise((resolve, reject) => {
        const check = () => {
          const found = logs.find(pred);
          if (found) {
            done();
            resolve(found);
          } else if (proc.exitCode !== null) {
            done();
            reject(new Error(`conveyor exited (${proc.exitCode}) first:\n${errLines.join("\n")}`));
          }
        };
        const timer = setTimeout(() => {
          done();
          reject(new Error(`no such log line within ${ms} ms:\n${errLines.join("\n")}`));
        }, ms);
        const done = () => {
          clearTimeout(timer);
          waiters.delete(check);
        };
        waiters.add(check);
        check();
      });
    },
  };
}

/** Runs a one-shot command to completion. */
export async function runConveyor(
  args: string[],
  o: { cwd?: string; env?: Record<string, string>; cmd?: string[] } = {},
): Promise<{ code: number; stdout: string; stderr: string }> {
  const d = spawnConveyor(args, o);
  const code = await d.exited;
  return { code, stdout: d.stdout(), stderr: d.stderr() };
}

export async function waitReady(d: Daemon, baseUrl: string, ms = 60_000): Promise<void> {
  const deadline = Date.now() + ms;
  for (;;) {
    if (d.proc.exitCode !== null) {
      throw new Error(`conveyor exited (${d.proc.exitCode}) before ready:\n${d.stderr()}`);
    }
    try {
      const res = await fetch(`${baseUrl}/readyz`);
      if (res.status === 200) return;
    } catch {
      // not listening yet
    }
    if (Date.now() > deadline) throw new Error(`not ready within ${ms} ms:\n${d.stderr()}`);
    await Bun.sleep(100);
  }
}

// Workspaces hold embedded clusters and copies of the compiled binary (about
// 1.5 GB over a full run): each test file that makes them removes them in
// its afterAll (bun test does not run process "exit" listeners).
const created: string[] = [];

/** Removes every folder tempFolder() made so far; for afterAll. */
export function removeTempFolders(): void {
  for (const dir of created.splice(0)) rmSync(dir, { recursive: true, force: true });
}

/** A temp folder, removed by removeTempFolders(). */
export async function tempFolder(prefix: string): Promise<string> {
  const dir = await mkdtemp(path.join(tmpdir(), prefix));
  created.push(dir);
  return dir;
}

/** A temp folder with conveyor.toml and the given plugin files; readable by user postgres. */
export async function workspace(
  toml: string,
  plugins: Record<string, string> = {},
): Promise<{ dir: string; config: string }> {
  const dir = await tempFolder("conveyor-daemon-");
  await chmod(dir, 0o755);
  for (const [name, text] of Object.entries(plugins)) {
    const file = path.join(dir, "plugins", name);
    await mkdir(path.dirname(file), { recursive: true });
    await writeFile(file, text);
  }
  const config = path.join(dir, "conveyor.toml");
  await writeFile(config, toml);
  return { dir, config };
}

export { freePort };

export async function pollUntil<T>(
  fn: () => Promise<T | undefined>,
  ms = 30_000,
  what = "condition",
): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await fn();
    if (v !== undefined) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await Bun.sleep(50);
  }
}
