// Job and lease events as log records: the loops only emit, this listens
// (convention 9). Completions and starts are debug, so a busy daemon's info
// log stays readable; everything that needs a look is info or warn.
import type { Events } from "../events.ts";
import type { Logger } from "../logger.ts";

export function logJobEvents(events: Events, logger: Logger): () => void {
  const log = logger.child({ component: "jobs" });
  const offs = [
    events.on("job:started", ({ job }) =>
      log.debug("job started", {
        jobId: job.id,
        kind: job.kind,
        queue: job.queue,
        attempt: job.attempts,
      }),
    ),
    events.on("job:completed", ({ job, durationMs }) =>
      log.debug("job completed", {
        jobId: job.id,
        kind: job.kind,
        queue: job.queue,
        durationMs: Math.round(durationMs),
      }),
    ),
    events.on("job:failed", ({ job, error, state, retryDelayMs }) =>
      log.warn(state === "discarded" ? "job failed for the last time" : "job failed; will retry", {
        jobId: job.id,
        kind: job.kind,
        queue: job.queue,
        attempt: job.attempts,
        maxAttempts: job.maxAttempts,
        state,
        ...(state === "discarded" ? {} : { retryInMs: retryDelayMs }),
        error,
      }),
    ),
    events.on("job:cancelled", ({ job, reason }) =>
      log.info("job cancelled", { jobId: job.id, kind: job.kind, queue: job.queue, reason }),
    ),
    events.on("job:snoozed", ({ job, delayMs }) =>
      log.debug("job snoozed", { jobId: job.id, kind: job.kind, delayMs }),
    ),
    events.on("job:released", ({ jobId }) => log.info("job released at shutdown", { jobId })),
    events.on("lease:reaped", ({ jobId, state, owner, fencingToken }) =>
      log.warn("expired lease reaped", { jobId, state, owner, fencingToken }),
    ),
  ];
  return () => {
    for (const off of offs) off();
  };
}
