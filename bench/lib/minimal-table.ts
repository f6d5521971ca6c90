// The ceiling's job table: the columns a fenced lease needs, one partial
// index for the dequeue, no trigger. Shared by the bench's bare SQL loop
// (bench/systems/bare-sql.ts) and bench/dissect.ts.
//
// Half-empty pages, as Conveyor's own table (migrations/0003_fillfactor.sql):
// each update's new row version stays on its page. The ceiling gets every
// storage tuning Conveyor gets. Measured, best cell of the grid, 3
// alternating rounds in one hour (2 cores, PostgreSQL 18, fsync on): at
// N = 10,000 fillfactor 100 gave 65,742 / 59,413 / 63,047 jobs/s, 50 gave
// 69,482 / 68,156 / 64,715; at 100,000, 75,507 / 78,867 / 76,884 against
// 83,567 / 79,665 / 73,549.
export const MINIMAL_TABLE_DDL = `
  create table bench_jobs (
    id               bigint generated always as identity primary key,
    queue            text not null,
    kind             text not null,
    payload          jsonb not null default '{}',
    state            smallint not null default 0, -- 0 available, 1 running, 2 completed
    priority         smallint not null default 0,
    run_at           timestamptz not null default now(),
    attempts         integer not null default 0,
    lease_owner      text,
    lease_version    bigint not null default 0,
    lease_expires_at timestamptz,
    finalized_at     timestamptz
  ) with (fillfactor = 50);
  create index bench_jobs_dequeue_idx on bench_jobs (queue, priority, run_at, id)
    where state = 0;`;
