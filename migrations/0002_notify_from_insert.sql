-- Conveyor schema, version 2: the enqueue statement sends its own NOTIFY.
--
-- The statement trigger of version 1 materialised every inserted row into a
-- transition table and ran a plpgsql query over it. On an idle machine that
-- cost 0.2-0.4 ms of a 1-1.5 ms single-job enqueue, which is most of the
-- margin of the 2 ms enqueue-to-start target. insertJobs (src/db/enqueue.ts),
-- the only insert path of the engine, now calls pg_notify in the same
-- statement, with the same payload (the queue name) and the same rule (only
-- jobs runnable now), and Postgres still folds duplicates per transaction.
-- Rows inserted with plain SQL are found by the next poll (poll_interval_ms),
-- as in River; `select pg_notify('conveyor_jobs', '<queue>')` wakes workers
-- at once.
drop trigger conveyor_jobs_notify_insert on conveyor_jobs;
drop function conveyor_notify_inserted();
