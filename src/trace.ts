/** W3C trace context: https://www.w3.org/TR/trace-context/ */
export const TRACEPARENT_RE = /^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$/;

// Murmur3's 32-bit block step and finalizer (Math.imul keeps them in 32 bits).
function absorb(h: number, k: number): number {
  k = Math.imul(k, 0xcc9e2d51);
  k = (k << 15) | (k >>> 17);
  h ^= Math.imul(k, 0x1b873593);
  h = (h << 13) | (h >>> 19);
  return (Math.imul(h, 5) + 0xe6546b64) | 0;
}

function finish(h: number): string {
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return (h >>> 0).toString(16).padStart(8, "0");
}

// One seed per 32-bit word of the result: four for the trace id, two for the
// parent id. Each word hashes the whole input with its own seed.
const SEEDS = [0x9e3779b9, 0x7f4a7c15, 0x85ebca77, 0xc2b2ae3d, 0x27d4eb2f, 0x165667b1];

/**
 * The root trace context of a job enqueued outside any trace, derived from
 * its id and its creation time in whole milliseconds, so that it need not be
 * stored: the job row keeps NULL and every reader (the enqueue's reply, the
 * API, the handler's `ctx.job`) derives the same value. Stable across the
 * job's attempts, as a stored one was; a copy of the database gives the same
 * jobs the same trace ids, as stored random ones would.
 *
 * A stored random traceparent made every job row 56 bytes wider, twice over
 * with the table's half-empty pages, and every fetch and completion wrote it
 * again: through the worker pool at 100,000 preloaded jobs (2 cores, fsync
 * on) 43,000-46,000 jobs/s and 30-33 µs of server CPU per job against
 * 48,000-60,000 and 23-30 without it (bench/pool-vs-loop.ts, `--preload`).
 *
 * Not a cryptographic hash: six seeded murmur3 words over the id's digits and
 * the time. Trace ids look random to samplers that read their low bytes
 * (OpenTelemetry's ratio sampler), which the job's sequential id would not.
 * The W3C random-trace-id flag stays unset; the sampled flag is set, as for
 * a fresh root.
 */
export function rootTraceparent(id: string, createdAtMs: number): string {
  const lo = createdAtMs >>> 0;
  const hi = Math.floor(createdAtMs / 0x1_0000_0000) >>> 0;
  const words: string[] = [];
  for (const seed of SEEDS) {
    let h = seed;
    for (let i = 0; i < id.length; i++) h = absorb(h, id.charCodeAt(i));
    h = absorb(absorb(h, lo), hi);
    words.push(finish(h ^ (id.length + 8)));
  }
  let traceId = words.slice(0, 4).join("");
  let parentId = words.slice(4).join("");
  // All zeros is invalid in either field (W3C); odds of 2^-128 and 2^-64.
  if (/^0+$/.test(traceId)) traceId = `${traceId.slice(0, 31)}1`;
  if (/^0+$/.test(parentId)) parentId = `${parentId.slice(0, 15)}1`;
  return `00-${traceId}-${parentId}-01`;
}

/** The job's stored trace context, or the root one derived for it. */
export function jobTraceparent(stored: string | null, id: string, createdAtMs: number): string {
  return stored ?? rootTraceparent(id, createdAtMs);
}
