export type LogLevel = "debug" | "info" | "warn" | "error";
export type LogFields = Record<string, unknown>;

export interface Logger {
  debug(msg: string, fields?: LogFields): void;
  info(msg: string, fields?: LogFields): void;
  warn(msg: string, fields?: LogFields): void;
  error(msg: string, fields?: LogFields): void;
  child(fields: LogFields): Logger;
}

const ORDER: Record<LogLevel, number> = { debug: 10, info: 20, warn: 30, error: 40 };

function serialise(v: unknown): unknown {
  if (v instanceof Error) {
    const out: Record<string, unknown> = { name: v.name, message: v.message };
    if (v.cause !== undefined) out.cause = serialise(v.cause);
    return out;
  }
  return v;
}

/** JSON lines on stderr, one object per record: {level, time, msg, ...fields}. */
export function jsonLogger(
  opts: { level?: LogLevel; base?: LogFields; write?: (line: string) => void } = {},
): Logger {
  const min = ORDER[opts.level ?? "info"];
  const write = opts.write ?? ((line: string) => process.stderr.write(`${line}\n`));
  const base = opts.base ?? {};
  const log = (level: LogLevel, msg: string, fields?: LogFields) => {
    if (ORDER[level] < min) return;
    const rec: Record<string, unknown> = { level, time: new Date().toISOString(), msg, ...base };
    if (fields) for (const [k, v] of Object.entries(fields)) rec[k] = serialise(v);
    try {
      write(JSON.stringify(rec));
    } catch {
      // A log line must never break the caller.
    }
  };
  return {
    debug: (m, f) => log("debug", m, f),
    info: (m, f) => log("info", m, f),
    warn: (m, f) => log("warn", m, f),
    error: (m, f) => log("error", m, f),
    child: (fields) => jsonLogger({ ...opts, base: { ...base, ...fields } }),
  };
}

export const silentLogger: Logger = {
  debug() {},
  info() {},
  warn() {},
  error() {},
  child: () => silentLogger,
};
