// /v1/queues: per-queue counts, pause and resume.
import type { Hono, MiddlewareHandler } from "hono";
import {
  countLiveJobsByQueue,
  countRecentFinalJobsByQueue,
  selectQueues,
  setQueuesPaused,
} from "../db/admin.ts";
import type { Pool } from "../db/db.ts";
import { notifyQueues } from "../db/wake.ts";
import { QUEUE_NAME_RE } from "../enqueue.ts";
import type { Scope } from "./auth.ts";
import { validationError } from "./http-error.ts";
import { readJson } from "./request.ts";
import { emptyRequestSchema, type FINAL_STATES } from "./schemas.ts";

/** Finished jobs counted per state: see countRecentFinalJobsByQueue. */
export const FINAL_COUNT_WINDOW = 10_000;

export interface QueueRoutesDeps {
  sql: Pool;
  auth: (scope: Scope) => MiddlewareHandler;
  bodyLimit: MiddlewareHandler;
}

type Counts = Record<"available" | "scheduled" | "running" | (typeof FINAL_STATES)[number], number>;

export function registerQueueRoutes(app: Hono, d: QueueRoutesDeps): void {
  const { sql } = d;

  // A queue is listed if it has a conveyor_queues row (it was ever paused or
  // resumed), live jobs, or jobs among the recent finished ones. Listing every
  // queue that ever had a job would need a scan of the table or an index led
  // by queue over all rows; neither is worth it for this view.
  app.get("/v1/queues", d.auth("admin"), async (c) => {
    const [settings, live, final] = await Promise.all([
      selectQueues(sql),
      countLiveJobsByQueue(sql),
      countRecentFinalJobsByQueue(sql, FINAL_COUNT_WINDOW),
    ]);
    const queues = new Map<string, { name: string; paused: boolean; counts: Counts }>();
    const get = (name: string) => {
      let q = queues.get(name);
      if (!q) {
        q = {
          name,
          paused: false,
          counts: {
            available: 0,
            scheduled: 0,
            running: 0,
            completed: 0,
            cancelled: 0,
            discarded: 0,
          },
        };
        queues.set(name, q);
      }
      return q;
    };
    for (const s of settings) get(s.name).paused = s.paused;
    for (const l of live) {
      const q = get(l.queue);
      q.counts.available = l.available;
      q.counts.scheduled = l.scheduled;
      q.counts.running = l.running;
    }
    const totals = { completed: 0, cancelled: 0, discarded: 0 };
    for (const f of final) {
      get(f.queue).counts[f.state] = f.n;
      totals[f.state] += f.n;
    }
    return c.json({
      queues: [...queues.values()].sort((a, b) => (a.name < b.name ? -1 : 1)),
      finalCounts: {
        window: FINAL_COUNT_WINDOW,
        exact: {
          completed: totals.completed < FINAL_COUNT_WINDOW,
          cancelled: totals.cancelled < FINAL_COUNT_WINDOW,
          discarded: totals.discarded < FINAL_COUNT_WINDOW,
        },
      },
    });
  });

  for (const [action, paused] of [
    ["pause", true],
    ["resume", false],
  ] as const) {
    app.post(`/v1/queues/:name/${action}`, d.auth("admin"), d.bodyLimit, async (c) => {
      const name = c.req.param("name");
      if (!QUEUE_NAME_RE.test(name)) {
        throw validationError("name", "1-128 characters from A-Z a-z 0-9 _ . : -");
      }
      await readJson(c, emptyRequestSchema, { emptyAllowed: true });
      const [row] = await setQueuesPaused(sql, [name], paused);
      if (!row) throw new Error("unreachable: upsert returned no row");
      // Idle workers learn of a resumed queue now rather than at their next poll.
      if (!paused) await notifyQueues(sql, [name]);
      return c.json({ queue: { name: row.name, paused: row.paused, updatedAt: row.updated_at } });
    });
  }
}
