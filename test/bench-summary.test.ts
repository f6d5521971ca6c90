// The benchmark's targets table (bench/lib/summary.ts) prints each measured
// ratio beside its goal and a met column; the printed figure must never read
// as the goal when the target is missed.
import { describe, expect, test } from "bun:test";
import fc from "fast-check";
import { fmtDown, noopFigures, PEERS, type RunRecord } from "../bench/lib/summary.ts";

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

// bench/across.ts and the targets table read a file's no-op figures through
// noopFigures: each system at its best setting's median, and the fastest peer.
describe("noopFigures", () => {
  const run = (system: string, setting: string, n: number, jobsPerSec: number): RunRecord =>
    ({
      phase: "throughput",
      scenario: "throughput",
      system,
      setting,
      settings: {},
      params: { n },
      rep: 1,
      status: "ok",
      result: { jobsPerSec, elapsedMs: 1, cpuMs: 1 },
      wallMs: 1,
      loadavgBefore: 0,
    }) as unknown as RunRecord;

  test("takes each system's best setting by median and the fastest peer", () => {
    const runs = [
      run("conveyor", "a", 10_000, 40_000),
      run("conveyor", "a", 10_000, 50_000),
      run("conveyor", "a", 10_000, 44_000),
      run("conveyor", "b", 10_000, 60_000),
      run("conveyor", "b", 10_000, 30_000),
      run("conveyor", "b", 10_000, 31_000),
      run("bare-sql", "l2", 10_000, 70_000),
      run("bare-sql-conveyor-schema", "l2", 10_000, 50_000),
      run("graphile-worker", "x", 10_000, 25_000),
      run("pg-boss", "y", 10_000, 20_000),
      // Another size must not leak in.
      run("graphile-worker", "x", 100_000, 90_000),
    ];
    const f = noopFigures(runs, 10_000);
    expect(f.conveyor).toBe(44_000);
    expect(f.ceiling).toBe(70_000);
    expect(f.statements).toBe(50_000);
    expect(f.bestPeer).toEqual({ p: "graphile-worker", v: 25_000 });
  });

  test("a system the file lacks is NaN, and no peer is undefined", () => {
    const f = noopFigures([run("conveyor", "a", 10_000, 1_000)], 10_000);
    expect(f.conveyor).toBe(1_000);
    expect(Number.isNaN(f.ceiling)).toBe(true);
    expect(Number.isNaN(f.statements)).toBe(true);
    expect(f.bestPeer).toBeUndefined();
  });

  test("the best peer is never Conveyor or a bare loop, and is the fastest of the peers", () => {
    fc.assert(
      fc.property(
        fc.array(
          fc.record({
            system: fc.constantFrom("conveyor", "bare-sql", "bare-sql-conveyor-schema", ...PEERS),
            v: fc.integer({ min: 1, max: 100_000 }),
          }),
          { minLength: 1, maxLength: 20 },
        ),
        (xs) => {
          // One setting per system: its median is its only run.
          const seen = new Map<string, number>();
          for (const x of xs) if (!seen.has(x.system)) seen.set(x.system, x.v);
          const runs = [...seen].map(([s, v]) => run(s, "only", 10_000, v));
          const f = noopFigures(runs, 10_000);
          const peers = [...seen].filter(([s]) => (PEERS as string[]).includes(s));
          if (peers.length === 0) expect(f.bestPeer).toBeUndefined();
          else expect(f.bestPeer?.v).toBe(Math.max(...peers.map(([, v]) => v)));
          expect((PEERS as string[]).includes(f.bestPeer?.p ?? "graphile-worker")).toBe(true);
        },
      ),
    );
  });
});
