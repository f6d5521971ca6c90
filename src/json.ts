import { ValidationError } from "./errors.ts";

export type JsonValue =
  | null
  | boolean
  | number
  | string
  | JsonValue[]
  | { [key: string]: JsonValue };

/**
 * Throws a ValidationError naming the first path at which `value` is not
 * plain JSON (undefined, functions, symbols, bigints, non-finite numbers,
 * class instances other than Date-free plain objects, cycles).
 */
export const MAX_JSON_DEPTH = 200;

export function assertJson(value: unknown, path: string): asserts value is JsonValue {
  const seen = new Set<object>();
  const visit = (v: unknown, p: string, depth: number): void => {
    if (v === null) return;
    switch (typeof v) {
      case "string":
        // jsonb rejects U+0000; say so here rather than as a Postgres error.
        if (v.includes("\u0000")) throw new ValidationError(p, "strings must not contain U+0000");
        if (!v.isWellFormed())
          throw new ValidationError(p, "strings must be well-formed UTF-16 (no lone surrogates)");
        return;
      case "boolean":
        return;
      case "number":
        if (!Number.isFinite(v)) throw new ValidationError(p, `${v} is not representable in JSON`);
        return;
      case "object": {
        if (seen.has(v)) throw new ValidationError(p, "circular reference");
        if (depth >= MAX_JSON_DEPTH)
          throw new ValidationError(p, `nested deeper than ${MAX_JSON_DEPTH} levels`);
        seen.add(v);
        if (Array.isArray(v)) {
          for (let i = 0; i < v.length; i++) visit(v[i], `${p}[${i}]`, depth + 1);
        } else {
          const proto = Object.getPrototypeOf(v);
          if (proto !== Object.prototype && proto !== null) {
            const name = (v as object).constructor?.name ?? "unknown";
            throw new ValidationError(p, `${name} is not a plain JSON object`);
          }
          for (const [k, child] of Object.entries(v)) {
            if (k.includes("\u0000") || !k.isWellFormed()) {
              throw new ValidationError(p, "keys must be well-formed and must not contain U+0000");
            }
            visit(child, `${p}.${k}`, depth + 1);
          }
        }
        seen.delete(v);
        return;
      }
      default:
        throw new ValidationError(p, `${typeof v} is not representable in JSON`);
    }
  };
  visit(value, path, 0);
}
