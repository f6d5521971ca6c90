/*
 * Conveyor: the lease (fencing token) protocol, as a Promela model for Spin.
 *
 * See spec/README.md for the mapping of every action to its SQL statement and
 * TypeScript function, what is abstracted away, and how to run the checks
 * (bash spec/check.sh, or npm run check:model).
 *
 * One file, several builds (spin -D...):
 *   (none)                      the real protocol; safety is checked exhaustively
 *   -DLIVENESS                  bounded faults + the LTL formula `live`
 *                               (run pan with -a -f: weak fairness)
 *   -DBUG_COMPLETE_NO_VERSION   completion (plain and effect transaction) ignores lease_version
 *   -DBUG_HEARTBEAT_NO_VERSION  heartbeat ignores lease_version
 *   -DBUG_DEQUEUE_NO_BUMP       dequeue does not increment lease_version
 *   -DBUG_REAPER_REUSES_VERSION reaper decrements lease_version, so the next
 *                               dequeue reissues a token that was already handed out
 *   -DBUG_ENQUEUE_NO_CONFLICT   enqueue without ON CONFLICT (duplicate rows per key)
 *   -DBUG_HANDOFF_ON_CONFLICT   a hand-off insert that meets an existing row leases
 *                               it anyway, with its literal first token (version 1)
 *   -DBUG_COMPLETE_NO_STATE     completion fenced by owner and version but not by
 *                               state = 'running' (a retried commit writes the effect again)
 *   -DBUG_EFFECT_SEPARATE_TXN   the effect commits in its own transaction, not in the
 *                               completion's (a crash in between, and the re-run writes it again)
 *   -DBUG_LAZY_FETCH            the plain job's dequeue commits with synchronous_commit off
 *                               as its completion does, so a Postgres crash can undo it
 *                               after its holder has the token
 *   -DNO_REAPER                 (with -DLIVENESS) no reaper: the liveness check must fail
 *   -DSAME_OWNER                every slot uses the same lease_owner, so only
 *                               lease_version separates leases (worst case for the owner check)
 *   -DCONSEQUENCES_ONLY         drop the two direct fencing assertions (P_FENCE,
 *                               P_UNIQUE_TOKEN) to see which downstream property a bug breaks
 *
 * Concurrency is interleaving; every SQL statement is one d_step (atomic on its
 * row thanks to the row lock). A worker that is "paused" (GC, SIGSTOP,
 * partition) is simply a process the scheduler does not run for a while, so
 * zombies need no special action: any slot may stall between any two of its
 * steps while its lease expires (time is abstract: any lease may expire at any
 * moment), the reaper reaps it and another slot dequeues the job, and then
 * resume with its old token.
 */

/* ------------------------------------------------------------------ sizes */

#ifndef NJOBS
#define NJOBS   3       /* jobs (= idempotency keys); 2..4 supported      */
#endif
#define NSLOTS  3       /* handler slots: concurrently running handlers
                           (fixed: ASSERT_FRESH and the Postgres restart
                           below spell out the three slots)                 */
#define MAXATT  2       /* max_attempts of every job                        */
#define MAXREL  1       /* successful releases (shutdown) in a whole run   */

/* A job is dequeued at most MAXATT + (successful releases) times: every
 * dequeue spends an attempt, only a release gives one back, fail and reap
 * never do.  lease_version starts at 0 and only dequeue bumps it. */
#define VBOUND  (MAXATT + MAXREL)

/* Slots 0 and 1 are two concurrent handlers of worker process A (one
 * lease_owner shared by its handlers), slot 2 is worker process B. */
#ifdef SAME_OWNER
#define OWNER(s) 1
#else
#define OWNER(s) ((s) < 2 -> 1 : 2)
#endif

/* The last job's handler has no database effect (its completion goes through
 * the batching completer); the others write their effect in the guarded
 * completion transaction of the executor. */
#define HAS_EFFECT(j) ((j) < NJOBS - 1)

#ifdef LIVENESS
#define MAXFAULT 1      /* crashes + lost connections + lost replies + Postgres restarts */
#define MAXHB    0      /* heartbeats per lease. 0: left out of the liveness
                           build. With time abstracted a successful heartbeat
                           changes no state, and a failed one is like any
                           other fenced write matching 0 rows; unbounded
                           heartbeats would model a handler that never ends. */
#endif

/* ------------------------------------------------------------------ state */

/* conveyor_job_state; NOROW = the row does not exist yet */
#define NOROW     0
#define AVAIL     1
#define RUNNING   2
#define COMPLETED 3
#define CANCELLED 4     /* handler cancel: folded into plain completion, see README */
#define DISCARDED 5

#define NOJOB 7

/* names of fenced writes, for the counterexample printout only */
mtype = { heartbeat, fenced_update, complete, fail, release }

typedef Job {
    unsigned state    : 3;
    unsigned attempts : 2;
    unsigned owner    : 2;  /* lease_owner; 0 = null. Like src/db/reap.ts, the reaper leaves it as it is */
    unsigned version  : 3;  /* lease_version: the fencing token                              */
    unsigned lock     : 2;  /* row lock held by the open completion transaction of slot lock-1 */
    unsigned ledger   : 2;  /* committed effect rows for this job (the ledger table)         */
    unsigned rows     : 2;  /* ghost: rows carrying this idempotency key                     */
    unsigned glease   : 3;  /* ghost: identity of the current lease = number of dequeues     */
    unsigned doneby   : 3;  /* ghost: glease of the lease whose completion committed, 0 none */
}
Job job[NJOBS];

/* Per-slot worker state: global so that assertions can compare slots. */
typedef SlotState {
    unsigned hold : 3 = NOJOB; /* job this slot believes it holds, NOJOB = none     */
    unsigned tok  : 3;  /* its token (the lease_version it was given)        */
    unsigned gl   : 3;  /* ghost: the lease identity it was given            */
    unsigned intx : 2;  /* completion transaction: 0 none, 1 guarded UPDATE
                           done (row locked), 2 effect INSERTed (uncommitted) */
    unsigned hb   : 2;  /* heartbeats of the current lease (LIVENESS only)   */
}
SlotState sl[NSLOTS];
unsigned nrel : 2;      /* successful releases so far (bounds versions)      */
/* The plain job's completion committed with synchronous_commit off (as with
 * [worker] durable_completions = false; the default waits, a subset of
 * this) and may not be on disk yet: a Postgres crash can undo it (see
 * Reaper). Never cleared by a later flush: nothing reads or changes a
 * completed row, so losing it after later commits is a superset of losing
 * it before them. */
bit unflushed;
#ifdef BUG_LAZY_FETCH
/* The bug: the plain job's latest dequeue may not be on disk either. The
 * crash below puts the row back as it was before it (preowner: its owner
 * then), while the slot that dequeued it keeps its token. */
bit fetchunflushed;
unsigned preowner : 2;
#define LAZY_FETCH(j) \
    if \
    :: j == NJOBS - 1 -> fetchunflushed = 1; preowner = job[j].owner \
    :: else -> skip \
    fi
#else
#define LAZY_FETCH(j) skip
#endif

#ifdef LIVENESS
unsigned nfault : 2;
#define FAULT_OK   (nfault < MAXFAULT)
#define FAULT_TAKE nfault++
#define HB_OK(s)   (sl[s].hb < MAXHB)
#define HB_TAKE(s) sl[s].hb++
#define HB_CLEAR(s) sl[s].hb = 0
#else
#define FAULT_OK   true
#define FAULT_TAKE skip
#define HB_OK(s)   true
#define HB_TAKE(s) skip
#define HB_CLEAR(s) skip
#endif

#define H          sl[s].hold
#define HOLDING(s) (sl[s].hold != NOJOB)

/* --------------------------------------------------------------- guards */

/* The fence of every lease write (src/db/outcome.ts, src/db/lease.ts):
 *   j.lease_version = $token AND j.lease_owner = $owner AND j.state = 'running' */
#define FENCE(j,s)    (job[j].state == RUNNING && job[j].owner == OWNER(s) && job[j].version == sl[s].tok)
#define NOVERSION(j,s) (job[j].state == RUNNING && job[j].owner == OWNER(s))

#define NOSTATE(j,s)   (job[j].owner == OWNER(s) && job[j].version == sl[s].tok)

#if defined(BUG_COMPLETE_NO_VERSION)
#define COMPLETE_FENCE(j,s) NOVERSION(j,s)
#elif defined(BUG_COMPLETE_NO_STATE)
#define COMPLETE_FENCE(j,s) NOSTATE(j,s)
#else
#define COMPLETE_FENCE(j,s) FENCE(j,s)
#endif
#ifdef BUG_HEARTBEAT_NO_VERSION
#define HEARTBEAT_FENCE(j,s) NOVERSION(j,s)
#else
#define HEARTBEAT_FENCE(j,s) FENCE(j,s)
#endif

/* ----------------------------------------------------------- properties */

/* P_FENCE (a stale write never changes a row): whenever a fenced write by slot
 * s matches the row, s holds the CURRENT lease of that job.  Stated on the
 * ghost lease identity, not on lease_version, so it does not merely restate
 * the guard: it checks that the guard implements "current lease holder". */
#ifndef CONSEQUENCES_ONLY
#define ASSERT_CURRENT(j,s) assert(job[j].state == RUNNING && job[j].glease == sl[s].gl)
#else
#define ASSERT_CURRENT(j,s) skip
#endif

/* P_EFFECT_ONCE, P_EFFECT_COMPLETED, P_ROWS, bounds: checked after every change of row j. */
#ifndef BUG_EFFECT_SEPARATE_TXN
#define EFFECT_ONLY_WITH_COMPLETION(j) \
    assert(job[j].ledger == 0 || (HAS_EFFECT(j) && job[j].state == COMPLETED))
#else
/* that variant makes the effect visible before completion on purpose; what
 * must fail is P_EFFECT_ONCE */
#define EFFECT_ONLY_WITH_COMPLETION(j) skip
#endif
#define CHECK(j) \
    assert(job[j].ledger <= 1); \
    EFFECT_ONLY_WITH_COMPLETION(j); \
    assert(job[j].state != COMPLETED || !HAS_EFFECT(j) || job[j].ledger == 1); \
    assert(job[j].rows <= 1); \
    assert(job[j].attempts <= MAXATT); \
    assert(job[j].version <= VBOUND && job[j].glease <= VBOUND)

/* P_UNIQUE_TOKEN (no two live leases with one version): when a dequeue hands
 * out token v for job j, no other live slot holds token v for j.  Tokens
 * change only at dequeue, so checking here covers every reachable state. */
#ifndef CONSEQUENCES_ONLY
#define ASSERT_FRESH(j,s) \
    assert(s == 0 || !(sl[0].hold == j && sl[0].tok == job[j].version)); \
    assert(s == 1 || !(sl[1].hold == j && sl[1].tok == job[j].version)); \
    assert(s == 2 || !(sl[2].hold == j && sl[2].tok == job[j].version))
#else
#define ASSERT_FRESH(j,s) skip
#endif

/* P_OUTCOME (disambiguating an unknown commit outcome): when a completion
 * (or its retry after a lost reply) matches 0 rows, the worker can tell
 * whether its own earlier attempt committed by reading the row:
 * (state = 'completed' AND lease_version = $token) iff its lease completed it. */
#define ASSERT_OUTCOME(j,s) \
    assert((job[j].state == COMPLETED && job[j].version == sl[s].tok) == (job[j].doneby == sl[s].gl))

/* The slot forgets the job: after an outcome, a 0-row write (StaleLeaseError),
 * or a crash (a restarted worker has no memory of its leases). */
#define DROP(s) sl[s].hold = NOJOB; sl[s].tok = 0; sl[s].gl = 0; HB_CLEAR(s)

/* A fenced write matched 0 rows: the worker learns its lease is gone. */
#define STALE(s,what) \
    printf("MSC: slot %d %e on job %d with token %d: 0 rows (row version %d), forgets the job\n", \
           s, what, sl[s].hold, sl[s].tok, job[sl[s].hold].version); \
    DROP(s)

/* Abort the slot's open completion transaction (ROLLBACK, crash, connection
 * loss, Postgres restart): the uncommitted UPDATE and effect row vanish and the
 * row lock is released. */
#define ABORT(s) \
    if \
    :: sl[s].intx != 0 -> job[sl[s].hold].lock = 0; sl[s].intx = 0 \
    :: else -> skip \
    fi

/* ------------------------------------------------------- row transitions */

/* src/db/fetch.ts fetchJobs: the CTE picks an available, unlocked row
 * (FOR UPDATE SKIP LOCKED; ORDER BY priority, run_at, id abstracted to "any"),
 * the UPDATE leases it. */
#define AVAILABLE(j) (job[j].state == AVAIL && job[j].lock == 0)
#ifdef BUG_DEQUEUE_NO_BUMP
#define BUMP(j) skip
#else
#define BUMP(j) job[j].version++
#endif
#define DEQUEUE(j,s) \
    LAZY_FETCH(j); \
    job[j].state = RUNNING; job[j].attempts++; job[j].owner = OWNER(s); \
    BUMP(j); job[j].glease++; \
    printf("MSC: slot %d (owner %d) dequeues job %d: attempt %d, token %d (lease #%d)\n", \
           s, OWNER(s), j, job[j].attempts, job[j].version, job[j].glease); \
    ASSERT_FRESH(j,s); \
    sl[s].hold = j; sl[s].tok = job[j].version; sl[s].gl = job[j].glease; HB_CLEAR(s); \
    CHECK(j)

/* src/db/reap.ts reapExpiredLeases: running, expired, not locked (SKIP LOCKED).
 * lease_version is left alone (the next dequeue bumps it); lease_owner too.
 *
 * Time is abstracted away: a holder may pause for any length of time (GC,
 * SIGSTOP, partition) and so miss any number of heartbeats, hence ANY running
 * lease may be expired at ANY moment.  The reaper may therefore reap any
 * running row that is not locked.  This is a superset of the real behaviours
 * (the real reaper needs lease_expires_at < now()), so safety proved here holds
 * for every timing; a heartbeat's only observable result is its answer. */
#define REAPABLE(j) (job[j].state == RUNNING && job[j].lock == 0)
#ifdef BUG_REAPER_REUSES_VERSION
#define REAP_VERSION(j) job[j].version--
#else
#define REAP_VERSION(j) skip
#endif
#define REAP(j) \
    printf("MSC: reaper takes back job %d (version %d)\n", j, job[j].version); \
    job[j].state = (job[j].attempts >= MAXATT -> DISCARDED : AVAIL); \
    REAP_VERSION(j); CHECK(j)

/* src/db/enqueue.ts insertJobs: INSERT ... ON CONFLICT (queue, idempotency_key)
 * DO NOTHING, then selectJobsByIdempotencyKey for the skipped duplicates. */
#ifdef BUG_ENQUEUE_NO_CONFLICT
#define INSERT_JOB(k) \
    if \
    :: job[k].rows == 0 -> job[k].state = AVAIL \
    :: else -> skip \
    fi; \
    printf("MSC: enqueue key %d: inserted a row (no ON CONFLICT)\n", k); \
    job[k].rows++; CHECK(k)
#else
#define INSERT_JOB(k) \
    if \
    :: job[k].rows == 0 -> job[k].rows = 1; job[k].state = AVAIL; printf("MSC: enqueue key %d: inserted\n", k) \
    :: else -> printf("MSC: enqueue key %d: conflict, existing row returned\n", k) \
    fi; \
    CHECK(k)
#endif

/* src/db/enqueue.ts insertHandedOff (src/db/handoff.ts): one INSERT ... ON
 * CONFLICT DO NOTHING commits a new job already leased to idle slot s, as its
 * first dequeue would lease it: 'running', attempt 1, lease_version 1 (a
 * literal: the row is new), s's owner. `learns` is 0 when the reply is lost:
 * the row is committed leased to s's owner, but neither the client nor slot s
 * hears of it (the real slot is given back on the error), so nobody holds the
 * lease until the reaper takes it back. A duplicate key leases nothing.
 * Pause is abstracted (a paused queue's job is inserted 'available'). */
#define HANDOFF_LEASE(k,s,learns) \
    job[k].state = RUNNING; job[k].attempts = 1; job[k].owner = OWNER(s); \
    job[k].version = 1; job[k].glease++; \
    printf("MSC: enqueue key %d handed off to slot %d (owner %d): token 1 (lease #%d)\n", \
           k, s, OWNER(s), job[k].glease); \
    ASSERT_FRESH(k,s); \
    if \
    :: learns -> sl[s].hold = k; sl[s].tok = 1; sl[s].gl = job[k].glease; HB_CLEAR(s) \
    :: else -> printf("MSC: reply lost: neither the client nor slot %d hears of the lease\n", s) \
    fi
#ifdef BUG_HANDOFF_ON_CONFLICT
/* the bug: ON CONFLICT DO UPDATE SET state = 'running', lease_version = 1, ... */
#define HANDOFF_CONFLICT(k,s,learns) \
    printf("MSC: enqueue key %d: conflict, existing row leased anyway\n", k); \
    HANDOFF_LEASE(k,s,learns)
#else
#define HANDOFF_CONFLICT(k,s,learns) \
    printf("MSC: enqueue key %d: conflict, nothing handed off\n", k)
#endif
#define HANDOFF(k,s,learns) \
    if \
    :: job[k].rows == 0 -> job[k].rows = 1; HANDOFF_LEASE(k,s,learns) \
    :: else -> HANDOFF_CONFLICT(k,s,learns) \
    fi; \
    CHECK(k)
#define IDLE(s) (!HOLDING(s) && sl[s].intx == 0)

/* src/db/outcome.ts completeJobsIdempotent (plain: the batching completer of
 * src/worker/completer.ts); also handler cancel (cancelLeasedJobs), which
 * has the same shape with 'cancelled'. */
#define PLAIN_COMPLETE(j,s) \
    printf("MSC: slot %d completes job %d with token %d (row version %d)\n", s, j, sl[s].tok, job[j].version); \
    ASSERT_CURRENT(j,s); job[j].state = COMPLETED; job[j].doneby = sl[s].gl; unflushed = 1; CHECK(j)

/* src/db/outcome.ts failJobs (retry with backoff: run_at abstracted) */
#define FAIL(j,s) \
    printf("MSC: slot %d fails job %d with token %d\n", s, j, sl[s].tok); \
    ASSERT_CURRENT(j,s); \
    job[j].state = (job[j].attempts >= MAXATT -> DISCARDED : AVAIL); \
    CHECK(j)

/* src/db/lease.ts releaseJobs (shutdown): the attempt is given back. Snooze
 * (snoozeJobs: available, max_attempts + 1) has the same effect on the
 * protocol: a new dequeue without a spent attempt. */
#define RELEASE(j,s) \
    printf("MSC: slot %d releases job %d with token %d\n", s, j, sl[s].tok); \
    ASSERT_CURRENT(j,s); \
    job[j].state = AVAIL; job[j].attempts--; nrel++; CHECK(j)

/* src/db/lease.ts extendLeases */
#define HEARTBEAT(j,s) \
    printf("MSC: slot %d heartbeat on job %d with token %d succeeds (row version %d)\n", s, j, sl[s].tok, job[j].version); \
    ASSERT_CURRENT(j,s); HB_TAKE(s)   /* lease_expires_at = now() + lease */

/* COMMIT of the executor's guarded transaction: the state change and the
 * effect row become visible together; the row lock is released. */
#ifndef BUG_EFFECT_SEPARATE_TXN
#define COMMIT_EFFECT(j) job[j].ledger++
#define INSERT_EFFECT(j) /* uncommitted until COMMIT */ \
    printf("MSC: slot %d INSERTs the effect row of job %d (uncommitted)\n", s, j)
#else
/* the anti-pattern: the handler's effect commits in its own transaction, then
 * the job is completed */
#define COMMIT_EFFECT(j) skip
#define INSERT_EFFECT(j) \
    printf("MSC: slot %d INSERTs the effect row of job %d and COMMITs it on its own\n", s, j); \
    job[j].ledger++; CHECK(j)
#endif
#define COMMIT(j,s) \
    printf("MSC: slot %d COMMITs job %d: completed + effect row (token %d)\n", s, j, sl[s].tok); \
    assert(job[j].lock == s + 1); ASSERT_CURRENT(j,s); \
    job[j].state = COMPLETED; COMMIT_EFFECT(j); job[j].doneby = sl[s].gl; \
    job[j].lock = 0; sl[s].intx = 0; CHECK(j)

/* ------------------------------------------------------------- processes */

/* A handler slot of a worker: dequeues one job at a time, runs its handler,
 * records its outcome.  Batching (fetch limit n, completer batches, heartbeat
 * batches) is n independent single-row fenced statements: each row is fenced
 * on its own, so one row per statement loses nothing. */
active [NSLOTS] proctype Slot()
{
    byte s = _pid;
    assert(s < NSLOTS);
end:
    do
    /* ---- Dequeue: src/db/fetch.ts fetchJobs ----------------------------- */
    :: d_step { !HOLDING(s) && AVAILABLE(0) -> DEQUEUE(0,s) }
    :: d_step { !HOLDING(s) && AVAILABLE(1) -> DEQUEUE(1,s) }
#if NJOBS > 2
    :: d_step { !HOLDING(s) && AVAILABLE(2) -> DEQUEUE(2,s) }
#endif
#if NJOBS > 3
    :: d_step { !HOLDING(s) && AVAILABLE(3) -> DEQUEUE(3,s) }
#endif

    /* ---- Heartbeat: src/db/lease.ts extendLeases ------------------------
     * An UPDATE waits for a row lock held by another slot's transaction
     * (the guard is then evaluated on the committed row). 0 rows: the
     * worker aborts the handler (StaleLeaseError) and forgets the job. */
    :: d_step { HOLDING(s) && sl[s].intx == 0 && job[H].lock == 0 && HB_OK(s) ->
           if
           :: HEARTBEAT_FENCE(H,s) -> HEARTBEAT(H,s)
           :: else -> STALE(s, heartbeat)
           fi }

    /* ---- Complete with effect: guarded transaction (src/worker/executor.ts
     *      + src/db/outcome.ts completeJobs as its first statement) ------- */
    /* BEGIN; UPDATE ... SET state='completed' WHERE <fence> RETURNING id:
     * takes the row lock; 0 rows -> ROLLBACK, the effect is never written. */
    :: d_step { HOLDING(s) && HAS_EFFECT(H) && sl[s].intx == 0 && job[H].lock == 0 ->
           if
           :: COMPLETE_FENCE(H,s) ->
              printf("MSC: slot %d BEGIN; fenced UPDATE of job %d with token %d matches (row version %d), row locked\n",
                     s, H, sl[s].tok, job[H].version);
              ASSERT_CURRENT(H,s); job[H].lock = s + 1; sl[s].intx = 1
           :: else -> ASSERT_OUTCOME(H,s); STALE(s, fenced_update)
           fi }
    /* the handler's fn(tx), e.g. INSERT INTO ledger ... (uncommitted: visible
     * to no one until COMMIT; see INSERT_EFFECT) */
    :: d_step { sl[s].intx == 1 -> sl[s].intx = 2; INSERT_EFFECT(H) }
    /* COMMIT, reply received: done */
    :: d_step { sl[s].intx == 2 -> COMMIT(H,s); DROP(s) }
    /* COMMIT succeeded but the reply was lost (connection dropped, Postgres
     * restarted right after): outcome unknown, the worker keeps its token
     * and may retry the whole transaction; the retry matches 0 rows. */
    :: d_step { sl[s].intx == 2 && FAULT_OK -> COMMIT(H,s); FAULT_TAKE;
                printf("MSC: slot %d: reply to COMMIT lost, keeps token %d\n", s, sl[s].tok) }
    /* Connection lost / statement error before COMMIT: Postgres rolls the
     * transaction back. The worker keeps its token and may retry or give up. */
    :: d_step { sl[s].intx != 0 && FAULT_OK -> ABORT(s); FAULT_TAKE;
                printf("MSC: slot %d: connection lost, transaction on job %d rolled back\n", s, H) }

    /* ---- Complete without effect: src/worker/completer.ts ->
     *      completeJobsIdempotent, whose 0 rows are told apart by the read
     *      of ASSERT_OUTCOME (and cancel: cancelLeasedJobs) -------------- */
    :: d_step { HOLDING(s) && !HAS_EFFECT(H) && job[H].lock == 0 ->
           if
           :: COMPLETE_FENCE(H,s) -> PLAIN_COMPLETE(H,s); DROP(s)
           :: else -> ASSERT_OUTCOME(H,s); STALE(s, complete)
           fi }
    /* ... committed, reply lost: the completer retries (same token). */
    :: d_step { HOLDING(s) && !HAS_EFFECT(H) && job[H].lock == 0 && COMPLETE_FENCE(H,s) && FAULT_OK ->
           PLAIN_COMPLETE(H,s); FAULT_TAKE;
           printf("MSC: slot %d: reply lost, keeps token %d\n", s, sl[s].tok) }

    /* ---- Fail: src/db/outcome.ts failJobs -------------------------------- */
    :: d_step { HOLDING(s) && sl[s].intx == 0 && job[H].lock == 0 ->
           if
           :: FENCE(H,s) -> FAIL(H,s); DROP(s)
           :: else -> STALE(s, fail)
           fi }
    :: d_step { HOLDING(s) && sl[s].intx == 0 && job[H].lock == 0 && FENCE(H,s) && FAULT_OK ->
           FAIL(H,s); FAULT_TAKE;            /* applied, reply lost */
           printf("MSC: slot %d: reply lost, keeps token %d\n", s, sl[s].tok) }

    /* ---- Release on shutdown: src/db/lease.ts releaseJobs ---------------- */
    :: d_step { HOLDING(s) && sl[s].intx == 0 && job[H].lock == 0 && nrel < MAXREL ->
           if
           :: FENCE(H,s) -> RELEASE(H,s); DROP(s)
           :: else -> STALE(s, release)
           fi }
    :: d_step { HOLDING(s) && sl[s].intx == 0 && job[H].lock == 0 && nrel < MAXREL && FENCE(H,s) && FAULT_OK ->
           RELEASE(H,s); FAULT_TAKE;         /* applied, reply lost */
           printf("MSC: slot %d: reply lost, keeps token %d\n", s, sl[s].tok) }

    /* ---- Crash: the process disappears (at any point, also while blocked
     *      on a row lock). Its open transaction aborts; its lease stays
     *      until it expires and is reaped. The slot restarts as a fresh
     *      handler with no memory of the job (same owner id: worst case). */
    :: d_step { HOLDING(s) && FAULT_OK ->
           printf("MSC: slot %d crashes holding job %d (token %d); restarts empty\n", s, H, sl[s].tok);
           ABORT(s); DROP(s); FAULT_TAKE }
    od
}

/* Every open transaction rolls back at once (a Postgres restart or crash). */
#define ABORT_OPEN_TXNS \
    i = 0; \
    do \
    :: i < NSLOTS -> if \
                     :: sl[i].intx != 0 -> job[sl[i].hold].lock = 0; sl[i].intx = 0 \
                     :: else -> skip \
                     fi; i++ \
    :: else -> break \
    od; \
    i = 0

/* The reaper (src/db/reap.ts reapExpiredLeases; time is abstract, see
 * REAPABLE) and Postgres restarts. */
active proctype Reaper()
{
    byte i;
end:
    do
#ifndef NO_REAPER
    :: d_step { REAPABLE(0) -> REAP(0) }
    :: d_step { REAPABLE(1) -> REAP(1) }
#if NJOBS > 2
    :: d_step { REAPABLE(2) -> REAP(2) }
#endif
#if NJOBS > 3
    :: d_step { REAPABLE(3) -> REAP(3) }
#endif
#endif
    /* Postgres restart: every open transaction aborts at once; committed
     * rows (and so leases) survive. Single statements in flight either
     * committed or not, which the "reply lost" transitions cover. */
    :: d_step { (sl[0].intx != 0 || sl[1].intx != 0 || sl[2].intx != 0) && FAULT_OK ->
           printf("MSC: Postgres restarts: all open transactions roll back\n");
           ABORT_OPEN_TXNS; FAULT_TAKE }
    /* Postgres crashes before the plain completion's WAL is flushed
     * (completeJobsIdempotent commits with synchronous_commit off): open
     * transactions roll back, and the completion is lost. The row is as it
     * was before it, 'running' under the lease that completed it; the slot
     * has forgotten the job (or keeps its token after a lost reply), and the
     * reaper takes it back. */
    :: d_step { unflushed && job[NJOBS - 1].state == COMPLETED && FAULT_OK ->
           printf("MSC: Postgres crashes: the completion of job %d was not flushed and is lost\n", NJOBS - 1);
           ABORT_OPEN_TXNS;
           job[NJOBS - 1].state = RUNNING; job[NJOBS - 1].doneby = 0; unflushed = 0;
           CHECK(NJOBS - 1); FAULT_TAKE }
#ifdef BUG_LAZY_FETCH
    :: d_step { fetchunflushed && job[NJOBS - 1].state == RUNNING && FAULT_OK ->
           printf("MSC: Postgres crashes: the dequeue of job %d (token %d) was not flushed and is lost\n",
                  NJOBS - 1, job[NJOBS - 1].version);
           ABORT_OPEN_TXNS;
           job[NJOBS - 1].state = AVAIL; job[NJOBS - 1].attempts--; job[NJOBS - 1].version--;
           job[NJOBS - 1].owner = preowner; fetchunflushed = 0;
           CHECK(NJOBS - 1); FAULT_TAKE }
#endif
    od
}

/* One enqueue of key k: a plain insert (src/db/enqueue.ts insertJobs), or a
 * hand-off to an idle slot (insertHandedOff), whose reply reaches the client
 * and the slot together (learns = 1) or neither (learns = 0). */
inline enqueue(k, learns)
{
    if
    :: d_step { INSERT_JOB(k) }
    :: d_step { IDLE(0) -> HANDOFF(k,0,learns) }
    :: d_step { IDLE(1) -> HANDOFF(k,1,learns) }
    :: d_step { IDLE(2) -> HANDOFF(k,2,learns) }
    fi
}

/* The client enqueues every key; for any key its reply may be lost, and it
 * resends the same key later (while workers may already be running, or even
 * have finished, the job). */
active proctype Client()
{
    byte k = 0;
end:
    do
    :: k < NJOBS -> enqueue(k, 1); k++
    :: k < NJOBS -> enqueue(k, 0);               /* reply lost ... */
                    enqueue(k, 1); k++           /* ... resent     */
    od
}

/* -------------------------------------------------------------- liveness */

#define TERMINAL(j) (job[j].state == COMPLETED || job[j].state == CANCELLED || job[j].state == DISCARDED)
#if NJOBS == 2
#define ALL_TERMINAL (TERMINAL(0) && TERMINAL(1))
#elif NJOBS == 3
#define ALL_TERMINAL (TERMINAL(0) && TERMINAL(1) && TERMINAL(2))
#else
#define ALL_TERMINAL (TERMINAL(0) && TERMINAL(1) && TERMINAL(2) && TERMINAL(3))
#endif

#ifdef LIVENESS
/* Every accepted job is eventually completed or discarded (the client
 * enqueues every key, so: eventually all jobs are terminal). Checked with
 * weak fairness (pan -a -f) and a bounded number of faults. */
ltl live { <> ALL_TERMINAL }
#endif
