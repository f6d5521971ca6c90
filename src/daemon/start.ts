// `conveyor start`: the API, workers, reaper and cron as cooperative loops
// over one Postgres pool, each role optional so extra machines can run, say,
// workers only. Order: plugins (fail before touching the database), database,
// migrations (advisory-locked, so concurrent starts apply each once), queue
// flags, then the roles. Stop reverses it: unready, cron off, API and workers
// drain together, reaper off, pool closed, embedded cluster stopped.
import type { Server } from "bun";
import { createApi } from "../api/index.ts";
import type { DaemonConfig } from "../config/load.ts";
import { type CronScheduler, createCronScheduler } from "../cron/scheduler.ts";
import { setQueuesPaused } from "../db/admin.ts";
import { selectUnservedJobs } from "../db/daemon.ts";
import { isConnectionError } from "../db/db.ts";
import { migrate } from "../db/migrate.ts";
import { createEvents } from "../events.ts";
import type { Logger } from "../logger.ts";
import { loadPlugins } from "../plugins/load.ts";
import type { Loop } from "../worker/loop.ts";
import { createPruner } from "../worker/pruner.ts";
import { createReaper } from "../worker/reaper.ts";
import { createWorker, fetchBatchOf, type Worker } from "../worker/worker.ts";
import { type Database, openDatabase } from "./database.ts";
import { serveApi } from "./http.ts";
import { logJobEvents } from "./job-log.ts";
import { makePlan, type Plan } from "./plan.ts";

export const ROLES = ["api", "worker", "cron", "reaper"] as const;
export type Role = (typeof ROLES)[number];

export const STARTUP_WAIT_MS = 300_000;

async function untilConnected(log: Logger, fn: () => Promise<void>): Promise<void> {
  const deadline = Date.now() + STARTUP_WAIT_MS;
  for (let attempt = 1; ; attempt++) {
    try {
      return await fn();
    } catch (error) {
      if (!isConnectionError(error) || Date.now() > deadline) throw error;
      const delay = Math.min(5_000, 100 * 2 ** attempt);
      log.warn("database not reachable; retrying", { error, attempt, retryInMs: delay });
      await Bun.sleep(delay);
    }
  }
}

export interface Daemon {
  /** The API's address when the api role runs, e.g. http://127.0.0.1:8080. */
  readonly apiUrl: string | undefined;
  readonly plan: Plan;
  /** Graceful stop; idempotent. */
  stop(): Promise<void>;
}

export interface StartOptions {
  config: DaemonConfig;
  roles: ReadonlySet<Role>;
  logger: Logger;
  version: string;
}

/** Plugins and plan for the given roles: only worker and cron need plugins. */
export async function planFor(
  config: DaemonConfig,
  roles: ReadonlySet<Role>,
  logger: Logger,
): Promise<Plan> {
  const needPlugins = roles.has("worker") || roles.has("cron");
  const plugins = needPlugins
    ? await loadPlugins(config.plugins.dir, {
        logger: logger.child({ component: "plugins" }),
        required: config.plugins.explicit,
      })
    : [];
  return makePlan(config, plugins, { requireCronKinds: needPlugins });
}

async function warnUnserved(db: Database, plan: Plan, logger: Logger): Promise<void> {
  const kinds = Object.keys(plan.handlers);
  const queues = plan.queues.map((q) => q.name);
  for (const row of await selectUnservedJobs(db.sql, kinds, queues)) {
    const reason = !kinds.includes(row.kind)
      ? "no plugin here handles this kind; the jobs wait in their queue"
      : "no worker here consumes this queue; the jobs wait in it";
    logger.warn(`available jobs will not run here: ${reason}`, { ...row });
  }
}

export async function startDaemon(o: StartOptions): Promise<Daemon> {
  const { config, roles } = o;
  const logger = o.logger;
  const log = logger.child({ component: "daemon" });
  const plan = await planFor(config, roles, logger);
  for (const p of plan.plugins) {
    log.info("plugin loaded", { kind: p.kind, file: p.file, queue: p.queue });
  }

  const db = await openDatabase(config, logger.child({ component: "database" }), "own");
  const cleanups: (() => Promise<void>)[] = [() => db.close()];
  const unwind = async () => {
    for (const fn of cleanups.reverse()) await fn().catch(() => {});
  };

  let workers: Worker[] = [];
  let reaper: Loop | undefined;
  let pruner: Loop | undefined;
  let cron: CronScheduler | undefined;
  let server: Server<undefined> | undefined;
  let ready = false;
  try {
    // Postgres may be restarting or not up yet (a container starting beside
    // us): wait for it rather than exit, as every loop does later.
    await untilConnected(log, async () => {
      const applied = await migrate(db.sql);
      log.info("migrations", { applied, upToDate: applied.length === 0 });

      for (const paused of [true, false]) {
        const names = Object.entries(config.queues)
          .filter(([, q]) => q.paused === paused)
          .map(([name]) => name);
        if (names.length > 0) {
          await setQueuesPaused(db.sql, names, paused);
          log.info(paused ? "queues paused by config" : "queues resumed by config", {
            queues: names,
          });
        }
      }
    });

    const events = createEvents((name, error) =>
      log.warn("event listener threw", { event: name, error }),
    );
    logJobEvents(events, logger);

    if (roles.has("worker")) {
      if (plan.plugins.length === 0) {
        log.warn("worker role has no plugins to run; no jobs will be fetched", {
          plugins: config.plugins.dir,
        });
      } else {
        await warnUnserved(db, plan, log).catch((error) =>
          log.warn("could not check for jobs no worker here serves", { error }),
        );
        workers = [
          createWorker({
            sql: db.sql,
            queues: Object.fromEntries(
              plan.queues.map((q) => [
                q.name,
                {
                  concurrency: q.concurrency,
                  fetchBatch: fetchBatchOf(q),
                  leaseMs: q.leaseMs,
                  backoff: q.backoff,
                },
              ]),
            ),
            handlers: plan.handlers,
            pollIntervalMs: config.worker.pollIntervalMs,
            ...(config.worker.heartbeatMs ? { heartbeatMs: config.worker.heartbeatMs } : {}),
            effectBatch: config.worker.effectBatch,
            effectConcurrency: config.worker.effectConcurrency,
            effectIsolation: config.worker.effectIsolation,
            effectTimeoutMs: config.worker.effectTimeoutMs,
            handOff: config.worker.handOff,
            durableCompletions: config.worker.durableCompletions,
            reaper: false,
            logger,
            events,
          }),
        ];
        for (const w of workers) await w.start();
      }
    }

    if (roles.has("reaper")) {
      reaper = createReaper({ sql: db.sql, logger: logger.child({ component: "reaper" }), events });
      reaper.start();
      // Maintenance rides with the reaper role: retention of finished jobs.
      pruner = createPruner({
        sql: db.sql,
        retentionMs: config.retentionMs,
        logger: logger.child({ component: "pruner" }),
        events,
      });
      pruner.start();
    }

    if (roles.has("cron") && plan.cron.length > 0) {
      cron = createCronScheduler({
        sql: db.sql,
        entries: plan.cron,
        logger: logger.child({ component: "cron" }),
      });
      cron.start();
    }

    if (roles.has("api")) {
      const app = createApi({
        sql: db.sql,
        logger: logger.child({ component: "api" }),
        auth: { tokens: config.api.tokens },
        // [queues.<name>] max_attempts and priority apply to HTTP enqueues too.
        enqueueDefaults: {
          queueDefaults: Object.fromEntries(
            Object.entries(config.queues).map(([name, q]) => [
              name,
              { priority: q.priority, maxAttempts: q.maxAttempts },
            ]),
          ),
        },
        ...(config.api.maxBodyBytes ? { maxBodyBytes: config.api.maxBodyBytes } : {}),
        version: o.version,
        isReady: async () => ready,
      });
      server = serveApi(app, {
        host: config.api.host,
        port: config.api.port,
        authenticated: config.api.tokens.length > 0,
      });
      const s = server;
      cleanups.push(async () => void s.stop(true));
    }
  } catch (error) {
    for (const w of workers) await w.stop({ graceMs: 0 }).catch(() => {});
    await reaper?.stop();
    await pruner?.stop();
    await cron?.stop();
    await unwind();
    throw error;
  }

  const apiUrl = server ? `http://${server.url.host}` : undefined;
  ready = true;
  log.info("conveyor started", {
    version: o.version,
    roles: [...roles],
    database: db.display,
    api: apiUrl,
    auth: server ? (config.api.tokens.length > 0 ? "tokens" : "none (loopback only)") : undefined,
    queues: plan.queues.map((q) => q.name),
    kinds: Object.keys(plan.handlers),
    cron: plan.cron.map((c) => c.name),
  });

  let stopping: Promise<void> | undefined;
  const stop = async () => {
    ready = false;
    log.info("stopping: draining jobs", { graceMs: config.worker.graceMs });
    await cron?.stop();
    // In-flight requests get the same grace as jobs; then open connections are cut.
    const closeHttp = async (s: Server<undefined>) => {
      await Promise.race([s.stop(false), Bun.sleep(config.worker.graceMs)]);
      await s.stop(true);
    };
    await Promise.all([
      server && closeHttp(server),
      ...workers.map((w) => w.stop({ graceMs: config.worker.graceMs })),
    ]);
    await reaper?.stop();
    await pruner?.stop();
    await db.close();
    log.info("conveyor stopped");
  };
  return {
    apiUrl,
    plan,
    stop: () => {
      stopping ??= stop();
      return stopping;
    },
  };
}
