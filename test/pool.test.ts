// The postgres.js pool as scripts/patch-postgres.mjs leaves it: a statement
// goes to the connection that became idle most recently, so light traffic
// keeps to one warm backend instead of rotating through the pool.
import { afterAll, beforeAll, expect, test } from "bun:test";
import type { Pool } from "../src/db/db.ts";
import { type TestDb, testDatabase } from "./harness.ts";

let db: TestDb;
beforeAll(async () => {
  db = await testDatabase();
});
afterAll(async () => {
  await db.drop();
});

/** n statements at once, each held 50 ms, open n connections; returns their backends' pids. */
async function openConnections(pool: Pool, n: number): Promise<Set<number>> {
  const opened = await Promise.all(
    Array.from({ length: n }, () => pool`select pg_backend_pid() as pid, pg_sleep(0.05)`),
  );
  return new Set(opened.map((r) => Number(r[0]?.pid)));
}

test("sequential statements run on the most recently idle connection, not in rotation", async () => {
  const pool = db.connect({ max: 4 });
  try {
    expect((await openConnections(pool, 4)).size).toBe(4);
    const pids: number[] = [];
    for (let i = 0; i < 12; i++) {
      const [r] = await pool`select pg_backend_pid() as pid`;
      pids.push(Number(r?.pid));
    }
    // One backend serves them all; in rotation they would spread over four.
    expect(new Set(pids).size).toBe(1);
    // Two at a time use two connections, the same two each time.
    const pairs = new Set<number>();
    for (let i = 0; i < 6; i++) {
      const rs = await Promise.all([
        pool`select pg_backend_pid() as pid`,
        pool`select pg_backend_pid() as pid`,
      ]);
      for (const [r] of rs) pairs.add(Number(r?.pid));
    }
    expect(pairs.size).toBe(2);
  } finally {
    await pool.end({ timeout: 5 });
  }
});

// The pool keeps its spare connections idle for long now, so a server or a
// firewall that closes idle sessions closes them: the pool must notice and
// open new ones, never hand a statement to a closed connection.
test("connections the server closed while idle are replaced, not used", async () => {
  // idle_session_timeout (PostgreSQL 14+) ends a session idle that long.
  const pool = db.connect({ max: 4, connection: { idle_session_timeout: 300 } });
  try {
    const first = await openConnections(pool, 4);
    expect(first.size).toBe(4);
    await Bun.sleep(800);
    // Every one of the four sessions is gone on the server.
    const [gone] = await db.sql`
      select count(*)::int as n from pg_stat_activity where pid = any(${[...first]}::int[])`;
    expect(gone?.n).toBe(0);
    const pids = new Set<number>();
    for (let i = 0; i < 6; i++) {
      const [r] = await pool`select pg_backend_pid() as pid`;
      pids.add(Number(r?.pid));
    }
    const rs = await Promise.all(
      Array.from({ length: 4 }, () => pool`select pg_backend_pid() as pid, pg_sleep(0.02)`),
    );
    for (const [r] of rs) pids.add(Number(r?.pid));
    for (const pid of pids) expect(first.has(pid)).toBe(false);
    expect(pids.size).toBe(4);
  } finally {
    await pool.end({ timeout: 5 });
  }
});
