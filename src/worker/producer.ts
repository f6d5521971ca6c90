// Producer: leases batches of jobs for one queue and hands them to the
// executor (spec: Dequeue), and, while idle, takes jobs this process enqueues
// leased by their insert (src/db/handoff.ts).
//
// Invariant: at most `concurrency` handlers of this queue run in this worker
// (slots reserved by fetches and hand-offs in flight count as taken), and at most
// `fetchesInFlight` fetches per queue are in flight, so notifications that
// arrive in a burst coalesce (the debounce) and idle workers do not stampede.
//
// A slot frees when its handler returns, not when the outcome commits: the
// completer batches outcomes, and a commit costs a disk flush (4 ms p50 on
// our CI machine), which would otherwise idle every slot for that long. The
// lease stays held, and heartbeated, until the outcome is written; outcomes
// waiting to be written hold back fetching once they exceed `concurrency`.
import type { Pool } from "../db/db.ts";
import { fetchJobs, type LeasedRow } from "../db/fetch.ts";
import type { HandOff } from "../db/handoff.ts";
import type { Events } from "../events.ts";
import type { Logger } from "../logger.ts";
import { jittered, nextTurn, withDeadline } from "./loop.ts";

export interface ProducerOptions {
  sql: Pool;
  queue: string;
  owner: string;
  kinds: string[];
  concurrency: number;
  fetchBatch: number;
  leaseMs: number;
  /** Fallback fetch when no notification came: lost notifications and scheduled jobs wait at most this long. */
  pollIntervalMs: number;
  /**
   * Runs a job; calls `handlerDone` when the handler has returned and `over`
   * once when the outcome is written (or given up). Never throws.
   */
  execute: (row: LeasedRow, leaseMs: number, handlerDone: () => void, over: () => void) => void;
  logger: Logger;
  events: Events;
  /** How long to wait for one fetch (DB_CALL_DEADLINE_MS by default). */
  deadlineMs?: number;
  /** At most this many fetches of this queue at once (MAX_FETCHES_IN_FLIGHT by default). */
  fetchesInFlight?: number;
}

const ERROR_BACKOFF_MS = 1_000;
/**
 * One fetch at a time per queue, by default. Its round trip still overlaps
 * the handlers of the batch before it and that batch's completion: two
 * statements in flight, as in the bare loop's best settings.
 *
 * Two fetches and two completion batches at once (fa91dc9) were measured
 * with fetches of 500. With fetches of 1,000-2,000, four statements in
 * flight on 2 cores cost the server more CPU per job than two (the same
 * holds for the bare loop: 4 loops against 2). 100,000 no-op jobs,
 * Conveyor's worker, pg_stat_statements and /proc, 4 interleaved rounds,
 * 2 cores, fsync on: cluster CPU per job 51.1 / 33.8 / 31.8 / 38.7 µs with
 * two and two, 31.1 / 22.7 / 23.8 / 31.2 with one and one (25.4-39.0k ->
 * 30.5-43.2k jobs/s). In the bench
 * (throughput phase, 3 alternating rounds), at 100,000 jobs the best setting
 * went from 34,408 / 36,081 / 31,671 to 42,653 / 38,831 / 40,125 jobs/s,
 * at 10,000 from 25,078 / 23,951 / 22,864 to 32,563 / 30,198 / 25,359, and
 * c100 (fetches of 100) at 100,000 from 15,239 / 14,630 / 17,010 to
 * 21,587 / 19,446 / 19,255. The cost: jobs whose effect is a ledger insert
 * in ctx.transaction, best setting at 10,000, 4 alternating rounds: 8,598 /
 * 8,319 / 6,975 / 8,599 jobs/s with two, 7,816 / 7,707 / 8,451 / 6,850 with
 * one (at 100,000, 2 rounds: 12,320 / 10,687 against 11,953 / 10,630).
 */
export const MAX_FETCHES_IN_FLIGHT = 1;

/**
 * PIPELINED_FETCH: when a fetch returns a batch and another may go, the next
 * fetch is sent before the batch's handlers run, not after them. In a
 * 10,000-job drain in batches of 2,000 the handlers of a batch (the
 * worker's own work per job: the job object, its context, the completion's
 * promise) took 13 ms warm and 37 ms cold, and the server, which spends
 * tens of milliseconds on a fetch of that size, waited for them each time.
 * In the bench's throughput phase (Conveyor only, 4 alternating rounds, 2
 * cores, fsync on), c4000-b2000 went from 35,665 / 30,861 / 37,609 / 31,047
 * to 42,295 / 38,580 / 39,306 / 31,640 jobs/s at 10,000 jobs and from
 * 46,138 / 37,842 / 36,305 / 38,386 to 43,083 / 41,888 / 46,334 / 41,038 at
 * 100,000.
 *
 * postgres.js sends a short statement (a prepared one's Bind and Execute)
 * from a setImmediate that a microtask registers; the handlers run after a
 * setImmediate registered from inside a first one, which comes after it.
 */
const afterWrites = () => new Promise<void>((resolve) => setImmediate(() => setImmediate(resolve)));

/** How long stop() waits for hand-off inserts still in flight. */
export const HANDOFF_STOP_WAIT_MS = 5_000;

export interface Producer {
  readonly queue: string;
  /** Handlers running now. */
  readonly active: number;
  /** Fetches whose statement has not returned yet. */
  readonly fetching: number;
  start(): void;
  /** Stops fetching; running jobs are the worker's to drain. */
  stop(): Promise<void>;
  /** A notification or a caller says there may be work. */
  wake(): void;
  /** One fetch, awaited: what tests call. Returns the number of jobs leased. */
  runOnce(): Promise<number>;
  /**
   * Reserves a slot for a job this process is enqueuing, if this producer is
   * idle: running, the last fetch came back short, and a free slot that
   * leaves enough free for a fetch (src/db/handoff.ts).
   */
  takeHandOff(kind: string): HandOff | undefined;
}

export function createProducer(o: ProducerOptions): Producer {
  const fetchesInFlight = o.fetchesInFlight ?? MAX_FETCHES_IN_FLIGHT;
  let active = 0;
  let reserved = 0;
  let unwritten = 0; // handlers done, outcome not yet written
  let stopped = true;
  // Fetches whose statement has not returned yet (at most fetchesInFlight).
  let fetching = 0;
  // Fetches not yet done with their rows (stop() waits for these).
  const inFlight = new Set<Promise<number>>();
  // Set when there may be more work than the last fetch took.
  let wanted = false;
  // The last fetch came back full (or none has yet): more is likely waiting.
  let backlog = true;
  // A fetch failed: no other until the retry timer fires.
  let backingOff = false;
  let pollTimer: ReturnType<typeof setTimeout> | undefined;
  // Hand-offs reserved and not yet delivered or released; stop() waits for them.
  const handOffs = new Set<Promise<void>>();
  let handOffsClosed = false;
  let retryTimer: ReturnType<typeof setTimeout> | undefined;

  const free = () => o.concurrency - active - reserved;
  // Whether a fetch may go with `f` slots free: when idle, for any; else only
  // for a worthwhile batch (one round trip per freed slot would cost more
  // than the jobs themselves).
  const worthFetching = (f: number) =>
    f > 0 && (active + reserved === 0 || f >= Math.ceil(o.fetchBatch / 2));

  const fetchOnce = async (): Promise<number> => {
    const slots = free();
    const limit = Math.min(slots, o.fetchBatch);
    if (limit <= 0) return 0;
    // With a backlog, and slots this fetch leaves free, another fetch may go
    // at once (when more than one may be in flight): else each returning
    // batch starts exactly one more, and they run one at a time.
    if (!(backlog && limit < slots)) wanted = false;
    reserved += limit;
    fetching++;
    let rows: LeasedRow[];
    try {
      // A fetch that settles after its deadline leases jobs nobody runs:
      // their leases expire and the reaper makes them available again.
      rows = await withDeadline(
        fetchJobs(o.sql, {
          queue: o.queue,
          owner: o.owner,
          limit,
          leaseMs: o.leaseMs,
          kinds: o.kinds,
        }),
        `fetch from ${o.queue}`,
        o.deadlineMs,
      );
    } finally {
      reserved -= limit;
      fetching--;
    }
    // A full batch suggests more is waiting.
    backlog = rows.length === limit;
    if (backlog) wanted = true;
    take(rows);
    // The next fetch goes before this batch's handlers run, so that its round
    // trip and the server's work overlap theirs; see PIPELINED_FETCH.
    if (fill()) await afterWrites();
    start(rows);
    return rows.length;
  };

  /** Counts leased rows as running: their slots are taken from now on. */
  const take = (rows: LeasedRow[]) => {
    active += rows.length;
    unwritten += rows.length;
  };

  /** Runs rows that take() counted. */
  const start = (rows: LeasedRow[]) => {
    for (const row of rows) {
      let released = false;
      const handlerDone = () => {
        if (released) return;
        released = true;
        active--;
        schedule();
      };
      const over = () => {
        handlerDone();
        unwritten--;
        schedule();
      };
      o.execute(row, o.leaseMs, handlerDone, over);
    }
  };

  const run = (rows: LeasedRow[]) => {
    take(rows);
    start(rows);
  };

  /** Starts a fetch if one may go now; returns whether it did. */
  const fill = (): boolean => {
    if (stopped || backingOff || !wanted || fetching >= fetchesInFlight) return false;
    // Back-pressure: while more outcomes wait to be written than we may run,
    // the database is the bottleneck; fetching more would only hold leases.
    if (unwritten - active > o.concurrency) return false;
    if (!worthFetching(free())) return false;
    const p = fetchOnce();
    inFlight.add(p);
    p.catch((error) => {
      o.logger.warn("fetch failed; retrying", { queue: o.queue, error });
      o.events.emit("loop:error", { loop: `producer:${o.queue}`, error });
      wanted = true;
      backingOff = true;
      clearTimeout(retryTimer);
      retryTimer = setTimeout(
        () => {
          backingOff = false;
          schedule();
        },
        jittered(ERROR_BACKOFF_MS, 0.3),
      );
      return 0;
    }).finally(() => {
      inFlight.delete(p);
      if (wanted) schedule();
    });
    // A second fetch, when this one left it wanted.
    if (wanted) schedule();
    return true;
  };

  // Coalesces wake-ups and freed slots within one turn of the event loop.
  const schedule = nextTurn(fill);

  const poll = () => {
    if (stopped) return;
    wanted = true;
    schedule();
    pollTimer = setTimeout(poll, jittered(o.pollIntervalMs));
  };

  return {
    queue: o.queue,
    get active() {
      return active;
    },
    get fetching() {
      return fetching;
    },
    start() {
      if (!stopped) return;
      stopped = false;
      wanted = true;
      schedule();
      pollTimer = setTimeout(poll, jittered(o.pollIntervalMs));
    },
    async stop() {
      stopped = true;
      clearTimeout(pollTimer);
      clearTimeout(retryTimer);
      await Promise.all([...inFlight].map((p) => p.catch(() => 0)));
      // A hand-off's insert may still commit a job leased to us: it runs
      // (and is drained with the rest) rather than wait out its lease. An
      // insert that has not returned by then is not waited for longer; its
      // job, if committed, runs once the reaper has taken its lease back.
      await withDeadline(Promise.all(handOffs), "hand-offs", HANDOFF_STOP_WAIT_MS).catch(() => {});
      handOffsClosed = true;
    },
    wake() {
      wanted = true;
      schedule();
    },
    runOnce: () => fetchOnce(),
    takeHandOff(kind) {
      // A fetch in flight does not stop an offer: its slots are reserved
      // already. Refusing then, at 1,000 enqueues a second, sent the few
      // enqueues that met a poll's fetch the usual way, and the wake-up each
      // sends started another fetch that the next enqueues met: the worker
      // stayed in that mode, every job a commit and a fetch later.
      if (stopped || backlog || !o.kinds.includes(kind)) return undefined;
      // Never the slots a fetch needs: hand-offs hold theirs until the insert
      // returns, and enqueues waiting on a busy pool or a slow commit once
      // held all of them, so that jobs the hand-off missed (and other
      // processes' jobs) waited over 0.4 s for a fetch the worker would
      // not start.
      const idle = active + reserved === 0;
      if (!(idle ? free() > 0 : worthFetching(free() - 1))) return undefined;
      reserved++;
      let settle!: () => void;
      const settled = new Promise<void>((r) => (settle = r));
      handOffs.add(settled);
      // True the first time only: deliver and release settle the slot once.
      const close = () => {
        if (!handOffs.delete(settled)) return false;
        reserved--;
        settle();
        return true;
      };
      return {
        owner: o.owner,
        leaseMs: o.leaseMs,
        deliver(row) {
          if (!close()) return;
          if (handOffsClosed) {
            o.logger.warn(
              "a job handed off after this worker stopped; it runs once its lease expires",
              {
                jobId: row.id,
              },
            );
            return;
          }
          run([row]);
        },
        release() {
          if (close()) schedule();
        },
      };
    },
  };
}
