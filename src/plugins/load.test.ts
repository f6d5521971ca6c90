import { afterAll, describe, expect, test } from "bun:test";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { PluginLoadError } from "../errors.ts";
import type { JobContext } from "../handler.ts";
import { outcomeKind, outcomeOf } from "../handler.ts";
import { type LogFields, silentLogger } from "../logger.ts";
import { loadPlugins } from "./load.ts";

const folders: string[] = [];
afterAll(async () => {
  await Promise.all(folders.map((dir) => rm(dir, { recursive: true, force: true })));
});

async function folder(files: Record<string, string>): Promise<string> {
  const dir = await mkdtemp(path.join(tmpdir(), "conveyor-plugins-"));
  folders.push(dir);
  for (const [name, text] of Object.entries(files)) {
    await mkdir(path.dirname(path.join(dir, name)), { recursive: true });
    await writeFile(path.join(dir, name), text);
  }
  return dir;
}

const HANDLER = "export default { handler: (p) => ({ echoed: p }) };\n";

async function loadError(files: Record<string, string>): Promise<PluginLoadError> {
  const dir = await folder(files);
  try {
    await loadPlugins(dir, { logger: silentLogger, required: true });
  } catch (error) {
    if (error instanceof PluginLoadError) return error;
    throw error;
  }
  throw new Error("expected a PluginLoadError");
}

describe("loadPlugins", () => {
  test("kinds come from paths; other files are logged and skipped", async () => {
    const dir = await folder({
      "a.ts": HANDLER,
      "email/send.ts": HANDLER,
      "renamed.js": 'export const kind = "custom/kind";\nexport default { handler() {} };\n',
      "README.md": "# notes",
      "types.d.ts": "export type X = 1;",
      "a.test.ts": "throw new Error('never imported');",
      "node_modules/dep/index.ts": "throw new Error('never imported');",
      ".hidden/x.ts": "throw new Error('never imported');",
    });
    const skipped: unknown[] = [];
    const logger = {
      ...silentLogger,
      info: (_: string, f?: LogFields) => void skipped.push(f?.file),
      child: () => logger,
    };
    const plugins = await loadPlugins(dir, { logger, required: true });
    expect(plugins.map((p) => [p.kind, p.file])).toEqual([
      ["a", "a.ts"],
      ["email/send", "email/send.ts"],
      ["custom/kind", "renamed.js"],
    ]);
    expect(skipped.sort()).toEqual(["README.md", "a.test.ts", "types.d.ts"]);
  });

  test("a syntax error names the file and carries the cause", async () => {
    const e = await loadError({
      "ok.ts": HANDLER,
      "sub/broken.ts": "export default { handler( };",
    });
    expect(e.file).toBe("sub/broken.ts");
    expect(e.message).toStartWith("plugin sub/broken.ts: failed to import");
    expect(e.cause).toBeDefined();
  });

  test("a wrong default export names the file and the problem", async () => {
    const noDefault = await loadError({ "x.ts": "export const handler = () => 1;" });
    expect(noDefault.message).toContain("x.ts: has no default export");
    const typo = await loadError({ "y.ts": "export default { handle() {} };" });
    expect(typo.message).toContain('plugin y.ts: unknown key "handle"');
    const notFn = await loadError({ "z.ts": 'export default { handler: "nope" };' });
    expect(notFn.message).toContain("plugin z.ts: default export handler: expected a function");
    const badOpt = await loadError({ "w.ts": "export default { handler() {}, timeoutMs: -1 };" });
    expect(badOpt.message).toContain("w.ts: default export timeoutMs");
  });

  test("two files claiming one kind are rejected, naming both", async () => {
    const e = await loadError({
      "a.ts": 'export default { kind: "same", handler() {} };',
      "b.ts": 'export default { kind: "same", handler() {} };',
    });
    expect(e.message).toBe('plugin b.ts: claims kind "same", which a.ts already handles');
  });

  test("a file name that is not a valid kind is rejected", async () => {
    const e = await loadError({ "has space.ts": HANDLER });
    expect(e.file).toBe("has space.ts");
  });

  test("a missing folder is an error only when the config names it", async () => {
    const dir = path.join(tmpdir(), "conveyor-no-such-folder");
    expect(await loadPlugins(dir, { logger: silentLogger, required: false })).toEqual([]);
    await expect(loadPlugins(dir, { logger: silentLogger, required: true })).rejects.toThrow(
      PluginLoadError,
    );
  });

  test("plugins import the daemon's own 'conveyor' module; a schema gates the handler", async () => {
    const dir = await folder({
      "typed.ts": `import { definePlugin, z } from "conveyor";
        export default definePlugin({
          schema: z.object({ n: z.number() }),
          handler: (p) => ({ doubled: p.n * 2 }),
        });`,
    });
    const [p] = await loadPlugins(dir, { logger: silentLogger, required: true });
    expect(p?.hasSchema).toBe(true);
    const ctx = {} as JobContext;
    expect(await p?.spec.handler({ n: 2 }, ctx)).toEqual({ doubled: 4 });
    const rejected = outcomeOf(await p?.spec.handler({ n: "two" }, ctx));
    expect(rejected && outcomeKind(rejected)).toBe("cancel");
    expect((rejected as unknown as { reason: string }).reason).toContain("invalid payload: n:");
  });
});
