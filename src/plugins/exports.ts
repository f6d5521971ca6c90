// Everything a plugin can import from "conveyor". The daemon serves this
// module under that name (conveyor-module.ts); a plugins project outside this
// repository can point its tsconfig `paths` entry for "conveyor" here.
export { z } from "zod";
export { cancel, type Handler, type HandlerOutcome, type JobContext, snooze } from "../handler.ts";
export type { Job } from "../job.ts";
export type { JsonValue } from "../json.ts";
export { definePlugin, type PayloadSchema, type Plugin } from "./plugin.ts";
