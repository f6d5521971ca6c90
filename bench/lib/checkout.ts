// Versions of the engine side by side: `git archive` of a revision in a
// folder of its own with this checkout's node_modules, so that uncommitted
// changes are not measured. bench/ab.ts and bench/stalls-ab.ts run the
// bench's own tools inside such folders.
import { spawnSync } from "node:child_process";
import { mkdirSync, symlinkSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { ROOT } from "./environment.ts";

/** Runs a command to its end; throws with its output if it fails. */
export function run(cmd: string[], cwd: string, env: Record<string, string> = {}): string {
  const r = spawnSync(cmd[0] as string, cmd.slice(1), {
    cwd,
    env: { ...process.env, ...env },
    encoding: "utf8",
    timeout: 900_000,
    maxBuffer: 64 * 1024 * 1024,
  });
  if (r.status !== 0) {
    throw new Error(`${cmd.join(" ")} (in ${cwd}) exited ${r.status}: ${r.stderr}${r.stdout}`);
  }
  return r.stdout;
}

/** The full sha of a revision of this repository. */
const revision = (rev: string) =>
  run(["git", "rev-parse", "--verify", `${rev}^{commit}`], ROOT).trim();

/** Revision `sha` in `dir`, with our node_modules; `patch` applied if given. */
function checkout(dir: string, sha: string, patch?: string) {
  mkdirSync(dir, { recursive: true });
  const tar = spawnSync("git", ["archive", sha], { cwd: ROOT, maxBuffer: 1024 ** 3 });
  if (tar.status !== 0) throw new Error(`git archive ${sha}: ${tar.stderr}`);
  const x = spawnSync("tar", ["-x", "-C", dir], { input: tar.stdout });
  if (x.status !== 0) throw new Error(`tar: ${x.stderr}`);
  symlinkSync(path.join(ROOT, "node_modules"), path.join(dir, "node_modules"));
  // git apply works outside a repository; it refuses a patch that no longer fits.
  if (patch) run(["git", "apply", patch], dir);
}

export const SIDES = ["base", "head"] as const;
export type Side = (typeof SIDES)[number];

/**
 * Checks out `base` and `head` (patch applied to head's copy), then calls
 * `step` for each of `rounds` rounds once per side, the order swapped every
 * round, with that side's folder and a file path there for the step's
 * output; removes both copies at the end. Returns the two full shas.
 */
export async function alternate(
  revs: Record<Side, string>,
  patch: string | undefined,
  rounds: number,
  step: (round: number, side: Side, dir: string, outFile: string, first: Side) => void,
): Promise<Record<Side, string>> {
  const shas = { base: revision(revs.base), head: revision(revs.head) };
  const work = await mkdtemp(path.join(tmpdir(), "conveyor-bench-alternate-"));
  try {
    checkout(path.join(work, "base"), shas.base);
    checkout(path.join(work, "head"), shas.head, patch);
    for (let r = 1; r <= rounds; r++) {
      const order = r % 2 === 1 ? SIDES : [...SIDES].reverse();
      for (const side of order) {
        step(
          r,
          side,
          path.join(work, side),
          path.join(work, `r${r}-${side}.json`),
          order[0] as Side,
        );
      }
    }
  } finally {
    await rm(work, { recursive: true, force: true });
  }
  return shas;
}

/** Where a comparison writes its results: `--out`, else results/<kind>-<date>-<label>.json. */
export function comparisonOut(
  kind: string,
  shas: Record<Side, string>,
  label: string | undefined,
  out: string | undefined,
): string {
  const date = new Date().toISOString().slice(0, 10);
  const name = label ?? `${shas.base.slice(0, 7)}-${shas.head.slice(0, 7)}`;
  return out ?? path.join(ROOT, "results", `${kind}-${date}-${name}.json`);
}
