// Kind "http/post": POSTs the payload's body to its url. The receiver can
// deduplicate retries by Idempotency-Key (stable across attempts) and reject
// a stale worker by X-Fencing-Token (grows with every lease). The request is
// aborted when the lease is lost, on timeout, or when the daemon shuts down.
import { cancel, type Plugin, z } from "conveyor";

const schema = z.object({
  url: z.url({ protocol: /^https?$/ }),
  body: z.unknown().optional(),
  headers: z.record(z.string(), z.string()).optional(),
});

export default {
  schema,
  timeoutMs: 30_000,
  async handler(req, ctx) {
    const res = await fetch(req.url, {
      method: "POST",
      headers: {
        "content-type": "application/json",
        ...req.headers,
        "idempotency-key": ctx.idempotencyKey,
        "x-fencing-token": String(ctx.fencingToken),
      },
      body: JSON.stringify(req.body ?? {}),
      signal: ctx.signal,
    });
    const text = (await res.text()).slice(0, 1_000);
    // 408, 429 and 5xx may succeed later: throw, and the job retries with backoff.
    if (res.status === 408 || res.status === 429 || res.status >= 500) {
      throw new Error(`POST ${req.url} answered ${res.status}: ${text}`);
    }
    // Any other 4xx will not: stop here.
    if (!res.ok) return cancel(`POST ${req.url} answered ${res.status}: ${text}`);
    return { status: res.status, body: text };
  },
} satisfies Plugin<z.infer<typeof schema>>;
