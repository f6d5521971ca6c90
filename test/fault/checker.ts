// Reads the final state after a fault run and counts every way the guarantee
// could have been broken. Nothing here trusts the workers: it reads the
// database and the sink's own records.
import type { Pool } from "../../src/db/db.ts";
import type { Delivery } from "./sink.ts";

export interface Verdict {
  jobs: number;
  completed: number;
  discarded: number;
  cancelled: number;
  /** Accepted jobs not final after the settle period, or missing. */
  lost: number;
  /** Ledger rows beyond one per job. */
  duplicateEffects: number;
  /** Ledger rows whose job is not completed: an effect that committed without its completion. */
  effectsWithoutCompletion: number;
  /** Completed ledger jobs with no ledger row. */
  completionsWithoutEffect: number;
  /** Ledger rows written under a token other than the one that completed the job: a stale write applied. */
  staleWritesApplied: number;
  externalDeliveries: number;
  /** Deliveries beyond the first per job: allowed (at-least-once), reported. */
  externalRedeliveries: number;
  /** Deliveries the fenced sink refused because a newer token had been seen. */
  externalStaleRejected: number;
  /** Deliveries whose idempotency key differs from the job's: must be 0. */
  externalKeyMismatches: number;
  /** Two deliveries of one job with one token: two executions under one lease, must be 0. */
  externalTokenReuse: number;
  /** Completed external jobs the sink never accepted a delivery for. */
  externalMissing: number;
  /** Tokens a job was delivered with that exceed its final lease version: impossible, must be 0. */
  externalTokensAhead: number;
}

export async function check(
  sql: Pool,
  accepted: Map<string, { kind: string; key: string }>,
  deliveries: Delivery[],
): Promise<Verdict> {
  const rows = await sql`
    select id::text, kind, state::text, lease_version::int as version,
           (select count(*)::int from ledger l where l.job_id = j.id) as effects,
           (select count(*)::int from ledger l where l.job_id = j.id and l.token <> j.lease_version) as stale
      from conveyor_jobs j`;
  const byId = new Map(rows.map((r) => [r.id as string, r]));
  const v: Verdict = {
    jobs: accepted.size,
    completed: 0,
    discarded: 0,
    cancelled: 0,
    lost: 0,
    duplicateEffects: 0,
    effectsWithoutCompletion: 0,
    completionsWithoutEffect: 0,
    staleWritesApplied: 0,
    externalDeliveries: deliveries.length,
    externalRedeliveries: 0,
    externalStaleRejected: deliveries.filter((d) => !d.accepted).length,
    externalKeyMismatches: 0,
    externalTokenReuse: 0,
    externalMissing: 0,
    externalTokensAhead: 0,
  };
  const perJob = new Map<string, Delivery[]>();
  for (const d of deliveries) perJob.set(d.jobId, [...(perJob.get(d.jobId) ?? []), d]);
  for (const [id, a] of accepted) {
    const r = byId.get(id);
    if (!r) {
      v.lost++;
      continue;
    }
    if (r.state === "completed") v.completed++;
    else if (r.state === "discarded") v.discarded++;
    else if (r.state === "cancelled") v.cancelled++;
    else v.lost++;
    v.duplicateEffects += Math.max(0, r.effects - 1);
    v.staleWritesApplied += r.stale;
    if (r.effects > 0 && r.state !== "completed") v.effectsWithoutCompletion += r.effects;
    if (a.kind === "fault/ledger" && r.state === "completed" && r.effects === 0)
      v.completionsWithoutEffect++;
    const ds = perJob.get(id) ?? [];
    if (a.kind === "fault/external") {
      v.externalRedeliveries += Math.max(0, ds.length - 1);
      v.externalKeyMismatches += ds.filter((d) => d.key !== a.key).length;
      const tokens = ds.map((d) => d.token);
      v.externalTokenReuse += tokens.length - new Set(tokens).size;
      v.externalTokensAhead += tokens.filter((t) => t > r.version).length;
      if (r.state === "completed" && !ds.some((d) => d.accepted)) v.externalMissing++;
    }
  }
  return v;
}

/** The fields that must be zero for a run to pass. */
export const MUST_BE_ZERO = [
  "lost",
  "duplicateEffects",
  "effectsWithoutCompletion",
  "completionsWithoutEffect",
  "staleWritesApplied",
  "externalKeyMismatches",
  "externalTokenReuse",
  "externalMissing",
  "externalTokensAhead",
] as const satisfies readonly (keyof Verdict)[];
