import m0001 from "../../migrations/0001_init.sql" with { type: "text" };
import m0002 from "../../migrations/0002_notify_from_insert.sql" with { type: "text" };
import m0003 from "../../migrations/0003_fillfactor.sql" with { type: "text" };
import { MigrationError } from "../errors.ts";
import type { Pool } from "./db.ts";

export interface Migration {
  version: number;
  name: string;
  sql: string;
}

/**
 * Forward-only migrations, in order. They are imported as text so the compiled
 * binary carries them; a new file in migrations/ needs a line here (the
 * migrate test fails if the two disagree).
 */
export const MIGRATIONS: readonly Migration[] = [
  { version: 1, name: "0001_init", sql: m0001 },
  { version: 2, name: "0002_notify_from_insert", sql: m0002 },
  { version: 3, name: "0003_fillfactor", sql: m0003 },
];

// Any constant works; this one is "conveyor" in ASCII, so it is recognisable in pg_locks.
const MIGRATION_LOCK = 0x636f6e766579;

/**
 * Applies pending migrations, each in its own transaction under a
 * transaction-level advisory lock, so several daemons starting at once apply
 * each migration exactly once: the second waits, then sees it recorded.
 * Returns the names applied by this call.
 */
export async function migrate(pool: Pool, migrations = MIGRATIONS): Promise<string[]> {
  const applied: string[] = [];
  for (const m of migrations) {
    const ran = await pool.begin(async (tx) => {
      await tx`select pg_advisory_xact_lock(${MIGRATION_LOCK})`;
      await tx`create table if not exists conveyor_migrations (
        version integer primary key,
        name text not null,
        applied_at timestamptz not null default now())`;
      const [done] = await tx`select 1 from conveyor_migrations where version = ${m.version}`;
      if (done) return false;
      try {
        await tx.unsafe(m.sql);
      } catch (cause) {
        throw new MigrationError(m.name, { cause });
      }
      await tx`insert into conveyor_migrations (version, name) values (${m.version}, ${m.name})`;
      return true;
    });
    if (ran) applied.push(m.name);
  }
  return applied;
}
