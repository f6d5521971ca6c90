import { describe, expect, test } from "bun:test";
import fc from "fast-check";
import { DEFAULT_BACKOFF, retryDelayMs } from "./retry.ts";

describe("retryDelayMs", () => {
  test("grows exponentially without jitter", () => {
    const p = { ...DEFAULT_BACKOFF, jitter: 0 };
    expect([1, 2, 3, 4].map((a) => retryDelayMs(a, p))).toEqual([1000, 2000, 4000, 8000]);
  });

  test("is capped at maxMs", () => {
    expect(retryDelayMs(60, { ...DEFAULT_BACKOFF, jitter: 0 })).toBe(DEFAULT_BACKOFF.maxMs);
  });

  test("stays within [capped·(1-jitter), capped] for any attempt and random draw", () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 10_000 }),
        fc.double({ min: 0, max: 1, maxExcluded: true, noNaN: true }),
        fc.double({ min: 0, max: 1, noNaN: true }),
        (attempt, r, jitter) => {
          const p = { ...DEFAULT_BACKOFF, jitter };
          const capped = Math.min(p.maxMs, p.baseMs * 2 ** Math.min(attempt - 1, 1000));
          const d = retryDelayMs(attempt, p, () => r);
          return d >= Math.floor(capped * (1 - jitter)) && d <= Math.ceil(capped);
        },
      ),
    );
  });
});
