// The compiled binary (`npm run build`) run from a folder with no
// node_modules, and the zero-config embedded database: created on the first
// start, reused on the next.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { existsSync } from "node:fs";
import { copyFile } from "node:fs/promises";
import path from "node:path";
import { RUNTIME_ENV } from "../src/runtime.ts";
import {
  cleanEnv,
  freePort,
  MAIN,
  REPO,
  removeTempFolders,
  runConveyor,
  spawnConveyor,
  tempFolder,
  waitReady,
  workspace,
} from "./daemon-process.ts";
import { type TestDb, testDatabase } from "./harness.ts";

const T = 180_000;

let db: TestDb;
beforeAll(async () => {
  db = await testDatabase();
}, 60_000);
afterAll(async () => {
  removeTempFolders();
  await db.drop();
});

// Type-only imports (erased by Bun's transpiler) and value imports from
// "conveyor" (served by the daemon): neither needs node_modules.
const PLUGINS = {
  "greet/hello.ts": `import type { JobContext, Plugin } from "conveyor";
interface Payload { name: string }
export default {
  handler: (p: Payload, ctx: JobContext) => ({ hello: p.name, token: ctx.fencingToken }),
} satisfies Plugin<Payload>;
`,
  "checked.ts": `import { definePlugin, z } from "conveyor";
export default definePlugin({
  schema: z.object({ n: z.number() }),
  handler: (p) => ({ twice: p.n * 2 }),
});
`,
};

// Logs when it starts, then holds its job for 1.5 s.
const SLOW_PLUGIN = {
  "work/slow.ts": `import type { JobContext, Plugin } from "conveyor";
export default {
  async handler(_p: unknown, ctx: JobContext) {
    ctx.logger.info("slow job started");
    await Bun.sleep(1_500);
    return { slept: true };
  },
} satisfies Plugin<unknown>;
`,
};

/** A config with no database URL (the embedded default) and the API on a free port. */
async function embeddedWorkspace(plugins: Record<string, string>) {
  const port = await freePort();
  const ws = await workspace(
    `[api]\nlisten = "127.0.0.1:${port}"\n[worker]\npoll_interval_ms = 200\n`,
    plugins,
  );
  return { ...ws, base: `http://127.0.0.1:${port}` };
}

/** POST /v1/jobs to queue "default" of a daemon with no API tokens. */
function postJob(base: string, kind: string, payload: unknown): Promise<Response> {
  return fetch(`${base}/v1/jobs`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ queue: "default", kind, payload }),
  });
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

async function jobOf(id: string) {
  return (await db.sql`select state, result from conveyor_jobs where id = ${id}`)[0];
}

async function waitCompleted(id: string, ms = 30_000) {
  const deadline = Date.now() + ms;
  for (;;) {
    const j = await jobOf(id);
    if (j?.state === "completed" || Date.now() > deadline) return j;
    await Bun.sleep(50);
  }
}

describe("the compiled binary", () => {
  test(
    "npm run build; check and start with plugins in a folder without node_modules",
    async () => {
      const build = Bun.spawnSync(["npm", "run", "build"], { cwd: REPO, env: cleanEnv() });
      expect(build.exitCode).toBe(0);
      const bin = path.join(REPO, "dist", "conveyor");
      expect(existsSync(bin)).toBe(true);

      const port = await freePort();
      const { dir, config } = await workspace(
        `[database]\nurl = "${db.url}"\n[api]\nlisten = "127.0.0.1:${port}"\n`,
        PLUGINS,
      );
      // The binary alone in its folder, run from there.
      const local = path.join(dir, "conveyor");
      await copyFile(bin, local);
      Bun.spawnSync(["chmod", "+x", local]);
      expect(existsSync(path.join(dir, "node_modules"))).toBe(false);
      const cmd = [local];

      const version = await runConveyor(["--version"], { cmd, cwd: dir });
      expect(version.stdout.trim()).toMatch(/^\d+\.\d+\.\d+/);

      const check = await runConveyor(["check", "--json"], { cmd, cwd: dir });
      expect(check.code).toBe(0);
      expect(JSON.parse(check.stdout).kinds).toEqual([
        { kind: "checked", file: "checked.ts", queue: null },
        { kind: "greet/hello", file: "greet/hello.ts", queue: null },
      ]);

      const daemon = spawnConveyor(["start", "--config", config], { cmd, cwd: dir });
      try {
        await waitReady(daemon, `http://127.0.0.1:${port}`);
        // The binary re-executed itself in place with its runtime settings
        // (src/runtime.ts), its own arguments intact (it answers on its port).
        const environ = await Bun.file(`/proc/${daemon.proc.pid}/environ`).text();
        for (const [k, v] of Object.entries(RUNTIME_ENV)) {
          expect(environ.split("\0")).toContain(`${k}=${v}`);
        }
        const enq = await runConveyor(["enqueue", "default", "greet/hello", '{"name":"bin"}'], {
          cmd,
          cwd: dir,
        });
        expect(enq.code).toBe(0);
        const { id } = JSON.parse(enq.stdout) as { id: string };
        expect(await waitCompleted(id)).toMatchObject({
          state: "completed",
          result: { hello: "bin" },
        });
        const res = await fetch(`http://127.0.0.1:${port}/v1/jobs`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify({ kind: "checked", payload: { n: 21 } }),
        });
        const { job } = (await res.json()) as { job: { id: string } };
        expect(await waitCompleted(job.id)).toMatchObject({ result: { twice: 42 } });
      } finally {
        daemon.proc.kill("SIGTERM");
      }
      expect(await daemon.exited).toBe(0);
    },
    T,
  );
});

describe("the embedded default", () => {
  test(
    "no database URL: creates a cluster next to the config, reuses it on the next start",
    async () => {
      const { dir, config, base } = await embeddedWorkspace(PLUGINS);
      const first = spawnConveyor(["start", "--config", config], { cwd: dir });
      let id: string;
      try {
        await waitReady(first, base, 120_000);
        const using = first.logs.find((r) => r.msg === "using embedded PostgreSQL");
        expect(using?.url).toMatch(/^postgres:\/\/postgres@127\.0\.0\.1:\d+\/conveyor$/);
        expect(existsSync(path.join(dir, ".conveyor", "pgdata", "PG_VERSION"))).toBe(true);
        // A second daemon cannot own the same cluster.
        const twin = await runConveyor(["start", "--config", config], { cwd: dir });
        expect(twin.code).toBe(1);
        expect(twin.stderr).toContain("is already running");
        // A one-shot command finds the running cluster rather than starting another.
        const enq = await runConveyor(
          ["enqueue", "default", "greet/hello", '{"name":"embedded"}', "--config", config],
          { cwd: dir },
        );
        expect(enq.code).toBe(0);
        id = (JSON.parse(enq.stdout) as { id: string }).id;
        const read = async () =>
          (await (await fetch(`${base}/v1/jobs/${id}`)).json()) as { job: { state: string } };
        for (let i = 0; i < 200 && (await read()).job.state !== "completed"; i++) {
          await Bun.sleep(50);
        }
        expect((await read()).job.state).toBe("completed");
      } finally {
        first.proc.kill("SIGTERM");
      }
      expect(await first.exited).toBe(0);
      expect(first.logs.some((r) => r.msg === "embedded PostgreSQL stopped")).toBe(true);

      const second = spawnConveyor(["start", "--config", config], { cwd: dir });
      try {
        await waitReady(second, base, 120_000);
        expect(second.logs.some((r) => r.msg === "starting embedded PostgreSQL")).toBe(true);
        const res = await fetch(`${base}/v1/jobs/${id}`);
        expect(((await res.json()) as { job: { state: string } }).job.state).toBe("completed");
      } finally {
        second.proc.kill("SIGTERM");
      }
      expect(await second.exited).toBe(0);
    },
    T,
  );

  test(
    "Ctrl-C (SIGINT to the whole group, then again as npm forwards it) drains the running job before the cluster stops",
    async () => {
      const { dir, config, base } = await embeddedWorkspace({ ...PLUGINS, ...SLOW_PLUGIN });
      // setsid: a process group of its own, as a terminal's foreground job;
      // it execs in place, so the daemon's pid is the group's id.
      const first = spawnConveyor(["start", "--config", config], {
        cwd: dir,
        cmd: ["setsid", process.execPath, MAIN],
      });
      let id: string;
      try {
        await waitReady(first, base, 120_000);
        const res = await postJob(base, "work/slow", {});
        id = ((await res.json()) as { job: { id: string } }).job.id;
        await first.waitForLog((r) => r.msg === "slow job started");
        const pid = first.proc.pid;
        process.kill(-pid, "SIGINT");
        await Bun.sleep(20);
        process.kill(pid, "SIGINT");
      } catch (error) {
        first.proc.kill("SIGKILL");
        throw error;
      }
      expect(await first.exited).toBe(0);
      const msgs = first.logs.map((r) => r.msg);
      expect(msgs).toContain("the same signal again: still draining");
      expect(msgs).not.toContain("second signal: exiting without waiting for jobs");
      expect(msgs).not.toContain(
        "could not record job outcome; the lease will expire and the job will rerun",
      );
      expect(msgs).toContain("embedded PostgreSQL stopped");

      const second = spawnConveyor(["start", "--config", config], { cwd: dir });
      try {
        await waitReady(second, base, 120_000);
        const res = await fetch(`${base}/v1/jobs/${id}`);
        const { job } = (await res.json()) as { job: { state: string; attempts: number } };
        // Completed by the first daemon's drain: one attempt, not a rerun.
        expect(job).toMatchObject({ state: "completed", attempts: 1 });
      } finally {
        second.proc.kill("SIGTERM");
      }
      expect(await second.exited).toBe(0);
    },
    T,
  );

  test(
    "a daemon killed with SIGKILL leaves its cluster running; the next start stops that orphan and starts its own",
    async () => {
      const { dir, config, base } = await embeddedWorkspace(PLUGINS);
      const first = spawnConveyor(["start", "--config", config], { cwd: dir });
      let orphan: number;
      try {
        await waitReady(first, base, 120_000);
        orphan = Number(first.logs.find((r) => r.msg === "using embedded PostgreSQL")?.pid);
        expect(orphan).toBeGreaterThan(0);
      } finally {
        first.proc.kill("SIGKILL");
      }
      await first.exited;
      expect(alive(orphan)).toBe(true);

      const second = spawnConveyor(["start", "--config", config], { cwd: dir });
      try {
        await waitReady(second, base, 120_000);
        const warned = second.logs.find(
          (r) =>
            r.msg ===
            "embedded PostgreSQL left running by a process that is gone: stopping it to start our own",
        );
        expect(warned).toMatchObject({ level: "warn", pid: orphan });
        expect(alive(orphan)).toBe(false);
        expect((await postJob(base, "greet/hello", { name: "x" })).status).toBe(201);
      } finally {
        second.proc.kill("SIGTERM");
      }
      expect(await second.exited).toBe(0);
    },
    T,
  );

  test(
    "the embedded server killed under a running daemon is restarted; the API answers 503 meanwhile, then works",
    async () => {
      const { dir, config, base } = await embeddedWorkspace(PLUGINS);
      const daemon = spawnConveyor(["start", "--config", config], { cwd: dir });
      try {
        await waitReady(daemon, base, 120_000);
        const pg = Number(daemon.logs.find((r) => r.msg === "using embedded PostgreSQL")?.pid);
        process.kill(pg, "SIGKILL");
        await daemon.waitForLog(
          (r) => r.msg === "embedded PostgreSQL exited unexpectedly; restarting it",
        );
        const during = await postJob(base, "greet/hello", { name: "during" });
        // Either the server was still down (503) or already back (201).
        expect([201, 503]).toContain(during.status);
        const restarted = await daemon.waitForLog((r) => r.msg === "embedded PostgreSQL restarted");
        expect(restarted.pid).not.toBe(pg);
        let res = await postJob(base, "greet/hello", { name: "after" });
        for (let i = 0; i < 100 && res.status === 503; i++) {
          await Bun.sleep(100);
          res = await postJob(base, "greet/hello", { name: "after" });
        }
        expect(res.status).toBe(201);
        const { job } = (await res.json()) as { job: { id: string } };
        let state = "";
        for (let i = 0; i < 200 && state !== "completed"; i++) {
          await Bun.sleep(50);
          const r = await fetch(`${base}/v1/jobs/${job.id}`);
          state = ((await r.json()) as { job: { state: string } }).job.state;
        }
        expect(state).toBe("completed");
      } finally {
        daemon.proc.kill("SIGTERM");
      }
      expect(await daemon.exited).toBe(0);
      expect(daemon.logs.some((r) => r.msg === "embedded PostgreSQL stopped")).toBe(true);
    },
    T,
  );

  test(
    "check resolves secrets only for the roles that need them",
    async () => {
      const dir = await tempFolder("conveyor-nodb-");
      const { config } = await workspace(
        `[[api.tokens]]\ntoken_env = "UNSET_TOKEN_VARIABLE"\nscopes = ["admin"]\n[embedded]\ndata_dir = "${dir}/pg"\n`,
        PLUGINS,
      );
      const check = await runConveyor(["check", "--config", config]);
      expect(check.code).toBe(78);
      expect(check.stderr).toContain("api.tokens.0.token_env");
      const workersOnly = await runConveyor(["check", "--config", config, "--roles", "worker"]);
      expect(workersOnly.code).toBe(0);
      expect(workersOnly.stdout).toContain("greet/hello");
    },
    T,
  );
});
