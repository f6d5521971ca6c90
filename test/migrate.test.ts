import { afterAll, beforeAll, expect, test } from "bun:test";
import { readdir } from "node:fs/promises";
import path from "node:path";
import { MIGRATIONS, migrate } from "../src/db/migrate.ts";
import { type TestDb, testDatabase } from "./harness.ts";

let db: TestDb;
beforeAll(async () => {
  db = await testDatabase();
});
afterAll(async () => {
  await db.drop();
});

test("every file in migrations/ is listed, in order", async () => {
  const files = (await readdir(path.join(import.meta.dir, "..", "migrations")))
    .filter((f) => f.endsWith(".sql"))
    .sort();
  expect(MIGRATIONS.map((m) => `${m.name}.sql`)).toEqual(files);
  expect(MIGRATIONS.map((m) => m.version)).toEqual(files.map((_, i) => i + 1));
});

test("concurrent migrators apply each migration exactly once", async () => {
  await db.sql`drop schema public cascade`;
  await db.sql`create schema public`;
  const pools = Array.from({ length: 6 }, () => db.connect({ max: 1 }));
  const applied = await Promise.all(pools.map((p) => migrate(p)));
  // Each migration takes the lock in its own transaction, so two migrators
  // may share the work (one applies 0001, another 0002 and 0003): together
  // they apply each exactly once, and each applies its share in order.
  expect(applied.flat().sort()).toEqual(MIGRATIONS.map((m) => m.name).sort());
  const order = MIGRATIONS.map((m) => m.name);
  for (const own of applied) {
    const at = own.map((name) => order.indexOf(name));
    expect(at).toEqual([...at].sort((a, b) => a - b));
  }
  const rows = await db.sql`select version from conveyor_migrations order by version`;
  expect(rows.map((r) => r.version)).toEqual(MIGRATIONS.map((m) => m.version));
  expect(await migrate(db.sql)).toEqual([]);
  // 0003: job pages keep room for a row's updates.
  const [rel] = await db.sql`select reloptions from pg_class where relname = 'conveyor_jobs'`;
  expect(rel?.reloptions).toEqual(["fillfactor=50"]);
});
