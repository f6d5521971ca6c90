// The benchmark's targets table (bench/lib/summary.ts) prints each measured
// ratio beside its goal and a met column; the printed figure must never read
// as the goal when the target is missed.
import { describe, expect, test } from "bun:test";
import fc from "fast-check";
import { fmtDown } from "../bench/lib/summary.ts";

const shown = (s: string) => Number(s.replaceAll(",", ""));

describe("fmtDown", () => {
  test("a ratio just under its goal prints under it", () => {
    expect(fmtDown(69.64, 1)).toBe("69.6");
    expect(fmtDown(1.4999, 2)).toBe("1.49");
    expect(fmtDown(70, 1)).toBe("70.0");
    expect(fmtDown(1.5, 2)).toBe("1.50");
    expect(fmtDown(Number.NaN, 1)).toBe("n/a");
  });

  test("prints at most the value and less than one last digit under it", () => {
    fc.assert(
      fc.property(
        fc.double({ min: 0, max: 5_000, noNaN: true }),
        fc.integer({ min: 0, max: 3 }),
        (v, digits) => {
          const p = shown(fmtDown(v, digits));
          const step = 10 ** -digits;
          // Binary fractions: allow the last place's rounding error.
          expect(p).toBeLessThanOrEqual(v + step * 1e-6);
          expect(v - p).toBeLessThan(step * (1 + 1e-6));
        },
      ),
    );
  });

  test("a goal held by its digits prints as met exactly when it is met", () => {
    fc.assert(
      fc.property(fc.double({ min: 0, max: 3, noNaN: true }), (r) => {
        // The two goals of the throughput targets: 1.5× and 70%.
        expect(shown(fmtDown(r, 2)) >= 1.5).toBe(r >= 1.5);
        expect(shown(fmtDown(r * 100, 1)) >= 70).toBe(r * 100 >= 70);
      }),
    );
  });
});
