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
