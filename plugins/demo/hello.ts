// Kind "demo/hello" (from the file's path). Imports only types, so it runs
// unchanged under the compiled binary with no node_modules beside it.
import type { Plugin } from "conveyor";

interface Hello {
  name?: string;
}

export default {
  handler(payload, ctx) {
    const greeting = `hello, ${payload.name ?? "world"}`;
    ctx.logger.info(greeting);
    return { greeting, attempt: ctx.job.attempts };
  },
} satisfies Plugin<Hello>;
