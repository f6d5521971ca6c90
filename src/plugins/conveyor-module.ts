// Serves src/plugins/exports.ts as the module "conveyor" through a Bun
// runtime plugin, so plugin folders need no node_modules, and the compiled
// binary, which has no files to resolve "conveyor" against, serves it too.
// src/types/conveyor.d.ts gives the name its types inside this repository.
import { plugin } from "bun";
import * as exports from "./exports.ts";

let registered = false;

/** Makes `import ... from "conveyor"` resolve in modules imported from now on. Idempotent. */
export function registerConveyorModule(): void {
  if (registered) return;
  registered = true;
  plugin({
    name: "conveyor-module",
    setup(build) {
      build.module("conveyor", () => ({ exports: { ...exports }, loader: "object" }));
    },
  });
}
