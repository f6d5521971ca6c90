// Process-level settings of the daemon that must be in place before Bun
// starts: its allocator (mimalloc) reads them from the environment once.

/**
 * mimalloc's purge delay, in ms: how long freed memory may stay unused before
 * it is given back to the operating system. The default (10 ms) gives back,
 * and soon faults in again, the memory a busy worker frees between batches.
 * Per thread of a worker's process, 100,000 no-op jobs in batches of 2,000,
 * 3 runs each, 2 cores: mimalloc's scavenger thread 1.5-1.8 µs per job and
 * the whole process 14.3-15.3 µs per job with the default, no scavenger time
 * and 8.1-9.4 µs with -1 (never). In the bench (throughput phase, 2
 * alternating rounds), Conveyor's best setting at 100,000 jobs went from
 * 38,941 / 33,782 to 50,714 / 47,499 jobs/s. The cost: memory freed after
 * a peak stays with the process (the bench's RSS phase measures it).
 */
export const ALLOCATOR_ENV = { MIMALLOC_PURGE_DELAY: "-1" } as const;

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
  process.execve(process.execPath, args, { ...ALLOCATOR_ENV, ...env });
}
