export interface BackoffPolicy {
  /** Delay before the second attempt. */
  baseMs: number;
  /** Upper bound on any delay. */
  maxMs: number;
  /** Growth per attempt. */
  factor: number;
  /** Fraction of the delay that is randomised, 0..1 (0.5: "equal jitter"). */
  jitter: number;
}

export const DEFAULT_BACKOFF: BackoffPolicy = {
  baseMs: 1_000,
  maxMs: 3_600_000,
  factor: 2,
  jitter: 0.5,
};

/**
 * Delay before retrying after `attempt` (1-based) failed: base·factor^(attempt-1),
 * capped at maxMs, with the top `jitter` fraction randomised so that jobs that
 * failed together do not retry together.
 */
export function retryDelayMs(
  attempt: number,
  policy: BackoffPolicy = DEFAULT_BACKOFF,
  random: () => number = Math.random,
): number {
  const n = Math.max(1, Math.floor(attempt));
  const exp = policy.baseMs * policy.factor ** Math.min(n - 1, 1000);
  const capped = Math.min(policy.maxMs, Number.isFinite(exp) ? exp : policy.maxMs);
  const fixed = capped * (1 - policy.jitter);
  return Math.round(fixed + random() * capped * policy.jitter);
}
