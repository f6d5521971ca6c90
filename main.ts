#!/usr/bin/env bun
// The conveyor binary: `bun main.ts <command>`, or dist/conveyor after `npm run build`.
//
// First it makes sure it runs with RUNTIME_ENV (src/runtime-env.ts): if a
// variable is unset it re-executes itself with it, in place (same pid, so a
// supervisor sees one process). Only then does it load the engine.
import { missingRuntimeEnv } from "./src/runtime-env.ts";

const missing = missingRuntimeEnv();
if (Object.keys(missing).length > 0) {
  // A compiled binary's own script lives in Bun's embedded file system; it
  // takes its arguments directly. Under `bun main.ts`, Bun needs its flags
  // and the script again.
  const compiled = import.meta.path.startsWith("/$bunfs/");
  const args = compiled ? process.argv.slice(2) : [...process.execArgv, ...process.argv.slice(1)];
  try {
    process.execve?.(process.execPath, [process.execPath, ...args], { ...process.env, ...missing });
  } catch {
    // Not fatal: the engine runs the same, only with the allocator's default.
  }
}

const { runCli } = await import("./src/cli.ts");
process.exit(await runCli(process.argv.slice(2)));
