// Hand-off: a job enqueued on a pool in this process goes straight to an idle
// worker of this process on the same database, leased by the insert itself.
//
// The insert commits the job already 'running' under the worker's owner with
// lease version 1, as its first dequeue would have; the worker runs it as
// soon as the insert returns, without a fetch (one commit fewer between
// enqueue and start). It is Enqueue and Dequeue in one transaction, an
// action of the lease model of its own (spec: HANDOFF): the token is fresh
// because the row is new (a duplicate key leases nothing), every later write
// is fenced as usual, and a lease nobody learns of (the insert's reply lost,
// the process gone) expires, and the reaper makes the job runnable again.
//
// A worker offers a slot only when it is idle by its own account: its last
// fetch came back short, and a free slot that leaves half a fetch batch free
// besides the slots of a fetch in flight (src/worker/producer.ts
// takeHandOff). A job enqueued here may then start before older jobs the
// worker has not yet heard of (from other processes, or scheduled ones
// coming due, or those a fetch in flight is about to lease); like any
// fetch, a hand-off never waits for them. A paused queue's job is inserted 'available' and the
// slot given back.
import type { Pool } from "./db.ts";
import type { LeasedRow } from "./fetch.ts";
import { perDatabase } from "./wake.ts";

/** A slot a local worker reserved for one job; exactly one of deliver and release must follow. */
export interface HandOff {
  owner: string;
  leaseMs: number;
  /** The insert committed the job leased to `owner`: run it. */
  deliver(row: LeasedRow): void;
  /** The job was not leased to us (paused queue, duplicate key, insert failed). */
  release(): void;
}

/** Reserves a slot for a job of this queue and kind, or says no. */
export type HandOffTaker = (queue: string, kind: string) => HandOff | undefined;

const takers = perDatabase<HandOffTaker>();

/** Registers a worker's taker for the pool's database; returns the unregister function. */
export function onHandOff(pool: Pool, taker: HandOffTaker): () => void {
  return takers.add(pool, taker);
}

/** The first local worker on this pool's database that reserves a slot for the job. */
export function takeHandOff(pool: Pool, queue: string, kind: string): HandOff | undefined {
  for (const taker of takers.of(pool) ?? []) {
    const h = taker(queue, kind);
    if (h) return h;
  }
  return undefined;
}
