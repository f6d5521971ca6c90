// BullMQ 6 on Node, on Redis or on its PostgreSQL backend (createPostgresBackend,
// built into bullmq since 6.0). Settings: concurrency (jobs in flight per
// worker), poolMax (Postgres backend: the worker's pg.Pool size). Completed
// jobs are kept to the last 1,000 (removeOnComplete), as a throughput-minded
// deployment would, so Redis memory and the Postgres table stay bounded.
import { createPostgresBackend, Queue, runMigrations, Worker } from "bullmq";
import pg from "pg";
import { type Adapter, counter, ENQUEUE_POOL, main, type Payload } from "../lib/driver.ts";
import type { Task } from "../lib/protocol.ts";

const QUEUE = "bench";
const NAME = "noop";
const CHUNK = 1_000;
const KEEP = { count: 1_000 };

function redisOptions(url: string) {
  const u = new URL(url);
  return {
    host: u.hostname,
    port: Number(u.port || 6379),
    db: Number(u.pathname.slice(1) || 0),
    // Workers must retry forever rather than fail commands while reconnecting.
    maxRetriesPerRequest: null,
  };
}

async function migratePostgres(url: string) {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    await runMigrations(client);
  } finally {
    await client.end();
  }
}

function bullmqAdapter(task: Task): Adapter {
  const s = task.settings;
  const onPostgres = task.system === "bullmq-postgres";
  if (!onPostgres && !task.redisUrl) throw new Error("BullMQ on Redis needs task.redisUrl");
  const redis = redisOptions(task.redisUrl ?? "redis://unused");
  const newQueue = () =>
    onPostgres
      ? new Queue(
          QUEUE,
          { connection: { connectionString: task.databaseUrl, max: ENQUEUE_POOL } },
          createPostgresBackend,
        )
      : new Queue(QUEUE, { connection: redis });
  const newWorker = (onStart: (p: Payload) => void) => {
    const processor = async (j: { data: Payload }) => {
      onStart(j.data);
    };
    const opts = {
      concurrency: Number(s.concurrency),
      removeOnComplete: KEEP,
      removeOnFail: KEEP,
    };
    return onPostgres
      ? new Worker(
          QUEUE,
          processor,
          {
            ...opts,
            connection: { connectionString: task.databaseUrl, max: Number(s.poolMax ?? 10) },
          },
          createPostgresBackend,
        )
      : new Worker(QUEUE, processor, { ...opts, connection: redis });
  };
  let queue: ReturnType<typeof newQueue> | undefined;
  let worker: ReturnType<typeof newWorker> | undefined;
  const completed = counter();
  const job = (p: Payload) => ({ name: NAME, data: p });

  return {
    postgres: onPostgres,
    async setup() {
      if (onPostgres) await migratePostgres(task.databaseUrl);
      queue = newQueue();
      await queue.waitUntilReady();
    },
    async preload(n) {
      for (let i = 0; i < n; i += CHUNK) {
        const count = Math.min(CHUNK, n - i);
        await queue?.addBulk(Array.from({ length: count }, (_, k) => job({ i: i + k })));
      }
    },
    async enqueueOne(p) {
      await queue?.add(NAME, p);
    },
    async enqueueBatch(ps) {
      await queue?.addBulk(ps.map(job));
    },
    async start(onStart) {
      worker = newWorker(onStart);
      // 'completed' fires once the job has been moved to completed in the store.
      worker.on("completed", () => completed.add());
      worker.on("error", (e) => process.stderr.write(`bullmq worker error: ${String(e)}\n`));
      await worker.waitUntilReady();
    },
    waitCompleted: (n) => completed.reach(n),
    async close() {
      await worker?.close();
      await queue?.close();
    },
  };
}

main(bullmqAdapter);
