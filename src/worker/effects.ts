// Effects: runs handlers' guarded transactions (ctx.transaction), several
// jobs to one commit (spec: the guarded effect transaction).
//
// Invariant: a job's effect commits only together with its fenced completion,
// and only while the worker still holds the job's lease; one job's failing
// effect never undoes or blocks another job's.
//
// One transaction per job made each effect cost a commit: a WAL flush, about
// 1 ms here, so effects ran at a few hundred jobs/s whatever the concurrency.
// While a transaction is in flight the requests that arrive wait, and the next
// transaction takes them together (adaptive, with no timer, like the
// completer):
//
//   BEGIN
//   complete every job, fenced (owner, version, state 'running')  -- 1 statement
//   per job: the handler's fn
//   store the results of the fns that returned one                -- 1 statement, if any
//   COMMIT
//
// A job whose lease was lost is not matched by the fence and its fn never
// runs. Nobody sees the completion before COMMIT, which shows it together
// with the effects, and its row lock keeps the lease's holder fixed until
// then (the reaper and dequeue skip locked rows). Completing before the fns
// run is sound because without savepoints the group commits whole or not at
// all: a fn that fails rolls everything back (below). A request alone runs
// the same way. With savepoints, where one fn may fail alone and its job
// must stay running, the first statement only locks the rows (FOR UPDATE,
// the same fence), and the last completes the jobs whose fn returned.
//
// Every group used to lock first and complete last: a statement more per
// group and a row lock per job, which WAL-logs a record of its own. With a
// ledger insert per job, completing first took PostgreSQL's CPU per job from
// 112-123 µs (median 115) to 92-108 (97), and throughput from 8,088-9,713
// (median 8,855) to 7,514-11,498 jobs/s (10,305): 10,000 jobs, c500-e4-ind
// of bench/plan.ts, 6 runs each interleaved, 2 cores.
//
// Isolating one job's failure from the others takes a savepoint per fn, and a
// savepoint is a subtransaction: every job then writes under a subtransaction
// id of its own, which COMMIT records one by one. With a ledger insert per
// job, savepoints cost a fifth to a quarter of the throughput (7,500 against
// 9,350 jobs/s at 10,000 jobs, 9,450 against 11,912 at 100,000, 2 cores:
// results/benchmarks-2026-12-01-rerun.json). So by default
// ("rerun") the group first runs with no savepoint at all. If any fn fails,
// or the completion does, before COMMIT is sent, the whole transaction rolls
// back, nothing of it stays, and the group runs again as below, each fn in
// its own savepoint: a fn may run twice, and only the last run's writes can
// commit. With "savepoint" the group runs that way from the start, each fn
// once:
//
//   per job: SAVEPOINT; the handler's fn; (ROLLBACK TO SAVEPOINT if it threw)
//
// A failed COMMIT is never rerun: its outcome is unknown, and every job of
// the group gets its error, as before. After a failed first pass, groups run
// with savepoints until one has no failing fn (runGroup).
//
// A fn declared independent (ctx.transaction(fn, { independent: true }))
// touches no row another fn does, so in the first pass the group's
// independent fns all start at once, before the others run one by one:
// postgres.js then pipelines their statements on the transaction's
// connection, several per network write, where one after another each cost a
// round trip. With a ledger insert per job that round trip was most of the
// CPU per job, worker's and server's: 7,571 jobs/s one by one, 12,957 at
// once (100,000 jobs, 2 cores, medians of 3 in one bench run,
// results/benchmarks-2026-12-01-independent.json). Savepoints are a stack
// that interleaved fns would unwind into each other (ROLLBACK TO one fn's
// savepoint undoes what another wrote after it), so an independent fn's tx
// refuses them; the savepoint pass runs every fn alone.
//
// Postgres caches 64 subtransaction ids per backend before every snapshot
// has to look them up in pg_subtrans, so a group stays below that.
//
// A transaction that has not committed after `timeoutMs` (fns included) is
// abandoned: its requests are rejected, its slot is freed, and it sends no
// completion or COMMIT any more (one already sent is an unknown outcome, as
// a lost reply is, which the executor's fail write reads back). Its rows
// stay locked while the server holds it open, and a locked row is neither
// heartbeated nor reaped, so the transaction also sets
// idle_in_transaction_session_timeout to the same limit: a client that goes
// quiet inside it (a hung fn, or a statement the client library never
// settled, seen in the fault suite before scripts/patch-postgres.mjs) has
// the server end it, which releases the rows for the reaper.

import type postgres from "postgres";
import type { Lease, Pool } from "../db/db.ts";
import { completeJobs, lockLeasedJobs, setResultsLocked } from "../db/outcome.ts";
import { ConveyorError, DeadlineError, StaleLeaseError } from "../errors.ts";
import { assertJson, type JsonValue } from "../json.ts";
import { DB_CALL_DEADLINE_MS, nextTurn, withDeadline } from "./loop.ts";

export const EFFECT_GROUP_MAX = 60;

/** How a shared transaction keeps one job's failing fn from undoing the others' (see above). */
export const EFFECT_ISOLATION = ["rerun", "savepoint"] as const;
export type EffectIsolation = (typeof EFFECT_ISOLATION)[number];

// biome-ignore lint/suspicious/noExplicitAny: postgres.js's custom-type parameter is irrelevant here.
type Tx = postgres.TransactionSql<any>;
type EffectFn = (tx: Tx) => Promise<JsonValue | undefined>;

export interface EffectRunner {
  /**
   * Runs fn in a transaction with the job's fenced completion. Resolves with
   * fn's result once committed; rejects with StaleLeaseError when the lease
   * was lost (fn did not run), with fn's error when it threw (nothing of it
   * committed), or with the database's error when the commit failed.
   */
  run(
    lease: Lease,
    fn: EffectFn,
    onStart?: () => void,
    independent?: boolean,
  ): Promise<JsonValue | undefined>;
  readonly pending: number;
}

export interface EffectRunnerOptions {
  sql: Pool;
  owner: string;
  /** Most jobs in one transaction; 1 gives every job its own. */
  maxGroup: number;
  /** Transactions in flight at once (each holds a pool connection). */
  concurrency: number;
  /** Default "rerun". */
  isolation?: EffectIsolation;
  /** Longest a transaction may take, fns included, before it is abandoned (see above); default DB_CALL_DEADLINE_MS. */
  timeoutMs?: number;
}

interface Request {
  lease: Lease;
  fn: EffectFn;
  /** Called when its transaction begins: from then on its row is (about to be) locked. */
  onStart: (() => void) | undefined;
  /** May run interleaved with the group's other independent fns (see above). */
  independent: boolean;
  resolve: (out: JsonValue | undefined) => void;
  reject: (error: unknown) => void;
  out?: JsonValue | undefined;
  /** Set for every request of a group before settle() answers them. */
  outcome?: { ok: true } | { ok: false; error: unknown };
}

const stale = (lease: Lease) => new StaleLeaseError(lease.id, String(lease.version), "complete");

/** The transaction as an independent fn sees it: the same, but no savepoints. */
function withoutSavepoints(tx: Tx): Tx {
  return new Proxy(tx, {
    get(target, prop, receiver) {
      if (prop === "savepoint") {
        return () => {
          throw new ConveyorError(
            "an independent ctx.transaction() fn may not take savepoints: interleaved with other jobs' fns, rolling one back would undo their writes",
          );
        };
      }
      return Reflect.get(target, prop, receiver);
    },
  });
}

export function createEffectRunner(o: EffectRunnerOptions): EffectRunner {
  const maxGroup = Math.max(1, Math.min(EFFECT_GROUP_MAX, o.maxGroup));
  const isolation = o.isolation ?? "rerun";
  const timeoutMs = o.timeoutMs ?? DB_CALL_DEADLINE_MS;
  const queue: Request[] = [];
  let active = 0;

  /**
   * o.sql.begin(body), abandoned after timeoutMs: rejects with DeadlineError
   * then, and the transaction, if it ever gets that far, rolls back instead
   * of completing its jobs. `inTime` throws once abandoned: body calls it
   * before its completion statement.
   */
  async function transaction(body: (tx: Tx, inTime: () => void) => Promise<void>): Promise<void> {
    let abandoned: DeadlineError | undefined;
    const inTime = () => {
      if (abandoned) throw abandoned;
    };
    const run = o.sql.begin(async (tx) => {
      // Sent before body's first statement, in the same network write.
      const limit =
        tx`select set_config('idle_in_transaction_session_timeout', ${String(timeoutMs)}, true)`.execute();
      await Promise.all([limit, body(tx, inTime)]);
      inTime();
    });
    await withDeadline(run, "effect transaction", timeoutMs).catch((error) => {
      if (error instanceof DeadlineError) abandoned = error;
      throw error;
    });
  }

  // An independent fn gets a tx without savepoints (withoutSavepoints).
  const runFn = async (r: Request, tx: Tx) => {
    const out = await r.fn(r.independent ? withoutSavepoints(tx) : tx);
    if (out !== undefined) assertJson(out, "result");
    return out;
  };

  async function runAlone(r: Request) {
    await transaction(async (tx, inTime) => {
      // First statement: the fenced completion, which also locks the row.
      const done = await completeJobs(tx, o.owner, [r.lease]);
      if (!done.has(r.lease.id)) throw stale(r.lease);
      r.out = await runFn(r, tx);
      inTime();
      if (r.out !== undefined) await setResultsLocked(tx, [{ id: r.lease.id, result: r.out }]);
    });
    r.outcome = { ok: true };
  }

  /**
   * One shared transaction for the group. With savepoints, a failing fn is
   * rolled back alone and its request gets its error. Without, a failing fn
   * (or the results' statement, after a fn left the transaction aborted)
   * rolls back everything before COMMIT is sent: returns false, every
   * request as it was before, for the caller to rerun. Other errors (the
   * first statement's, COMMIT's) are thrown.
   */
  async function runShared(group: Request[], savepoints: boolean): Promise<boolean> {
    let rerun = false;
    try {
      await transaction(async (tx, inTime) => {
        const leases = group.map((r) => r.lease);
        // Without savepoints every fn runs or the whole group rolls back, so
        // the group is completed first, as a request alone is; with them a
        // fn may fail alone and its job must stay running, so the rows are
        // only locked, and completed once the fns are done.
        const held = savepoints
          ? await lockLeasedJobs(tx, o.owner, leases)
          : await completeJobs(tx, o.owner, leases);
        rerun = !savepoints;
        const ran: Request[] = [];
        const live: Request[] = [];
        for (const r of group) {
          if (held.has(r.lease.id)) live.push(r);
          else r.outcome = { ok: false, error: stale(r.lease) };
        }
        if (!savepoints) {
          // Every independent fn settles before any error rolls back: none
          // may still be issuing statements on this connection after it.
          const together = live.filter((r) => r.independent);
          const settled = await Promise.allSettled(together.map((r) => runFn(r, tx)));
          settled.forEach((s, i) => {
            if (s.status === "rejected") throw s.reason;
            (together[i] as Request).out = s.value;
          });
          ran.push(...together);
          for (const r of live) {
            if (r.independent) continue;
            r.out = await runFn(r, tx);
            ran.push(r);
          }
          inTime();
          // A fn that caught its own failed statement returned normally but
          // left the transaction aborted, and COMMIT would only roll it
          // back, failing every job: a statement after the fns fails
          // instead, and the group reruns. The results' statement is that
          // statement, or a bare one when no fn returned a result.
          const results = ran.flatMap((r) =>
            r.out === undefined ? [] : [{ id: r.lease.id, result: r.out }],
          );
          if (results.length > 0) await setResultsLocked(tx, results);
          else await tx`select 1`;
          rerun = false;
          for (const r of ran) r.outcome = { ok: true };
          return;
        }
        for (const r of live) {
          try {
            r.out = await tx.savepoint((sp) => runFn(r, sp));
            ran.push(r);
          } catch (error) {
            r.outcome = { ok: false, error };
          }
        }
        inTime();
        const done = await completeJobs(
          tx,
          o.owner,
          ran.map((r) => (r.out === undefined ? r.lease : { ...r.lease, result: r.out })),
        );
        for (const r of ran) {
          // Locked above, so this cannot miss; if it did, fn's effect would
          // commit without the completion, so fail the whole transaction.
          if (!done.has(r.lease.id)) throw stale(r.lease);
          r.outcome = { ok: true };
        }
      });
    } catch (error) {
      // An abandoned transaction may still hold the rows: never rerun it.
      if (!rerun || error instanceof DeadlineError) throw error;
      for (const r of group) {
        r.out = undefined;
        r.outcome = undefined;
      }
      return false;
    }
    return true;
  }

  // After a first pass fails, the next groups take savepoints from the
  // start, until one runs with no fn failing: where many fns fail (a kind
  // whose effects often violate a constraint), most groups would otherwise
  // run twice, costlier than savepoints alone.
  let together = isolation === "rerun";

  async function runGroup(group: Request[]) {
    if (together) {
      if (await runShared(group, false)) return;
      together = false;
    }
    await runShared(group, true);
    const clean = group.every((r) => r.outcome?.ok || r.outcome?.error instanceof StaleLeaseError);
    if (isolation === "rerun" && clean) together = true;
  }

  async function settle(group: Request[]) {
    for (const r of group) r.onStart?.();
    try {
      if (group.length === 1) await runAlone(group[0] as Request);
      else await runGroup(group);
    } catch (error) {
      // Nothing committed. Requests that had their own outcome keep it
      // (their fn threw, or their lease was gone); the rest get this error.
      for (const r of group) {
        if (r.outcome === undefined || r.outcome.ok) r.outcome = { ok: false, error };
      }
    }
    for (const r of group) {
      if (r.outcome?.ok) r.resolve(r.out);
      else r.reject(r.outcome?.error);
    }
  }

  const pump = () => {
    while (active < o.concurrency && queue.length > 0) {
      const group = queue.splice(0, maxGroup);
      active++;
      void settle(group).finally(() => {
        active--;
        pump();
      });
    }
  };

  // A new request waits for the next turn of the event loop: the jobs of one
  // fetched batch call ctx.transaction() in the same turn, and starting at
  // once would send the first few alone, each with a commit of its own.
  const schedule = nextTurn(pump);

  return {
    run(lease, fn, onStart, independent = false) {
      return new Promise((resolve, reject) => {
        queue.push({ lease, fn, onStart, independent, resolve, reject });
        schedule();
      });
    },
    get pending() {
      return queue.length;
    },
  };
}
