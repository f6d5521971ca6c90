// The bench's command-line checks (bench/lib/args.ts, bench/run.ts): a typo
// must stop the run with the flag and the value named, never quietly measure
// less than was asked, or another configuration than was asked.
import { describe, expect, test } from "bun:test";
import path from "node:path";
import fc from "fast-check";
import { choices, positiveInt, positiveInts } from "../bench/lib/args.ts";

const ROOT = path.join(import.meta.dir, "..");
const ALLOWED = ["throughput", "ledger", "latency", "enqueue", "scale", "rss"] as const;

describe("choices", () => {
  test("returns the listed names in order when all are allowed", () => {
    fc.assert(
      fc.property(
        fc.array(fc.constantFrom(...ALLOWED), { minLength: 1, maxLength: 8 }),
        (picked) => {
          expect(choices("phases", picked.join(","), ALLOWED)).toEqual(picked);
          expect(choices("phases", picked.join(" , "), ALLOWED)).toEqual(picked);
        },
      ),
    );
  });

  test("names the first item that is not allowed", () => {
    fc.assert(
      fc.property(
        fc.array(fc.constantFrom(...ALLOWED), { maxLength: 4 }),
        fc
          .string({ minLength: 1, maxLength: 12 })
          .filter((s) => !s.includes(",") && !(ALLOWED as readonly string[]).includes(s.trim())),
        (good, bad) => {
          const value = [...good, bad].join(",");
          expect(() => choices("phases", value, ALLOWED)).toThrow(
            `--phases ${value}: ${bad.trim()} is not one of`,
          );
        },
      ),
    );
  });
});

describe("positiveInt(s)", () => {
  test("accepts whole numbers from 1", () => {
    fc.assert(
      fc.property(fc.array(fc.integer({ min: 1, max: 10_000_000 }), { minLength: 1 }), (ns) => {
        expect(positiveInts("sizes", ns.join(","))).toEqual(ns);
      }),
    );
  });

  test("rejects zero, negatives, fractions and words", () => {
    for (const bad of ["0", "-3", "2.5", "abc", "", "1e400"]) {
      expect(() => positiveInt("reps", bad)).toThrow(`--reps ${bad}: expected a whole number`);
    }
    expect(() => positiveInts("sizes", "500,1O000")).toThrow("--sizes 1O000");
  });
});

/** bench/run.ts with `args` and --dry-run: its exit code, stdout and stderr. */
function dryRun(args: string[]) {
  const r = Bun.spawnSync([process.execPath, "bench/run.ts", ...args, "--dry-run"], {
    cwd: ROOT,
    stdout: "pipe",
    stderr: "pipe",
  });
  return { code: r.exitCode, out: r.stdout.toString(), err: r.stderr.toString() };
}

/** Expects bench/run.ts to refuse `args`, saying `says`; returns its stderr. */
function refused(args: string[], says: string): string {
  const r = dryRun(args);
  expect(r.code).not.toBe(0);
  expect(r.err).toContain(says);
  return r.err;
}

describe("bench/run.ts options", () => {
  test("a misspelt phase or system stops the run and names it", () => {
    refused(["--phases", "throughput,latenc"], "--phases throughput,latenc: latenc is not one of");
    refused(
      ["--only", "conveyor,bulmq-redis", "--phases", "throughput"],
      "bulmq-redis is not one of",
    );
    refused(["--reps", "three"], "--reps three: expected a whole number");
  });

  test("a setting must be one of that system's", () => {
    refused(["--setting", "c4000-b2000,bullmq-redis=c999"], "bullmq-redis has no setting c999");
    refused(["--setting", "c9"], "conveyor has no setting c9");
  });

  test("latency without a throughput run to pick settings needs each system's", () => {
    const base = ["--only", "conveyor,bullmq-redis", "--phases", "latency"];
    refused(base, "required for conveyor");
    const err = refused([...base, "--setting", "c4000-b2000"], "required for bullmq-redis");
    expect(err).not.toContain("required for conveyor");

    const both = dryRun([...base, "--setting", "c4000-b2000,bullmq-redis=c200"]);
    expect(both.err).toBe("");
    expect(both.code).toBe(0);
    expect(JSON.parse(both.out)).toMatchObject({
      systems: ["conveyor", "bullmq-redis"],
      phases: ["latency"],
      givenSettings: { conveyor: "c4000-b2000", "bullmq-redis": "c200" },
    });
  });

  test("a throughput run at the reference size picks the settings itself", () => {
    const r = dryRun(["--only", "conveyor,bullmq-redis", "--phases", "throughput,latency"]);
    expect(r.err).toBe("");
    expect(r.code).toBe(0);
    expect(JSON.parse(r.out)).toMatchObject({
      phases: ["throughput", "latency"],
      givenSettings: {},
    });
    // The scale phase runs only Conveyor: a peer needs no setting for it.
    const scale = dryRun([
      "--only",
      "conveyor,graphile-worker",
      "--phases",
      "scale",
      "--setting",
      "c100",
    ]);
    expect(scale.code).toBe(0);
  });
});
