// The process environment the conveyor binary runs with. main.ts re-executes
// itself (same pid, same arguments) with any of these the environment leaves
// unset; a value set by the operator always wins.
//
// MIMALLOC_PURGE_DELAY=-1: Bun's allocator, mimalloc, gives freed pages back
// to the kernel 10 ms after they empty (madvise), and the next allocation
// faults them in again. A worker allocates and frees a little per job all
// the time, so it paid that round trip continuously: on this project's
// 2-core virtual machine page faults and madvise were most of the worker's
// kernel time, a fifth of its CPU (perf). Kept, the pages are reused. Three
// interleaved pairs of 10,000 no-op jobs (c2000-b1000, outside the bench):
// worker CPU 26.3-28.1 -> 21.8-22.6 µs per job, 24.0-25.4k -> 27.2-28.1k
// jobs/s. The cost is that the process keeps its high-water mark of freed
// native memory instead of returning it; the RSS phase of bench/ measures
// the daemon's memory with it.
export const RUNTIME_ENV: Readonly<Record<string, string>> = {
  MIMALLOC_PURGE_DELAY: "-1",
};

/** The variables of RUNTIME_ENV that `env` does not set. */
export function missingRuntimeEnv(env: NodeJS.ProcessEnv = process.env): Record<string, string> {
  return Object.fromEntries(Object.entries(RUNTIME_ENV).filter(([k]) => env[k] === undefined));
}
