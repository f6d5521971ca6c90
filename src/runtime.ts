// Process-level settings of the daemon that must be in place before Bun
// starts: its allocator (mimalloc) and JavaScriptCore read them from the
// environment once.

/**
 * MIMALLOC_PURGE_DELAY: mimalloc's purge delay, in ms: how long freed memory may stay unused before
 * it is given back to the operating system. The default (10 ms) gives back,
 * and soon faults in again, the memory a busy worker frees between batches.
 * Per thread of a worker's process, 100,000 no-op jobs in batches of 2,000,
 * 2 cores, 8 runs of each, interleaved: mimalloc's scavenger thread 1.5-2.8
 * µs per job and the whole process 11.0-15.4 µs per job with the default,
 * no scavenger time and 6.3-9.4 µs with -1 (never). In the bench
 * (throughput phase, 2 alternating rounds), Conveyor's best setting at
 * 100,000 jobs went from 38,941 / 33,782 to 50,714 / 47,499 jobs/s.
 *
 * Never purging made RSS a high-water mark: through the bench's
 * 1,000,000-job backlog (c4000-b2000, 3 full runs of 3) it peaked at 154-186
 * MB and crept up by 0.56-3.86 MB per 100,000 jobs after its first climb,
 * over the bench's flatness bound (through 3,000,000 jobs it rose 1-10 MB
 * after the millionth). Ten seconds keeps what a busy worker reuses and
 * gives back what a peak left: through the same backlog, 3 runs, RSS peaked
 * at 141, 163 and 134 MB and fell after its peak (-2.31, -5.69 and -1.25 MB
 * per 100,000 jobs) at 45-56k jobs/s. Worker CPU per job against never,
 * c4000-b2000, 6 interleaved runs of each on one morning: 8.5 against 7.7 µs
 * at 100,000 jobs (54,149 against 55,909 jobs/s, medians), 10.9 and 10.9 at
 * 10,000 (56,985 against 55,891). 1,000 ms was flat too but cost more
 * (8.8-9.5 µs per job, and 49,582 against 53,775 jobs/s in one of two
 * comparisons); 250 ms kept most of the default's cost.
 *
 * MIMALLOC_PURGE_HOLES=0: besides that delayed purge, the mimalloc in Bun
 * 1.4 gives back the free holes inside its pages when a thread goes idle
 * (its scavenger thread sweeps the parked thread's heap; `MIMALLOC_VERBOSE=1`
 * lists the purge_holes options). A worker goes idle between replies, so it
 * kept giving back, and faulting in again, memory it reuses every batch,
 * and each give-back also flushes the other core's TLB. One worker through
 * 100,000 no-op jobs in batches of 2,000, against the machine's
 * PostgreSQL 15: 3,100-3,900 madvise(MADV_DONTNEED) calls with it, 600
 * without (strace). On a host whose kernel isolates page tables (a
 * paravirtualized guest with PTI on an AMD EPYC of family 26 model 2) that
 * was a third of the worker's CPU. 3 alternating runs of each, in the
 * measured window: system time 1.4-2.3 µs per job with it, 0.56-0.63
 * without; minor faults 7,700-10,600 against 2,300-3,800. The bench's
 * Conveyor throughput cells on that host (bench/ab.ts, 8 alternating
 * rounds, results/ab-2026-12-06-purge-holes-off.json): worker CPU per job
 * -3.32 µs at 10,000 jobs and -2.28 µs at 100,000 (lower in 8 of 8 rounds
 * each); jobs/s x1.129 and x1.14 (faster in 6 and 5 of 8). The delayed
 * purge above still gives back what a peak left: through the bench's
 * 1,000,000-job backlog (c4000-b2000, 3 runs on the same host,
 * results/benchmarks-2026-12-06-amd5-rss-purge-holes.json) RSS peaked at
 * 132, 115 and 138 MB, slope -1.02, +1.09 and -0.62 MB per 100,000 jobs.
 *
 * BUN_JSC_useWarmUpMarkedBlocks=0: JavaScriptCore's JSCWarmUp thread keeps
 * a supply of fresh GC blocks whose pages it has already faulted in, so that
 * the main thread does not take those faults while the heap grows. In a
 * worker that frees most of what each batch allocated, it is busy all the
 * time: 17-22 ms of the window of a 10,000-job drain and 72-85 ms of a
 * 100,000-job one (bench/README.md, "Where the worker's time goes"), on
 * cores the worker shares with PostgreSQL. Without it, the bench's Conveyor
 * throughput cells (bench/ab.ts, 8 alternating rounds,
 * results/ab-2026-12-05-warmup-off.json): worker CPU per job -2.12 µs at
 * 10,000 jobs (lower in 8 of 8 rounds) and -1.24 µs at 100,000 (7 of 8);
 * jobs/s x1.041 and x1.074 (faster in 5 and 5 of 8).
 *
 * BUN_JSC_useFTLJIT=0: JavaScriptCore's top tier (FTL) compiles the
 * hottest functions once more, on a compiler thread, after the DFG tier
 * has. A worker's hot functions are hot within its first batches, so those
 * compilations land in the first seconds of a drain, on cores the worker
 * shares with PostgreSQL (before ca10248 one of them took 156 ms of a
 * 100,000-job drain: bench/README.md, "Where the worker's time goes").
 * Without the FTL tier (the DFG tier's code stays), the bench's Conveyor
 * throughput cells (bench/ab.ts, 8 alternating rounds on an AMD EPYC,
 * results/ab-2026-12-06-ftl-off.json): worker CPU per job -2.69 µs at
 * 10,000 jobs (lower in 7 of 8 rounds) and -0.72 µs at 100,000 (6 of 8);
 * jobs/s x1.105 and x1.015 (faster in 6 and 5 of 8). Through 1,000,000 jobs, where the FTL's code
 * has the longest to pay back its compiling (2 rounds,
 * results/ab-2026-12-06-ftl-off-1m.json): worker CPU per job -0.17 µs
 * (lower in 2 of 2), jobs/s x1.055 (faster in 2 of 2): no loss there either.
 */
export const RUNTIME_ENV = {
  MIMALLOC_PURGE_DELAY: "10000",
  MIMALLOC_PURGE_HOLES: "0",
  BUN_JSC_useWarmUpMarkedBlocks: "0",
  BUN_JSC_useFTLJIT: "0",
} as const;

/** `env` with RUNTIME_ENV's variables added where it leaves them unset. */
export function withRuntimeEnv(env: NodeJS.ProcessEnv): NodeJS.ProcessEnv {
  return { ...RUNTIME_ENV, ...env };
}

/**
 * Re-executes this process in place (same pid, process.execve) with
 * RUNTIME_ENV added, unless the environment already sets every variable
 * in it (a value of its own, or this call's earlier exec). Called first
 * thing by the daemon's entry, before anything is opened or started.
 * Returns only when it did not re-execute.
 */
export function execWithRuntimeSettings(env: NodeJS.ProcessEnv = process.env): void {
  const missing = Object.keys(RUNTIME_ENV).filter((k) => env[k] === undefined);
  if (missing.length === 0 || typeof process.execve !== "function") return;
  // A compiled binary's argv[1] is its embedded entry, which it adds itself.
  const compiled = Bun.main.startsWith("/$bunfs/");
  const args = compiled
    ? [process.execPath, ...process.argv.slice(2)]
    : [process.execPath, ...process.execArgv, ...process.argv.slice(1)];
  try {
    process.execve(process.execPath, args, withRuntimeEnv(env));
  } catch (error) {
    // Not worth failing to start over: run on with Bun's defaults.
    process.stderr.write(
      `conveyor: could not re-execute with ${missing.join(", ")} set (${String(error)}); continuing without\n`,
    );
  }
}
