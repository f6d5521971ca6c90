// `bun bench/stalls-trace.ts STALLS.json PERF.txt START_EPOCH_S`: lines the
// slowest jobs of a `bench/stalls.ts` run up with the server's slow WAL
// flushes, seen by a system-wide trace taken beside it:
//
//   date +%s.%N > start; perf trace -a --duration 3 -e fdatasync,fsync,\
//     pwrite64,write,openat,unlink,fallocate,ftruncate,sync_file_range,\
//     pread64,read > perf.txt &
//   bun bench/stalls.ts --variants bare,handoff --rounds 2 --out stalls.json
//   pkill -INT -f 'perf trace'
//
// perf trace prints milliseconds since its first event, which comes a little
// after `date`: one offset for the whole trace is fitted, the one that puts
// the most bursts on a flush. A burst is slowest-1% jobs issued within 50 ms
// of each other; it is matched when a PostgreSQL fdatasync of 3 ms or more
// overlaps the time from its first job's issue to its slowest job's end.
// As a control for chance, it prints the median count over every offset
// tried: what lining up with no relation to the trace would give.
import { readFileSync } from "node:fs";

const [stallsFile, perfFile, startFile] = process.argv.slice(2);
if (!stallsFile || !perfFile || !startFile) {
  console.error("usage: bun bench/stalls-trace.ts STALLS.json PERF.txt START_EPOCH_S");
  process.exit(2);
}
const startMs = Number(readFileSync(startFile, "utf8").trim()) * 1000;

interface Call {
  at: number;
  ms: number;
  comm: string;
  call: string;
}
const calls: Call[] = [];
const line = /^\s*([\d.]+) \(\s*([\d.]+) ms\): (\S+?)\/\d+\s+(?:\.\.\. \[continued\]: )?(\w+)\(/;
for (const l of readFileSync(perfFile, "utf8").split("\n")) {
  const m = line.exec(l);
  // A call that began before the trace prints a wrapped-around duration.
  if (m && Number(m[2]) < 1e6) {
    calls.push({ at: Number(m[1]), ms: Number(m[2]), comm: m[3] as string, call: m[4] as string });
  }
}
if (calls.length === 0) {
  console.error(
    `${perfFile}: no line of perf trace's output ("<ms> (<ms> ms): <comm>/<pid> <call>(")`,
  );
  process.exit(1);
}
const flushes = calls.filter((c) => c.comm === "postgres" && c.call === "fdatasync");

interface Run {
  round: number;
  variant: string;
  startedAtMs: number;
  slowest: [number, number][];
}
interface Burst {
  run: Run;
  /** ms after `date`, uncorrected. */
  at: number;
  longest: number;
  jobs: number;
}
const bursts: Burst[] = [];
for (const run of (JSON.parse(readFileSync(stallsFile, "utf8")) as { runs: Run[] }).runs) {
  let group: [number, number][] = [];
  const close = () => {
    const first = group[0];
    if (!first) return;
    bursts.push({
      run,
      at: run.startedAtMs + first[1] * 1000 - startMs,
      longest: Math.max(...group.map((g) => g[0])),
      jobs: group.length,
    });
    group = [];
  };
  for (const job of [...run.slowest].sort((a, b) => a[1] - b[1])) {
    const last = group.at(-1);
    if (last && job[1] - last[1] > 0.05) close();
    group.push(job);
  }
  close();
}

const under = (b: Burst, offset: number) =>
  flushes.filter((f) => f.at + f.ms >= b.at + offset - 10 && f.at <= b.at + offset + b.longest);
const tried: { offset: number; matched: number }[] = [];
for (let o = -1000; o <= 1000; o += 2) {
  tried.push({ offset: o, matched: bursts.filter((b) => under(b, o).length > 0).length });
}
// The first of the best, as a scan from -1 s would keep it.
const best = tried.reduce((a, t) => (t.matched > a.matched ? t : a));
const offset = best.offset;
const counts = tried.map((t) => t.matched).sort((a, b) => a - b);
console.log(
  `offset ${offset} ms: ${best.matched} of ${bursts.length} bursts on a flush ` +
    `(median over the offsets tried: ${counts[counts.length >> 1]})`,
);
for (const b of bursts) {
  const f = under(b, offset);
  console.log(
    `round ${b.run.round} ${b.run.variant.padEnd(8)} at ${(b.at / 1000).toFixed(3)} s: ` +
      `${String(b.jobs).padStart(3)} jobs, slowest ${b.longest.toFixed(2)} ms; ` +
      `fdatasync ${f.map((c) => `${c.ms.toFixed(1)}`).join(", ") || "none over 3 ms"}`,
  );
}
const others = calls.filter(
  (c) =>
    c.comm === "postgres" &&
    c.call !== "fdatasync" &&
    bursts.some((b) => Math.abs(c.at - (b.at + offset)) < 50),
);
console.log(
  `other slow calls of the server within 50 ms of a burst: ${others.map((c) => `${c.call} ${c.ms.toFixed(1)} ms`).join(", ") || "none"}`,
);
