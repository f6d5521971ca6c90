// Fault-suite workload: a database effect. The ledger row and the job's
// completion commit in one fenced transaction; sleeps before and inside it
// put faults mid-job and mid-commit.
import type { JobContext } from "../../../src/handler.ts";

interface Payload {
  before: number;
  inside: number;
}

export default {
  kind: "fault/ledger",
  async handler(p: Payload, ctx: JobContext) {
    await Bun.sleep(p.before);
    // Half the jobs declare their effect independent, so shared transactions
    // mix fns run at once with fns run one by one, and faults hit both.
    return ctx.transaction(
      async (tx) => {
        await tx`insert into ledger (job_id, token, owner) values (${ctx.job.id}, ${ctx.fencingToken}, ${ctx.job.leaseOwner})`;
        await Bun.sleep(p.inside);
        return { token: ctx.fencingToken };
      },
      { independent: Number(ctx.job.id) % 2 === 0 },
    );
  },
};
