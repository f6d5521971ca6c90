import type { z } from "zod";
import { ValidationError } from "./errors.ts";

/** Parses with zod; the first issue becomes a ValidationError naming its path. */
export function parseOrThrow<S extends z.ZodType>(
  schema: S,
  value: unknown,
  root: string,
): z.output<S> {
  const parsed = schema.safeParse(value);
  if (parsed.success) return parsed.data;
  const issue = parsed.error.issues[0];
  let field = root;
  for (const seg of issue?.path ?? []) {
    field += typeof seg === "number" ? `[${seg}]` : field ? `.${String(seg)}` : String(seg);
  }
  throw new ValidationError(field || root, issue?.message ?? "invalid", { cause: parsed.error });
}
