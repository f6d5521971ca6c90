// Completer: commits plain handlers' completions in batches (spec: Complete).
//
// Invariant: a job is reported completed only after its guarded UPDATE
// committed and returned its row; a row the guard rejected is reported stale.
//
// Batching is adaptive, with no timer: while a batch is in flight the next
// accumulates, so an idle worker completes a job in one round trip and a
// busy one completes hundreds per statement (River's batch completer,
// without its fixed wait). By default one batch is written at a time; with
// more allowed, a second goes alongside the first only once
// COMPLETER_SECOND_BATCH_MIN completions wait; fewer wait for the first to
// commit and go together after it (group commit). While no fetch of the
// worker is in flight, two batches may be written at once
// (COMPLETER_IDLE_BATCHES).

import type { Pool } from "../db/db.ts";
import type { Completion } from "../db/outcome.ts";
import { completeJobsIdempotent } from "../db/outcome.ts";
import type { Logger } from "../logger.ts";
import { nextTurn, OUTCOME_RETRY_DELAYS_MS, withDeadline } from "./loop.ts";

export const COMPLETER_MAX_BATCH = 2_000;
/**
 * Batches written at once, by default. Two (with two fetches in flight) were
 * chosen when the bench's largest fetch was 500: a single completion was the
 * busy pipeline's serial step. With fetches of 1,000-2,000, the statements
 * in flight contend on 2 cores instead: see MAX_FETCHES_IN_FLIGHT in
 * producer.ts for the measurement that made both one.
 */
export const COMPLETER_CONCURRENCY = 1;
/**
 * Completions that must be waiting before a second batch goes while one is
 * in flight. At a steady 1,000 one-job enqueues per second, a second batch
 * at once meant a commit per job, each contending for the WAL flush with the
 * next enqueue's commit: enqueue-to-start p50 1.6-3.3 ms (median 2.55) in 8
 * runs against 1.0-2.1 ms (median 1.7) with this threshold, same hour, 2
 * cores, fsync on. A completion waits at most one commit longer. Busy
 * workers hand in hundreds per batch, so their second batch still goes at
 * once (no-op throughput unchanged in the same comparison).
 */
export const COMPLETER_SECOND_BATCH_MIN = 64;

/**
 * Batches written at once while no fetch of this worker is in flight
 * (`fetchIdle`): the same two statements as a fetch beside a batch.
 *
 * The end of a drain ran one statement on 2 cores. A 10,000-job drain in
 * fetches of 2,000, timed on the wire: the fetch that finds the queue
 * empty is back in a millisecond, and the last batch's 2,000 completions
 * then went as one statement, 25 of the window's 230-260 ms, with nothing
 * else running. Now a batch started with nothing in flight and no fetch
 * either takes half of what waits, and the other half goes beside it; a
 * second batch may also go while one is in flight. Both need
 * COMPLETER_SECOND_BATCH_MIN waiting (a half, twice that), so a steady
 * trickle of completions (the 1,000/s latency cells) never splits.
 *
 * While a fetch is in flight, one batch at a time, as before: splitting
 * then too (three statements on 2 cores) measured x0.943 at both 10,000
 * and 100,000 jobs (bench/ab.ts, 8 rounds, faster in 1 and 3 of 8). But
 * the empty fetch's reply is read only after the turn in which the last
 * batch's handlers return, so a pump that would send 2 x
 * COMPLETER_SECOND_BATCH_MIN or more while a fetch is in flight waits one
 * turn first, and splits if the fetch is back by then.
 */
export const COMPLETER_IDLE_BATCHES = 2;

/**
 * Told once what became of a completion handed to submit(): committed, or
 * not (the lease was lost, nothing written; or `error` when the batch was
 * given up after its retries). Called with the caller's `ctx`, so that one
 * function serves every job and nothing is made per job but the queue entry.
 */
export type Settle<C> = (ctx: C, committed: boolean, error: unknown) => void;

export interface Completer {
  /** Resolves true when committed, false when the lease was lost (nothing written). */
  complete(item: Completion): Promise<boolean>;
  /**
   * As complete(), without a promise: `settle(ctx, …)` is called when the
   * batch is written. The executor's path for every plain completion: a
   * promise per job, its resolving functions and the turn of the microtask
   * queue that resumes its awaiter cost the busy worker more than the
   * callback.
   */
  submit<C>(item: Completion, ctx: C, settle: Settle<C>): void;
  /** Resolves when everything handed in so far has been written or given up. */
  flush(): Promise<void>;
  readonly pending: number;
}

interface Waiting {
  item: Completion;
  ctx: unknown;
  settle: Settle<unknown>;
}

/** complete()'s promise, settled through submit(). */
interface Resolvers {
  resolve: (committed: boolean) => void;
  reject: (error: unknown) => void;
}
const settlePromise: Settle<Resolvers> = (r, committed, error) => {
  if (error === undefined) r.resolve(committed);
  else r.reject(error);
};

/** One waiter told; a callback that throws must not keep the rest of its batch waiting. */
function tell(w: Waiting, committed: boolean, error: unknown, logger: Logger) {
  try {
    w.settle(w.ctx, committed, error);
  } catch (e) {
    logger.error("a completion's callback threw", { jobId: w.item.id, error: e });
  }
}

export interface CompleterOptions {
  /** How long one batch's statement may take before that try is given up (withDeadline). Default DB_CALL_DEADLINE_MS. */
  deadlineMs?: number;
  /** Batches written at once (COMPLETER_IDLE_BATCHES or more while no fetch is in flight). Default COMPLETER_CONCURRENCY. */
  batchesInFlight?: number;
  /** True while no fetch of this worker is in flight (COMPLETER_IDLE_BATCHES). Default: never. */
  fetchIdle?: () => boolean;
  /** Wait for each batch's WAL flush (completeJobsIdempotent's `durable`). Default true. */
  durable?: boolean;
}

export function createCompleter(
  sql: Pool,
  owner: string,
  logger: Logger,
  options: CompleterOptions = {},
): Completer {
  const {
    deadlineMs,
    batchesInFlight = COMPLETER_CONCURRENCY,
    fetchIdle = () => false,
    durable = true,
  } = options;
  const queue: Waiting[] = [];

  const writeBatch = async (batch: Waiting[]) => {
    let lastError: unknown;
    for (let attempt = 0; attempt <= OUTCOME_RETRY_DELAYS_MS.length; attempt++) {
      try {
        // Safe to retry after an unknown outcome: if the first try committed,
        // the guard (state = 'running') now rejects the row, and
        // completeJobsIdempotent recognises our own commit.
        const done = await withDeadline(
          completeJobsIdempotent(
            sql,
            owner,
            batch.map((w) => w.item),
            durable,
          ),
          "completion batch",
          deadlineMs,
        );
        for (const w of batch) tell(w, done.has(w.item.id), undefined, logger);
        return;
      } catch (error) {
        lastError = error;
        const delay = OUTCOME_RETRY_DELAYS_MS[attempt];
        if (delay === undefined) break;
        logger.warn("completion batch failed; retrying", {
          error,
          size: batch.length,
          attempt,
          retryInMs: delay,
        });
        await Bun.sleep(delay);
      }
    }
    // Give up: leases expire and the reaper makes the jobs runnable again.
    for (const w of batch)
      tell(w, false, lastError ?? new Error("completion batch failed"), logger);
  };

  // Batches being written: at most batchesInFlight, or COMPLETER_IDLE_BATCHES
  // while no fetch is in flight.
  const writing = new Set<Promise<void>>();

  // Set while a pump waits one turn for a fetch to come back (see below).
  let waited = false;

  const pump = () => {
    while (queue.length > 0) {
      const enough = queue.length >= COMPLETER_SECOND_BATCH_MIN;
      // Enough that half of it is worth a statement of its own.
      const halves = queue.length >= 2 * COMPLETER_SECOND_BATCH_MIN;
      const idle = enough && fetchIdle();
      if (writing.size > 0) {
        const most = idle ? Math.max(batchesInFlight, COMPLETER_IDLE_BATCHES) : batchesInFlight;
        if (!enough || writing.size >= most) break;
      } else if (!idle && !waited && halves) {
        // A fetch is in flight. The last one of a drain comes back empty
        // at once, but its reply is read only after this turn: wait one
        // turn, then split if it is back.
        waited = true;
        schedule();
        return;
      }
      waited = false;
      // With nothing in flight, half now and half beside it (a second
      // pass of this loop).
      const size = writing.size === 0 && idle && halves ? Math.ceil(queue.length / 2) : Infinity;
      const batch = queue.splice(0, Math.min(size, COMPLETER_MAX_BATCH));
      const p: Promise<void> = writeBatch(batch).finally(() => {
        writing.delete(p);
        pump();
      });
      writing.add(p);
    }
  };

  // Start on the next turn of the event loop, not now: a fetched batch's
  // handlers return in the same turn, and the first completion would
  // otherwise go alone and hold the rest back for a whole commit.
  const schedule = nextTurn(pump);

  return {
    complete(item) {
      return new Promise((resolve, reject) => {
        queue.push({ item, ctx: { resolve, reject }, settle: settlePromise as Settle<unknown> });
        schedule();
      });
    },
    submit(item, ctx, settle) {
      queue.push({ item, ctx, settle: settle as Settle<unknown> });
      schedule();
    },
    async flush() {
      // Queued items are either being written soon (a pump is scheduled) or
      // wait for a batch in `writing` to finish.
      while (writing.size > 0 || queue.length > 0) {
        if (writing.size > 0) await Promise.all(writing);
        else await new Promise<void>((r) => setImmediate(r));
      }
    },
    get pending() {
      return queue.length;
    },
  };
}
