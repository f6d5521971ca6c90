// Command-line numbers of the bench's tools, checked: a typo must stop the
// tool with the flag named, not run zero rounds and write an empty file.

/** `value` of `--flag` as a whole number of at least 1. */
export function positiveInt(flag: string, value: string): number {
  const v = Number(value);
  if (!Number.isInteger(v) || v < 1) {
    throw new Error(`--${flag} ${value}: expected a whole number of at least 1`);
  }
  return v;
}

/** `value` of `--flag` as a comma-separated list of such numbers. */
export function positiveInts(flag: string, value: string): number[] {
  return value.split(",").map((part) => positiveInt(flag, part.trim()));
}

/** `value` of `--flag` as a comma-separated list, each item one of `allowed`. */
export function choices<T extends string>(flag: string, value: string, allowed: readonly T[]): T[] {
  return value.split(",").map((part) => {
    const v = part.trim();
    if (!(allowed as readonly string[]).includes(v)) {
      throw new Error(`--${flag} ${value}: ${v} is not one of ${allowed.join(", ")}`);
    }
    return v as T;
  });
}
