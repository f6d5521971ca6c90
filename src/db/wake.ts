// Wake-ups for listening workers: one NOTIFY on JOBS_CHANNEL per queue, the
// queue name as payload (followed by the sender's tag, below).
//
// Postgres serialises the commits of every transaction that notified: from
// PreCommit_Notify to the end of the commit (its WAL flush included) each
// holds one cluster-wide lock, so notifying transactions cannot share a flush
// (group commit) the way plain ones do. So an enqueue that commits on its own
// (on the pool, not in a caller's transaction) inserts without notifying and
// hands its queues to the pool's waker, which sends them after the commit in
// one statement of its own: one notifying transaction at a time per pool,
// whatever the enqueue rate, and every enqueue that committed meanwhile rides
// on the next one. Measured on 2 cores with fsync on, 1,000 one-job
// enqueues per second with a worker running them, this and the local
// wake-up below together against pg_notify in the insert (two runs each,
// same hour): enqueue acknowledged at p50 1.0-1.1 ms instead of 1.46, p99
// 3.7-4.4 ms instead of 6.8-29.6; enqueue to handler start p50 2.0-2.3 ms
// instead of 2.56-2.58, p99 6.1-7.5 ms instead of 8.7-31.
//
// Workers in the enqueuing process, on the same database, are woken directly
// when the insert has committed, without waiting for the notification's round
// trip through Postgres (the daemon's HTTP API and its worker pool share a
// process). The notification is still sent, for every other process; it
// carries the sender's tag, by which those same local workers skip it.
//
// A wake-up is a hint, never the delivery: a job whose notification is lost
// (the process exits first, the connection drops) is found by the workers'
// poll. An enqueue inside a caller's transaction notifies in its own
// statement, delivered only if that transaction commits (src/db/enqueue.ts).
import { randomBytes } from "node:crypto";
import type { Db, Pool } from "./db.ts";

export const JOBS_CHANNEL = "conveyor_jobs";

const PROCESS_TAG = randomBytes(6).toString("hex");

const keys = new WeakMap<Pool, string>();

/** Pools to one database, as postgres.js parsed their options; computed once per pool. */
function databaseKey(pool: Pool): string {
  let key = keys.get(pool);
  if (key === undefined) {
    const o = pool.options;
    key = `${o.user}@${o.host.join(",")}:${o.port.join(",")}/${o.database}`;
    keys.set(pool, key);
  }
  return key;
}

/**
 * Callbacks of this process, registered per database (any pool to it finds
 * them): local wake-ups here, hand-offs in src/db/handoff.ts.
 */
export function perDatabase<F>() {
  const byKey = new Map<string, Set<F>>();
  return {
    /** Registers `fn` for the pool's database; returns the unregister function. */
    add(pool: Pool, fn: F): () => void {
      const key = databaseKey(pool);
      let set = byKey.get(key);
      if (!set) {
        set = new Set();
        byKey.set(key, set);
      }
      set.add(fn);
      return () => {
        set.delete(fn);
        if (set.size === 0) byKey.delete(key);
      };
    },
    /** The callbacks registered for the pool's database, if any. */
    of: (pool: Pool): ReadonlySet<F> | undefined => byKey.get(databaseKey(pool)),
  };
}

/** Names this process and the pool's database in a notification's payload. */
export function senderTag(pool: Pool): string {
  return `${PROCESS_TAG}.${Bun.hash(databaseKey(pool)).toString(36)}`;
}

/**
 * A notification's payload: the queue, then the sender's tag when the
 * notification follows a committed enqueue (queue names have no spaces).
 * A bare queue name (a caller's transaction, the API, a manual pg_notify)
 * wakes everyone.
 */
export function parseWake(payload: string): { queue: string; sender: string | undefined } {
  const space = payload.indexOf(" ");
  return space < 0
    ? { queue: payload, sender: undefined }
    : { queue: payload.slice(0, space), sender: payload.slice(space + 1) };
}

const localListeners = perDatabase<(queue: string) => void>();

/** Calls `fn` with each queue this process's enqueues on the pool's database make runnable, once committed. */
export function onLocalWake(pool: Pool, fn: (queue: string) => void): () => void {
  return localListeners.add(pool, fn);
}

/** A postgres.js pool, as opposed to a transaction or a reserved connection: its statements commit on their own. */
export function isPool(db: Db): db is Pool {
  return typeof (db as Pool).begin === "function";
}

/**
 * Notifies these queues now (each payload a queue name, optionally followed
 * by a sender's tag). In a caller's transaction the notification is
 * delivered when it commits. On a pool the statement is a transaction of its
 * own, committed without waiting for its WAL flush (synchronous_commit off
 * for that transaction only): it changes no data, so a crash can lose nothing
 * but the notification, which the poll covers; and it holds the notify lock
 * (above) for microseconds instead of a disk flush. Postgres gives a notifying
 * transaction an XID, so with the default it would wait for a flush.
 */
export async function notifyQueues(db: Db, payloads: Iterable<string>): Promise<void> {
  const list = [...new Set(payloads)];
  if (list.length === 0) return;
  if (isPool(db)) {
    await db`
      select set_config('synchronous_commit', 'off', true), pg_notify(${JOBS_CHANNEL}, q)
        from unnest(${list}::text[]) as q`;
  } else {
    await db`select pg_notify(${JOBS_CHANNEL}, q) from unnest(${list}::text[]) as q`;
  }
}

interface Waker {
  /** The sender tag of this pool's database. */
  tag: string;
  pending: Set<string>;
  /** The flush loop, while one runs. */
  flushing: Promise<void> | undefined;
}

const wakers = new WeakMap<Pool, Waker>();

/**
 * Call after an insert on `pool` has committed: wakes this process's workers
 * on that database at once, and every other process by a notification,
 * coalesced per pool: at most one notifying statement in flight, which takes
 * every queue added while the previous one ran. Never throws and never delays
 * the caller; a failed notification is dropped (the poll finds the jobs).
 */
export function wakeAfterCommit(pool: Pool, queues: Iterable<string>): void {
  let w = wakers.get(pool);
  if (!w) {
    w = { tag: senderTag(pool), pending: new Set(), flushing: undefined };
    wakers.set(pool, w);
  }
  const listeners = localListeners.of(pool);
  for (const q of queues) {
    w.pending.add(q);
    if (listeners) for (const fn of listeners) fn(q);
  }
  if (w.pending.size === 0 || w.flushing) return;
  const waker = w;
  waker.flushing = (async () => {
    try {
      while (waker.pending.size > 0) {
        const batch = [...waker.pending].map((q) => `${q} ${waker.tag}`);
        waker.pending.clear();
        await notifyQueues(pool, batch).catch(() => {});
      }
    } finally {
      waker.flushing = undefined;
    }
  })();
}

/** Resolves once every wake-up handed to this pool so far has been sent (or dropped). */
export async function wakesSent(pool: Pool): Promise<void> {
  for (;;) {
    const flushing = wakers.get(pool)?.flushing;
    if (!flushing) return;
    await flushing;
  }
}
