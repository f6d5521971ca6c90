// Conveyor's HTTP API (createApi) served by Bun.serve in a process of its own,
// as the daemon serves it, for the HTTP enqueue measurement. Started by
// conveyor.ts; prints "@@port <n>" once listening.
import postgres from "postgres";
import { createApi } from "../../src/api/index.ts";
import { silentLogger } from "../../src/index.ts";
import { ENQUEUE_POOL } from "../lib/driver.ts";

const url = process.env.BENCH_DATABASE_URL;
const token = process.env.BENCH_API_TOKEN;
if (!url || !token) throw new Error("BENCH_DATABASE_URL and BENCH_API_TOKEN are required");
const sql = postgres(url, { max: ENQUEUE_POOL, onnotice: () => {} });
const app = createApi({
  sql,
  logger: silentLogger,
  auth: { tokens: [{ token, scopes: ["enqueue"] }] },
  version: "bench",
});
const server = Bun.serve({ hostname: "127.0.0.1", port: 0, fetch: app.fetch });
process.stdout.write(`@@port ${server.port}\n`);
// A measurement killed at its time limit cannot stop us: leave when orphaned.
const parent = process.ppid;
setInterval(() => {
  if (process.ppid !== parent) process.exit(0);
}, 500).unref();
process.on("SIGTERM", async () => {
  await server.stop();
  await sql.end({ timeout: 2 });
  process.exit(0);
});
