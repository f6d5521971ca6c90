import type { Lease } from "../db/db.ts";
import type { Job } from "../job.ts";

/** One job this worker holds a lease on, from dequeue until its outcome is written. */
export interface Execution {
  readonly job: Job;
  readonly lease: Lease;
  readonly leaseMs: number;
  readonly controller: AbortController;
  /** Inside ctx.transaction(): the row is locked by us, heartbeats skip it. */
  inTransaction: boolean;
  /** The handler returned; its outcome write is queued or in flight. */
  finishing: boolean;
  /** ctx.transaction() committed: the job is completed. */
  committed: boolean;
  /** Given back on shutdown: skip any outcome write. */
  released: boolean;
  readonly done: Promise<void>;
}
