import type { Db } from "./db/db.ts";
import type { Job } from "./job.ts";
import type { JsonValue } from "./json.ts";
import type { Logger } from "./logger.ts";
import type { BackoffPolicy } from "./retry.ts";

/** What a handler receives besides its payload. */
export interface JobContext {
  readonly job: Job;
  /**
   * The lease version: increases on every dequeue of this job. Pass it to
   * storage that can reject writes carrying a token older than one it has seen.
   */
  readonly fencingToken: number;
  /** Stable across attempts (the job's idempotency key, or `job:<id>`): for APIs such as payment providers. */
  readonly idempotencyKey: string;
  /** Aborts when the lease is lost (reason: StaleLeaseError), on timeout, or on shutdown. */
  readonly signal: AbortSignal;
  readonly logger: Logger;
  /**
   * Runs `fn` in one transaction with this job's completion, fenced by the
   * lease: if this worker no longer holds it, `fn` does not run and nothing
   * commits, so the effect commits at most once. `fn`'s return value becomes
   * the job's result. Call it at most once; after it commits the job is
   * completed whatever the handler does next.
   *
   * Jobs whose transactions arrive together share one transaction and one
   * commit (worker option `effectBatch`). A `fn` that throws rolls back only
   * its own effect, and the promise rejects with its error: by default the
   * shared transaction then rolls back whole and runs again with each `fn` in
   * its own savepoint, so `fn` may run twice, and only its last run's writes
   * can commit (worker option `effectIsolation: "savepoint"` runs each `fn`
   * once, at a subtransaction per job). Keep `fn` to database work: while it
   * runs, the jobs after it in the shared transaction wait, unless it is
   * `independent` (see TransactionOptions). A shared transaction not
   * committed within worker option `effectTimeoutMs` (30 s) rolls back, and
   * the promise rejects with DeadlineError.
   */
  transaction<T extends JsonValue | undefined>(
    fn: (tx: Db) => Promise<T>,
    options?: TransactionOptions,
  ): Promise<T>;
}

export interface TransactionOptions {
  /**
   * `fn` reads no row another job's `fn` writes, writes no row another job's
   * `fn` reads or writes, and takes no savepoint (`tx.savepoint` throws): an
   * insert keyed by the job, say. The independent `fn`s of one shared
   * transaction then run at once, before the others, so their statements
   * travel together on its connection instead of one round trip after
   * another. Interleaved, two `fn`s that touch the same rows could each read
   * before the other writes (a lost update), with no lock to stop them: they
   * are one transaction. The rerun after a failure, and every run under
   * `effectIsolation: "savepoint"`, runs each `fn` alone, as without this.
   * Default false.
   */
  independent?: boolean;
}

/** What a handler may return: a JSON result (stored on the job), nothing, or cancel()/snooze(). */
// biome-ignore lint/suspicious/noConfusingVoidType: handlers that return nothing are typed `void`.
export type HandlerReturn = HandlerOutcome | JsonValue | undefined | void;

export type Handler<P = JsonValue> = (
  payload: P,
  ctx: JobContext,
) => Promise<HandlerReturn> | HandlerReturn;

const OUTCOME = Symbol.for("conveyor.outcome");

export type HandlerOutcome =
  | { readonly [OUTCOME]: "cancel"; readonly reason: string }
  | { readonly [OUTCOME]: "snooze"; readonly delayMs: number };

/** Return from a handler to finish the job as cancelled (no retry). */
export function cancel(reason: string): HandlerOutcome {
  return { [OUTCOME]: "cancel", reason };
}

/** Return from a handler to run the job again after `delayMs`, without spending an attempt. */
export function snooze(delayMs: number): HandlerOutcome {
  if (!Number.isFinite(delayMs) || delayMs < 0)
    throw new RangeError("snooze delay must be >= 0 ms");
  return { [OUTCOME]: "snooze", delayMs };
}

export function outcomeOf(value: unknown): HandlerOutcome | undefined {
  if (value && typeof value === "object" && OUTCOME in value) return value as HandlerOutcome;
  return undefined;
}

export function outcomeKind(o: HandlerOutcome): "cancel" | "snooze" {
  return o[OUTCOME];
}

/** A handler with per-kind settings. */
export interface HandlerSpec<P = JsonValue> {
  handler: Handler<P>;
  /** Abort and fail the attempt after this long. */
  timeoutMs?: number;
  backoff?: Partial<BackoffPolicy>;
}
