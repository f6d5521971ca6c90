// Fenced writes probe conveyor_jobs by primary key, whatever the table's
// size: a hash join over a sequential scan (which the planner preferred for
// tables under some 20,000 rows, src/db/db.ts fencedBatch) read the whole
// table for every completion and heartbeat.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import type { Db, Lease } from "../src/db/db.ts";
import { fetchJobs } from "../src/db/fetch.ts";
import { extendLeases, releaseJobs } from "../src/db/lease.ts";
import {
  cancelLeasedJobs,
  completeJobs,
  failJobs,
  lockLeasedJobs,
  selectCompletedBy,
  setResultsLocked,
  snoozeJobs,
} from "../src/db/outcome.ts";
import { type TestDb, testDatabase } from "./harness.ts";

const OWNER = "plans-worker";
const ROWS = 5_000;
const err = { attempt: 1, at: new Date().toISOString(), name: "E", message: "m" };

let db: TestDb;
let leases: Lease[];
beforeAll(async () => {
  db = await testDatabase();
  // A table as a young installation has it: some thousands of rows, never analyzed.
  await db.sql`
    insert into conveyor_jobs (queue, kind, payload)
    select 'plans', 'k', jsonb_build_object('i', g) from generate_series(1, ${ROWS}::int) g`;
  const rows = await fetchJobs(db.sql, {
    queue: "plans",
    owner: OWNER,
    limit: 3,
    leaseMs: 60_000,
    kinds: ["k"],
  });
  leases = rows.map((r) => ({ id: r.id, version: Number(r.lease_version) }));
  expect(leases).toHaveLength(3);
});
afterAll(async () => {
  await db.drop();
});

class Rollback extends Error {}

const scanCounts = async (tx: Db) => {
  const [s] = await tx`
    select seq_scan::int as seq, idx_scan::int as idx,
           seq_tup_read::int as seq_read, idx_tup_fetch::int as fetched
      from pg_stat_xact_user_tables where relname = 'conveyor_jobs'`;
  return {
    seq: Number(s?.seq),
    idx: Number(s?.idx),
    seqRead: Number(s?.seq_read),
    fetched: Number(s?.fetched),
  };
};

/**
 * Scans of conveyor_jobs by `write` (after `setup`, not counted), in a
 * transaction that is then rolled back: the difference of the backend's
 * counts around it (they may include earlier statements not yet reported).
 */
async function scansBy(
  write: (tx: Db) => Promise<{ size: number }>,
  setup?: (tx: Db) => Promise<unknown>,
) {
  let scans: (Awaited<ReturnType<typeof scanCounts>> & { changed: number }) | undefined;
  await db.sql
    .begin(async (tx) => {
      await setup?.(tx);
      const before = await scanCounts(tx);
      const out = await write(tx);
      const after = await scanCounts(tx);
      scans = {
        seq: after.seq - before.seq,
        idx: after.idx - before.idx,
        seqRead: after.seqRead - before.seqRead,
        fetched: after.fetched - before.fetched,
        changed: out.size,
      };
      throw new Rollback();
    })
    .catch((e) => {
      if (!(e instanceof Rollback)) throw e;
    });
  if (!scans) throw new Error("no scan counts");
  return scans;
}

const writes: [string, (tx: Db, batch: Lease[]) => Promise<{ size: number }>][] = [
  ["completeJobs", (tx, b) => completeJobs(tx, OWNER, b)],
  [
    "failJobs",
    (tx, b) =>
      failJobs(
        tx,
        OWNER,
        b.map((l) => ({ ...l, error: err, retryDelayMs: 1_000 })),
      ),
  ],
  [
    "snoozeJobs",
    (tx, b) =>
      snoozeJobs(
        tx,
        OWNER,
        b.map((l) => ({ ...l, delayMs: 1_000 })),
      ),
  ],
  [
    "cancelLeasedJobs",
    (tx, b) =>
      cancelLeasedJobs(
        tx,
        OWNER,
        b.map((l) => ({ ...l, error: err })),
      ),
  ],
  ["lockLeasedJobs", (tx, b) => lockLeasedJobs(tx, OWNER, b)],
  [
    "setResultsLocked",
    (tx, b) =>
      setResultsLocked(
        tx,
        b.map((l) => ({ id: l.id, result: { ok: 1 } })),
      ),
  ],
  ["extendLeases", (tx, b) => extendLeases(tx, OWNER, b, 60_000)],
  ["releaseJobs", (tx, b) => releaseJobs(tx, OWNER, b)],
];

describe(`fenced writes on ${ROWS.toLocaleString("en-US")} rows probe the primary key`, () => {
  for (const [name, write] of writes) {
    for (const size of [1, 3]) {
      test(`${name}, ${size} lease(s)`, async () => {
        const scans = await scansBy((tx) => write(tx, leases.slice(0, size)));
        expect(scans.changed).toBe(size);
        expect(scans.seq).toBe(0);
        expect(scans.idx).toBeGreaterThanOrEqual(1);
      });
    }
  }

  test("selectCompletedBy", async () => {
    const scans = await scansBy(
      (tx) => selectCompletedBy(tx, OWNER, leases),
      (tx) => completeJobs(tx, OWNER, leases),
    );
    expect(scans.changed).toBe(leases.length);
    expect(scans.seq).toBe(0);
    expect(scans.idx).toBeGreaterThanOrEqual(1);
  });
});

// The dequeue's update joined its locked batch to conveyor_jobs; on an
// analyzed table of some thousands of rows the planner preferred a hash join
// over a sequential scan of the whole table to a primary-key probe per job
// (4.9 of 9 ms for a batch of 250 on 10,000 rows, auto_explain). The batch is
// now an array the update probes by primary key.
describe("the dequeue leases a batch by primary key", () => {
  for (const limit of [1, 250, 1_000]) {
    test(`${limit} job(s) on an analyzed table of ${ROWS.toLocaleString("en-US")} rows`, async () => {
      const scans = await scansBy(
        async (tx) => ({
          size: (
            await fetchJobs(tx, {
              queue: "plans",
              owner: "plans-other",
              limit,
              leaseMs: 60_000,
              kinds: ["k"],
            })
          ).length,
        }),
        (tx) => tx`analyze conveyor_jobs`,
      );
      expect(scans.changed).toBe(limit);
      expect(scans.seq).toBe(0);
      expect(scans.idx).toBeGreaterThanOrEqual(2);
    });
  }
});

// A batch of thousands of leases on a table of 100,000 rows. With the
// batch's size in plain sight the planner chose a hash join over a
// sequential scan, or a merge join from the primary key's first entry: both
// read the whole table (src/db/db.ts fencedBatch has the measurements). The
// probes read an index entry or two per lease.
describe("fenced writes of 2,000 leases on 100,000 rows probe the primary key", () => {
  const BIG = 100_000;
  const SIZE = 2_000;
  let big: Lease[] = [];
  beforeAll(async () => {
    // The leased jobs come last in id order (their priority puts them first
    // in the dequeue), so walking the index from its start costs the most.
    await db.sql`
      insert into conveyor_jobs (queue, kind, payload, priority)
      select 'plans-big', 'k', jsonb_build_object('i', g), case when g > ${BIG - SIZE}::int then -1 else 0 end
        from generate_series(1, ${BIG}::int) g`;
    const rows = await fetchJobs(db.sql, {
      queue: "plans-big",
      owner: OWNER,
      limit: SIZE,
      leaseMs: 60_000,
      kinds: ["k"],
    });
    big = rows.map((r) => ({ id: r.id, version: Number(r.lease_version) }));
    expect(big).toHaveLength(SIZE);
    await db.sql`analyze conveyor_jobs`;
  });

  for (const [name, write] of writes) {
    test(name, async () => {
      const scans = await scansBy((tx) => write(tx, big));
      expect(scans.changed).toBe(SIZE);
      expect(scans.seq).toBe(0);
      expect(scans.seqRead).toBe(0);
      // A probe or two per lease (extendLeases reads its rows twice); a merge
      // join from the first entry fetched the whole table (105,000 rows).
      expect(scans.fetched).toBeLessThanOrEqual(3 * SIZE);
    });
  }
});
