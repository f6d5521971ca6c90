-- Conveyor schema, version 1: queues and jobs with fenced leases.
--
-- The fencing token is jobs.lease_version. Every dequeue increments it; every
-- write a worker makes about a job it holds (heartbeat, complete, fail, snooze,
-- cancel, release) is guarded by state = 'running' AND lease_owner AND
-- lease_version, so a worker that lost its lease changes 0 rows.

create type conveyor_job_state as enum (
  'pending',    -- waiting for dependencies (reserved for workflows)
  'available',  -- runnable once run_at <= now() (covers scheduled and retrying jobs)
  'running',    -- leased: lease_owner holds lease_version until lease_expires_at
  'completed',
  'cancelled',
  'discarded'   -- failed max_attempts times, or dropped by policy
);

create table conveyor_queues (
  name        text primary key check (name ~ '^[A-Za-z0-9_.:-]{1,128}$'),
  paused      boolean not null default false,
  created_at  timestamptz not null default now(),
  updated_at  timestamptz not null default now()
);

create table conveyor_jobs (
  id               bigint generated always as identity primary key,
  queue            text not null,
  kind             text not null,
  payload          jsonb not null default '{}'::jsonb,
  state            conveyor_job_state not null default 'available',
  -- Lower runs first, as in graphile-worker and River.
  priority         smallint not null default 0,
  run_at           timestamptz not null default now(),
  attempts         integer not null default 0 check (attempts >= 0),
  max_attempts     integer not null default 25 check (max_attempts >= 1),
  lease_owner      text,
  lease_version    bigint not null default 0,
  lease_expires_at timestamptz,
  idempotency_key  text,
  result           jsonb,
  -- One object per failed attempt: {attempt, at, message, name, stack?}.
  errors           jsonb not null default '[]'::jsonb,
  traceparent      text,
  tracestate       text,
  created_at       timestamptz not null default now(),
  attempted_at     timestamptz,
  finalized_at     timestamptz,
  constraint conveyor_jobs_running_has_lease check (
    state <> 'running' or (lease_owner is not null and lease_expires_at is not null)
  )
);

-- Dequeue reads only this partial index, so its cost is O(batch) however many
-- finished jobs the table keeps: completed rows are not in it.
create index conveyor_jobs_dequeue_idx on conveyor_jobs (queue, priority, run_at, id)
  where state = 'available';

-- The reaper scans only running jobs by expiry.
create index conveyor_jobs_lease_expiry_idx on conveyor_jobs (lease_expires_at)
  where state = 'running';

-- Idempotency keys are unique per queue for as long as the job row exists.
create unique index conveyor_jobs_idempotency_idx on conveyor_jobs (queue, idempotency_key)
  where idempotency_key is not null;

-- Listing and pruning finished jobs.
create index conveyor_jobs_state_finalized_idx on conveyor_jobs (state, finalized_at)
  where finalized_at is not null;

-- Wake idle workers: one notification per statement and queue, not per row.
-- Postgres folds identical notifications within a transaction, so a batch
-- enqueue wakes each queue's listeners once.
create function conveyor_notify_inserted() returns trigger
language plpgsql as $$
begin
  perform pg_notify('conveyor_jobs', q.queue)
    from (select distinct queue from inserted
           where state = 'available' and run_at <= now()) q;
  return null;
end;
$$;

create trigger conveyor_jobs_notify_insert
  after insert on conveyor_jobs
  referencing new table as inserted
  for each statement execute function conveyor_notify_inserted();
