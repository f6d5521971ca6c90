// Types of the "conveyor" module that the daemon serves to plugins: the
// exports of src/plugins/exports.ts. (An ambient module cannot re-export a
// relative path, hence one line per name.)
declare module "conveyor" {
  type Exports = typeof import("../plugins/exports.ts");

  export { z } from "zod";
  export const cancel: Exports["cancel"];
  export const snooze: Exports["snooze"];
  export const definePlugin: Exports["definePlugin"];
  export type Plugin<P = JsonValue> = import("../plugins/exports.ts").Plugin<P>;
  export type PayloadSchema<P> = import("../plugins/exports.ts").PayloadSchema<P>;
  export type Handler<P = JsonValue> = import("../plugins/exports.ts").Handler<P>;
  export type HandlerOutcome = import("../plugins/exports.ts").HandlerOutcome;
  export type JobContext = import("../plugins/exports.ts").JobContext;
  export type Job = import("../plugins/exports.ts").Job;
  export type JsonValue = import("../plugins/exports.ts").JsonValue;
}
