import { expect, test } from "bun:test";
import { daemonLogger, prettyLine } from "./log.ts";

test("JSON lines by default; the same records as text for a terminal", () => {
  const lines: string[] = [];
  const json = daemonLogger({ pretty: false, write: (l) => lines.push(l) });
  json.child({ component: "worker" }).info("job failed", { jobId: "7", error: new Error("x") });
  expect(JSON.parse(lines[0] as string)).toMatchObject({
    level: "info",
    msg: "job failed",
    component: "worker",
    jobId: "7",
    error: { name: "Error", message: "x" },
  });
  const text = prettyLine(lines[0] as string, false);
  expect(text).toMatch(/^\d\d:\d\d:\d\d\.\d{3} INFO {2}worker {4}job failed {2}jobId=7 error=/);
  const pretty: string[] = [];
  daemonLogger({ pretty: true, write: (l) => pretty.push(l), level: "warn" }).info("hidden");
  expect(pretty).toEqual([]);
});
