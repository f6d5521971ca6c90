import type { Context } from "hono";
import type { ContentfulStatusCode } from "hono/utils/http-status";
import { ConveyorError } from "../errors.ts";

/**
 * An error the API answers with as-is: `{ error: { code, message, field? } }`
 * and its status. Anything else that reaches the error handler is logged and
 * answered with a bare 500, so no internal detail leaks to the client.
 */
export class HttpError extends ConveyorError {
  override readonly name = "HttpError";
  constructor(
    readonly status: ContentfulStatusCode,
    readonly code: string,
    message: string,
    readonly field?: string,
    readonly headers?: Record<string, string>,
  ) {
    super(message);
  }
}

export const validationError = (field: string, message: string) =>
  new HttpError(400, "validation_error", `${field}: ${message}`, field);

export function errorResponse(c: Context, e: HttpError): Response {
  const body: { code: string; message: string; field?: string } = {
    code: e.code,
    message: e.message,
  };
  if (e.field !== undefined) body.field = e.field;
  for (const [k, v] of Object.entries(e.headers ?? {})) c.header(k, v);
  return c.json({ error: body }, e.status);
}
