// The ceiling: no queue library, just postgres.js and the two statements any
// Postgres queue must run per batch — a FOR UPDATE SKIP LOCKED dequeue that
// bumps the lease version, and a completion fenced on that version — from
// `loops` concurrent loops of `batch` jobs each. Runs on Bun.
//
// Two tables:
// - bare-sql: a minimal job table (the columns a fenced lease needs, one
//   partial index for the dequeue, no trigger, Conveyor's fillfactor:
//   bench/lib/minimal-table.ts). The ceiling we measure against.
// - bare-sql-conveyor-schema: Conveyor's own table and its own statements
//   (src/db/fetch.ts, src/db/outcome.ts) driven by the same loop, so the gap
//   between it and Conveyor is the worker pool, and the gap between it and
//   bare-sql is the schema and statements.
//
// With `ledger`, each batch's completion and its ledger rows commit in one
// transaction.
import { randomUUID } from "node:crypto";
import postgres from "postgres";
import { fetchJobs } from "../../src/db/fetch.ts";
import { migrate } from "../../src/db/migrate.ts";
import { completeJobsIdempotent } from "../../src/db/outcome.ts";
import { type Adapter, counter, main, type Payload } from "../lib/driver.ts";
import { MINIMAL_TABLE_DDL } from "../lib/minimal-table.ts";
import type { Task } from "../lib/protocol.ts";

const QUEUE = "bench";
const KIND = "noop";
const LEASE_MS = 30_000;

interface Leased {
  id: string;
  version: string;
  payload: Payload;
}

interface Statements {
  setup(): Promise<void>;
  preload(n: number): Promise<void>;
  insertOne(p: Payload): Promise<void>;
  insertMany(ps: Payload[]): Promise<void>;
  dequeue(db: postgres.Sql, limit: number): Promise<Leased[]>;
  /** Fenced; returns how many rows it changed. */
  complete(db: postgres.Sql | postgres.TransactionSql, jobs: Leased[]): Promise<number>;
}

function minimalTable(sql: postgres.Sql, owner: string): Statements {
  return {
    async setup() {
      await sql.unsafe(MINIMAL_TABLE_DDL);
    },
    async preload(n) {
      await sql`insert into bench_jobs (queue, kind, payload)
        select ${QUEUE}, ${KIND}, jsonb_build_object('i', g - 1) from generate_series(1, ${n}::int) g`;
    },
    async insertOne(p) {
      await sql`insert into bench_jobs (queue, kind, payload)
        values (${QUEUE}, ${KIND}, ${JSON.stringify(p)}::jsonb)`;
    },
    async insertMany(ps) {
      await sql`insert into bench_jobs (queue, kind, payload)
        select ${QUEUE}, ${KIND}, p from unnest(${ps.map((p) => JSON.stringify(p))}::jsonb[]) p`;
    },
    // The locked ids as an array the update probes by primary key, as
    // Conveyor's fetchJobs: joined as a CTE, the planner hashed them against
    // a sequential scan of the table. The array form gave the higher, and so
    // stricter, ceiling (3 reps each, same hour: best cell at N = 100,000
    // 52,526 -> 63,342 jobs/s; at 10,000 within noise, 53,475 and 50,293).
    async dequeue(db, limit) {
      return (await db`
        update bench_jobs j
           set state = 1, attempts = j.attempts + 1, lease_owner = ${owner},
               lease_version = j.lease_version + 1,
               lease_expires_at = now() + ${LEASE_MS}::float8 * interval '1 millisecond'
         where j.id = any(array(
           select id from bench_jobs
            where state = 0 and queue = ${QUEUE} and run_at <= now()
            order by priority, run_at, id
            limit ${limit}
            for update skip locked))
        returning j.id, j.lease_version as version, j.payload`) as unknown as Leased[];
    },
    async complete(db, jobs) {
      const r = await db`
        update bench_jobs j
           set state = 2, finalized_at = now(), lease_expires_at = null
          from unnest(${jobs.map((j) => j.id)}::bigint[], ${jobs.map((j) => j.version)}::bigint[])
               as t(id, version)
         where j.id = t.id and j.lease_version = t.version
           and j.lease_owner = ${owner} and j.state = 1`;
      return r.count;
    },
  };
}

function conveyorTable(sql: postgres.Sql, owner: string): Statements {
  return {
    setup: () => migrate(sql).then(() => {}),
    async preload(n) {
      await sql`insert into conveyor_jobs (queue, kind, payload)
        select ${QUEUE}, ${KIND}, jsonb_build_object('i', g - 1) from generate_series(1, ${n}::int) g`;
    },
    insertOne: () => Promise.reject(new Error("enqueue through Conveyor's API instead")),
    insertMany: () => Promise.reject(new Error("enqueue through Conveyor's API instead")),
    async dequeue(db, limit) {
      const rows = await fetchJobs(db, {
        queue: QUEUE,
        owner,
        limit,
        leaseMs: LEASE_MS,
        kinds: [KIND],
      });
      return rows.map((r) => ({
        id: String(r.id),
        version: String(r.lease_version),
        payload: r.payload as unknown as Payload,
      }));
    },
    async complete(db, jobs) {
      const done = await completeJobsIdempotent(
        db,
        owner,
        jobs.map((j) => ({ id: j.id, version: Number(j.version) })),
      );
      return done.size;
    },
  };
}

function bareAdapter(task: Task): Adapter {
  const s = task.settings;
  const loops = Number(s.loops ?? 4);
  const batch = Number(s.batch ?? 500);
  const sql = postgres(task.databaseUrl, {
    max: Number(s.poolMax ?? loops + 1),
    onnotice: () => {},
  });
  const owner = `bare:${process.pid}:${randomUUID().slice(0, 8)}`;
  const st =
    task.system === "bare-sql-conveyor-schema"
      ? conveyorTable(sql, owner)
      : minimalTable(sql, owner);
  const completed = counter();
  const failures: unknown[] = [];
  let running: Promise<void>[] = [];

  // The whole batch in one transaction: the fenced completion, then every
  // job's ledger row in one statement. One commit per batch is what a
  // hand-written loop would do; Conveyor's shared effect transactions come
  // close to it, with the handler's own statement per job.
  const ledgerTx = (jobs: Leased[]) =>
    sql.begin(async (tx) => {
      const n = await st.complete(tx, jobs);
      if (n !== jobs.length) throw new Error(`fence rejected ${jobs.length - n} completions`);
      const ids = jobs.map((j) => j.id);
      await tx`insert into bench_ledger (job_id, amount) select unnest(${ids}::bigint[]), 1`;
    });

  const loop = async (onStart: (p: Payload) => void) => {
    for (;;) {
      const jobs = await st.dequeue(sql, batch);
      // Everything was pre-enqueued: an empty dequeue means the backlog is gone.
      if (jobs.length === 0) return;
      for (const j of jobs) onStart(j.payload);
      if (task.ledger) {
        await ledgerTx(jobs);
        completed.add(jobs.length);
      } else {
        const n = await st.complete(sql, jobs);
        if (n !== jobs.length) throw new Error(`fence rejected ${jobs.length - n} completions`);
        completed.add(n);
      }
    }
  };

  return {
    postgres: true,
    unsupported: ["latency", "rss"],
    async setup() {
      await st.setup();
      if (task.ledger) {
        await sql`create table bench_ledger (
          job_id bigint primary key, amount integer not null, at timestamptz not null default now())`;
      }
    },
    preload: (n) => st.preload(n),
    enqueueOne: (p) => st.insertOne(p),
    enqueueBatch: (ps) => st.insertMany(ps),
    async start(onStart) {
      running = Array.from({ length: loops }, () =>
        loop(onStart).catch((e) => void failures.push(e)),
      );
    },
    async waitCompleted(n) {
      await Promise.race([completed.reach(n), Promise.all(running)]);
      if (failures.length > 0) throw failures[0];
      if (completed.value < n) throw new Error(`only ${completed.value} of ${n} completed`);
    },
    async close() {
      await Promise.all(running);
      await sql.end({ timeout: 5 });
    },
  };
}

main(bareAdapter);
