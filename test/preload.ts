import { afterAll } from "bun:test";
import { stopSharedCluster } from "./harness.ts";

// One cluster per `bun test` run, stopped after the last file.
afterAll(async () => {
  await stopSharedCluster();
});
