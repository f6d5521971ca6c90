// Which cron slots a tick must enqueue: pure functions of (schedule, since,
// now), so tests pass the times instead of waiting for them.
import { Cron } from "croner";

/**
 * A slot later than this when its tick runs counts as missed (the daemon was
 * down, or could not reach Postgres) and follows the entry's `missed` policy.
 * Below it, a late tick still enqueues every slot it covers.
 */
export const CRON_MISSED_AFTER_MS = 60_000;
/** Upper bound on the slots one entry enqueues in one tick. */
export const MAX_SLOTS_PER_TICK = 1_000;

export type MissedPolicy = "skip" | "catch_up_one";

export function cronPattern(schedule: string, timezone: string): Cron {
  return new Cron(schedule, { paused: true, timezone });
}

/** Slots in (after, upTo], oldest first, at most `limit`. */
export function slotsBetween(
  cron: Cron,
  after: Date,
  upTo: Date,
  limit = MAX_SLOTS_PER_TICK,
): Date[] {
  const out: Date[] = [];
  let t = cron.nextRun(after);
  while (t && t.getTime() <= upTo.getTime() && out.length < limit) {
    out.push(t);
    t = cron.nextRun(t);
  }
  return out;
}

/** The latest slot at or before `at`, if any. */
export function lastSlotAtOrBefore(cron: Cron, at: Date): Date | undefined {
  // previousRuns excludes a run exactly at its reference, hence +1 ms.
  return cron.previousRuns(1, new Date(at.getTime() + 1))[0];
}

/**
 * Slots a tick covering (since, now] enqueues: every slot younger than
 * `missedAfterMs`, plus, with catch_up_one, the latest of the older ones.
 */
export function dueSlots(
  cron: Cron,
  since: Date,
  now: Date,
  missed: MissedPolicy,
  missedAfterMs = CRON_MISSED_AFTER_MS,
): { due: Date[]; skipped: number } {
  if (now.getTime() <= since.getTime()) return { due: [], skipped: 0 };
  const cutoff = new Date(Math.max(since.getTime(), now.getTime() - missedAfterMs));
  const onTime = slotsBetween(cron, cutoff, now);
  if (cutoff.getTime() === since.getTime()) return { due: onTime, skipped: 0 };
  const old = slotsBetween(cron, since, cutoff, MAX_SLOTS_PER_TICK);
  if (old.length === 0) return { due: onTime, skipped: 0 };
  if (missed === "skip") return { due: onTime, skipped: old.length };
  const latest = old[old.length - 1] as Date;
  return { due: [latest, ...onTime], skipped: old.length - 1 };
}

/** Slots enqueued when a daemon starts: none with skip, the latest past one with catch_up_one. */
export function startupSlots(cron: Cron, now: Date, missed: MissedPolicy): Date[] {
  if (missed === "skip") return [];
  const last = lastSlotAtOrBefore(cron, now);
  return last ? [last] : [];
}

/** Milliseconds from `now` to the entry's next slot, or undefined when it has none. */
export function msUntilNext(cron: Cron, now: Date): number | undefined {
  const next = cron.nextRun(now);
  return next ? next.getTime() - now.getTime() : undefined;
}

export function slotKey(name: string, slot: Date): string {
  return `cron:${name}:${slot.toISOString()}`;
}
