// Plain statistics for the harness; no dependencies, usable from Bun and Node.

export function median(values: number[]): number {
  if (values.length === 0) return Number.NaN;
  const s = [...values].sort((a, b) => a - b);
  const mid = Math.floor(s.length / 2);
  return s.length % 2 === 1
    ? (s[mid] as number)
    : ((s[mid - 1] as number) + (s[mid] as number)) / 2;
}

/** Percentile by linear interpolation between closest ranks (p in 0..100) of sorted values. */
export function percentileSorted(sorted: number[], p: number): number {
  if (sorted.length === 0) return Number.NaN;
  const rank = (p / 100) * (sorted.length - 1);
  const lo = Math.floor(rank);
  const hi = Math.ceil(rank);
  const a = sorted[lo] as number;
  const b = sorted[hi] as number;
  return a + (b - a) * (rank - lo);
}

export function summarize(values: number[]) {
  const s = Float64Array.from(values).sort();
  const arr = Array.from(s);
  const mean = arr.reduce((a, b) => a + b, 0) / Math.max(1, arr.length);
  return {
    p50: percentileSorted(arr, 50),
    p95: percentileSorted(arr, 95),
    p99: percentileSorted(arr, 99),
    max: arr.length ? (arr[arr.length - 1] as number) : Number.NaN,
    mean,
    samples: arr.length,
  };
}

/** Least-squares slope of y over x. */
export function slope(xs: number[], ys: number[]): number {
  const n = Math.min(xs.length, ys.length);
  if (n < 2) return Number.NaN;
  let sx = 0;
  let sy = 0;
  for (let i = 0; i < n; i++) {
    sx += xs[i] as number;
    sy += ys[i] as number;
  }
  const mx = sx / n;
  const my = sy / n;
  let num = 0;
  let den = 0;
  for (let i = 0; i < n; i++) {
    const dx = (xs[i] as number) - mx;
    num += dx * ((ys[i] as number) - my);
    den += dx * dx;
  }
  return den === 0 ? Number.NaN : num / den;
}

export const round = (v: number, digits = 0) => {
  const f = 10 ** digits;
  return Math.round(v * f) / f;
};

/** Every field of `o` rounded to `digits` places. */
export function roundAll<T extends Record<string, number>>(o: T, digits = 3): T {
  const out = { ...o };
  for (const k of Object.keys(out))
    (out as Record<string, number>)[k] = round(o[k] as number, digits);
  return out;
}
