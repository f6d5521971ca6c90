import { describe, expect, test } from "bun:test";
import {
  cronPattern,
  dueSlots,
  lastSlotAtOrBefore,
  msUntilNext,
  slotKey,
  slotsBetween,
  startupSlots,
} from "./slots.ts";

const at = (iso: string) => new Date(iso);
const iso = (ds: Date[]) => ds.map((d) => d.toISOString());

describe("cron slots", () => {
  const everySecond = cronPattern("* * * * * *", "UTC");
  const everyMinute = cronPattern("* * * * *", "UTC");

  test("slotsBetween is (after, upTo]", () => {
    expect(
      iso(slotsBetween(everySecond, at("2030-01-01T00:00:00Z"), at("2030-01-01T00:00:02Z"))),
    ).toEqual(["2030-01-01T00:00:01.000Z", "2030-01-01T00:00:02.000Z"]);
    expect(
      slotsBetween(everyMinute, at("2030-01-01T00:00:00Z"), at("2030-01-01T00:00:59.999Z")),
    ).toEqual([]);
  });

  test("a late tick enqueues every slot it covers while they are recent", () => {
    const { due, skipped } = dueSlots(
      everySecond,
      at("2030-01-01T00:00:00Z"),
      at("2030-01-01T00:00:03.5Z"),
      "skip",
    );
    expect(iso(due)).toHaveLength(3);
    expect(skipped).toBe(0);
  });

  test("slots older than the missed threshold follow the policy", () => {
    const since = at("2030-01-01T00:00:00Z");
    const now = at("2030-01-01T01:00:30Z"); // an hour late
    const skip = dueSlots(everyMinute, since, now, "skip", 60_000);
    expect(iso(skip.due)).toEqual(["2030-01-01T01:00:00.000Z"]);
    expect(skip.skipped).toBe(59);
    const one = dueSlots(everyMinute, since, now, "catch_up_one", 60_000);
    expect(iso(one.due)).toEqual(["2030-01-01T00:59:00.000Z", "2030-01-01T01:00:00.000Z"]);
    expect(one.skipped).toBe(58);
  });

  test("on start: nothing with skip, the last slot at or before now with catch_up_one", () => {
    const now = at("2030-01-01T10:30:00Z");
    const daily = cronPattern("0 3 * * *", "UTC");
    expect(startupSlots(daily, now, "skip")).toEqual([]);
    expect(iso(startupSlots(daily, now, "catch_up_one"))).toEqual(["2030-01-01T03:00:00.000Z"]);
    expect(lastSlotAtOrBefore(daily, at("2030-01-01T03:00:00Z"))?.toISOString()).toBe(
      "2030-01-01T03:00:00.000Z",
    );
  });

  test("timezones move the slots", () => {
    const paris = cronPattern("0 9 * * *", "Europe/Paris");
    expect(iso(startupSlots(paris, at("2030-07-01T12:00:00Z"), "catch_up_one"))).toEqual([
      "2030-07-01T07:00:00.000Z",
    ]);
  });

  test("keys and waits", () => {
    expect(slotKey("nightly", at("2030-01-01T03:00:00Z"))).toBe(
      "cron:nightly:2030-01-01T03:00:00.000Z",
    );
    expect(msUntilNext(everyMinute, at("2030-01-01T00:00:59.250Z"))).toBe(750);
  });
});
