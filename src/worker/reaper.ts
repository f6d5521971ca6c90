// Reaper: returns jobs whose lease expired by Postgres's clock (spec: Reap).
//
// Invariant: it never changes lease_version; the next dequeue issues a higher
// one, so the expired holder's writes match 0 rows from then on.
//
// Each round also analyzes a small table that has outgrown its statistics
// (src/db/stats.ts), so that plans cached while it was nearly empty do not
// scan it as it grows.
import type { Pool } from "../db/db.ts";
import { reapExpiredLeases } from "../db/reap.ts";
import { analyzeIfOutgrown } from "../db/stats.ts";
import type { Events } from "../events.ts";
import type { Logger } from "../logger.ts";
import { intervalLoop, type Loop } from "./loop.ts";

export const DEFAULT_REAPER_INTERVAL_MS = 1_000;
export const REAPER_BATCH = 1_000;

export interface ReaperOptions {
  sql: Pool;
  intervalMs?: number;
  logger: Logger;
  events: Events;
}

export function createReaper(o: ReaperOptions): Loop {
  const reapAll = async () => {
    for (;;) {
      const reaped = await reapExpiredLeases(o.sql, { limit: REAPER_BATCH });
      for (const r of reaped) {
        o.events.emit("lease:reaped", {
          jobId: String(r.id),
          state: r.state,
          owner: r.lease_owner,
          fencingToken: Number(r.lease_version),
        });
      }
      if (reaped.length > 0) o.logger.info("reaped expired leases", { count: reaped.length });
      if (reaped.length < REAPER_BATCH) break;
    }
    if (await analyzeIfOutgrown(o.sql)) {
      o.logger.info("analyzed conveyor_jobs: it had outgrown its planner statistics");
    }
  };
  return intervalLoop({
    name: "reaper",
    intervalMs: o.intervalMs ?? DEFAULT_REAPER_INTERVAL_MS,
    staggerFirst: true,
    logger: o.logger,
    events: o.events,
    run: reapAll,
  });
}
