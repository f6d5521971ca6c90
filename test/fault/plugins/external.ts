// Fault-suite workload: an external effect. The sink (a fenced store) sees
// every delivery with its token and idempotency key; the job completes through
// the batched completer afterwards.
import type { JobContext } from "../../../src/handler.ts";

interface Payload {
  before: number;
  sink: string;
}

export default {
  kind: "fault/external",
  async handler(p: Payload, ctx: JobContext) {
    await Bun.sleep(p.before);
    const res = await fetch(p.sink, {
      method: "POST",
      headers: {
        "content-type": "application/json",
        "idempotency-key": ctx.idempotencyKey,
        "x-fencing-token": String(ctx.fencingToken),
      },
      body: JSON.stringify({ jobId: ctx.job.id }),
      signal: ctx.signal,
    });
    if (res.status === 409) throw new Error("sink rejected a stale fencing token");
    if (!res.ok) throw new Error(`sink answered ${res.status}`);
    return { token: ctx.fencingToken };
  },
};
