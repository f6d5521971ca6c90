// Loads every handler module in the plugins folder. The file's path without
// extension is the job kind (graphile-worker's task directory does the same);
// files that are not modules are logged and skipped; any failure stops the
// load with a PluginLoadError naming the file, carrying the cause.
import { existsSync } from "node:fs";
import { readdir } from "node:fs/promises";
import path from "node:path";
import { pathToFileURL } from "node:url";
import { KIND_RE } from "../enqueue.ts";
import { PluginLoadError } from "../errors.ts";
import { cancel, type Handler, type HandlerSpec } from "../handler.ts";
import type { Logger } from "../logger.ts";
import { registerConveyorModule } from "./conveyor-module.ts";
import { pluginShape, type ValidPlugin } from "./plugin.ts";

const MODULE_RE = /\.(ts|mts|js|mjs)$/;
const SKIP_RE = /(\.d\.m?ts|\.(test|spec)\.m?[jt]s)$/;
const SKIP_DIRS = new Set(["node_modules"]);

export interface LoadedPlugin {
  kind: string;
  /** Path relative to the plugins folder, as given in errors and logs. */
  file: string;
  queue: string | undefined;
  hasSchema: boolean;
  spec: HandlerSpec;
}

async function walk(root: string, rel: string, out: string[], logger: Logger): Promise<void> {
  const entries = await readdir(path.join(root, rel), { withFileTypes: true });
  entries.sort((a, b) => a.name.localeCompare(b.name));
  for (const e of entries) {
    const file = rel ? `${rel}/${e.name}` : e.name;
    if (e.name.startsWith(".")) continue;
    if (e.isDirectory()) {
      if (SKIP_DIRS.has(e.name)) continue;
      await walk(root, file, out, logger);
    } else if (MODULE_RE.test(e.name) && !SKIP_RE.test(e.name)) {
      out.push(file);
    } else {
      logger.info("skipping file in plugins folder: not a handler module", { file });
    }
  }
}

function issueText(issue: { path: ReadonlyArray<PropertyKey>; message: string }): string {
  const at = issue.path.map(String).join(".");
  return at ? `${at}: ${issue.message}` : issue.message;
}

/** The plugin's handler behind its payload schema: a rejected payload cancels the job. */
export function withSchema(p: ValidPlugin): Handler {
  const schema = p.schema;
  const handler = p.handler as Handler;
  if (!schema) return handler;
  return (payload, ctx) => {
    const parsed = schema.safeParse(payload);
    if (!parsed.success) {
      const issues = parsed.error.issues.slice(0, 5).map(issueText).join("; ");
      return cancel(`invalid payload: ${issues}`);
    }
    return handler(parsed.data as typeof payload, ctx);
  };
}

async function loadOne(root: string, file: string): Promise<LoadedPlugin> {
  let mod: Record<string, unknown>;
  try {
    mod = await import(pathToFileURL(path.join(root, file)).href);
  } catch (cause) {
    const msg = cause instanceof Error ? cause.message : String(cause);
    throw new PluginLoadError(file, `failed to import: ${msg}`, { cause });
  }
  if (mod.default === undefined) {
    throw new PluginLoadError(file, "has no default export; expected `export default { handler }`");
  }
  const parsed = pluginShape.safeParse(mod.default);
  if (!parsed.success) {
    // An unknown key usually explains a missing one (`handle` for `handler`): report it first.
    const issues = parsed.error.issues;
    const issue = issues.find((i) => i.code === "unrecognized_keys") ?? issues[0];
    const detail =
      issue?.code === "unrecognized_keys"
        ? `unknown key ${JSON.stringify(issue.keys[0])} in the default export; expected kind, handler, schema, timeoutMs, backoff, queue`
        : `default export ${issue ? issueText(issue) : "is invalid"}`;
    throw new PluginLoadError(file, detail, { cause: parsed.error });
  }
  const p = parsed.data;
  const named = mod.kind;
  if (named !== undefined && typeof named !== "string") {
    throw new PluginLoadError(file, "exports `kind` that is not a string");
  }
  if (named !== undefined && p.kind !== undefined && named !== p.kind) {
    throw new PluginLoadError(file, `exports kind ${named} but its default export says ${p.kind}`);
  }
  const kind = p.kind ?? named ?? file.replace(MODULE_RE, "");
  if (!KIND_RE.test(kind)) {
    throw new PluginLoadError(
      file,
      `kind ${JSON.stringify(kind)} is not valid: 1-256 characters from A-Z a-z 0-9 _ . : / - (rename the file or export kind)`,
    );
  }
  const spec: HandlerSpec = { handler: withSchema(p) };
  if (p.timeoutMs !== undefined) spec.timeoutMs = p.timeoutMs;
  if (p.backoff !== undefined) spec.backoff = p.backoff;
  return { kind, file, queue: p.queue, hasSchema: p.schema !== undefined, spec };
}

/**
 * Imports every plugin under `dir`, in path order. A missing folder is an
 * error when the config names it, and means "no plugins" otherwise.
 */
export async function loadPlugins(
  dir: string,
  opts: { logger: Logger; required: boolean },
): Promise<LoadedPlugin[]> {
  if (!existsSync(dir)) {
    if (opts.required) throw new PluginLoadError(dir, "plugins folder not found");
    opts.logger.warn("no plugins folder; no job kinds will be handled", { dir });
    return [];
  }
  registerConveyorModule();
  const files: string[] = [];
  try {
    await walk(dir, "", files, opts.logger);
  } catch (cause) {
    throw new PluginLoadError(dir, "cannot read the plugins folder", { cause });
  }
  const byKind = new Map<string, LoadedPlugin>();
  for (const file of files) {
    const p = await loadOne(dir, file);
    const other = byKind.get(p.kind);
    if (other) {
      throw new PluginLoadError(
        file,
        `claims kind ${JSON.stringify(p.kind)}, which ${other.file} already handles`,
      );
    }
    byKind.set(p.kind, p);
  }
  return [...byKind.values()];
}
