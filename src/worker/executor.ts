// Executor: runs one leased job and writes its outcome (spec: Run, Complete,
// Fail, Snooze, Cancel, and the guarded effect transaction).
//
// Invariant: every write about the job carries (owner, lease version) and the
// state guard; a write that matches 0 rows is reported as lease:lost and never
// retried as a different write. A write whose try failed is retried as the
// same write (writeFenced), which tells its own earlier commit from a lost lease.
import type { Db, Pool } from "../db/db.ts";
import type { LeasedRow } from "../db/fetch.ts";
import {
  cancelLeasedJobs,
  errorRecorded,
  failJobs,
  selectCompletedBy,
  snoozed,
  snoozeJobs,
} from "../db/outcome.ts";
import {
  ConveyorError,
  JobTimeoutError,
  ShutdownError,
  StaleLeaseError,
  ValidationError,
} from "../errors.ts";
import type { Events } from "../events.ts";
import type { HandlerSpec, JobContext, TransactionOptions } from "../handler.ts";
import { outcomeKind, outcomeOf } from "../handler.ts";
import type { AttemptError, Job, JobState } from "../job.ts";
import { jobFromLeasedRow } from "../job.ts";
import { assertJson, type JsonValue } from "../json.ts";
import type { Logger } from "../logger.ts";
import { type BackoffPolicy, retryDelayMs } from "../retry.ts";
import type { Completer } from "./completer.ts";
import type { EffectRunner } from "./effects.ts";
import { abortExecution, type Execution, endExecution, signalOf } from "./execution.ts";
import { writeFenced } from "./loop.ts";

export interface ExecutorDeps {
  sql: Pool;
  owner: string;
  handlers: Map<string, HandlerSpec>;
  completer: Completer;
  /** Runs ctx.transaction(): fenced completion and effect in one commit, shared by several jobs. */
  effects: EffectRunner;
  running: Map<string, Execution>;
  backoff: BackoffPolicy;
  /** Per-queue overrides of `backoff`; a kind's own backoff overrides both. */
  queueBackoff: Map<string, Partial<BackoffPolicy>>;
  events: Events;
  logger: Logger;
  /** How long to wait for one outcome write (DB_CALL_DEADLINE_MS by default). */
  deadlineMs?: number;
}

function isThenable(v: unknown): v is PromiseLike<unknown> {
  return (
    v !== null &&
    (typeof v === "object" || typeof v === "function") &&
    typeof (v as { then?: unknown }).then === "function"
  );
}

export function attemptError(job: Job, error: unknown): AttemptError {
  const e = error instanceof Error ? error : new Error(String(error));
  const out: AttemptError = {
    attempt: job.attempts,
    at: new Date().toISOString(),
    name: e.name,
    message: e.message,
  };
  if (e.stack) out.stack = e.stack.slice(0, 4_000);
  return out;
}

export function createExecutor(d: ExecutorDeps) {
  const stale = (job: Job, operation: StaleLeaseError["operation"]) => {
    const error = new StaleLeaseError(job.id, String(job.leaseVersion), operation);
    d.logger.warn("stale write rejected by fence", {
      jobId: job.id,
      fencingToken: job.leaseVersion,
      operation,
    });
    d.events.emit("lease:lost", { error });
    return error;
  };

  const lostLease = (exec: Execution) => exec.abortReason instanceof StaleLeaseError;

  async function fail(exec: Execution, spec: HandlerSpec | undefined, error: unknown) {
    const { job } = exec;
    const policy = { ...d.backoff, ...d.queueBackoff.get(job.queue), ...spec?.backoff };
    const delay = retryDelayMs(job.attempts, policy);
    const failure = { ...exec.lease, error: attemptError(job, error), retryDelayMs: delay };
    const state = await writeFenced<JobState>({
      what: "fail write",
      fields: { jobId: job.id },
      write: async () => (await failJobs(d.sql, d.owner, [failure])).get(job.id),
      // Even a first try's 0 rows may be ours: ctx.transaction may have
      // committed the job before its reply was lost, and the handler threw.
      earlierOnFirstTry: true,
      earlier: async () => {
        // failJobs's own rule, for the state an earlier committed try set.
        if (await errorRecorded(d.sql, job.id, failure.error)) {
          return job.attempts >= job.maxAttempts ? "discarded" : "available";
        }
        const ours = await selectCompletedBy(d.sql, d.owner, [exec.lease]);
        return ours.has(job.id) ? "completed" : undefined;
      },
      logger: d.logger,
      deadlineMs: d.deadlineMs,
    });
    if (state === "completed") {
      exec.committed = true;
      d.events.emit("job:completed", { job, durationMs: 0 });
      return;
    }
    if (!state) {
      stale(job, "fail");
      return;
    }
    d.events.emit("job:failed", { job, error, state, retryDelayMs: delay });
  }

  /**
   * A handler's ctx. A class, not an object literal: a literal with getters
   * and a method made four objects per job, and its getters new functions
   * each time. What most handlers never read (signal, logger, transaction,
   * idempotencyKey) is made on first read; `transaction` is a bound function,
   * so that `const { transaction } = ctx` works as before.
   */
  class Context implements JobContext {
    readonly job: Job;
    readonly fencingToken: number;
    #exec: Execution;
    // Guards a second call while the first is in flight (exec.committed is
    // set only once it commits).
    #transactionCalled = false;
    #logger: Logger | undefined;
    #transaction: JobContext["transaction"] | undefined;

    constructor(exec: Execution) {
      this.#exec = exec;
      this.job = exec.job;
      this.fencingToken = exec.lease.version;
    }
    get idempotencyKey() {
      return this.job.idempotencyKey ?? `job:${this.job.id}`;
    }
    get signal() {
      return signalOf(this.#exec);
    }
    get logger() {
      this.#logger ??= d.logger.child({
        jobId: this.job.id,
        kind: this.job.kind,
        fencingToken: this.fencingToken,
      });
      return this.#logger;
    }
    get transaction(): JobContext["transaction"] {
      this.#transaction ??= (fn, options) => this.#runTransaction(fn, options);
      return this.#transaction;
    }

    async #runTransaction<T extends JsonValue | undefined>(
      fn: (tx: Db) => Promise<T>,
      options: TransactionOptions | undefined,
    ): Promise<T> {
      const exec = this.#exec;
      if (exec.committed || this.#transactionCalled) {
        throw new ConveyorError("ctx.transaction() may be called once per job");
      }
      this.#transactionCalled = true;
      try {
        // Heartbeats continue while the request waits for a transaction;
        // they stop once its transaction begins and locks the row.
        const out = await d.effects.run(
          exec.lease,
          fn as Parameters<EffectRunner["run"]>[1],
          () => (exec.inTransaction = true),
          options?.independent === true,
        );
        exec.committed = true;
        return out as T;
      } catch (error) {
        if (error instanceof StaleLeaseError) {
          stale(exec.job, "complete");
          abortExecution(exec, error);
        }
        throw error;
      } finally {
        exec.inTransaction = false;
        this.#transactionCalled = exec.committed;
      }
    }
  }

  async function writeOutcome(
    exec: Execution,
    spec: HandlerSpec | undefined,
    value: unknown,
    ms: number,
  ) {
    const { job, lease } = exec;
    const outcome = outcomeOf(value);
    if (outcome && outcomeKind(outcome) === "cancel") {
      const reason = (outcome as { reason: string }).reason;
      const err = attemptError(job, new ConveyorError(reason));
      err.name = "Cancelled";
      const ok = await writeFenced({
        what: "cancel write",
        fields: { jobId: job.id },
        write: async () =>
          (await cancelLeasedJobs(d.sql, d.owner, [{ ...lease, error: err }])).has(job.id) ||
          undefined,
        earlier: async () => (await errorRecorded(d.sql, job.id, err)) || undefined,
        logger: d.logger,
        deadlineMs: d.deadlineMs,
      });
      if (ok) d.events.emit("job:cancelled", { job, reason });
      else stale(job, "cancel");
      return;
    }
    if (outcome) {
      const delayMs = (outcome as { delayMs: number }).delayMs;
      const ok = await writeFenced({
        what: "snooze write",
        fields: { jobId: job.id },
        write: async () =>
          (await snoozeJobs(d.sql, d.owner, [{ ...lease, delayMs }])).has(job.id) || undefined,
        earlier: async () => (await snoozed(d.sql, lease, job.attempts)) || undefined,
        logger: d.logger,
        deadlineMs: d.deadlineMs,
      });
      if (ok) d.events.emit("job:snoozed", { job, delayMs });
      else stale(job, "snooze");
      return;
    }
    let result: JsonValue | undefined;
    if (value !== undefined) {
      try {
        assertJson(value, "result");
        result = value;
      } catch (error) {
        await fail(exec, spec, error);
        return;
      }
    }
    const committed = await d.completer.complete(
      result === undefined ? lease : { ...lease, result },
    );
    if (committed) d.events.emit("job:completed", { job, durationMs: ms });
    else stale(job, "complete");
  }

  /**
   * The handler's outcome, after it returned or threw. The common case (it
   * returned nothing, and the lease is still ours) goes to the completer
   * with no promise and no async function: `completed` hears of the commit.
   * Anything else goes to settle().
   *
   * Until 2026-12-05 everything from the handler call to the last write was
   * one async function of 2,161 bytecodes. JavaScriptCore compiles an async
   * function's body anew at each tier, and its cost grows with the body's
   * awaits and live variables: its DFG compilations took 27-36 ms of the
   * 250 ms window of a 10,000-job drain, its FTL compilation 156 ms in a
   * 100,000-job one (BUN_JSC_reportCompileTimes).
   */
  function finish(
    exec: Execution,
    spec: HandlerSpec,
    value: unknown,
    thrown: { error: unknown } | undefined,
    ms: number,
    handlerDone: (() => void) | undefined,
  ): void {
    try {
      // Now, not after the write: a timeout firing while the outcome is being
      // written would stop the heartbeat for a job that already finished.
      clearTimeout(exec.timer);
      exec.finishing = true;
      handlerDone?.();
      if (
        value === undefined &&
        thrown === undefined &&
        !exec.committed &&
        !exec.released &&
        !lostLease(exec)
      ) {
        exec.durationMs = ms;
        d.completer.submit(exec.lease, exec, completed);
        return;
      }
    } catch (error) {
      // Nothing here throws but a caller's callback; the job must still end.
      unrecorded(exec, error);
      end(exec);
      return;
    }
    void settle(exec, spec, value, thrown, ms);
  }

  /** The completer's word on a plain completion. */
  const completed = (exec: Execution, committed: boolean, error: unknown) => {
    try {
      if (committed) {
        d.events.emit("job:completed", { job: exec.job, durationMs: exec.durationMs });
      } else if (error === undefined) stale(exec.job, "complete");
      else unrecorded(exec, error);
    } finally {
      end(exec);
    }
  };

  /** Every outcome but a plain completion. Never rejects. */
  async function settle(
    exec: Execution,
    spec: HandlerSpec | undefined,
    value: unknown,
    thrown: { error: unknown } | undefined,
    ms: number,
  ): Promise<void> {
    const { job } = exec;
    try {
      if (exec.committed) {
        if (thrown) {
          d.logger.warn("handler threw after its transaction committed; the job stays completed", {
            jobId: job.id,
            error: thrown.error,
          });
        }
        d.events.emit("job:completed", { job, durationMs: ms });
      } else if (exec.released) {
        // shutdown gave the lease back; any write would be fenced out
      } else if (lostLease(exec)) {
        // already reported; a write would match 0 rows
      } else if (thrown) {
        const reason = exec.abortReason;
        const error =
          reason instanceof JobTimeoutError || reason instanceof ShutdownError
            ? reason
            : thrown.error;
        await fail(exec, spec, error);
      } else await writeOutcome(exec, spec, value, ms);
    } catch (error) {
      unrecorded(exec, error);
    } finally {
      end(exec);
    }
  }

  /** A handler's promise, awaited; then as finish(). */
  async function awaitHandler(
    exec: Execution,
    spec: HandlerSpec,
    pending: PromiseLike<unknown>,
    started: number,
    handlerDone: (() => void) | undefined,
  ): Promise<void> {
    let value: unknown;
    let thrown: { error: unknown } | undefined;
    try {
      value = await pending;
    } catch (error) {
      thrown = { error };
    }
    finish(exec, spec, value, thrown, performance.now() - started, handlerDone);
  }

  /** The outcome write itself failed (connection lost, Postgres restarting). */
  function unrecorded(exec: Execution, error: unknown) {
    // The lease runs out and the reaper makes the job runnable again.
    d.logger.error("could not record job outcome; the lease will expire and the job will rerun", {
      jobId: exec.job.id,
      error,
    });
  }

  function end(exec: Execution) {
    clearTimeout(exec.timer);
    d.running.delete(exec.job.id);
    endExecution(exec);
  }

  /**
   * Runs a dequeued job to its outcome. Calls `handlerDone` once the handler
   * has returned (or thrown) and `over` once the job is off this worker's
   * hands: its outcome written, or given up to the reaper. Never throws.
   * Returns nothing: a handler that returns a plain value is not awaited (an
   * await costs a turn of the microtask queue and suspending a function),
   * and a promise per job only for its caller to wait on cost more than the
   * callback.
   */
  return function execute(
    row: LeasedRow,
    leaseMs: number,
    handlerDone?: () => void,
    over?: () => void,
  ): void {
    const job = jobFromLeasedRow(row, d.owner, leaseMs);
    const exec: Execution = {
      job,
      lease: { id: job.id, version: job.leaseVersion },
      leaseMs,
      abortReason: undefined,
      controller: undefined,
      timer: undefined,
      durationMs: 0,
      whenOver: over,
      inTransaction: false,
      finishing: false,
      committed: false,
      released: false,
      done: undefined,
      finish: undefined,
      over: false,
    };
    d.running.set(job.id, exec);
    d.events.emit("job:started", { job });
    const spec = d.handlers.get(job.kind);
    if (!spec) {
      // fetchJobs only leases kinds we handle; reaching here is a bug, but
      // losing the job would be worse: record it as a failure and let it retry.
      const error = new ValidationError("kind", `no handler for kind ${job.kind}`);
      void settle(exec, undefined, undefined, { error }, 0);
      return;
    }
    if (spec.timeoutMs) {
      const ms = spec.timeoutMs;
      exec.timer = setTimeout(() => abortExecution(exec, new JobTimeoutError(ms)), ms);
    }
    const started = performance.now();
    let value: unknown;
    try {
      value = spec.handler(job.payload, new Context(exec));
      if (isThenable(value)) {
        void awaitHandler(exec, spec, value, started, handlerDone);
        return;
      }
    } catch (error) {
      finish(exec, spec, undefined, { error }, performance.now() - started, handlerDone);
      return;
    }
    finish(exec, spec, value, undefined, performance.now() - started, handlerDone);
  };
}
