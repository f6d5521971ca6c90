// CPU time of the PostgreSQL cluster a measurement runs against: every
// process of the cluster (backends, WAL writer, checkpointer, ...) read from
// /proc, so that a throughput figure can be split into the worker's CPU per
// job and the server's. On two cores shared by both, jobs/s can be at most
// 2 s of CPU per second ÷ (worker + server CPU per job): a system whose
// statements cost the server more per job is bounded by that, however little
// its worker does.
//
// Live processes are read from /proc/<pid>/schedstat (nanoseconds on the
// CPU); processes that exited since are in the postmaster's cutime and cstime
// (clock ticks, 10 ms), so a backend that ends inside the window is counted,
// coarsely. Needs the cluster on this machine and /proc readable (root, or
// the cluster's own user): otherwise sample() is never offered and the run
// records no server CPU. Shared by Bun and Node children: node: APIs only.
import { readFileSync } from "node:fs";
import type postgres from "postgres";

/** Linux's USER_HZ: the unit of utime / stime / cutime / cstime in /proc/<pid>/stat. */
const TICK_MS = 10;

/** Fields of /proc/<pid>/stat after the command name (which may contain spaces). */
function statFields(pid: number): string[] {
  const s = readFileSync(`/proc/${pid}/stat`, "utf8");
  return s.slice(s.lastIndexOf(")") + 2).split(" ");
}

/** ms on the CPU of one live process, or 0 if it has gone. */
function liveMs(pid: number): number {
  try {
    const ns = Number(readFileSync(`/proc/${pid}/schedstat`, "utf8").split(" ")[0]);
    return ns / 1e6;
  } catch {
    return 0;
  }
}

function childrenOf(pid: number): number[] {
  const text = readFileSync(`/proc/${pid}/task/${pid}/children`, "utf8").trim();
  return text === "" ? [] : text.split(" ").map(Number);
}

export interface ServerCpu {
  /** Cumulative CPU ms of the whole cluster so far; only differences mean anything. */
  sample(): number;
}

/**
 * Finds the postmaster behind `db` (the parent of its backend) and returns a
 * sampler, or undefined when /proc does not show it (another machine, no
 * permission, not Linux).
 */
export async function serverCpu(db: postgres.Sql): Promise<ServerCpu | undefined> {
  try {
    const [row] = await db`select pg_backend_pid() as pid`;
    const backend = Number(row?.pid);
    // Field 4 of stat is the parent pid: index 1 after the name.
    const postmaster = Number(statFields(backend)[1]);
    const sample = () => {
      const f = statFields(postmaster);
      // utime, stime, cutime, cstime: fields 14-17, indexes 11-14 after the name.
      const exited = (Number(f[13]) + Number(f[14])) * TICK_MS;
      let ms = liveMs(postmaster) + exited;
      for (const pid of childrenOf(postmaster)) ms += liveMs(pid);
      return ms;
    };
    // The cluster is on this machine if this reads a live process tree.
    if (!(sample() > 0)) return undefined;
    return { sample };
  } catch {
    return undefined;
  }
}
