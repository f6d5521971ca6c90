// Conveyor through its real worker pool (createWorker) and its public enqueue
// API; as conveyor-http, enqueues go through the HTTP API (createApi in a
// server process of its own) and the typed client instead. Runs on Bun.
// Settings: concurrency, fetchBatch, poolMax (postgres.js pool of the worker);
// for the ledger also effectConcurrency, effectIsolation and independent (the
// handler declares its insert independent of other jobs').
import { randomBytes } from "node:crypto";
import path from "node:path";
import type { Subprocess } from "bun";
import postgres from "postgres";
import { type Client, createClient } from "../../src/client/index.ts";
import {
  createWorker,
  enqueue,
  enqueueMany,
  type JobContext,
  migrate,
  silentLogger,
  type Worker,
} from "../../src/index.ts";
import type { EffectIsolation } from "../../src/worker/effects.ts";
import { type Adapter, counter, ENQUEUE_POOL, main, type Payload } from "../lib/driver.ts";
import type { Task } from "../lib/protocol.ts";

const QUEUE = "bench";
const KIND = "noop";
// Beyond this the preload uses one insert ... select generate_series, so a
// 1M-job backlog takes seconds rather than minutes of JSON validation.
const SQL_PRELOAD_ABOVE = 200_000;
const ENQUEUE_CHUNK = 5_000;

/** The HTTP API in a process of its own, and the typed client pointed at it. */
async function startApiServer(databaseUrl: string) {
  const token = randomBytes(16).toString("hex");
  const server = Bun.spawn(
    [process.execPath, path.join(import.meta.dir, "conveyor-api-server.ts")],
    {
      env: { ...process.env, BENCH_DATABASE_URL: databaseUrl, BENCH_API_TOKEN: token },
      stdout: "pipe",
      stderr: "inherit",
    },
  );
  process.once("exit", () => server.kill("SIGKILL"));
  const reader = server.stdout.getReader();
  let out = "";
  while (!/@@port (\d+)/.test(out)) {
    const { value, done } = await reader.read();
    if (done) throw new Error(`API server exited before listening: ${out}`);
    out += new TextDecoder().decode(value);
  }
  reader.releaseLock();
  const port = Number(/@@port (\d+)/.exec(out)?.[1]);
  return { client: createClient({ baseUrl: `http://127.0.0.1:${port}`, token }), server };
}

function conveyorAdapter(task: Task): Adapter {
  const s = task.settings;
  const sql = postgres(task.databaseUrl, {
    max: Number(s.poolMax ?? 10),
    onnotice: () => {},
  });
  // Enqueues come from a pool of their own, as from an API process.
  const client = postgres(task.databaseUrl, { max: ENQUEUE_POOL, onnotice: () => {} });
  const completed = counter();
  let worker: Worker | undefined;
  let http: { client: Client; server: Subprocess } | undefined;

  const job = (p: Payload) => ({ queue: QUEUE, kind: KIND, payload: { ...p } });

  return {
    postgres: true,
    async setup() {
      await migrate(sql);
      if (task.system === "conveyor-http") http = await startApiServer(task.databaseUrl);
      if (task.ledger) {
        await sql`create table if not exists bench_ledger (
          job_id bigint primary key, amount integer not null, at timestamptz not null default now())`;
      }
    },
    async preload(n) {
      if (task.finishedRows) {
        await sql`
          insert into conveyor_jobs
            (queue, kind, payload, state, attempts, lease_version, attempted_at, finalized_at)
          select ${QUEUE}, ${KIND}, jsonb_build_object('i', -g), 'completed', 1, 1, now(), now()
            from generate_series(1, ${task.finishedRows}::int) g`;
      }
      if (n > SQL_PRELOAD_ABOVE) {
        await sql`
          insert into conveyor_jobs (queue, kind, payload)
          select ${QUEUE}, ${KIND}, jsonb_build_object('i', g - 1)
            from generate_series(1, ${n}::int) g`;
        return;
      }
      for (let i = 0; i < n; i += ENQUEUE_CHUNK) {
        const count = Math.min(ENQUEUE_CHUNK, n - i);
        await enqueueMany(
          client,
          Array.from({ length: count }, (_, k) => job({ i: i + k })),
        );
      }
    },
    async enqueueOne(p) {
      if (http) await http.client.enqueue(job(p));
      else await enqueue(client, job(p));
    },
    async enqueueBatch(ps) {
      if (http) await http.client.enqueueBatch(ps.map(job));
      else await enqueueMany(client, ps.map(job));
    },
    async start(onStart) {
      const independent = s.independent === true;
      const handler = task.ledger
        ? async (p: Payload, ctx: JobContext) => {
            onStart(p);
            await ctx.transaction(
              async (tx) => {
                await tx`insert into bench_ledger (job_id, amount) values (${ctx.job.id}, 1)`;
                return undefined;
              },
              { independent },
            );
          }
        : (p: Payload) => {
            onStart(p);
          };
      worker = createWorker({
        sql,
        queues: {
          [QUEUE]: {
            concurrency: Number(s.concurrency),
            fetchBatch: s.fetchBatch === undefined ? undefined : Number(s.fetchBatch),
            leaseMs: 30_000,
          },
        },
        // biome-ignore lint/suspicious/noExplicitAny: payload typed by the bench, not JSON.
        handlers: { [KIND]: handler as any },
        pollIntervalMs: Number(s.pollIntervalMs ?? 1_000),
        ...(s.effectBatch === undefined ? {} : { effectBatch: Number(s.effectBatch) }),
        ...(s.effectConcurrency === undefined
          ? {}
          : { effectConcurrency: Number(s.effectConcurrency) }),
        ...(s.effectIsolation === undefined
          ? {}
          : { effectIsolation: s.effectIsolation as EffectIsolation }),
        listen: true,
        logger: silentLogger,
      });
      worker.events.on("job:completed", () => completed.add());
      await worker.start();
    },
    waitCompleted: (n) => completed.reach(n),
    async close() {
      http?.server.kill("SIGTERM");
      await http?.server.exited;
      await worker?.stop({ graceMs: 2_000 });
      await Promise.all([sql.end({ timeout: 5 }), client.end({ timeout: 5 })]);
    },
  };
}

main(conveyorAdapter);
