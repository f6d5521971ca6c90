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

function fmix(h: number): number {
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  return h ^ (h >>> 16);
}

/** One 32-bit word of the result: the input's four words hashed with its own seed. */
function lane(seed: number, a: number, b: number, c: number, d: number): number {
  return fmix(absorb(absorb(absorb(absorb(seed, a), b), c), d) ^ 16);
}

const HEX = Array.from({ length: 256 }, (_, i) => i.toString(16).padStart(2, "0"));

function hex(w: number): string {
  return (
    (HEX[w >>> 24] as string) +
    (HEX[(w >>> 16) & 255] as string) +
    (HEX[(w >>> 8) & 255] as string) +
    (HEX[w & 255] as string)
  );
}

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
 * again (bench/pool-vs-loop.ts `--preloads plain,traced` measures it).
 *
 * Not a cryptographic hash: the id and the time as four 32-bit words, each
 * of the six words of the result a murmur3 hash of them with its own seed.
 * Trace ids look random to samplers that read their low bytes (OpenTelemetry's
 * ratio sampler), which the job's sequential id would not. The W3C
 * random-trace-id flag stays unset; the sampled flag is set, as for a fresh
 * root. About 0.2 µs a call, and a handler's job derives it only when read
 * (jobFromLeasedRow).
 */
export function rootTraceparent(id: string, createdAtMs: number): string {
  let a: number;
  let b: number;
  const n = Number(id);
  if (n <= Number.MAX_SAFE_INTEGER) {
    a = n >>> 0;
    b = Math.floor(n / 0x1_0000_0000) >>> 0;
  } else {
    // Ids past 2^53 (a Number would round them) hash their digits; bit 21
    // of b, never set for a smaller id, keeps the two kinds apart.
    a = 0;
    b = 0x5bd1e995;
    for (let i = 0; i < id.length; i++) {
      a = absorb(a, id.charCodeAt(i));
      b = absorb(b, id.charCodeAt(i));
    }
    b |= 0x20_0000;
  }
  const c = createdAtMs >>> 0;
  const d = Math.floor(createdAtMs / 0x1_0000_0000) >>> 0;
  const t0 = lane(0x9e3779b9, a, b, c, d);
  const t1 = lane(0x7f4a7c15, a, b, c, d);
  const t2 = lane(0x85ebca77, a, b, c, d);
  let t3 = lane(0xc2b2ae3d, a, b, c, d);
  const p0 = lane(0x27d4eb2f, a, b, c, d);
  let p1 = lane(0x165667b1, a, b, c, d);
  // All zeros is invalid in either field (W3C); odds of 2^-128 and 2^-64.
  if ((t0 | t1 | t2 | t3) === 0) t3 = 1;
  if ((p0 | p1) === 0) p1 = 1;
  const traceId = hex(t0) + hex(t1) + hex(t2) + hex(t3);
  const parentId = hex(p0) + hex(p1);
  return `00-${traceId}-${parentId}-01`;
}

/** The job's stored trace context, or the root one derived for it. */
export function jobTraceparent(stored: string | null, id: string, createdAtMs: number): string {
  return stored ?? rootTraceparent(id, createdAtMs);
}
