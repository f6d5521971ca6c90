/** W3C trace context: https://www.w3.org/TR/trace-context/ */
export const TRACEPARENT_RE = /^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$/;

function hex(bytes: number): string {
  const buf = new Uint8Array(bytes);
  crypto.getRandomValues(buf);
  return Buffer.from(buf).toString("hex");
}

/** A fresh sampled root traceparent, for jobs enqueued outside any trace. */
export function newTraceparent(): string {
  return `00-${hex(16)}-${hex(8)}-01`;
}
