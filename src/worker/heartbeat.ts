// Heartbeat: extends the leases this worker still holds (spec: Heartbeat).
//
// Invariant: a lease is extended only while owner + version + state match;
// a job whose lease did not extend has its handler's signal aborted with a
// StaleLeaseError, and no later write of that job is attempted.
import type { Pool } from "../db/db.ts";
import { extendLeases } from "../db/lease.ts";
import { StaleLeaseError } from "../errors.ts";
import type { Events } from "../events.ts";
import type { Logger } from "../logger.ts";
import { abortExecution, type Execution } from "./execution.ts";
import { intervalLoop, type Loop } from "./loop.ts";

export interface HeartbeatOptions {
  sql: Pool;
  owner: string;
  running: Map<string, Execution>;
  intervalMs: number;
  logger: Logger;
  events: Events;
  deadlineMs?: number;
}

export function createHeartbeat(o: HeartbeatOptions): Loop {
  const beat = async () => {
    // Jobs inside their guarded transaction hold the row lock: nobody can take
    // them, and an UPDATE here would only wait for that transaction.
    const byLeaseMs = new Map<number, Execution[]>();
    for (const e of o.running.values()) {
      if (e.inTransaction || e.committed || e.released || e.abortReason !== undefined) continue;
      const list = byLeaseMs.get(e.leaseMs) ?? [];
      list.push(e);
      byLeaseMs.set(e.leaseMs, list);
    }
    for (const [leaseMs, execs] of byLeaseMs) {
      const extended = await extendLeases(
        o.sql,
        o.owner,
        execs.map((e) => e.lease),
        leaseMs,
      );
      for (const e of execs) {
        // A job whose outcome was written meanwhile is simply gone; that is not a lost lease.
        if (extended.has(e.lease.id) || e.finishing || e.inTransaction || e.committed) continue;
        const error = new StaleLeaseError(e.lease.id, String(e.lease.version), "heartbeat");
        o.logger.warn("lease lost; aborting handler", {
          jobId: e.lease.id,
          fencingToken: e.lease.version,
        });
        o.events.emit("lease:lost", { error });
        abortExecution(e, error);
      }
    }
  };
  return intervalLoop({
    name: "heartbeat",
    intervalMs: o.intervalMs,
    logger: o.logger,
    events: o.events,
    run: beat,
    ...(o.deadlineMs ? { deadlineMs: o.deadlineMs } : {}),
  });
}
