// The benchmark's server-CPU sampler (bench/lib/server-cpu.ts) against the
// test server: it finds the cluster behind a connection, and what it reads
// grows with the work that server does, not with the client's.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { serverCpu } from "../bench/lib/server-cpu.ts";
import { type TestDb, testDatabase } from "./harness.ts";

let db: TestDb;
beforeAll(async () => {
  db = await testDatabase();
});
afterAll(() => db.drop());

test("server CPU grows with the server's work, not the client's", async () => {
  const probe = await serverCpu(db.sql);
  expect(probe).toBeDefined();
  const sample = probe?.sample as () => number;

  // Busy on the client only: the server idles.
  const idle0 = sample();
  const until = performance.now() + 200;
  let spin = 0;
  while (performance.now() < until) spin++;
  const idle = sample() - idle0;
  expect(spin).toBeGreaterThan(0);

  // About 200 ms of CPU in one backend.
  const busy0 = sample();
  await db.sql`select count(*) from generate_series(1, 3000000)`;
  const busy = sample() - busy0;

  expect(busy).toBeGreaterThan(50);
  expect(idle).toBeLessThan(busy / 2);
});
