// The HTTP API as a Hono app. The daemon owns the socket and mounts it with
// Bun.serve({ fetch: app.fetch }); tests call app.fetch directly.
import { Hono } from "hono";
import { bodyLimit } from "hono/body-limit";
import { HTTPException } from "hono/http-exception";
import type { ContentfulStatusCode } from "hono/utils/http-status";
import { z } from "zod";
import { ping } from "../db/admin.ts";
import { isConnectionError, type Pool } from "../db/db.ts";
import { DEFAULT_MAX_PAYLOAD_BYTES, type EnqueueOptions } from "../enqueue.ts";
import type { Logger } from "../logger.ts";
import { parseOrThrow } from "../validate.ts";
import { createAuth, SCOPES, type Scope } from "./auth.ts";
import { errorResponse, HttpError } from "./http-error.ts";
import { registerJobRoutes } from "./jobs.ts";
import { buildOpenApi } from "./openapi.ts";
import { registerQueueRoutes } from "./queues.ts";

/** Room for the rest of an enqueue request around a payload of the maximum size. */
export const BODY_OVERHEAD_BYTES = 64 * 1024;
export const READY_TIMEOUT_MS = 2_000;
/** Retry-After of a 503 answered while the database is unreachable. */
export const DATABASE_RETRY_AFTER_S = 1;

export interface ApiOptions {
  sql: Pool;
  logger: Logger;
  auth: { tokens: { token: string; scopes: Scope[] }[] };
  /** Largest request body; default the payload limit plus BODY_OVERHEAD_BYTES. */
  maxBodyBytes?: number;
  enqueueDefaults?: EnqueueOptions;
  version: string;
  /** Extra readiness condition (e.g. migrations applied); /readyz also pings the database. */
  isReady?: () => Promise<boolean>;
}

const optionsSchema = z
  .object({
    sql: z.custom<Pool>((v) => typeof v === "function", "a postgres.js pool"),
    logger: z.custom<Logger>((v) => typeof v === "object" && v !== null, "a Logger"),
    auth: z
      .object({
        tokens: z.array(
          z
            .object({
              token: z.string().regex(/^[^\s]+$/, "a non-empty token without whitespace"),
              scopes: z.array(z.enum(SCOPES)).min(1),
            })
            .strict(),
        ),
      })
      .strict(),
    maxBodyBytes: z.number().int().positive().optional(),
    enqueueDefaults: z
      .object({
        maxPayloadBytes: z.number().int().positive().optional(),
        defaultMaxAttempts: z.number().int().min(1).max(1000).optional(),
      })
      .loose() // passed through to enqueue(), which may grow options this file does not know
      .optional(),
    version: z.string().min(1),
    isReady: z.custom<() => Promise<boolean>>((v) => typeof v === "function").optional(),
  })
  .strict();

/** Paths and the methods they answer, for 405 responses with an Allow header. */
const ALLOWED: Record<string, string[]> = {
  "/v1/jobs/batch": ["POST"],
  "/v1/jobs": ["GET", "POST"],
  "/v1/jobs/:id{[0-9]+}/cancel": ["POST"],
  "/v1/jobs/:id{[0-9]+}/retry": ["POST"],
  "/v1/jobs/:id{[0-9]+}": ["GET"],
  "/v1/queues": ["GET"],
  "/v1/queues/:name/pause": ["POST"],
  "/v1/queues/:name/resume": ["POST"],
  "/healthz": ["GET"],
  "/readyz": ["GET"],
  "/openapi.json": ["GET"],
};

export function createApi(options: ApiOptions): Hono {
  const opts = parseOrThrow(optionsSchema, options, "api");
  const { sql, logger, version } = opts;
  const maxBodyBytes =
    opts.maxBodyBytes ??
    (opts.enqueueDefaults?.maxPayloadBytes ?? DEFAULT_MAX_PAYLOAD_BYTES) + BODY_OVERHEAD_BYTES;
  const app = new Hono();
  const auth = createAuth(opts.auth);
  const limit = bodyLimit({
    maxSize: maxBodyBytes,
    onError: (c) =>
      errorResponse(
        c,
        new HttpError(413, "payload_too_large", `request body exceeds ${maxBodyBytes} bytes`),
      ),
  });

  app.get("/healthz", (c) => c.json({ status: "ok", version }));

  app.get("/readyz", async (c) => {
    const ready = await withTimeout(
      (async () => {
        await ping(sql);
        return (await opts.isReady?.()) ?? true;
      })(),
      READY_TIMEOUT_MS,
    ).catch((error: unknown) => {
      logger.warn("readiness check failed", { error });
      return false;
    });
    if (!ready) throw new HttpError(503, "not_ready", "not ready");
    return c.json({ status: "ok", version });
  });

  let openapi: Record<string, unknown> | undefined;
  app.get("/openapi.json", (c) => {
    openapi ??= buildOpenApi(version);
    return c.json(openapi);
  });

  registerJobRoutes(app, {
    sql,
    enqueueDefaults: opts.enqueueDefaults ?? {},
    auth,
    bodyLimit: limit,
  });
  registerQueueRoutes(app, { sql, auth, bodyLimit: limit });

  // Registered after the real routes, so they only see methods nothing else answered.
  for (const [path, methods] of Object.entries(ALLOWED)) {
    app.all(path, (c) =>
      errorResponse(
        c,
        new HttpError(405, "method_not_allowed", `${c.req.method} is not allowed here`, undefined, {
          Allow: methods.join(", "),
        }),
      ),
    );
  }

  app.notFound((c) =>
    errorResponse(c, new HttpError(404, "not_found", `no route for ${c.req.method} ${c.req.path}`)),
  );

  app.onError((err, c) => {
    if (err instanceof HttpError) return errorResponse(c, err);
    if (err instanceof HTTPException && err.status < 500) {
      return errorResponse(
        c,
        new HttpError(err.status as ContentfulStatusCode, "http_error", err.message),
      );
    }
    if (isConnectionError(err)) {
      // Not the client's fault and not ours: the database is restarting or
      // unreachable. A retry soon may succeed; an enqueue retried with the
      // same Idempotency-Key is harmless even if this one did commit.
      logger.warn("api: database unavailable", {
        error: err,
        method: c.req.method,
        path: c.req.path,
      });
      return errorResponse(
        c,
        new HttpError(
          503,
          "database_unavailable",
          "the database is not reachable; retry later (with an Idempotency-Key, a retried enqueue is never applied twice)",
          undefined,
          { "Retry-After": String(DATABASE_RETRY_AFTER_S) },
        ),
      );
    }
    logger.error("api: unexpected error", {
      error: err,
      method: c.req.method,
      path: c.req.path,
    });
    return errorResponse(c, new HttpError(500, "internal", "internal error"));
  });

  return app;
}

function withTimeout<T>(p: Promise<T>, ms: number): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms`)), ms);
  });
  return Promise.race([p, timeout]).finally(() => clearTimeout(timer));
}
