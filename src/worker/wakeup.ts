// Wake-ups: LISTEN on the channel the enqueue statement notifies, one message
// per queue and transaction. postgres.js keeps one dedicated connection for it and
// re-listens after reconnecting; `onlisten` runs each time, which is when we
// wake every producer to catch up on notifications missed while disconnected.
import type { Pool } from "../db/db.ts";
import type { Logger } from "../logger.ts";

export const JOBS_CHANNEL = "conveyor_jobs";
const LISTEN_RETRY_MS = 2_000;

export interface Wakeup {
  stop(): Promise<void>;
}

export function listenForJobs(
  sql: Pool,
  onQueue: (queue: string) => void,
  onConnected: () => void,
  logger: Logger,
): Wakeup {
  let stopped = false;
  let unlisten: (() => Promise<void>) | undefined;
  let retry: ReturnType<typeof setTimeout> | undefined;
  const attempt = async () => {
    try {
      const sub = await sql.listen(JOBS_CHANNEL, onQueue, onConnected);
      if (stopped) await sub.unlisten();
      else unlisten = sub.unlisten;
    } catch (error) {
      // Polling covers the gap; try again.
      logger.warn("LISTEN failed; polling until it succeeds", { error });
      if (!stopped) retry = setTimeout(attempt, LISTEN_RETRY_MS);
    }
  };
  void attempt();
  return {
    async stop() {
      stopped = true;
      clearTimeout(retry);
      await unlisten?.().catch(() => {});
    },
  };
}
