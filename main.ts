#!/usr/bin/env bun
// The conveyor binary: `bun main.ts <command>`, or dist/conveyor after `npm run build`.
import { runCli } from "./src/cli.ts";

process.exit(await runCli(process.argv.slice(2)));
