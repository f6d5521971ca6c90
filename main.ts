#!/usr/bin/env bun
// The conveyor binary: `bun main.ts <command>`, or dist/conveyor after `npm run build`.
import { runCli } from "./src/cli.ts";
import { execWithRuntimeSettings } from "./src/runtime.ts";

const argv = process.argv.slice(2);
// The daemon only: short commands would pay a second start for nothing.
if (argv[0] === "start") execWithRuntimeSettings();
process.exit(await runCli(argv));
