// Serves the API app on the configured address with Bun.serve.
import type { Server } from "bun";
import type { Hono } from "hono";
import { isLoopback } from "../config/load.ts";

/** Host header without its port: "[::1]:8080" → "::1", "localhost:80" → "localhost". */
export function hostName(header: string): string {
  const v6 = /^\[([^\]]+)\]/.exec(header);
  if (v6) return v6[1] as string;
  return header.replace(/:\d+$/, "");
}

/**
 * Without tokens the API has no authentication and listens on loopback only.
 * A page in a local browser can still reach it through DNS rebinding (a
 * hostile name resolving to 127.0.0.1): its requests carry the hostile name
 * in Host, so only loopback names are answered.
 */
export function loopbackHostGuard(fetch: Hono["fetch"]): Hono["fetch"] {
  return (req, ...rest) => {
    const host = req.headers.get("host");
    if (host !== null && !isLoopback(hostName(host))) {
      return Response.json(
        {
          error: {
            code: "forbidden_host",
            message: "this API has no tokens configured and answers only loopback host names",
          },
        },
        { status: 403 },
      );
    }
    return fetch(req, ...rest);
  };
}

export function serveApi(
  app: Hono,
  o: { host: string; port: number; authenticated: boolean },
): Server<undefined> {
  const fetch = o.authenticated ? app.fetch : loopbackHostGuard(app.fetch);
  return Bun.serve({ hostname: o.host, port: o.port, fetch });
}
