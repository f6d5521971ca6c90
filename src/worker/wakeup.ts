// Wake-ups: LISTEN on the channel enqueues notify (src/db/wake.ts), one message
// per queue and notifying transaction, plus the direct wake-ups of enqueues
// committed by this process on the same database (whose notifications, tagged
// with this process, are then skipped). postgres.js keeps one dedicated
// connection for LISTEN and re-listens after reconnecting; `onlisten` runs
// each time, which is when we wake every producer to catch up on
// notifications missed while disconnected.
import type { Pool } from "../db/db.ts";
import { JOBS_CHANNEL, onLocalWake, parseWake, senderTag } from "../db/wake.ts";
import type { Logger } from "../logger.ts";

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
  const self = senderTag(sql);
  const offLocal = onLocalWake(sql, onQueue);
  const onMessage = (payload: string) => {
    const { queue, sender } = parseWake(payload);
    if (sender !== self) onQueue(queue);
  };
  const attempt = async () => {
    try {
      const sub = await sql.listen(JOBS_CHANNEL, onMessage, onConnected);
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
      offLocal();
      clearTimeout(retry);
      await unlisten?.().catch(() => {});
    },
  };
}
