// graphile-worker through run() and WorkerUtils, on Node (it requires >= 22.18).
// Settings: concurrency (concurrentJobs), maxPoolSize, and the batching
// options of 0.16+: localQueueSize (localQueue.size; -1 = off),
// completeJobBatchDelay and failJobBatchDelay (-1 = off, 0 = batch what
// accumulates within one tick).
import { Logger, makeWorkerUtils, type Runner, run, type WorkerUtils } from "graphile-worker";
import postgres from "postgres";
import { type Adapter, ENQUEUE_POOL, main, type Payload, pollUntil } from "../lib/driver.ts";
import type { Task } from "../lib/protocol.ts";

const TASK = "noop";
const CHUNK = 5_000;
const silent = new Logger(() => () => {});

function graphileAdapter(task: Task): Adapter {
  const s = task.settings;
  const connectionString = task.databaseUrl;
  const worker = {
    connectionString,
    concurrentJobs: Number(s.concurrency),
    maxPoolSize: Number(s.maxPoolSize ?? 10),
    pollInterval: Number(s.pollInterval ?? 2_000),
    localQueue: { size: Number(s.localQueueSize ?? -1) },
    completeJobBatchDelay: Number(s.completeJobBatchDelay ?? -1),
    failJobBatchDelay: Number(s.failJobBatchDelay ?? -1),
  };
  let utils: WorkerUtils | undefined;
  let runner: Runner | undefined;
  const probe = postgres(connectionString, { max: 1, onnotice: () => {} });
  const spec = (p: Payload) => ({ identifier: TASK, payload: p });

  return {
    postgres: true,
    async setup() {
      utils = await makeWorkerUtils({
        connectionString,
        logger: silent,
        maxPoolSize: ENQUEUE_POOL,
      });
      await utils.migrate();
    },
    async preload(n) {
      for (let i = 0; i < n; i += CHUNK) {
        const count = Math.min(CHUNK, n - i);
        await utils?.addJobs(Array.from({ length: count }, (_, k) => spec({ i: i + k })));
      }
    },
    async enqueueOne(p) {
      await utils?.addJob(TASK, p);
    },
    async enqueueBatch(ps) {
      await utils?.addJobs(ps.map(spec));
    },
    async start(onStart) {
      runner = await run({
        logger: silent,
        noHandleSignals: true,
        taskList: {
          [TASK]: async (payload) => {
            onStart(payload as Payload);
          },
        },
        preset: { worker },
      });
    },
    async waitCompleted() {
      // Completed jobs are deleted; batched completions land after the task
      // returns, so wait for the table to empty rather than for events.
      await pollUntil(async () => {
        const [r] = await probe`select count(*)::int as c from graphile_worker._private_jobs`;
        return r?.c === 0;
      });
    },
    async close() {
      await runner?.stop();
      await utils?.release();
      await probe.end({ timeout: 5 });
    },
  };
}

main(graphileAdapter);
