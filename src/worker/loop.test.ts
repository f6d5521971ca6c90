import { describe, expect, test } from "bun:test";
import { DeadlineError } from "../errors.ts";
import { silentLogger } from "../logger.ts";
import { intervalLoop, withDeadline } from "./loop.ts";

describe("withDeadline", () => {
  test("passes a value or an error through when the promise settles in time", async () => {
    expect(await withDeadline(Promise.resolve(7), "x", 50)).toBe(7);
    await expect(withDeadline(Promise.reject(new Error("boom")), "x", 50)).rejects.toThrow("boom");
  });

  test("rejects with DeadlineError when the promise never settles", async () => {
    const err = (await withDeadline(new Promise(() => {}), "fetch from q", 20).catch(
      (e) => e,
    )) as DeadlineError;
    expect(err).toBeInstanceOf(DeadlineError);
    expect(err.message).toBe("fetch from q did not settle within 20 ms");
  });
});

test("a loop whose iteration hangs moves on at the deadline and keeps running", async () => {
  let calls = 0;
  const loop = intervalLoop({
    name: "t",
    intervalMs: 5,
    deadlineMs: 30,
    logger: silentLogger,
    run: () => {
      calls++;
      return calls === 1 ? new Promise(() => {}) : Promise.resolve();
    },
  });
  loop.start();
  await Bun.sleep(150);
  await loop.stop();
  expect(calls).toBeGreaterThan(2);
});
