// The executor driven directly, for paths a worker's fetch never takes.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { fetchJobs } from "../src/db/fetch.ts";
import { enqueue } from "../src/enqueue.ts";
import { ValidationError } from "../src/errors.ts";
import { createEvents } from "../src/events.ts";
import type { HandlerSpec } from "../src/handler.ts";
import { silentLogger } from "../src/logger.ts";
import { DEFAULT_BACKOFF } from "../src/retry.ts";
import { createCompleter } from "../src/worker/completer.ts";
import { createEffectRunner } from "../src/worker/effects.ts";
import type { Execution } from "../src/worker/execution.ts";
import { createExecutor } from "../src/worker/executor.ts";
import { type TestDb, testDatabase } from "./harness.ts";

let db: TestDb;
beforeAll(async () => {
  db = await testDatabase();
});
afterAll(async () => {
  await db.drop();
});

test("a leased job whose kind has no handler is failed with a retry, not lost", async () => {
  const owner = "W-ghost";
  const sql = db.connect({ max: 2 });
  const events = createEvents();
  const failed: { error: unknown; state: string }[] = [];
  events.on("job:failed", (e) => failed.push({ error: e.error, state: e.state }));
  const running = new Map<string, Execution>();
  const execute = createExecutor({
    sql,
    owner,
    handlers: new Map<string, HandlerSpec>(),
    completer: createCompleter(sql, owner, silentLogger),
    effects: createEffectRunner({ sql, owner, maxGroup: 1, concurrency: 1 }),
    running,
    backoff: { ...DEFAULT_BACKOFF, baseMs: 60_000 },
    queueBackoff: new Map(),
    events,
    logger: silentLogger,
  });
  try {
    const { job } = await enqueue(db.sql, { queue: "ghosts", kind: "ghost", payload: { n: 1 } });
    // A fetch that believed it could run "ghost", as one with a stale list would.
    const [row] = await fetchJobs(db.sql, {
      queue: "ghosts",
      owner,
      limit: 1,
      leaseMs: 30_000,
      kinds: ["ghost"],
    });
    if (!row) throw new Error("nothing leased");
    let handlerDone = 0;
    const over = Promise.withResolvers<void>();
    execute(
      row,
      30_000,
      () => handlerDone++,
      () => over.resolve(),
    );
    expect(running.has(job.id)).toBe(true);
    await over.promise;
    expect(running.size).toBe(0);
    // No handler ran, so there is no handler to report as done.
    expect(handlerDone).toBe(0);
    expect(failed).toHaveLength(1);
    expect(failed[0]?.error).toBeInstanceOf(ValidationError);
    expect(failed[0]?.state).toBe("available");
    const [after] = await db.sql`
      select state, attempts, lease_expires_at, errors, run_at > now() + interval '30 seconds' as later
        from conveyor_jobs where id = ${job.id}`;
    expect(after?.state).toBe("available");
    expect(after?.attempts).toBe(1);
    expect(after?.lease_expires_at).toBeNull();
    expect(after?.later).toBe(true);
    expect(after?.errors).toHaveLength(1);
    expect(after?.errors[0].message).toContain("no handler for kind ghost");
  } finally {
    await sql.end();
  }
});
