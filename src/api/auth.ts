// Bearer-token auth with two scopes: `enqueue` (add jobs, read one job) and
// `admin` (everything). With no tokens configured nothing is enforced; the
// daemon binds to loopback in that case, and the host and origin checks
// below keep web pages in a local browser from using that open door.
import { createHash, timingSafeEqual } from "node:crypto";
import type { MiddlewareHandler } from "hono";
import { HttpError } from "./http-error.ts";

export const SCOPES = ["enqueue", "admin"] as const;
export type Scope = (typeof SCOPES)[number];

export interface AuthConfig {
  tokens: { token: string; scopes: Scope[] }[];
}

const REALM = 'Bearer realm="conveyor"';
const digest = (s: string) => createHash("sha256").update(s).digest();

export function createAuth(config: AuthConfig): (scope: Scope) => MiddlewareHandler {
  // Comparing fixed-length digests with timingSafeEqual, and always against
  // every token, keeps the time independent of how much of a guess matched
  // and of which token it was.
  const known = config.tokens.map((t) => ({ digest: digest(t.token), scopes: new Set(t.scopes) }));

  const scopesOf = (token: string): Set<Scope> | undefined => {
    const d = digest(token);
    let found: Set<Scope> | undefined;
    for (const k of known) {
      if (timingSafeEqual(d, k.digest)) found = k.scopes;
    }
    return found;
  };

  return (scope) => async (c, next) => {
    if (known.length === 0) {
      rejectBrowserAttacks(c.req.raw);
      return next();
    }
    const header = c.req.header("authorization") ?? "";
    const match = /^Bearer +([^\s]+) *$/i.exec(header);
    if (!match?.[1]) {
      throw new HttpError(401, "unauthorized", "missing bearer token", undefined, {
        "WWW-Authenticate": REALM,
      });
    }
    const scopes = scopesOf(match[1]);
    if (!scopes) {
      throw new HttpError(401, "unauthorized", "unknown bearer token", undefined, {
        "WWW-Authenticate": `${REALM}, error="invalid_token"`,
      });
    }
    if (!scopes.has("admin") && !scopes.has(scope)) {
      throw new HttpError(403, "forbidden", `this token lacks the ${scope} scope`, undefined, {
        "WWW-Authenticate": `${REALM}, error="insufficient_scope", scope="${scope}"`,
      });
    }
    return next();
  };
}

const LOOPBACK_HOST = /^(?:localhost|[^.]+\.localhost|127(?:\.\d{1,3}){3}|\[::1\])$/i;

/**
 * Without tokens the API trusts whoever can reach the loopback socket, which
 * includes web pages in a local browser. Two checks keep them out:
 * - Browsers send Origin on every cross-origin POST, while curl and
 *   server-side clients send none: a foreign Origin is a web page.
 * - DNS rebinding makes a page's own origin resolve to 127.0.0.1, so Origin
 *   matches; its Host is still the attacker's name, not a loopback one.
 */
function rejectBrowserAttacks(req: Request): void {
  const url = new URL(req.url);
  if (!LOOPBACK_HOST.test(url.hostname)) {
    throw new HttpError(
      403,
      "host_not_allowed",
      `without auth tokens only loopback host names are served, not ${url.hostname}; configure tokens`,
    );
  }
  const origin = req.headers.get("origin");
  if (origin !== null && origin !== url.origin) {
    throw new HttpError(403, "cross_origin", "cross-origin requests are not accepted");
  }
}
