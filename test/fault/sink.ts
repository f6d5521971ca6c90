// The external system of the fault suite: an HTTP store that, like a storage
// service that understands fencing tokens, accepts a write for a job only if
// its token is at least the highest it has accepted for that job. Every
// delivery is recorded, accepted or not, so the checker can count
// redeliveries (allowed: at-least-once) and check that idempotency keys and
// accepted tokens behave.

export interface Delivery {
  jobId: string;
  token: number;
  key: string;
  accepted: boolean;
}

export interface Sink {
  readonly url: string;
  readonly deliveries: Delivery[];
  stop(): Promise<void>;
}

export function startSink(): Sink {
  const deliveries: Delivery[] = [];
  const highest = new Map<string, number>();
  const server = Bun.serve({
    port: 0,
    hostname: "127.0.0.1",
    async fetch(req) {
      if (req.method !== "POST") return new Response("method", { status: 405 });
      const body = (await req.json()) as { jobId: string };
      const token = Number(req.headers.get("x-fencing-token"));
      const key = req.headers.get("idempotency-key") ?? "";
      const top = highest.get(body.jobId) ?? 0;
      const accepted = token >= top;
      if (accepted) highest.set(body.jobId, token);
      deliveries.push({ jobId: body.jobId, token, key, accepted });
      return accepted
        ? Response.json({ ok: true })
        : Response.json({ error: "stale fencing token" }, { status: 409 });
    },
  });
  return {
    url: `http://127.0.0.1:${server.port}/`,
    deliveries,
    async stop() {
      await server.stop(true);
    },
  };
}
