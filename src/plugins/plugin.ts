// What a plugin file exports, and the zod schema the loader checks it with.
import { z } from "zod";
import { KIND_RE, QUEUE_NAME_RE } from "../enqueue.ts";
import type { Handler } from "../handler.ts";
import type { JsonValue } from "../json.ts";
import type { BackoffPolicy } from "../retry.ts";
import { backoffSchema } from "../worker/worker.ts";

/** A zod schema (or anything with zod's safeParse) for a plugin's payload. */
export interface PayloadSchema<P> {
  safeParse(value: unknown):
    | { success: true; data: P }
    | {
        success: false;
        error: { issues: ReadonlyArray<{ path: ReadonlyArray<PropertyKey>; message: string }> };
      };
}

/** The default export of a plugin file. */
export interface Plugin<P = JsonValue> {
  /** Defaults to the file's path in the plugins folder without extension: `email/send.ts` → `email/send`. */
  kind?: string;
  handler: Handler<P>;
  /**
   * Checked before the handler runs. A payload it rejects cancels the job
   * (state `cancelled`, the issues recorded in its errors): a retry would
   * reject the same payload again.
   */
  schema?: PayloadSchema<P>;
  /** Abort the handler's signal and fail the attempt after this long. */
  timeoutMs?: number;
  /** Retry delays for this kind; overrides the queue's backoff_*_ms. */
  backoff?: Partial<BackoffPolicy>;
  /** The queue this kind is consumed from and that cron entries of this kind default to. */
  queue?: string;
}

/** Identity function that types a plugin's payload from its schema or handler. */
export function definePlugin<P = JsonValue>(plugin: Plugin<P>): Plugin<P> {
  return plugin;
}

const fn = z.custom<(...args: unknown[]) => unknown>(
  (v) => typeof v === "function",
  "expected a function",
);

export const pluginShape = z
  .object({
    kind: z
      .string()
      .regex(KIND_RE, "expected 1-256 characters from A-Z a-z 0-9 _ . : / -")
      .optional(),
    handler: fn,
    schema: z
      .custom<PayloadSchema<unknown>>(
        (v) =>
          typeof v === "object" &&
          v !== null &&
          typeof (v as { safeParse?: unknown }).safeParse === "function",
        "expected a zod schema (an object with safeParse)",
      )
      .optional(),
    timeoutMs: z.number().int().positive().optional(),
    backoff: backoffSchema.optional(),
    queue: z.string().regex(QUEUE_NAME_RE, "expected a queue name").optional(),
  })
  .strict();

export type ValidPlugin = z.output<typeof pluginShape>;
