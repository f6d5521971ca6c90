import type { StaleLeaseError } from "./errors.ts";
import type { Job, JobState } from "./job.ts";

/** Everything the engine reports. Metrics and logs subscribe; loops only emit. */
export interface ConveyorEvents {
  "job:started": { job: Job };
  "job:completed": { job: Job; durationMs: number };
  "job:failed": { job: Job; error: unknown; state: JobState; retryDelayMs: number };
  "job:snoozed": { job: Job; delayMs: number };
  "job:cancelled": { job: Job; reason: string };
  "job:released": { jobId: string };
  "lease:lost": { error: StaleLeaseError };
  "lease:reaped": { jobId: string; state: JobState; owner: string; fencingToken: number };
  "loop:error": { loop: string; error: unknown };
}

export type EventName = keyof ConveyorEvents;
type Listener<K extends EventName> = (payload: ConveyorEvents[K]) => void;

export interface Events {
  on<K extends EventName>(name: K, fn: Listener<K>): () => void;
  emit<K extends EventName>(name: K, payload: ConveyorEvents[K]): void;
}

/** A typed emitter whose emit never throws: a failing listener is reported to onListenerError and skipped. */
export function createEvents(onListenerError?: (name: EventName, error: unknown) => void): Events {
  const listeners = new Map<EventName, Set<Listener<EventName>>>();
  return {
    on(name, fn) {
      let set = listeners.get(name);
      if (!set) {
        set = new Set();
        listeners.set(name, set);
      }
      set.add(fn as Listener<EventName>);
      return () => {
        set.delete(fn as Listener<EventName>);
      };
    },
    emit(name, payload) {
      const set = listeners.get(name);
      if (!set) return;
      for (const fn of set) {
        try {
          fn(payload as ConveyorEvents[EventName]);
        } catch (error) {
          try {
            onListenerError?.(name, error);
          } catch {
            // nothing more to do
          }
        }
      }
    },
  };
}
