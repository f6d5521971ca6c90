import { DeadlineError } from "../errors.ts";
import type { Events } from "../events.ts";
import type { Logger } from "../logger.ts";

/** `ms` ± `ratio`·ms, so that loops in several processes do not fire in lockstep. */
export function jittered(ms: number, ratio = 0.1): number {
  return Math.max(0, ms + (Math.random() * 2 - 1) * ratio * ms);
}

/**
 * Returns a trigger that runs `fn` once on the next turn of the event loop,
 * however often it is pulled before then. Work that arrives in one turn (a
 * fetched batch's handlers returning, a burst of notifications) is then
 * handled together instead of the first piece going alone.
 */
export function nextTurn(fn: () => void): () => void {
  let scheduled = false;
  return () => {
    if (scheduled) return;
    scheduled = true;
    setImmediate(() => {
      scheduled = false;
      fn();
    });
  };
}

/**
 * How long a loop waits for one database call. A healthy call takes
 * milliseconds; this bounds the rare one that never settles (a client-library
 * bug left queries on a dead connection pending forever in our fault suite;
 * scripts/patch-postgres.mjs now settles them), so that it costs one
 * iteration instead of wedging the loop.
 */
export const DB_CALL_DEADLINE_MS = 30_000;

/** Rejects with DeadlineError if `p` has not settled after `ms`; `p` itself runs on. */
export function withDeadline<T>(
  p: PromiseLike<T>,
  what: string,
  ms = DB_CALL_DEADLINE_MS,
): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const deadline = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new DeadlineError(what, ms)), ms);
  });
  return Promise.race([Promise.resolve(p), deadline]).finally(() => clearTimeout(timer));
}

/**
 * Pauses between the tries of an outcome write whose try failed (a dropped
 * connection, Postgres restarting): about 4 s in all, far inside a lease,
 * which the heartbeat keeps extending meanwhile. After the last, the caller
 * gives up and the lease's expiry makes the job runnable again.
 */
export const OUTCOME_RETRY_DELAYS_MS: readonly number[] = [50, 200, 1_000, 3_000];

export interface FencedWrite<T> {
  /** Names the write in logs and deadline errors. */
  what: string;
  /** Logged with each retry, e.g. the job's id. */
  fields?: Record<string, unknown>;
  /** The fenced write: its result, or undefined when the guard matched nothing. */
  write: () => Promise<T | undefined>;
  /**
   * Asked only after a retry matched nothing: what an earlier try committed,
   * if one did before its reply was lost; undefined when none did.
   */
  earlier: () => Promise<T | undefined>;
  /** Ask `earlier` after a first try's 0 rows too: something else may have ended the lease for us. */
  earlierOnFirstTry?: boolean;
  logger: Logger;
  deadlineMs?: number | undefined;
}

/**
 * Runs a fenced outcome write, retrying it after an error. A retry is safe:
 * the guard (owner, version, state 'running') rejects the row if an earlier
 * try committed, and `earlier` then tells that apart from a lost lease.
 * Resolves undefined for a lost lease; rejects once every try failed.
 */
export async function writeFenced<T>(o: FencedWrite<T>): Promise<T | undefined> {
  let lastError: unknown;
  for (let attempt = 0; attempt <= OUTCOME_RETRY_DELAYS_MS.length; attempt++) {
    try {
      const out = await withDeadline(o.write(), o.what, o.deadlineMs);
      if (out !== undefined || (attempt === 0 && !o.earlierOnFirstTry)) return out;
      return await withDeadline(o.earlier(), `${o.what} check`, o.deadlineMs);
    } catch (error) {
      lastError = error;
      const delay = OUTCOME_RETRY_DELAYS_MS[attempt];
      if (delay === undefined) break;
      o.logger.warn(`${o.what} failed; retrying`, {
        ...o.fields,
        error,
        attempt,
        retryInMs: delay,
      });
      await Bun.sleep(delay);
    }
  }
  throw lastError;
}

export interface Loop {
  start(signal?: AbortSignal): void;
  /** Idempotent; resolves once a running iteration has finished. */
  stop(): Promise<void>;
  /** One iteration, awaited, errors propagated: what tests call. */
  runOnce(): Promise<void>;
}

export interface LoopOptions {
  name: string;
  intervalMs: number;
  /** Delay of the first run as a fraction of the interval, randomised (River staggers its services the same way). */
  staggerFirst?: boolean;
  logger: Logger;
  events?: Events;
  run: () => Promise<void>;
  /** Longest an iteration may take before the loop moves on; default DB_CALL_DEADLINE_MS. */
  deadlineMs?: number;
}

/**
 * Runs `run` every jittered interval. An error is logged, emitted as
 * "loop:error" and the loop continues: a dropped connection or a Postgres
 * restart costs one iteration, never the loop.
 */
export function intervalLoop(o: LoopOptions): Loop {
  let timer: ReturnType<typeof setTimeout> | undefined;
  let running: Promise<void> | undefined;
  let stopped = true;
  const tick = async () => {
    timer = undefined;
    if (stopped) return;
    running = withDeadline(o.run(), `${o.name} iteration`, o.deadlineMs).catch((error) => {
      o.logger.warn(`${o.name} iteration failed; will retry`, { error });
      o.events?.emit("loop:error", { loop: o.name, error });
    });
    await running;
    running = undefined;
    if (!stopped) timer = setTimeout(tick, jittered(o.intervalMs));
  };
  const stop = async () => {
    stopped = true;
    if (timer) clearTimeout(timer);
    timer = undefined;
    await running;
  };
  return {
    start(signal) {
      if (!stopped) return;
      stopped = false;
      signal?.addEventListener("abort", () => void stop(), { once: true });
      const first = o.staggerFirst ? Math.random() * o.intervalMs : 0;
      timer = setTimeout(tick, first);
    },
    stop,
    runOnce: () => o.run(),
  };
}
