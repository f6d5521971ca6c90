// Cron scheduler: one loop for every [[cron]] entry. Each slot is enqueued
// with idempotencyKey = cron:<name>:<slot ISO time>, and keys are unique per
// queue, so any number of daemons running this loop enqueue each slot exactly
// once between them, with no leader election: whoever inserts first wins and
// the others get `duplicate`.
//
// Invariant: `since` advances only after the tick's batch committed, so a
// failed tick (Postgres unreachable) is retried by the next one, whose window
// still covers the slots (see dueSlots for what counts as missed).
import type { Pool } from "../db/db.ts";
import { type EnqueueInput, enqueueMany } from "../enqueue.ts";
import type { JsonValue } from "../json.ts";
import type { Logger } from "../logger.ts";
import {
  cronPattern,
  dueSlots,
  type MissedPolicy,
  msUntilNext,
  slotKey,
  startupSlots,
} from "./slots.ts";

/** Re-check at least this often, so a clock jump or a suspended host is noticed. */
export const MAX_SLEEP_MS = 30_000;
/** A tick fires this long after its slot, so the slot is never "in the future" by a timer's rounding. */
export const FIRE_DELAY_MS = 5;
export const RETRY_AFTER_ERROR_MS = 1_000;

export interface CronEntry {
  name: string;
  schedule: string;
  timezone: string;
  queue: string;
  kind: string;
  payload: JsonValue;
  missed: MissedPolicy;
  priority: number;
  maxAttempts: number;
}

export interface CronEnqueued {
  name: string;
  slot: Date;
  jobId: string;
  duplicate: boolean;
}

export interface CronScheduler {
  /** Enqueues catch-up slots, then fires on schedule until stopped. */
  start(signal?: AbortSignal): void;
  stop(): Promise<void>;
  /** Catch-up on start (what start() does first), with "now" injectable. */
  runStartup(now?: Date): Promise<CronEnqueued[]>;
  /** One tick covering (last tick, now]. */
  runOnce(now?: Date): Promise<CronEnqueued[]>;
}

export interface CronSchedulerOptions {
  sql: Pool;
  entries: CronEntry[];
  logger: Logger;
  /** The clock; tests pass their own. */
  now?: () => Date;
}

export function createCronScheduler(o: CronSchedulerOptions): CronScheduler {
  const clock = o.now ?? (() => new Date());
  const entries = o.entries.map((e) => ({ e, cron: cronPattern(e.schedule, e.timezone) }));
  let since: Date | undefined;
  let timer: ReturnType<typeof setTimeout> | undefined;
  let running: Promise<unknown> | undefined;
  let stopped = true;

  const enqueueSlots = async (slots: { e: CronEntry; slot: Date }[]): Promise<CronEnqueued[]> => {
    if (slots.length === 0) return [];
    const inputs: EnqueueInput[] = slots.map(({ e, slot }) => ({
      queue: e.queue,
      kind: e.kind,
      payload: e.payload,
      priority: e.priority,
      maxAttempts: e.maxAttempts,
      idempotencyKey: slotKey(e.name, slot),
    }));
    const results = await enqueueMany(o.sql, inputs);
    return results.map((r, i) => {
      const { e, slot } = slots[i] as { e: CronEntry; slot: Date };
      const out = { name: e.name, slot, jobId: r.job.id, duplicate: r.duplicate };
      const fields = { cron: e.name, slot: slot.toISOString(), jobId: r.job.id, kind: e.kind };
      if (r.duplicate) o.logger.debug("cron slot already enqueued", fields);
      else o.logger.info("cron slot enqueued", fields);
      return out;
    });
  };

  const runStartup = async (now = clock()) => {
    const slots = entries.flatMap(({ e, cron }) =>
      startupSlots(cron, now, e.missed).map((slot) => ({ e, slot })),
    );
    const done = await enqueueSlots(slots);
    since = now;
    return done;
  };

  const runOnce = async (now = clock()) => {
    const from = since ?? now;
    const slots: { e: CronEntry; slot: Date }[] = [];
    for (const { e, cron } of entries) {
      const { due, skipped } = dueSlots(cron, from, now, e.missed);
      if (skipped > 0) {
        o.logger.warn("cron slots missed and skipped", { cron: e.name, count: skipped });
      }
      for (const slot of due) slots.push({ e, slot });
    }
    const done = await enqueueSlots(slots);
    since = now;
    return done;
  };

  const sleepMs = (now: Date): number => {
    let ms = MAX_SLEEP_MS;
    for (const { cron } of entries) {
      const next = msUntilNext(cron, now);
      if (next !== undefined) ms = Math.min(ms, next + FIRE_DELAY_MS);
    }
    return Math.max(0, ms);
  };

  const schedule = (ms: number, run: () => Promise<unknown>) => {
    if (stopped) return;
    timer = setTimeout(async () => {
      timer = undefined;
      if (stopped) return;
      let retry = false;
      running = run().catch((error) => {
        retry = true;
        o.logger.warn("cron tick failed; will retry", { error });
      });
      await running;
      running = undefined;
      schedule(
        retry ? RETRY_AFTER_ERROR_MS : sleepMs(clock()),
        retry && !since ? runStartup : tick,
      );
    }, ms);
  };
  const tick = () => runOnce();

  const stop = async () => {
    stopped = true;
    if (timer) clearTimeout(timer);
    timer = undefined;
    await running;
  };

  return {
    start(signal) {
      if (!stopped || entries.length === 0) return;
      stopped = false;
      signal?.addEventListener("abort", () => void stop(), { once: true });
      o.logger.info("cron started", {
        entries: entries.map(({ e, cron }) => ({
          name: e.name,
          schedule: e.schedule,
          next: cron.nextRun(clock())?.toISOString(),
        })),
      });
      schedule(0, () => runStartup());
    },
    stop,
    runStartup,
    runOnce,
  };
}
