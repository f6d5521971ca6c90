import { describe, expect, test } from "bun:test";
import fc from "fast-check";
import { jobTraceparent, rootTraceparent, TRACEPARENT_RE } from "../src/trace.ts";

// Job ids are bigint identities as decimal strings; creation times are epoch
// milliseconds from 1970 to 2200.
const jobId = fc.bigInt({ min: 1n, max: 2n ** 63n - 1n }).map(String);
const createdAtMs = fc.integer({ min: 0, max: 7_258_118_400_000 });

describe("rootTraceparent", () => {
  test("is a valid W3C traceparent, sampled, with non-zero ids, the same on every call", () => {
    fc.assert(
      fc.property(jobId, createdAtMs, (id, ms) => {
        const tp = rootTraceparent(id, ms);
        expect(tp).toMatch(TRACEPARENT_RE);
        const [version, traceId, parentId, flags] = tp.split("-");
        expect(version).toBe("00");
        expect(flags).toBe("01");
        expect(traceId).not.toMatch(/^0+$/);
        expect(parentId).not.toMatch(/^0+$/);
        expect(rootTraceparent(id, ms)).toBe(tp);
      }),
    );
  });

  test("differs between jobs, by id or by creation time", () => {
    fc.assert(
      fc.property(
        fc.uniqueArray(fc.tuple(jobId, createdAtMs), {
          minLength: 2,
          maxLength: 200,
          selector: ([id, ms]) => `${id}@${ms}`,
        }),
        (jobs) => {
          const traceIds = new Set(jobs.map(([id, ms]) => rootTraceparent(id, ms).slice(3, 35)));
          const parentIds = new Set(jobs.map(([id, ms]) => rootTraceparent(id, ms).slice(36, 52)));
          expect(traceIds.size).toBe(jobs.length);
          expect(parentIds.size).toBe(jobs.length);
        },
      ),
    );
  });

  test("sequential ids in one millisecond give trace ids whose low half looks uniform", () => {
    // OpenTelemetry's ratio sampler keeps a trace when the trace id's low 8
    // bytes fall under ratio * 2^64; sequential ids must not all fall low.
    const n = 20_000;
    const buckets = new Array<number>(16).fill(0);
    for (let i = 1; i <= n; i++) {
      const traceId = rootTraceparent(String(i), 1_796_000_000_000).slice(3, 35);
      const b = Number.parseInt(traceId.charAt(16), 16);
      buckets[b] = (buckets[b] ?? 0) + 1;
    }
    // Each of 16 buckets expects 1,250; 5 standard deviations is about 171.
    for (const c of buckets) expect(Math.abs(c - n / 16)).toBeLessThan(171);
  });

  test("a stored traceparent wins over the derived one", () => {
    const stored = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    expect(jobTraceparent(stored, "7", 0)).toBe(stored);
    expect(jobTraceparent(null, "7", 0)).toBe(rootTraceparent("7", 0));
  });
});
