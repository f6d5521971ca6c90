// The daemon's logger: JSON lines (src/logger.ts) for machines, and the same
// records as aligned text when stderr is a terminal.
import { jsonLogger, type Logger, type LogLevel } from "../logger.ts";

export const LOG_LEVELS = ["debug", "info", "warn", "error"] as const;
export const DEFAULT_LOG_LEVEL: LogLevel = "info";

const COLORS: Record<string, string> = {
  debug: "\x1b[2m",
  info: "\x1b[36m",
  warn: "\x1b[33m",
  error: "\x1b[31m",
};
const RESET = "\x1b[0m";

function value(v: unknown): string {
  if (typeof v === "string") return /[\s="]/.test(v) ? JSON.stringify(v) : v;
  return JSON.stringify(v);
}

/** One JSON log record as `12:00:01.123 INFO  worker  message key=value ...`. */
export function prettyLine(json: string, color: boolean): string {
  let rec: Record<string, unknown>;
  try {
    rec = JSON.parse(json);
  } catch {
    return json;
  }
  const { level, time, msg, component, ...rest } = rec;
  const lvl = String(level ?? "info");
  const clock = typeof time === "string" ? time.slice(11, 23) : "";
  const tag = lvl.toUpperCase().padEnd(5);
  const head = color ? `${COLORS[lvl] ?? ""}${tag}${RESET}` : tag;
  const comp = component ? `${String(component).padEnd(9)} ` : "";
  const fields = Object.entries(rest)
    .map(([k, v]) => `${k}=${value(v)}`)
    .join(" ");
  return `${clock} ${head} ${comp}${String(msg ?? "")}${fields ? `  ${fields}` : ""}`;
}

export function daemonLogger(
  opts: { level?: LogLevel; pretty?: boolean; write?: (line: string) => void } = {},
): Logger {
  const pretty = opts.pretty ?? process.stderr.isTTY === true;
  const out = opts.write ?? ((line: string) => process.stderr.write(`${line}\n`));
  const write = pretty ? (line: string) => out(prettyLine(line, opts.write === undefined)) : out;
  return jsonLogger({ level: opts.level ?? DEFAULT_LOG_LEVEL, write });
}
