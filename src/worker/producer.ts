// Producer: leases batches of jobs for one queue and hands them to the
// executor (spec: Dequeue).
//
// Invariant: at most `concurrency` jobs of this queue run in this worker, and
// at most one fetch per queue is in flight, so notifications that arrive in a
// burst coalesce into one fetch (the debounce) and idle workers do not stampede.
import type { Pool } from "../db/db.ts";
import { fetchJobs } from "../db/fetch.ts";
import type { Events } from "../events.ts";
import type { JobRow } from "../job.ts";
import type { Logger } from "../logger.ts";
import { jittered } from "./loop.ts";

export interface ProducerOptions {
  sql: Pool;
  queue: string;
  owner: string;
  kinds: string[];
  concurrency: number;
  fetchBatch: number;
  leaseMs: number;
  /** Fallback fetch when no notification came: lost notifications and scheduled jobs wait at most this long. */
  pollIntervalMs: number;
  execute: (row: JobRow, leaseMs: number) => Promise<void>;
  logger: Logger;
  events: Events;
}

const ERROR_BACKOFF_MS = 1_000;

export interface Producer {
  readonly queue: string;
  readonly active: number;
  start(): void;
  /** Stops fetching; running jobs are the worker's to drain. */
  stop(): Promise<void>;
  /** A notification or a caller says there may be work. */
  wake(): void;
  /** One fetch, awaited: what tests call. Returns the number of jobs leased. */
  runOnce(): Promise<number>;
}

export function createProducer(o: ProducerOptions): Producer {
  let active = 0;
  let stopped = true;
  let fetching: Promise<number> | undefined;
  // Set when there may be more work than the last fetch took.
  let wanted = false;
  let pollTimer: ReturnType<typeof setTimeout> | undefined;
  let retryTimer: ReturnType<typeof setTimeout> | undefined;
  let scheduled = false;

  const free = () => o.concurrency - active;

  const fetchOnce = async (): Promise<number> => {
    const limit = Math.min(free(), o.fetchBatch);
    if (limit <= 0) return 0;
    wanted = false;
    const rows = await fetchJobs(o.sql, {
      queue: o.queue,
      owner: o.owner,
      limit,
      leaseMs: o.leaseMs,
      kinds: o.kinds,
    });
    // A full batch suggests more is waiting.
    if (rows.length === limit) wanted = true;
    for (const row of rows) {
      active++;
      void o.execute(row, o.leaseMs).finally(() => {
        active--;
        schedule();
      });
    }
    return rows.length;
  };

  const fill = () => {
    scheduled = false;
    if (stopped || fetching || !wanted) return;
    // Wait for a worthwhile batch unless idle: one round trip per freed slot
    // would cost more than the jobs themselves.
    if (free() <= 0 || (active > 0 && free() < Math.ceil(o.fetchBatch / 2))) return;
    fetching = fetchOnce();
    fetching
      .catch((error) => {
        o.logger.warn("fetch failed; retrying", { queue: o.queue, error });
        o.events.emit("loop:error", { loop: `producer:${o.queue}`, error });
        wanted = true;
        clearTimeout(retryTimer);
        retryTimer = setTimeout(schedule, jittered(ERROR_BACKOFF_MS, 0.3));
        return 0;
      })
      .finally(() => {
        fetching = undefined;
        if (wanted) schedule();
      });
  };

  // Coalesces wake-ups and freed slots within one turn of the event loop.
  const schedule = () => {
    if (scheduled || stopped) return;
    scheduled = true;
    setImmediate(fill);
  };

  const poll = () => {
    if (stopped) return;
    wanted = true;
    schedule();
    pollTimer = setTimeout(poll, jittered(o.pollIntervalMs));
  };

  return {
    queue: o.queue,
    get active() {
      return active;
    },
    start() {
      if (!stopped) return;
      stopped = false;
      wanted = true;
      schedule();
      pollTimer = setTimeout(poll, jittered(o.pollIntervalMs));
    },
    async stop() {
      stopped = true;
      clearTimeout(pollTimer);
      clearTimeout(retryTimer);
      await fetching?.catch(() => 0);
    },
    wake() {
      wanted = true;
      schedule();
    },
    runOnce: () => fetchOnce(),
  };
}
