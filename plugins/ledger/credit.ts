// Kind "ledger/credit": writes one ledger row in the job's guarded effect
// transaction. The transaction's first statement completes the job under its
// lease fence, so the row commits at most once even if this worker lost its
// lease and another already ran the job again.
//
// "conveyor" is served by the daemon itself (no install needed): definePlugin
// types the payload from the schema, and z is the daemon's zod.
import { definePlugin, z } from "conveyor";

const schema = z.object({
  account: z.string().min(1),
  amountCents: z.number().int(),
  memo: z.string().max(500).optional(),
});

export default definePlugin({
  schema, // a payload that fails it cancels the job: retrying would fail the same way
  queue: "ledger",
  async handler(credit, ctx) {
    // Independent: it writes only its own job's row, so the jobs sharing
    // its transaction may run their inserts at once, pipelined.
    return ctx.transaction(
      async (tx) => {
        // The plugin owns its table. Two first runs racing on the create can
        // fail one with a duplicate-type error; that attempt simply retries.
        await tx`create table if not exists ledger_entries (
        id bigint generated always as identity primary key,
        job_id bigint not null unique,
        account text not null,
        amount_cents bigint not null,
        memo text,
        fencing_token bigint not null,
        created_at timestamptz not null default now())`;
        const [row] = await tx`
        insert into ledger_entries (job_id, account, amount_cents, memo, fencing_token)
        values (${ctx.job.id}, ${credit.account}, ${credit.amountCents}, ${credit.memo ?? null},
                ${ctx.fencingToken})
        returning id`;
        return { entryId: String(row?.id) };
      },
      { independent: true },
    );
  },
});
