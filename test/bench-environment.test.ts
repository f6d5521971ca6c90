// What a results file records of the machine and of the Bun children's
// environment (bench/lib/environment.ts), and what the rendered tables say
// of it (bench/render.ts).
import { describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { cpuId, extraJscOptions } from "../bench/lib/environment.ts";
import { renderMarkdown, resultsFiles } from "../bench/render.ts";
import { RUNTIME_ENV } from "../src/runtime.ts";

describe("cpuId", () => {
  test("reads family, model and stepping, not the model name", () => {
    const cpuinfo = [
      "processor\t: 0",
      "vendor_id\t: AuthenticAMD",
      "cpu family\t: 25",
      "model\t\t: 17",
      "model name\t: AMD EPYC",
      "stepping\t: 1",
      "",
      "processor\t: 1",
      "cpu family\t: 25",
      "model\t\t: 17",
    ].join("\n");
    expect(cpuId(cpuinfo)).toBe("family 25 model 17 stepping 1");
  });

  test("says nothing where /proc/cpuinfo has no family or model", () => {
    expect(cpuId("processor\t: 0\nmodel name\t: some CPU\n")).toBeUndefined();
    expect(cpuId("")).toBeUndefined();
  });
});

describe("extraJscOptions", () => {
  test("leaves out the options the daemon sets itself, keeps others and changed values", () => {
    const env = {
      ...RUNTIME_ENV,
      PATH: "/usr/bin",
      BUN_JSC_useJIT: "0",
      BUN_JSC_useFTLJIT: "1",
      BUN_JSC_unset: undefined,
    };
    expect(extraJscOptions(env, RUNTIME_ENV)).toEqual({
      BUN_JSC_useJIT: "0",
      BUN_JSC_useFTLJIT: "1",
    });
    expect(extraJscOptions({ ...RUNTIME_ENV }, RUNTIME_ENV)).toEqual({});
  });
});

describe("renderMarkdown", () => {
  test("does not call the daemon's own options extra in files that listed them", () => {
    // Files of runs with BUN_JSC_useWarmUpMarkedBlocks=0 set only by the daemon's
    // environment listed it under jscOptions too.
    const plain = resultsFiles().find((f) => f.endsWith("benchmarks-2026-12-06-amd4-full.json"));
    expect(plain).toBeDefined();
    const doc = JSON.parse(readFileSync(plain as string, "utf8"));
    expect(Object.keys(doc.jscOptions).length).toBeGreaterThan(0);
    const md = renderMarkdown(doc);
    expect(md).toContain("the environment the daemon gives itself");
    expect(md).not.toContain("options the daemon does not set");
    // An option the daemon does not set is still named.
    const withExtra = { ...doc, jscOptions: { ...doc.jscOptions, BUN_JSC_useJIT: "0" } };
    expect(renderMarkdown(withExtra)).toContain(
      "options the daemon does not set: BUN_JSC_useJIT=0.",
    );
  });
});
