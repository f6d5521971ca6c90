// Line numbers for conveyor.toml errors. Bun's TOML parser reports neither
// the position of a syntax error nor where a value came from, so we scan the
// text ourselves: enough of TOML to know which key path each line defines
// (table headers, arrays of tables, dotted keys, quoted keys), skipping the
// insides of multi-line strings and arrays. The scan never decides validity;
// Bun.TOML.parse does.

export type KeyPath = readonly (string | number)[];

interface Entry {
  path: (string | number)[];
  line: number;
}

/** Splits `a."b.c".'d'` into ["a", "b.c", "d"]; undefined when it is not a key. */
export function parseKey(raw: string): string[] | undefined {
  const out: string[] = [];
  let i = 0;
  const s = raw.trim();
  if (s === "") return undefined;
  while (i < s.length) {
    while (s[i] === " " || s[i] === "\t") i++;
    const c = s[i];
    if (c === '"' || c === "'") {
      let j = i + 1;
      let key = "";
      while (j < s.length && s[j] !== c) {
        if (c === '"' && s[j] === "\\" && j + 1 < s.length) {
          key += s[j + 1];
          j += 2;
          continue;
        }
        key += s[j];
        j++;
      }
      if (j >= s.length) return undefined;
      out.push(key);
      i = j + 1;
    } else {
      const m = /^[A-Za-z0-9_-]+/.exec(s.slice(i));
      if (!m) return undefined;
      out.push(m[0]);
      i += m[0].length;
    }
    while (s[i] === " " || s[i] === "\t") i++;
    if (i >= s.length) break;
    if (s[i] !== ".") return undefined;
    i++;
  }
  return out;
}

/** Index of the first `=` outside quotes, or -1. */
function assignmentAt(line: string): number {
  let quote: string | undefined;
  for (let i = 0; i < line.length; i++) {
    const c = line[i];
    if (quote) {
      if (c === "\\" && quote === '"') i++;
      else if (c === quote) quote = undefined;
    } else if (c === '"' || c === "'") quote = c;
    else if (c === "=") return i;
    else if (c === "#") return -1;
  }
  return -1;
}

interface ValueState {
  /** Open `[` / `{` in the value being read. */
  depth: number;
  /** Inside a `"""` or `'''` string that continues on later lines. */
  multiline: '"""' | "'''" | undefined;
}

/** Advances the value scanner over `text` (one line, or the rest of one). */
function scanValue(text: string, st: ValueState): void {
  let i = 0;
  while (i < text.length) {
    if (st.multiline) {
      const end = text.indexOf(st.multiline, i);
      if (end < 0) return;
      i = end + 3;
      st.multiline = undefined;
      continue;
    }
    const c = text[i];
    if (c === "#") return;
    if (text.startsWith('"""', i) || text.startsWith("'''", i)) {
      st.multiline = text.slice(i, i + 3) as '"""' | "'''";
      i += 3;
      continue;
    }
    if (c === '"' || c === "'") {
      let j = i + 1;
      while (j < text.length && text[j] !== c) j += c === '"' && text[j] === "\\" ? 2 : 1;
      i = j + 1;
      continue;
    }
    if (c === "[" || c === "{") st.depth++;
    else if (c === "]" || c === "}") st.depth = Math.max(0, st.depth - 1);
    i++;
  }
}

/** Every key path the text defines, with the 1-based line that defines it. */
export function keyLines(text: string): Entry[] {
  const entries: Entry[] = [];
  const arrayCounts = new Map<string, number>();
  const resolve = (keys: string[]): (string | number)[] => {
    const out: (string | number)[] = [];
    for (const k of keys) {
      out.push(k);
      const n = arrayCounts.get(JSON.stringify(out));
      if (n !== undefined) out.push(n);
    }
    return out;
  };
  let table: (string | number)[] = [];
  const st: ValueState = { depth: 0, multiline: undefined };
  const lines = text.split(/\r?\n/);
  for (let n = 0; n < lines.length; n++) {
    const line = lines[n] ?? "";
    if (st.multiline || st.depth > 0) {
      scanValue(line, st);
      continue;
    }
    const t = line.trim();
    if (t === "" || t.startsWith("#")) continue;
    const header = /^\[\[\s*(.+?)\s*\]\]\s*(#.*)?$/.exec(t) ?? /^\[\s*(.+?)\s*\](\s*#.*)?$/.exec(t);
    if (header && !/^\[\s*\]/.test(t)) {
      const keys = parseKey(header[1] ?? "");
      if (!keys) continue;
      if (t.startsWith("[[")) {
        const parent = resolve(keys.slice(0, -1));
        const arrayPath = [...parent, keys[keys.length - 1] as string];
        const id = JSON.stringify(arrayPath);
        const index = (arrayCounts.get(id) ?? -1) + 1;
        arrayCounts.set(id, index);
        table = [...arrayPath, index];
      } else {
        table = resolve(keys);
      }
      entries.push({ path: table, line: n + 1 });
      continue;
    }
    const eq = assignmentAt(line);
    if (eq < 0) continue;
    const keys = parseKey(line.slice(0, eq));
    if (keys) entries.push({ path: [...table, ...keys], line: n + 1 });
    scanValue(line.slice(eq + 1), st);
  }
  return entries;
}

/**
 * The line that defines `path`, or the closest enclosing key or table that the
 * file spells out (an unknown key inside an inline table points at that table's
 * line; a missing key points at its table's header). Undefined when nothing in
 * the file encloses it, e.g. a key missing from the top level.
 */
export function lineOf(text: string, path: KeyPath): number | undefined {
  let best: Entry | undefined;
  for (const e of keyLines(text)) {
    if (e.path.length > path.length) continue;
    if (!e.path.every((k, i) => String(k) === String(path[i]))) continue;
    if (!best || e.path.length > best.path.length) best = e;
  }
  return best?.line;
}

/**
 * The line of a syntax error: Bun's parser does not say, so find the longest
 * prefix of whole lines that parses; the error is on the line after it. A
 * construct left open by a prefix (a multi-line array) fails too, but the
 * longest good prefix ends after it closes, so the answer stays right.
 */
export function syntaxErrorLine(text: string, parse: (s: string) => unknown): number {
  const lines = text.split(/\r?\n/);
  let good = 0;
  for (let k = 1; k <= lines.length; k++) {
    try {
      parse(lines.slice(0, k).join("\n"));
      good = k;
    } catch {
      // keep looking: a later prefix may close what this one left open
    }
  }
  return Math.min(good + 1, lines.length);
}
