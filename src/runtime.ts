// Process-level settings of the daemon that must be in place before Bun
// starts: its allocator (mimalloc) reads them from the environment once.

/**
 * mimalloc's purge delay, in ms: how long freed memory may stay unused before
 * it is given back to the operating system. The default (10 ms) gives back,
 * and soon faults in again, the memory a busy worker frees between batches.
 * Per thread of a worker's process, 100,000 no-op jobs in batches of 2,000,
 * 2 cores, 8 runs of each, interleaved: mimalloc's scavenger thread 1.5-2.8
 * µs per job and the whole process 11.0-15.4 µs per job with the default,
 * no scavenger time and 6.3-9.4 µs with -1 (never). In the bench
 * (throughput phase, 2 alternating rounds), Conveyor's best setting at
 * 100,000 jobs went from 38,941 / 33,782 to 50,714 / 47,499 jobs/s; in the
 * full run of 443bc92, 86% of the bare SQL ceiling at 100,000 jobs against
 * 60% in the run before. Delays of 250 and 1,000 ms kept most of the cost
 * (13.5-14.7 and 11.2-14.7 µs per job), and so did reset instead of
 * decommit (MIMALLOC_PURGE_DECOMMITS=0: 13.3-15.8).
 *
 * The cost: memory freed after a peak stays with the process. Through the
 * bench's 1,000,000-job backlog (c4000-b2000, 2 full runs of 3) RSS peaked
 * at 164-186 MB and grew 0.56-2.38 MB per 100,000 jobs after its first
 * climb (145 MB, no growth, with the default); an earlier attempt (57ae606)
 * was reverted for 155-164 MB and 1.6-2.5 MB per 100,000 at c2000-b1000.
 * That growth slows: through 3,000,000 jobs (3 runs) RSS peaked at 157, 189
 * and 191 MB, rising 9, 10 and 1 MB after the millionth job; with the
 * default it moved between 90 and 149 MB.
 */
export const ALLOCATOR_ENV = { MIMALLOC_PURGE_DELAY: "-1" } as const;

/** `env` with ALLOCATOR_ENV's variables added where it leaves them unset. */
export function withAllocatorEnv(env: NodeJS.ProcessEnv): NodeJS.ProcessEnv {
  return { ...ALLOCATOR_ENV, ...env };
}

/**
 * Re-executes this process in place (same pid, process.execve) with
 * ALLOCATOR_ENV added, unless the environment already sets every variable
 * in it (a value of its own, or this call's earlier exec). Called first
 * thing by the daemon's entry, before anything is opened or started.
 * Returns only when it did not re-execute.
 */
export function execWithAllocatorSettings(env: NodeJS.ProcessEnv = process.env): void {
  const missing = Object.keys(ALLOCATOR_ENV).filter((k) => env[k] === undefined);
  if (missing.length === 0 || typeof process.execve !== "function") return;
  // A compiled binary's argv[1] is its embedded entry, which it adds itself.
  const compiled = Bun.main.startsWith("/$bunfs/");
  const args = compiled
    ? [process.execPath, ...process.argv.slice(2)]
    : [process.execPath, ...process.execArgv, ...process.argv.slice(1)];
  try {
    process.execve(process.execPath, args, withAllocatorEnv(env));
  } catch (error) {
    // Not worth failing to start over: run on with the allocator's defaults.
    process.stderr.write(
      `conveyor: could not re-execute with ${missing.join(", ")} set (${String(error)}); continuing without\n`,
    );
  }
}
