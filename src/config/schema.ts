// The shape of conveyor.toml. Every table is strict: an unknown key is an
// error, so a typo never silently falls back to a default.
import { Cron } from "croner";
import { z } from "zod";
import { DEFAULT_MAX_ATTEMPTS, KIND_RE, QUEUE_NAME_RE } from "../enqueue.ts";
import { DEFAULT_BACKOFF } from "../retry.ts";
import { EFFECT_GROUP_MAX, EFFECT_ISOLATION } from "../worker/effects.ts";
import { DB_CALL_DEADLINE_MS } from "../worker/loop.ts";
import { DEFAULT_RETENTION_MS } from "../worker/pruner.ts";
import {
  DEFAULT_CONCURRENCY,
  DEFAULT_EFFECT_BATCH,
  DEFAULT_EFFECT_CONCURRENCY,
  DEFAULT_GRACE_MS,
  DEFAULT_LEASE_MS,
  DEFAULT_POLL_INTERVAL_MS,
  MAX_FETCH_BATCH,
} from "../worker/worker.ts";

export const DEFAULT_CONFIG_FILE = "conveyor.toml";
export const DEFAULT_POOL_SIZE = 10;
/** Relative to the folder of the config file. */
export const DEFAULT_DATA_DIR = ".conveyor/pgdata";
/** 0: a free port on every start. The data folder, not the port, carries the state. */
export const DEFAULT_EMBEDDED_PORT = 0;
export const DEFAULT_LISTEN = "127.0.0.1:8080";
/** Relative to the folder of the config file. */
export const DEFAULT_PLUGINS_DIR = "plugins";
export const DEFAULT_PRIORITY = 0;
/**
 * Cron schedules are read in UTC unless an entry names a timezone, so that
 * daemons on hosts with different local zones compute the same slots (and so
 * the same idempotency keys).
 */
export const DEFAULT_CRON_TIMEZONE = "UTC";
export const DEFAULT_CRON_MISSED = "skip";
export const MIN_TOKEN_LENGTH = 16;
export const CRON_NAME_RE = /^[A-Za-z0-9_.:-]{1,128}$/;
export const SCOPES = ["enqueue", "admin"] as const;

const int = (min: number, max: number) => z.number().int().min(min).max(max);
const DAY_MS = 86_400_000;

const databaseSchema = z
  .object({
    url: z
      .string()
      .regex(/^postgres(ql)?:\/\//, "expected a postgres:// or postgresql:// URL")
      .optional(),
    pool_size: int(1, 1000).default(DEFAULT_POOL_SIZE),
  })
  .strict();

const embeddedSchema = z
  .object({
    data_dir: z.string().min(1).optional(),
    port: int(0, 65535).default(DEFAULT_EMBEDDED_PORT),
  })
  .strict();

const tokenSchema = z
  .object({
    token: z
      .string()
      .min(MIN_TOKEN_LENGTH, `expected a token of at least ${MIN_TOKEN_LENGTH} characters`)
      .optional(),
    token_env: z
      .string()
      .regex(/^[A-Za-z_][A-Za-z0-9_]*$/, "expected an environment variable name")
      .optional(),
    scopes: z.array(z.enum(SCOPES)).min(1, "expected at least one scope"),
  })
  .strict()
  .refine((t) => t.token !== undefined || t.token_env !== undefined, {
    message: "expected token or token_env",
  });

const apiSchema = z
  .object({
    listen: z.string().default(DEFAULT_LISTEN),
    max_body_bytes: int(1024, 1024 * 1024 * 1024).optional(),
    tokens: z.array(tokenSchema).default([]),
  })
  .strict();

const workerSchema = z
  .object({
    poll_interval_ms: int(10, DAY_MS).default(DEFAULT_POLL_INTERVAL_MS),
    grace_ms: int(0, DAY_MS).default(DEFAULT_GRACE_MS),
    heartbeat_ms: int(10, DAY_MS).optional(),
    effect_batch: int(1, EFFECT_GROUP_MAX).default(DEFAULT_EFFECT_BATCH),
    effect_concurrency: int(1, 64).default(DEFAULT_EFFECT_CONCURRENCY),
    effect_isolation: z.enum(EFFECT_ISOLATION).default("rerun"),
    effect_timeout_ms: int(100, DAY_MS).default(DB_CALL_DEADLINE_MS),
    hand_off: z.boolean().default(true),
    durable_completions: z.boolean().default(true),
  })
  .strict();

const queueSchema = z
  .object({
    concurrency: int(1, 10_000).default(DEFAULT_CONCURRENCY),
    lease_ms: int(100, DAY_MS).default(DEFAULT_LEASE_MS),
    /** Absent: min(concurrency, DEFAULT_FETCH_BATCH). */
    fetch_batch: int(1, MAX_FETCH_BATCH).optional(),
    max_attempts: int(1, 1000).default(DEFAULT_MAX_ATTEMPTS),
    backoff_base_ms: int(1, DAY_MS).default(DEFAULT_BACKOFF.baseMs),
    backoff_max_ms: int(1, 30 * DAY_MS).default(DEFAULT_BACKOFF.maxMs),
    priority: int(-32768, 32767).default(DEFAULT_PRIORITY),
    /** Absent: leave the queue's paused flag as the database has it. */
    paused: z.boolean().optional(),
  })
  .strict()
  .refine((q) => q.backoff_base_ms <= q.backoff_max_ms, {
    message: "expected backoff_base_ms <= backoff_max_ms",
    path: ["backoff_base_ms"],
  });

function validTimezone(tz: string): boolean {
  try {
    new Intl.DateTimeFormat("en", { timeZone: tz });
    return true;
  } catch {
    return false;
  }
}

function cronPatternError(schedule: string): string | undefined {
  try {
    new Cron(schedule, { paused: true }).stop();
    return undefined;
  } catch (error) {
    return error instanceof Error ? error.message : String(error);
  }
}

const cronSchema = z
  .object({
    name: z.string().regex(CRON_NAME_RE, "expected 1-128 characters from A-Z a-z 0-9 _ . : -"),
    schedule: z.string().superRefine((s, ctx) => {
      const error = cronPatternError(s);
      if (error) ctx.addIssue({ code: "custom", message: `expected a cron pattern: ${error}` });
    }),
    timezone: z
      .string()
      .refine(validTimezone, "expected an IANA timezone such as Europe/Paris")
      .default(DEFAULT_CRON_TIMEZONE),
    queue: z.string().regex(QUEUE_NAME_RE, "expected a queue name").optional(),
    kind: z.string().regex(KIND_RE, "expected a job kind"),
    payload: z.record(z.string(), z.unknown()).default({}),
    missed: z.enum(["skip", "catch_up_one"]).default(DEFAULT_CRON_MISSED),
  })
  .strict();

/** How long finished jobs are kept; `false` keeps them forever. */
const keepFor = z.union([int(60_000, 100 * 365 * DAY_MS), z.literal(false)]);
const retentionSchema = z
  .object({
    completed_ms: keepFor.default(DEFAULT_RETENTION_MS.completed),
    cancelled_ms: keepFor.default(DEFAULT_RETENTION_MS.cancelled),
    discarded_ms: keepFor.default(DEFAULT_RETENTION_MS.discarded),
  })
  .strict();

export const configSchema = z
  .object({
    database: databaseSchema.default({ pool_size: DEFAULT_POOL_SIZE }),
    embedded: embeddedSchema.default({ port: DEFAULT_EMBEDDED_PORT }),
    api: apiSchema.default({ listen: DEFAULT_LISTEN, tokens: [] }),
    plugins: z.string().min(1).optional(),
    worker: workerSchema.default({
      poll_interval_ms: DEFAULT_POLL_INTERVAL_MS,
      grace_ms: DEFAULT_GRACE_MS,
      effect_batch: DEFAULT_EFFECT_BATCH,
      effect_concurrency: DEFAULT_EFFECT_CONCURRENCY,
      effect_isolation: "rerun",
      effect_timeout_ms: DB_CALL_DEADLINE_MS,
      hand_off: true,
      durable_completions: true,
    }),
    queues: z
      .record(z.string().regex(QUEUE_NAME_RE, "expected a queue name"), queueSchema)
      .default({}),
    cron: z.array(cronSchema).default([]),
    retention: retentionSchema.default({
      completed_ms: DEFAULT_RETENTION_MS.completed,
      cancelled_ms: DEFAULT_RETENTION_MS.cancelled,
      discarded_ms: DEFAULT_RETENTION_MS.discarded,
    }),
  })
  .strict()
  .superRefine((c, ctx) => {
    const seen = new Set<string>();
    c.cron.forEach((entry, i) => {
      if (seen.has(entry.name)) {
        ctx.addIssue({
          code: "custom",
          path: ["cron", i, "name"],
          message: "expected a unique name: another [[cron]] entry has it",
        });
      }
      seen.add(entry.name);
    });
  });

export type RawConfig = z.output<typeof configSchema>;
export type Scope = (typeof SCOPES)[number];
