// The daemon as a subprocess on a real database: start, HTTP and CLI
// enqueues, auth, config and plugin errors, cron across two daemons, and the
// SIGTERM drain.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { chmod } from "node:fs/promises";
import path from "node:path";
import { enqueue } from "../src/enqueue.ts";
import { RUNTIME_ENV } from "../src/runtime.ts";
import {
  cleanEnv,
  type Daemon,
  freePort,
  pollUntil,
  removeTempFolders,
  runConveyor,
  spawnConveyor,
  tempFolder,
  waitReady,
  workspace,
} from "./daemon-process.ts";
import { type TestDb, testDatabase } from "./harness.ts";

const ADMIN = "admin-token-0123456789";
const ENQUEUER = "enqueue-token-0123456789";
const EXIT_CONFIG = 78;
/** Per test: subprocesses start in ~1 s, but this machine is shared and slow at times. */
const T = 60_000;

const PLUGINS = {
  "echo.ts": "export default { handler: (p) => ({ echoed: p }) };\n",
  "fail.ts": 'export default { handler() { throw new Error("boom"); } };\n',
  "work/slow.ts": `import type { Plugin } from "conveyor";
export default {
  async handler(p) {
    await Bun.sleep(p.ms);
    return { slept: p.ms };
  },
} satisfies Plugin<{ ms: number }>;
`,
};

let db: TestDb;
beforeAll(async () => {
  db = await testDatabase();
}, 60_000);
afterAll(async () => {
  removeTempFolders();
  await db.drop();
});

const jobState = async (id: string) =>
  (await db.sql`select state, result from conveyor_jobs where id = ${id}`)[0] as
    | { state: string; result: unknown }
    | undefined;

const completed = (id: string) =>
  pollUntil(
    async () => {
      const j = await jobState(id);
      return j?.state === "completed" ? j : undefined;
    },
    30_000,
    `job ${id} to complete`,
  );

describe("a running daemon", () => {
  let daemon: Daemon;
  let base: string;
  let config: string;

  beforeAll(async () => {
    // Waiting before the start: a kind no plugin handles, which start warns about.
    await enqueue(db.sql, { kind: "nobody/handles", payload: {} });
    const port = await freePort();
    base = `http://127.0.0.1:${port}`;
    ({ config } = await workspace(
      `[database]
url = "${db.url}"
pool_size = 5

[api]
listen = "127.0.0.1:${port}"

[[api.tokens]]
token = "${ADMIN}"
scopes = ["admin"]

[[api.tokens]]
token_env = "TEST_ENQUEUE_TOKEN"
scopes = ["enqueue"]

[worker]
poll_interval_ms = 200
grace_ms = 10000

[queues.held]
paused = true
`,
      PLUGINS,
    ));
    daemon = spawnConveyor(["start", "--config", config], {
      env: cleanEnv({ TEST_ENQUEUE_TOKEN: ENQUEUER }),
    });
    await waitReady(daemon, base);
  }, 90_000);

  afterAll(async () => {
    daemon.proc.kill("SIGKILL");
    await daemon.exited;
  });

  test(
    "logs JSON lines with level, time, component; migrated; kinds loaded",
    async () => {
      const started = await daemon.waitForLog((r) => r.msg === "conveyor started");
      expect(started).toMatchObject({ level: "info", component: "daemon" });
      expect(typeof started.time).toBe("string");
      expect(started.kinds).toEqual(["echo", "fail", "work/slow"]);
      expect(started.queues).toEqual(["held", "default"]);
      const warn = await daemon.waitForLog((r) => r.kind === "nobody/handles");
      expect(warn).toMatchObject({ level: "warn", queue: "default", available: 1 });
      const [held] = await db.sql`select paused from conveyor_queues where name = 'held'`;
      expect(held?.paused).toBe(true);
    },
    T,
  );

  test(
    "the daemon re-executed itself in place with its runtime settings (allocator, JIT)",
    async () => {
      // Same pid as spawned (process.execve keeps it), and that process answers.
      const environ = await Bun.file(`/proc/${daemon.proc.pid}/environ`).text();
      for (const [k, v] of Object.entries(RUNTIME_ENV)) {
        expect(environ.split("\0")).toContain(`${k}=${v}`);
      }
      expect((await fetch(`${base}/readyz`)).status).toBe(200);
    },
    T,
  );

  test(
    "a job enqueued over HTTP runs and reads back",
    async () => {
      const res = await fetch(`${base}/v1/jobs`, {
        method: "POST",
        headers: { authorization: `Bearer ${ENQUEUER}`, "content-type": "application/json" },
        body: JSON.stringify({ kind: "echo", payload: { n: 1 } }),
      });
      expect(res.status).toBeLessThan(300);
      const { job } = (await res.json()) as { job: { id: string } };
      expect((await completed(job.id)).result).toEqual({ echoed: { n: 1 } });
      const read = await fetch(`${base}/v1/jobs/${job.id}`, {
        headers: { authorization: `Bearer ${ENQUEUER}` },
      });
      expect(((await read.json()) as { job: { state: string } }).job.state).toBe("completed");
    },
    T,
  );

  test(
    "a failing job is logged with its jobId",
    async () => {
      const { job } = await enqueue(db.sql, { kind: "fail", payload: {}, maxAttempts: 1 });
      const line = await daemon.waitForLog((r) => r.jobId === job.id);
      expect(line).toMatchObject({
        level: "warn",
        component: "jobs",
        kind: "fail",
        state: "discarded",
        error: { message: "boom" },
      });
    },
    T,
  );

  test(
    "`conveyor enqueue` adds a job once per idempotency key",
    async () => {
      const args = ["enqueue", "default", "echo", '{"via":"cli"}', "--idempotency-key", "k-1"];
      const first = await runConveyor([...args, "--config", config]);
      expect(first.code).toBe(0);
      const out = JSON.parse(first.stdout) as { id: string; duplicate: boolean };
      expect(out.duplicate).toBe(false);
      expect((await completed(out.id)).result).toEqual({ echoed: { via: "cli" } });
      const again = JSON.parse((await runConveyor([...args, "--config", config])).stdout);
      expect(again).toMatchObject({ id: out.id, duplicate: true });
      const bad = await runConveyor(["enqueue", "default", "echo", "{nope", "--config", config]);
      expect(bad.code).toBe(64);
      expect(bad.stderr).toContain("not valid JSON");
    },
    T,
  );

  test(
    "auth: a missing or unknown token is 401, a token without the scope is 403",
    async () => {
      const list = (token?: string) =>
        fetch(`${base}/v1/jobs`, token ? { headers: { authorization: `Bearer ${token}` } } : {});
      expect((await list()).status).toBe(401);
      expect((await list("wrong-token-0123456789")).status).toBe(401);
      expect((await list(ENQUEUER)).status).toBe(403);
      expect((await list(ADMIN)).status).toBe(200);
    },
    T,
  );

  test(
    "SIGTERM drains: the job in flight completes, then the process exits 0",
    async () => {
      const { job } = await enqueue(db.sql, { kind: "work/slow", payload: { ms: 1500 } });
      await pollUntil(async () =>
        (await jobState(job.id))?.state === "running" ? true : undefined,
      );
      daemon.proc.kill("SIGTERM");
      expect(await daemon.exited).toBe(0);
      expect(await jobState(job.id)).toMatchObject({ state: "completed", result: { slept: 1500 } });
      expect(daemon.logs.some((r) => r.msg === "conveyor stopped")).toBe(true);
    },
    T,
  );
});

test(
  "check --json shows the fetch size each queue will use",
  async () => {
    const { config } = await workspace(
      `[database]\nurl = "${db.url}"\n[queues.small]\nfetch_batch = 250\n[queues.big]\nconcurrency = 3000\n`,
      PLUGINS,
    );
    const r = await runConveyor(["check", "--json", "--config", config]);
    expect(r.code).toBe(0);
    const queues = JSON.parse(r.stdout).queues as { name: string; fetchBatch: number }[];
    const of = (name: string) => queues.find((q) => q.name === name)?.fetchBatch;
    expect(of("small")).toBe(250);
    expect(of("big")).toBe(1_000);
    expect(of("default")).toBe(10);
  },
  T,
);

test(
  "a runtime setting in the environment is kept, not replaced by the daemon's",
  async () => {
    // Nothing listens on port 1: the daemon stays up, waiting for its database.
    const { config } = await workspace(
      `[database]\nurl = "postgres://127.0.0.1:1/none"\n[api]\nlisten = "127.0.0.1:${await freePort()}"\n`,
      PLUGINS,
    );
    const daemon = spawnConveyor(["start", "--config", config], {
      env: cleanEnv({ MIMALLOC_PURGE_DELAY: "25" }),
    });
    try {
      await daemon.waitForLog((r) => r.msg === "database not reachable; retrying");
      const environ = (await Bun.file(`/proc/${daemon.proc.pid}/environ`).text()).split("\0");
      expect(environ.filter((e) => e.startsWith("MIMALLOC_PURGE_DELAY="))).toEqual([
        "MIMALLOC_PURGE_DELAY=25",
      ]);
      // The variable left unset is still added.
      expect(environ).toContain("BUN_JSC_useWarmUpMarkedBlocks=0");
    } finally {
      daemon.proc.kill("SIGKILL");
      await daemon.exited;
    }
  },
  T,
);

describe("start refuses bad config and bad plugins", () => {
  const start = async (toml: string, plugins: Record<string, string> = PLUGINS) => {
    const { config } = await workspace(`[database]\nurl = "${db.url}"\n${toml}`, plugins);
    return runConveyor(["start", "--config", config]);
  };

  test(
    "an unknown key: named with its line, exit 78",
    async () => {
      const r = await start('\n[api]\nlisten = "127.0.0.1:0"\nlisen = "127.0.0.1:1"\n');
      expect(r.code).toBe(EXIT_CONFIG);
      expect(r.stderr).toContain('conveyor.toml:6: api.lisen: unknown key \\"lisen\\"');
    },
    T,
  );

  test(
    "a wrong type: key, value, expectation and line",
    async () => {
      const r = await start("[queues.email]\nconcurrency = true\n");
      expect(r.code).toBe(EXIT_CONFIG);
      expect(r.stderr).toContain(
        "conveyor.toml:4: queues.email.concurrency: got true: expected number, received boolean",
      );
    },
    T,
  );

  test(
    "a plugin with a syntax error names the file",
    async () => {
      const r = await start("", {
        ...PLUGINS,
        "broken/parse.ts": "export default { handler( };\n",
      });
      expect(r.code).toBe(EXIT_CONFIG);
      expect(r.stderr).toContain("plugin broken/parse.ts: failed to import");
    },
    T,
  );

  test(
    "a plugin with the wrong export names the file",
    async () => {
      const r = await start("", { ...PLUGINS, "wrong.ts": "export default { run() {} };\n" });
      expect(r.code).toBe(EXIT_CONFIG);
      expect(r.stderr).toContain('plugin wrong.ts: unknown key \\"run\\"');
    },
    T,
  );

  test(
    "two plugins claiming one kind name both files",
    async () => {
      const r = await start("", {
        ...PLUGINS,
        "other.ts": 'export default { kind: "echo", handler() {} };\n',
      });
      expect(r.code).toBe(EXIT_CONFIG);
      expect(r.stderr).toContain(
        'plugin other.ts: claims kind \\"echo\\", which echo.ts already handles',
      );
    },
    T,
  );

  test(
    "a cron entry whose kind no plugin handles",
    async () => {
      const r = await start(
        "[[cron]]\nname = 'c'\nschedule = '* * * * *'\nkind = 'missing/kind'\n",
      );
      expect(r.code).toBe(EXIT_CONFIG);
      expect(r.stderr).toContain("conveyor.toml:6: cron.0.kind");
    },
    T,
  );

  test(
    "no tokens and a public listen address",
    async () => {
      const r = await start('[api]\nlisten = "0.0.0.0:8080"\n');
      expect(r.code).toBe(EXIT_CONFIG);
      expect(r.stderr).toContain("conveyor.toml:4: api.listen");
      expect(r.stderr).toContain("loopback only");
    },
    T,
  );

  test.if(process.getuid?.() === 0)(
    "as root, an embedded data folder postgres cannot reach fails clearly",
    async () => {
      const locked = await tempFolder("conveyor-locked-");
      await chmod(locked, 0o700);
      const { config } = await workspace(
        `[embedded]\ndata_dir = "${path.join(locked, "pg")}"\n`,
        PLUGINS,
      );
      const r = await runConveyor(["start", "--config", config]);
      expect(r.code).toBe(1);
      expect(r.stderr).toContain(`which cannot enter ${locked} (mode 700)`);
    },
    T,
  );
});

describe("cron across daemons", () => {
  test(
    "two daemons running an every-second entry enqueue each slot exactly once",
    async () => {
      const { config } = await workspace(
        `[database]
url = "${db.url}"

[[cron]]
name = "every-second"
schedule = "* * * * * *"
kind = "echo"
queue = "cron-race"
payload = { from = "cron" }
`,
        PLUGINS,
      );
      const daemons = [0, 1].map(() =>
        spawnConveyor(["start", "--config", config, "--roles", "cron"]),
      );
      try {
        await Promise.all(daemons.map((d) => d.waitForLog((r) => r.msg === "conveyor started")));
        await Bun.sleep(3_500);
      } finally {
        for (const d of daemons) d.proc.kill("SIGTERM");
      }
      expect(await Promise.all(daemons.map((d) => d.exited))).toEqual([0, 0]);
      // The cron role alone opens no HTTP port.
      expect(daemons[0]?.logs.find((r) => r.msg === "conveyor started")?.api).toBeUndefined();
      const rows = (await db.sql`
      select idempotency_key as key, count(*)::int as n from conveyor_jobs
       where queue = 'cron-race' group by idempotency_key order by idempotency_key`) as unknown as {
        key: string;
        n: number;
      }[];
      expect(rows.length).toBeGreaterThanOrEqual(3);
      expect(rows.every((r) => r.n === 1)).toBe(true);
      const slots = rows.map((r) => Date.parse(r.key.replace("cron:every-second:", "")));
      for (let i = 1; i < slots.length; i++) {
        expect((slots[i] as number) - (slots[i - 1] as number)).toBe(1000);
      }
    },
    T,
  );
});
