import { afterAll, beforeAll } from "bun:test";
import { startSharedServer, stopSharedCluster } from "./harness.ts";

// One cluster per `bun test` run, started before the first file (initdb can
// take several seconds on a loaded machine, longer than a hook's default
// timeout) and stopped after the last.
beforeAll(async () => {
  await startSharedServer();
}, 120_000);

afterAll(async () => {
  await stopSharedCluster();
});
