/** Every error Conveyor raises on purpose extends ConveyorError. */
export class ConveyorError extends Error {
  override readonly name: string = "ConveyorError";
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
  }
}

/** Input to a public function was invalid. `field` names the offending input path. */
export class ValidationError extends ConveyorError {
  override readonly name = "ValidationError";
  constructor(
    readonly field: string,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(`${field}: ${message}`, options);
  }
}

/**
 * A fenced write matched 0 rows: the job's lease was reissued (or the job left
 * `running`) since this worker dequeued it. The write was not applied.
 */
export class StaleLeaseError extends ConveyorError {
  override readonly name = "StaleLeaseError";
  constructor(
    readonly jobId: string,
    readonly fencingToken: string,
    readonly operation: "heartbeat" | "complete" | "fail" | "snooze" | "cancel" | "release",
  ) {
    super(
      `lease lost on job ${jobId} (token ${fencingToken}) during ${operation}; write not applied`,
    );
  }
}

/** The worker is shutting down and the grace period ran out. */
export class ShutdownError extends ConveyorError {
  override readonly name = "ShutdownError";
  constructor() {
    super("worker shutting down: grace period elapsed");
  }
}

/** A handler exceeded its per-job timeout. */
export class JobTimeoutError extends ConveyorError {
  override readonly name = "JobTimeoutError";
  constructor(readonly timeoutMs: number) {
    super(`handler exceeded its timeout of ${timeoutMs} ms`);
  }
}

/**
 * A database call did not settle in time. The call may still complete later;
 * every caller treats the late result as lost (a lease nobody runs expires and
 * is reaped; a completion is re-checked on retry).
 */
export class DeadlineError extends ConveyorError {
  override readonly name = "DeadlineError";
  constructor(
    readonly what: string,
    readonly ms: number,
  ) {
    super(`${what} did not settle within ${ms} ms`);
  }
}

/** Applying a migration failed; `version` names the file. */
export class MigrationError extends ConveyorError {
  override readonly name = "MigrationError";
  constructor(
    readonly migration: string,
    options: { cause: unknown },
  ) {
    super(`migration ${migration} failed: ${errorMessage(options.cause)}`, options);
  }
}

export function errorMessage(error: unknown): string {
  if (error instanceof Error) return error.message;
  return String(error);
}

/**
 * conveyor.toml is unreadable or invalid. `path` is the key path
 * (`queues.email.concurrency`), `line` its 1-based line when the file spells it.
 */
export class ConfigError extends ConveyorError {
  override readonly name = "ConfigError";
  constructor(
    readonly file: string,
    readonly path: string,
    readonly line: number | undefined,
    readonly detail: string,
    options?: { cause?: unknown },
  ) {
    super(
      `${file}${line === undefined ? "" : `:${line}`}: ${path ? `${path}: ` : ""}${detail}`,
      options,
    );
  }
}

/** A plugin file failed to import, exports the wrong shape, or claims a kind another file claims. */
export class PluginLoadError extends ConveyorError {
  override readonly name = "PluginLoadError";
  constructor(
    readonly file: string,
    detail: string,
    options?: { cause?: unknown },
  ) {
    super(`plugin ${file}: ${detail}`, options);
  }
}
