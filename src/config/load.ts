// Reads conveyor.toml once: parse (Bun's TOML), validate (zod, strict), then
// resolve what depends on the environment (secrets, database URL) and on the
// file's folder (relative paths). Every error names the file, the line, the
// key path, the bad value and what was expected.
import { existsSync, readFileSync } from "node:fs";
import path from "node:path";
import type { z } from "zod";
import { ConfigError } from "../errors.ts";
import type { EffectIsolation } from "../worker/effects.ts";
import { lineOf, syntaxErrorLine } from "./locate.ts";
import {
  configSchema,
  DEFAULT_DATA_DIR,
  DEFAULT_PLUGINS_DIR,
  type RawConfig,
  type Scope,
} from "./schema.ts";

export interface QueueConfig {
  concurrency: number;
  /** Jobs leased per fetch; undefined: the worker's default, min(concurrency, 1,000). */
  fetchBatch: number | undefined;
  leaseMs: number;
  maxAttempts: number;
  backoff: { baseMs: number; maxMs: number };
  priority: number;
  paused: boolean | undefined;
}

export interface CronEntryConfig {
  name: string;
  schedule: string;
  timezone: string;
  /** Undefined: the queue of the plugin that handles `kind`, else "default". */
  queue: string | undefined;
  kind: string;
  payload: Record<string, unknown>;
  missed: "skip" | "catch_up_one";
}

export interface ApiToken {
  token: string;
  scopes: Scope[];
}

export type DatabaseSource = "CONVEYOR_DATABASE_URL" | "DATABASE_URL" | "database.url";

export interface DaemonConfig {
  /** Absolute path of the file read; undefined when none existed and defaults apply. */
  file: string | undefined;
  /** The path as the user gave it, for messages. */
  name: string;
  /** The file's text ("" without a file), for locating keys in later errors. */
  text: string;
  /** Folder relative paths are resolved against. */
  dir: string;
  database: { url: string | undefined; source: DatabaseSource | undefined; poolSize: number };
  embedded: { dataDir: string; port: number };
  api: { host: string; port: number; maxBodyBytes: number | undefined; tokens: ApiToken[] };
  plugins: { dir: string; explicit: boolean };
  worker: {
    pollIntervalMs: number;
    graceMs: number;
    heartbeatMs: number | undefined;
    effectBatch: number;
    effectConcurrency: number;
    effectIsolation: EffectIsolation;
    effectTimeoutMs: number;
    handOff: boolean;
    durableCompletions: boolean;
  };
  queues: Record<string, QueueConfig>;
  cron: CronEntryConfig[];
  /** Per final state, how long finished jobs are kept; null: forever. */
  retentionMs: { completed: number | null; cancelled: number | null; discarded: number | null };
}

export type Env = Record<string, string | undefined>;

const LOOPBACK_HOSTS = new Set(["localhost", "::1"]);

export function isLoopback(host: string): boolean {
  return LOOPBACK_HOSTS.has(host.toLowerCase()) || /^127(\.\d{1,3}){3}$/.test(host);
}

/** "host:port", "[::1]:port"; undefined when malformed. */
export function parseListen(s: string): { host: string; port: number } | undefined {
  const m = /^\[([0-9A-Fa-f:.]+)\]:(\d{1,5})$/.exec(s) ?? /^([^:[\]\s]+):(\d{1,5})$/.exec(s);
  if (!m) return undefined;
  const port = Number(m[2]);
  if (port > 65535) return undefined;
  return { host: m[1] as string, port };
}

function show(value: unknown): string {
  if (value === undefined) return "(missing)";
  const s = JSON.stringify(value);
  return s.length > 80 ? `${s.slice(0, 77)}...` : s;
}

function valueAt(root: unknown, keyPath: readonly PropertyKey[]): unknown {
  let v = root;
  for (const k of keyPath) {
    if (v === null || typeof v !== "object") return undefined;
    v = (v as Record<PropertyKey, unknown>)[k];
  }
  return v;
}

function issueError(
  file: string,
  text: string,
  raw: unknown,
  issue: z.core.$ZodIssue,
): ConfigError {
  const at = issue.path.filter((k): k is string | number => typeof k !== "symbol");
  if (issue.code === "unrecognized_keys") {
    const key = issue.keys[0] as string;
    const keyPath = [...at, key];
    return new ConfigError(
      file,
      keyPath.join("."),
      lineOf(text, keyPath),
      `unknown key ${show(key)}${issue.keys.length > 1 ? ` (and ${issue.keys.slice(1).join(", ")})` : ""}; expected one of the documented keys (docs/config.md)`,
    );
  }
  const value = valueAt(raw, at);
  const expected = issue.message.replace(/^Invalid input: /, "");
  return new ConfigError(file, at.join("."), lineOf(text, at), `got ${show(value)}: ${expected}`);
}

/** Parses and validates the text of a config file; `file` only names it in errors. */
export function parseConfigText(text: string, file: string): RawConfig {
  let raw: unknown;
  try {
    raw = Bun.TOML.parse(text);
  } catch (cause) {
    const line = syntaxErrorLine(text, (s) => Bun.TOML.parse(s));
    const msg = cause instanceof Error ? cause.message.replace(/^TOML Parse error: /, "") : "";
    throw new ConfigError(file, "", line, `invalid TOML: ${msg}`, { cause });
  }
  const parsed = configSchema.safeParse(raw);
  if (!parsed.success) {
    const issue = parsed.error.issues[0] as z.core.$ZodIssue;
    const error = issueError(file, text, raw, issue);
    throw new ConfigError(error.file, error.path, error.line, error.detail, {
      cause: parsed.error,
    });
  }
  return parsed.data;
}

/**
 * Resolves a validated file against its folder and the environment. Secrets
 * in the environment win over values in the file: CONVEYOR_DATABASE_URL, then
 * DATABASE_URL, then database.url; a token's token_env, then its token.
 */
export function resolveConfig(
  raw: RawConfig,
  o: {
    file: string | undefined;
    name: string;
    dir: string;
    text: string;
    env: Env;
    /** False for commands that never serve the API: a token_env that is unset is then no error. */
    secrets?: boolean;
  },
): DaemonConfig {
  const fail = (keyPath: (string | number)[], detail: string) =>
    new ConfigError(o.name, keyPath.join("."), lineOf(o.text, keyPath), detail);

  let url: string | undefined;
  let source: DatabaseSource | undefined;
  for (const [value, from] of [
    [o.env.CONVEYOR_DATABASE_URL, "CONVEYOR_DATABASE_URL"],
    [o.env.DATABASE_URL, "DATABASE_URL"],
    [raw.database.url, "database.url"],
  ] as const) {
    if (value) {
      url = value;
      source = from;
      break;
    }
  }

  const listen = parseListen(raw.api.listen);
  if (!listen) {
    throw fail(["api", "listen"], `got ${show(raw.api.listen)}: expected "host:port"`);
  }
  const tokens: ApiToken[] = raw.api.tokens
    .map((t, i) => {
      const fromEnv = t.token_env ? o.env[t.token_env] : undefined;
      const token = fromEnv || t.token;
      if (!token && o.secrets === false) return { token: "", scopes: [] };
      if (!token) {
        throw fail(
          ["api", "tokens", i, "token_env"],
          `environment variable ${t.token_env} is not set and no token is given`,
        );
      }
      return { token, scopes: [...new Set(t.scopes)] };
    })
    .filter((t) => t.token !== "");
  if (raw.api.tokens.length === 0 && !isLoopback(listen.host)) {
    throw fail(
      ["api", "listen"],
      `got ${show(raw.api.listen)}: without [[api.tokens]] the API has no authentication, so it may listen on loopback only (127.0.0.1, ::1, localhost); add a token or listen on 127.0.0.1`,
    );
  }

  const queues: Record<string, QueueConfig> = {};
  for (const [q, c] of Object.entries(raw.queues)) {
    queues[q] = {
      concurrency: c.concurrency,
      fetchBatch: c.fetch_batch,
      leaseMs: c.lease_ms,
      maxAttempts: c.max_attempts,
      backoff: { baseMs: c.backoff_base_ms, maxMs: c.backoff_max_ms },
      priority: c.priority,
      paused: c.paused,
    };
  }

  return {
    file: o.file,
    name: o.name,
    text: o.text,
    dir: o.dir,
    database: { url, source, poolSize: raw.database.pool_size },
    embedded: {
      dataDir: path.resolve(o.dir, raw.embedded.data_dir ?? DEFAULT_DATA_DIR),
      port: raw.embedded.port,
    },
    api: {
      host: listen.host,
      port: listen.port,
      maxBodyBytes: raw.api.max_body_bytes,
      tokens,
    },
    plugins: {
      dir: path.resolve(o.dir, raw.plugins ?? DEFAULT_PLUGINS_DIR),
      explicit: raw.plugins !== undefined,
    },
    worker: {
      pollIntervalMs: raw.worker.poll_interval_ms,
      graceMs: raw.worker.grace_ms,
      heartbeatMs: raw.worker.heartbeat_ms,
      effectBatch: raw.worker.effect_batch,
      effectConcurrency: raw.worker.effect_concurrency,
      effectIsolation: raw.worker.effect_isolation,
      effectTimeoutMs: raw.worker.effect_timeout_ms,
      handOff: raw.worker.hand_off,
      durableCompletions: raw.worker.durable_completions,
    },
    queues,
    cron: raw.cron.map((c) => ({ ...c, queue: c.queue })),
    retentionMs: {
      completed: raw.retention.completed_ms === false ? null : raw.retention.completed_ms,
      cancelled: raw.retention.cancelled_ms === false ? null : raw.retention.cancelled_ms,
      discarded: raw.retention.discarded_ms === false ? null : raw.retention.discarded_ms,
    },
  };
}

/**
 * Loads the config file at `file`. With `required` false (no --config given)
 * a missing file means "all defaults", relative to the current folder.
 */
export function loadConfig(
  file: string,
  opts: { required: boolean; env?: Env; secrets?: boolean } = { required: true },
): DaemonConfig {
  const abs = path.resolve(file);
  const env = opts.env ?? process.env;
  const secrets = opts.secrets ?? true;
  if (!existsSync(abs)) {
    if (opts.required) throw new ConfigError(file, "", undefined, "file not found");
    const raw = parseConfigText("", file);
    return resolveConfig(raw, {
      file: undefined,
      name: file,
      dir: path.dirname(abs),
      text: "",
      env,
    });
  }
  let text: string;
  try {
    text = readFileSync(abs, "utf8");
  } catch (cause) {
    throw new ConfigError(file, "", undefined, "cannot read the file", { cause });
  }
  const raw = parseConfigText(text, file);
  return resolveConfig(raw, { file: abs, name: file, dir: path.dirname(abs), text, env, secrets });
}
