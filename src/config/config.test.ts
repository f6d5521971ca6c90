import { describe, expect, test } from "bun:test";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { ConfigError } from "../errors.ts";
import { isLoopback, loadConfig, parseConfigText, parseListen, resolveConfig } from "./load.ts";
import { keyLines, lineOf, parseKey, syntaxErrorLine } from "./locate.ts";
import { DEFAULT_LISTEN, DEFAULT_POOL_SIZE } from "./schema.ts";

const TEXT = `# comment
plugins = "handlers"

[database]
pool_size = 5

[api]
listen = "127.0.0.1:9000"
notes = """
[queues.fake]
concurrency = 1
"""
scopes_like = [
  "a",
  "b",
]

[[api.tokens]]
token = "x"
scopes = ["admin"]

[[api.tokens]]
token = "y" # trailing
scopes = ["enqueue"]

[queues."my.queue"]
concurrency = 3
retry.base = 1

[queues.inline]
email = { concurrency = "ten" }

[[cron]]
name = "a"
[cron.payload]
n = 1
`;

describe("locate", () => {
  test("parseKey handles bare, quoted and dotted keys", () => {
    expect(parseKey("a.b")).toEqual(["a", "b"]);
    expect(parseKey(' queues . "my.queue" ')).toEqual(["queues", "my.queue"]);
    expect(parseKey("'lit'.x")).toEqual(["lit", "x"]);
    expect(parseKey("a b")).toBeUndefined();
  });

  test("every key path maps to its line, skipping multi-line strings and arrays", () => {
    const lines = new Map(keyLines(TEXT).map((e) => [e.path.join("."), e.line]));
    expect(lines.get("plugins")).toBe(2);
    expect(lines.get("database.pool_size")).toBe(5);
    expect(lines.get("api.listen")).toBe(8);
    expect(lines.get("api.notes")).toBe(9);
    expect(lines.has("queues.fake")).toBe(false);
    expect(lines.get("api.scopes_like")).toBe(13);
    expect(lines.get("api.tokens.0.token")).toBe(19);
    expect(lines.get("api.tokens.1.token")).toBe(23);
    expect(lines.get("api.tokens.1.scopes")).toBe(24);
    expect(lines.get("queues.my.queue.concurrency")).toBe(27);
    expect(lines.get("queues.my.queue.retry.base")).toBe(28);
    expect(lines.get("cron.0.name")).toBe(34);
    expect(lines.get("cron.0.payload.n")).toBe(36);
  });

  test("lineOf falls back to the closest enclosing key or header", () => {
    expect(lineOf(TEXT, ["queues", "inline", "email", "concurrency"])).toBe(31);
    expect(lineOf(TEXT, ["api", "tokens", 1, "token_env"])).toBe(22);
    expect(lineOf(TEXT, ["api", "scopes_like", 1])).toBe(13);
    expect(lineOf(TEXT, ["worker"])).toBeUndefined();
  });

  test("syntaxErrorLine finds the first line no prefix gets past", () => {
    const text = "a = 1\nb = [\n  1,\n  2,\n]\nc = \nd = 4\n";
    expect(syntaxErrorLine(text, (s) => Bun.TOML.parse(s))).toBe(6);
  });
});

const env = {};
const load = (text: string, e: Record<string, string | undefined> = env) =>
  resolveConfig(parseConfigText(text, "conveyor.toml"), {
    file: "/srv/conveyor.toml",
    name: "conveyor.toml",
    dir: "/srv",
    text,
    env: e,
  });

function configError(fn: () => unknown): ConfigError {
  try {
    fn();
  } catch (error) {
    if (error instanceof ConfigError) return error;
    throw error;
  }
  throw new Error("expected a ConfigError");
}

describe("config", () => {
  test("defaults apply to an empty file, paths resolve against its folder", () => {
    const c = load("");
    expect(c.database).toEqual({ url: undefined, source: undefined, poolSize: DEFAULT_POOL_SIZE });
    expect(c.embedded.dataDir).toBe("/srv/.conveyor/pgdata");
    expect(c.plugins).toEqual({ dir: "/srv/plugins", explicit: false });
    expect(`${c.api.host}:${c.api.port}`).toBe(DEFAULT_LISTEN);
    expect(c.api.tokens).toEqual([]);
    expect(c.cron).toEqual([]);
  });

  test("an unknown key names its path and line", () => {
    const e = configError(() => load('[api]\nlisten = "127.0.0.1:1"\nlisen = "x"\n'));
    expect(e.path).toBe("api.lisen");
    expect(e.line).toBe(3);
    expect(e.message).toContain("conveyor.toml:3: api.lisen: unknown key");
  });

  test("a wrong type names the path, the value, what was expected and the line", () => {
    const e = configError(() => load('\n[queues.email]\nconcurrency = "ten"\n'));
    expect(e.message).toBe(
      'conveyor.toml:3: queues.email.concurrency: got "ten": expected number, received string',
    );
    const f = configError(() => load("[[cron]]\nname='a'\nschedule='nope'\nkind='k'\n"));
    expect(f.path).toBe("cron.0.schedule");
    expect(f.line).toBe(3);
    expect(f.message).toContain("expected a cron pattern");
  });

  test("hand-off: on by default, off by key, and not a string", () => {
    expect(load("").worker.handOff).toBe(true);
    expect(load("[worker]\nhand_off = false\n").worker.handOff).toBe(false);
    const e = configError(() => load('[worker]\nhand_off = "no"\n'));
    expect(e.path).toBe("worker.hand_off");
    expect(e.line).toBe(2);
  });

  test("durable completions: on by default, off by key, and not a string", () => {
    expect(load("").worker.durableCompletions).toBe(true);
    expect(load("[worker]\ndurable_completions = false\n").worker.durableCompletions).toBe(false);
    const e = configError(() => load('[worker]\n\ndurable_completions = "yes"\n'));
    expect(e.path).toBe("worker.durable_completions");
    expect(e.line).toBe(3);
  });

  test("effect sharing: defaults, and a batch beyond the subtransaction cache is refused", () => {
    expect(load("").worker).toMatchObject({
      effectBatch: 50,
      effectConcurrency: 4,
      effectIsolation: "rerun",
      effectTimeoutMs: 30_000,
    });
    expect(load("[worker]\neffect_batch = 1\n").worker.effectBatch).toBe(1);
    expect(load("[worker]\neffect_timeout_ms = 120000\n").worker.effectTimeoutMs).toBe(120_000);
    const short = configError(() => load("[worker]\neffect_timeout_ms = 5\n"));
    expect(short.path).toBe("worker.effect_timeout_ms");
    expect(short.line).toBe(2);
    const e = configError(() => load("[worker]\ngrace_ms = 5\neffect_batch = 61\n"));
    expect(e.path).toBe("worker.effect_batch");
    expect(e.line).toBe(3);
    expect(load('[worker]\neffect_isolation = "savepoint"\n').worker.effectIsolation).toBe(
      "savepoint",
    );
    const bad = configError(() => load('[worker]\n\neffect_isolation = "none"\n'));
    expect(bad.path).toBe("worker.effect_isolation");
    expect(bad.line).toBe(3);
    expect(bad.message).toContain("savepoint");
  });

  test("a missing key points at its table's header", () => {
    const e = configError(() => load("[[cron]]\nname = 'a'\nkind = 'k'\n\n[[cron]]\nname = 'b'\n"));
    expect(e.path).toBe("cron.0.schedule");
    expect(e.line).toBe(1);
  });

  test("TOML syntax errors carry a line", () => {
    const e = configError(() => load("[api]\nlisten = \n"));
    expect(e.line).toBe(2);
    expect(e.message).toContain("invalid TOML");
  });

  test("duplicate cron names and bad timezones are rejected", () => {
    const dup = "[[cron]]\nname='a'\nschedule='* * * * *'\nkind='k'\n";
    expect(configError(() => load(dup + dup)).message).toContain("conveyor.toml:6: cron.1.name");
    const tz = configError(() => load(`${dup}timezone = "Mars/Olympus"\n`));
    expect(tz.path).toBe("cron.0.timezone");
    expect(tz.line).toBe(5);
  });

  test("environment secrets win over the file", () => {
    const text = `[database]\nurl = "postgres://file/db"\n[api]\nlisten = "0.0.0.0:80"\n[[api.tokens]]\ntoken = "from-the-file-0123456789"\ntoken_env = "TOK"\nscopes = ["admin", "admin"]\n`;
    const c = load(text, { DATABASE_URL: "postgres://env/db", TOK: "from-the-environment-0123" });
    expect(c.database).toMatchObject({ url: "postgres://env/db", source: "DATABASE_URL" });
    expect(c.api.tokens).toEqual([{ token: "from-the-environment-0123", scopes: ["admin"] }]);
    const d = load(text, { CONVEYOR_DATABASE_URL: "postgres://c/db", DATABASE_URL: "x" });
    expect(d.database.source).toBe("CONVEYOR_DATABASE_URL");
    expect(d.api.tokens[0]?.token).toBe("from-the-file-0123456789");
    expect(load(text).database.source).toBe("database.url");
  });

  test("a token_env that is unset, with no token, is an error at its line", () => {
    const e = configError(() =>
      load('[[api.tokens]]\ntoken_env = "NOPE"\nscopes = ["enqueue"]\n', {}),
    );
    expect(e.path).toBe("api.tokens.0.token_env");
    expect(e.line).toBe(2);
  });

  test("without tokens the API must listen on loopback", () => {
    const e = configError(() => load('[api]\nlisten = "0.0.0.0:8080"\n'));
    expect(e.line).toBe(2);
    expect(e.message).toContain("loopback only");
    expect(load('[api]\nlisten = "[::1]:8080"\n').api.host).toBe("::1");
    expect(load('[api]\nlisten = "localhost:8080"\n').api.port).toBe(8080);
  });

  test("listen addresses and loopback names", () => {
    expect(parseListen("127.0.0.1:0")).toEqual({ host: "127.0.0.1", port: 0 });
    expect(parseListen("[::]:80")).toEqual({ host: "::", port: 80 });
    expect(parseListen("8080")).toBeUndefined();
    expect(parseListen("a:99999")).toBeUndefined();
    expect(isLoopback("127.1.2.3")).toBe(true);
    expect(isLoopback("0.0.0.0")).toBe(false);
    expect(isLoopback("LOCALHOST")).toBe(true);
  });

  test("queues map to camelCase settings with named defaults", () => {
    const c = load("[queues.a]\nconcurrency = 2\npaused = true\nbackoff_max_ms = 5000\n");
    expect(c.queues.a).toMatchObject({
      concurrency: 2,
      fetchBatch: undefined,
      paused: true,
      backoff: { baseMs: 1000, maxMs: 5000 },
      maxAttempts: 25,
      priority: 0,
    });
    const e = configError(() => load("[queues.a]\nbackoff_base_ms = 9000\nbackoff_max_ms = 10\n"));
    expect(e.path).toBe("queues.a.backoff_base_ms");
    expect(load("[queues.a]\nfetch_batch = 250\n").queues.a?.fetchBatch).toBe(250);
    const big = configError(() => load("[queues.a]\nconcurrency = 5000\nfetch_batch = 2001\n"));
    expect(big.path).toBe("queues.a.fetch_batch");
    expect(big.message).toContain("conveyor.toml:3:");
  });

  test("loadConfig: an explicit missing file is an error, the default one means defaults", async () => {
    const dir = await mkdtemp(path.join(tmpdir(), "conveyor-config-"));
    const file = path.join(dir, "conveyor.toml");
    expect(() => loadConfig(file, { required: true, env: {} })).toThrow(ConfigError);
    expect(loadConfig(file, { required: false, env: {} }).file).toBeUndefined();
    await writeFile(file, 'plugins = "p"\n');
    expect(loadConfig(file, { required: true, env: {} }).plugins.dir).toBe(path.join(dir, "p"));
    await rm(dir, { recursive: true, force: true });
  });
});
