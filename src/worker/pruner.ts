// Pruner: deletes finished jobs past their retention, so the table's history
// stays bounded (River's JobCleaner). Dequeue does not need it — its partial
// index holds only available jobs — but disk, vacuum and listing do.
//
// Invariant: only rows in a final state are deleted; a job that is available,
// running or pending is never touched.
import type { Pool } from "../db/db.ts";
import { type FinalState, pruneFinishedJobs } from "../db/prune.ts";
import type { Events } from "../events.ts";
import type { Logger } from "../logger.ts";
import { intervalLoop, type Loop } from "./loop.ts";

export const DEFAULT_RETENTION_MS: Record<FinalState, number> = {
  completed: 24 * 3_600_000,
  cancelled: 24 * 3_600_000,
  discarded: 7 * 24 * 3_600_000,
};
export const DEFAULT_PRUNER_INTERVAL_MS = 60_000;
export const PRUNER_BATCH = 5_000;

export interface PrunerOptions {
  sql: Pool;
  /** Per final state; `null` keeps that state forever. */
  retentionMs?: Partial<Record<FinalState, number | null>>;
  intervalMs?: number;
  logger: Logger;
  events?: Events;
}

export function createPruner(o: PrunerOptions): Loop {
  const retention = { ...DEFAULT_RETENTION_MS, ...o.retentionMs };
  const pruneAll = async () => {
    for (const [state, olderThanMs] of Object.entries(retention) as [FinalState, number | null][]) {
      if (olderThanMs === null) continue;
      let total = 0;
      // Batches, each its own short transaction, so no long lock or huge WAL burst.
      for (;;) {
        const n = await pruneFinishedJobs(o.sql, { state, olderThanMs, limit: PRUNER_BATCH });
        total += n;
        if (n < PRUNER_BATCH) break;
      }
      if (total > 0) o.logger.info("pruned finished jobs", { state, count: total });
    }
  };
  return intervalLoop({
    name: "pruner",
    intervalMs: o.intervalMs ?? DEFAULT_PRUNER_INTERVAL_MS,
    staggerFirst: true,
    logger: o.logger,
    ...(o.events ? { events: o.events } : {}),
    run: pruneAll,
  });
}
