// What a daemon would run, from its config and its plugins: the queues its
// workers consume, the handler of each kind, and the resolved cron entries.
// `conveyor check` prints it; `conveyor start` runs it.
import type { CronEntryConfig, DaemonConfig, QueueConfig } from "../config/load.ts";
import { lineOf } from "../config/locate.ts";
import { DEFAULT_PRIORITY } from "../config/schema.ts";
import type { CronEntry } from "../cron/scheduler.ts";
import { DEFAULT_MAX_ATTEMPTS, DEFAULT_QUEUE } from "../enqueue.ts";
import { ConfigError } from "../errors.ts";
import type { HandlerSpec } from "../handler.ts";
import type { JsonValue } from "../json.ts";
import type { LoadedPlugin } from "../plugins/load.ts";
import { DEFAULT_BACKOFF } from "../retry.ts";
import { DEFAULT_CONCURRENCY, DEFAULT_LEASE_MS } from "../worker/worker.ts";

export const DEFAULT_QUEUE_CONFIG: QueueConfig = {
  concurrency: DEFAULT_CONCURRENCY,
  fetchBatch: undefined,
  leaseMs: DEFAULT_LEASE_MS,
  maxAttempts: DEFAULT_MAX_ATTEMPTS,
  backoff: { baseMs: DEFAULT_BACKOFF.baseMs, maxMs: DEFAULT_BACKOFF.maxMs },
  priority: DEFAULT_PRIORITY,
  paused: undefined,
};

export interface PlannedQueue extends QueueConfig {
  name: string;
  /** Why the queue is consumed: named in [queues], by a plugin, by a cron entry, or the default queue. */
  from: "config" | "plugin" | "cron" | "default";
}

export interface Plan {
  queues: PlannedQueue[];
  plugins: LoadedPlugin[];
  handlers: Record<string, HandlerSpec>;
  cron: CronEntry[];
}

/** The settings enqueues into `queue` default to. */
export function queueSettings(config: DaemonConfig, queue: string): QueueConfig {
  return config.queues[queue] ?? DEFAULT_QUEUE_CONFIG;
}

function cronQueue(entry: CronEntryConfig, plugins: Map<string, LoadedPlugin>): string {
  return entry.queue ?? plugins.get(entry.kind)?.queue ?? DEFAULT_QUEUE;
}

/**
 * Resolves config and plugins together. With `requireCronKinds`, a cron entry
 * whose kind no plugin handles is an error (its jobs would wait forever).
 */
export function makePlan(
  config: DaemonConfig,
  plugins: LoadedPlugin[],
  opts: { requireCronKinds: boolean },
): Plan {
  const byKind = new Map(plugins.map((p) => [p.kind, p]));
  const cron: CronEntry[] = config.cron.map((c, i) => {
    if (opts.requireCronKinds && !byKind.has(c.kind)) {
      throw new ConfigError(
        config.name,
        `cron.${i}.kind`,
        lineOf(config.text, ["cron", i, "kind"]),
        `got ${JSON.stringify(c.kind)}: no plugin handles this kind (plugins: ${[...byKind.keys()].join(", ") || "none"})`,
      );
    }
    const queue = cronQueue(c, byKind);
    const q = queueSettings(config, queue);
    return {
      name: c.name,
      schedule: c.schedule,
      timezone: c.timezone,
      queue,
      kind: c.kind,
      payload: c.payload as JsonValue,
      missed: c.missed,
      priority: q.priority,
      maxAttempts: q.maxAttempts,
    };
  });

  const queues = new Map<string, PlannedQueue>();
  const add = (name: string, from: PlannedQueue["from"]) => {
    if (!queues.has(name)) queues.set(name, { name, from, ...queueSettings(config, name) });
  };
  for (const name of Object.keys(config.queues)) add(name, "config");
  for (const p of plugins) if (p.queue) add(p.queue, "plugin");
  for (const c of cron) add(c.queue, "cron");
  add(DEFAULT_QUEUE, "default");

  return {
    queues: [...queues.values()],
    plugins,
    handlers: Object.fromEntries(plugins.map((p) => [p.kind, p.spec])),
    cron,
  };
}
