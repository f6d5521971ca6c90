// Turning a request into validated values, or into a 4xx naming the field.
// Field paths read like the JSON they point into: `jobs[2].payload.a`.
import type { Context } from "hono";
import type { z } from "zod";
import { HttpError, validationError } from "./http-error.ts";

/** Deeper than this is a client bug, and deep enough to overflow recursive code or Postgres's stack. */
export const MAX_JSON_DEPTH = 64;

const PLAIN_KEY = /^[A-Za-z_$][\w$-]*$/;

/** `jobs[2].payload.a`; a key that would read ambiguously is quoted: `payload["a.b"]`. */
export function fieldPath(path: readonly PropertyKey[]): string {
  let out = "";
  for (const p of path) {
    if (typeof p === "number") out += `[${p}]`;
    else if (typeof p === "string" && PLAIN_KEY.test(p)) out += out === "" ? p : `.${p}`;
    else out += `[${JSON.stringify(String(p))}]`;
  }
  return out || "body";
}

/** The first zod issue as a 400 naming its path; an unknown key names the key itself. */
export function issueError(error: z.ZodError, prefix: readonly PropertyKey[] = []): HttpError {
  const issue = error.issues[0];
  if (!issue) return validationError(fieldPath(prefix), "invalid");
  const path = [...prefix, ...issue.path];
  if (issue.code === "unrecognized_keys") {
    const key = issue.keys[0] ?? "";
    return validationError(fieldPath([...path, key]), "unknown field");
  }
  return validationError(fieldPath(path), issue.message);
}

export function parse<S extends z.ZodType>(
  schema: S,
  value: unknown,
  prefix: readonly PropertyKey[] = [],
): z.output<S> {
  const r = schema.safeParse(value);
  if (!r.success) throw issueError(r.error, prefix);
  return r.data;
}

const JSON_TYPE = /^application\/(?:[\w.+-]+\+)?json\s*(?:;|$)/i;

/**
 * Reads the body as JSON and validates it. An empty body counts as `{}` when
 * `emptyAllowed`. A non-empty body must say it is JSON: besides being honest,
 * that makes a browser preflight any cross-origin attempt, which this API
 * never answers, so a web page cannot post jobs to a daemon on loopback.
 */
export async function readJson<S extends z.ZodType>(
  c: Context,
  schema: S,
  opts: { emptyAllowed: boolean },
): Promise<z.output<S>> {
  const text = await c.req.text();
  if (text.trim() === "") {
    if (opts.emptyAllowed) return parse(schema, {});
    throw new HttpError(400, "invalid_json", "request body is empty; expected a JSON object");
  }
  const type = c.req.header("content-type") ?? "";
  if (!JSON_TYPE.test(type)) {
    throw new HttpError(
      415,
      "unsupported_media_type",
      "Content-Type must be application/json",
      "Content-Type",
    );
  }
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (cause) {
    throw new HttpError(400, "invalid_json", `body is not valid JSON: ${(cause as Error).message}`);
  }
  assertStorable(value);
  return parse(schema, value);
}

/**
 * Walks parsed JSON without recursion and rejects what Postgres's jsonb would
 * refuse with an error of its own: U+0000 and unpaired surrogates in strings
 * or keys, and nesting deeper than MAX_JSON_DEPTH.
 */
export function assertStorable(root: unknown): void {
  const stack: { v: unknown; path: PropertyKey[] }[] = [{ v: root, path: [] }];
  const bad = (s: string) => s.includes("\u0000") || !s.isWellFormed();
  while (stack.length > 0) {
    const { v, path } = stack.pop() as { v: unknown; path: PropertyKey[] };
    if (typeof v === "string") {
      if (bad(v))
        throw validationError(fieldPath(path), "must be well-formed Unicode without U+0000");
      continue;
    }
    if (v === null || typeof v !== "object") continue;
    if (path.length >= MAX_JSON_DEPTH) {
      throw validationError(fieldPath(path), `nested deeper than ${MAX_JSON_DEPTH} levels`);
    }
    if (Array.isArray(v)) {
      for (let i = v.length - 1; i >= 0; i--) stack.push({ v: v[i], path: [...path, i] });
      continue;
    }
    for (const [k, child] of Object.entries(v)) {
      if (bad(k))
        throw validationError(fieldPath(path), "keys must be well-formed Unicode without U+0000");
      stack.push({ v: child, path: [...path, k] });
    }
  }
}
