// pg-boss 12 on Node (it requires >= 22.12). Settings: batchSize (jobs per
// fetch and per handler call), localConcurrency (workers polling in parallel
// in this process), poolMax. Always on: LISTEN/NOTIFY (useListenNotify + the
// queue's notify) for latency, and burstWhenBatchFull so a full batch fetches
// again at once instead of waiting out the polling interval.
import { PgBoss } from "pg-boss";
import postgres from "postgres";
import { type Adapter, ENQUEUE_POOL, main, type Payload, pollUntil } from "../lib/driver.ts";
import type { Task } from "../lib/protocol.ts";

const QUEUE = "bench";
const CHUNK = 5_000;

function pgBossAdapter(task: Task): Adapter {
  const s = task.settings;
  const boss = new PgBoss({
    connectionString: task.databaseUrl,
    max: Number(s.poolMax ?? 10),
    useListenNotify: true,
  });
  // Jobs are sent from an instance of their own, as from an API process.
  const sender = new PgBoss({
    connectionString: task.databaseUrl,
    max: ENQUEUE_POOL,
    supervise: false,
    schedule: false,
  });
  for (const b of [boss, sender]) {
    b.on("error", (e) => process.stderr.write(`pg-boss error: ${String(e)}\n`));
  }
  const probe = postgres(task.databaseUrl, { max: 1, onnotice: () => {} });

  return {
    postgres: true,
    async setup() {
      await boss.start();
      await boss.createQueue(QUEUE, { notify: true });
      await sender.start();
    },
    async preload(n) {
      for (let i = 0; i < n; i += CHUNK) {
        const count = Math.min(CHUNK, n - i);
        await sender.insert(
          QUEUE,
          Array.from({ length: count }, (_, k) => ({ data: { i: i + k } })),
        );
      }
    },
    async enqueueOne(p) {
      await sender.send(QUEUE, p);
    },
    async enqueueBatch(ps) {
      await sender.insert(
        QUEUE,
        ps.map((p) => ({ data: p })),
      );
    },
    async start(onStart) {
      await boss.work<Payload>(
        QUEUE,
        {
          batchSize: Number(s.batchSize),
          localConcurrency: Number(s.localConcurrency ?? 1),
          pollingIntervalSeconds: 0.5,
          notifyPollingIntervalSeconds: 0.5,
          burstWhenBatchFull: true,
        },
        async (jobs) => {
          for (const job of jobs) onStart(job.data);
        },
      );
    },
    async waitCompleted() {
      // A batch is completed in one statement after its handler returns.
      await pollUntil(async () => {
        const [r] = await probe`
          select count(*)::int as c from pgboss.job
           where name = ${QUEUE} and state <> 'completed'`;
        return r?.c === 0;
      });
    },
    async close() {
      await boss.stop({ graceful: true, timeout: 5_000 });
      await sender.stop({ graceful: true, timeout: 5_000 });
      await probe.end({ timeout: 5 });
    },
  };
}

main(pgBossAdapter);
