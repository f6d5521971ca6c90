-- Conveyor schema, version 4: a completion writes no index entry but the
-- primary key's.
--
-- conveyor_jobs_state_finalized_idx held every finished job, so each
-- completion (the update that ends nearly every job) inserted an entry into
-- it beside the primary key's. Measured on PostgreSQL 18, 2 cores, fsync on,
-- 100,000 pre-enqueued no-op jobs:
-- - the same fetch and completion statements, batches of 1,000, alternated
--   batch by batch between a database with the index and one without, 3
--   runs: the completion's time per job 10.6-11.3 -> 8.7-10.0 µs, the
--   fetch's about the same (13.4-14.1 against 12.9-14.3 µs);
-- - the worker pool (concurrency 4,000, fetches of 2,000), 8 interleaved
--   runs each: with the index dropped outright, the cluster's CPU per job
--   27.9 -> 23.8 µs and 42,346 -> 46,660 jobs/s (medians); with this
--   migration, 10 runs each, 41,632 -> 40,276 jobs/s, no difference beyond
--   the noise (the fetch, not the completion, is the longer leg of the
--   worker's pipeline);
-- - the bench's throughput phase, 3 alternating rounds of 2: Conveyor's best
--   setting 30,646 -> 35,286 jobs/s at 10,000 jobs and 33,643 -> 36,452 at
--   100,000 (medians), c2000-b1000 26,525 -> 29,231 and 39,958 -> 32,859.
--
-- What read it: the pruner (completed jobs by age), the queue counts and the
-- job listing. Completed jobs are now found by the primary key instead: the
-- pruner walks ids from the oldest (src/db/prune.ts) and the counts read the
-- newest ids first (src/db/admin.ts). Cancelled and discarded jobs, rare and
-- kept apart by operators, keep an index of their own, written only when a
-- job ends in one of those states.
drop index conveyor_jobs_state_finalized_idx;

create index conveyor_jobs_final_rare_idx on conveyor_jobs (state, finalized_at)
  where finalized_at is not null and state in ('cancelled', 'discarded');
