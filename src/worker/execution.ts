import type { Lease } from "../db/db.ts";
import type { Job } from "../job.ts";

/** One job this worker holds a lease on, from dequeue until its outcome is written. */
export interface Execution {
  readonly job: Job;
  readonly lease: Lease;
  readonly leaseMs: number;
  /** Why the handler was told to stop (StaleLeaseError, JobTimeoutError, ShutdownError), once set. */
  abortReason: unknown;
  /**
   * Created only when the handler reads ctx.signal: an AbortController per job
   * cost 3-4% of the worker's CPU for handlers that never look at it.
   */
  controller: AbortController | undefined;
  /** The handler's timeout (HandlerSpec.timeoutMs), until its outcome is written. */
  timer: ReturnType<typeof setTimeout> | undefined;
  /** How long the handler ran, for job:completed once the completion commits. */
  durationMs: number;
  /** The executor's caller's callback, called once when the execution is over. */
  whenOver: (() => void) | undefined;
  /** ctx.transaction()'s transaction has begun: the row is locked by us, heartbeats skip it. */
  inTransaction: boolean;
  /** The handler returned; its outcome write is queued or in flight. */
  finishing: boolean;
  /** ctx.transaction() committed: the job is completed. */
  committed: boolean;
  /** Given back on shutdown: skip any outcome write. */
  released: boolean;
  /** Settled once the job is off this worker's hands; made on first ask (see doneOf). */
  done: Promise<void> | undefined;
  finish: (() => void) | undefined;
  /** The executor is through with this job: it left `running`. */
  over: boolean;
}

/**
 * Resolves when the execution is over. Made only when asked for (at
 * shutdown): a promise and its resolver per job cost the busy worker for
 * nothing.
 */
export function doneOf(e: Execution): Promise<void> {
  if (e.over) return Promise.resolve();
  e.done ??= new Promise<void>((r) => (e.finish = r));
  return e.done;
}

/**
 * Marks the execution over, settles doneOf's promise if one was asked for,
 * and tells the executor's caller.
 */
export function endExecution(e: Execution): void {
  if (e.over) return;
  e.over = true;
  e.finish?.();
  e.whenOver?.();
}

export function abortExecution(e: Execution, reason: unknown): void {
  if (e.abortReason !== undefined) return;
  e.abortReason = reason;
  e.controller?.abort(reason);
}

export function signalOf(e: Execution): AbortSignal {
  if (!e.controller) {
    e.controller = new AbortController();
    if (e.abortReason !== undefined) e.controller.abort(e.abortReason);
  }
  return e.controller.signal;
}
