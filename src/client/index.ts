// A typed client for Conveyor's HTTP API (docs/api.md). It needs nothing but
// fetch, so it runs in Bun, Node 18+, Deno, browsers and edge runtimes; the
// imports below are types only and vanish when compiled.
import type { AttemptError, Job, JobState } from "../job.ts";
import type { JsonValue } from "../json.ts";

/** A non-2xx answer from the API, or an answer that was not the API's JSON. */
export class ApiError extends Error {
  override readonly name = "ApiError";
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly field?: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }
}

export interface ClientOptions {
  /** e.g. "http://127.0.0.1:7070"; a path prefix is kept. */
  baseUrl: string;
  /** Bearer token, when the server has tokens configured. */
  token?: string;
  fetch?: typeof fetch;
}

export interface EnqueueInput {
  kind: string;
  queue?: string;
  payload?: JsonValue;
  priority?: number;
  /** A Date or an ISO 8601 string with Z or an offset. */
  runAt?: Date | string;
  delayMs?: number;
  maxAttempts?: number;
  idempotencyKey?: string;
  traceparent?: string;
  tracestate?: string;
}

export interface EnqueueResult {
  job: Job;
  duplicate: boolean;
}

export interface JobFilter {
  queue?: string;
  state?: JobState;
  kind?: string;
  /** Page size, 1-500; default 50. */
  limit?: number;
  cursor?: string;
}

export interface JobPage {
  jobs: Job[];
  /** Pass as `cursor` for the next page; null after the last one. */
  nextCursor: string | null;
}

export interface QueueInfo {
  name: string;
  paused: boolean;
  counts: {
    available: number;
    scheduled: number;
    running: number;
    completed: number;
    cancelled: number;
    discarded: number;
  };
}

export interface QueueList {
  queues: QueueInfo[];
  /** Finished jobs are counted among the `window` most recent per state; where not exact, lower bounds. */
  finalCounts: {
    window: number;
    exact: { completed: boolean; cancelled: boolean; discarded: boolean };
  };
}

export interface QueueState {
  name: string;
  paused: boolean;
  updatedAt: Date;
}

export interface RequestOptions {
  signal?: AbortSignal;
}

export interface Client {
  enqueue(job: EnqueueInput, opts?: RequestOptions): Promise<EnqueueResult>;
  /** One transaction; results in input order. */
  enqueueBatch(jobs: EnqueueInput[], opts?: RequestOptions): Promise<EnqueueResult[]>;
  getJob(id: string, opts?: RequestOptions): Promise<Job>;
  /** One page, newest job first. */
  listJobs(filter?: JobFilter, opts?: RequestOptions): Promise<JobPage>;
  /** Every page from `filter.cursor` (or the start) to the end, fetched as iterated. */
  listJobPages(filter?: JobFilter, opts?: RequestOptions): AsyncIterableIterator<JobPage>;
  /** Cancels a job no worker holds; a running job is an ApiError with code job_running. */
  cancelJob(id: string, reason?: string, opts?: RequestOptions): Promise<Job>;
  retryJob(id: string, opts?: RequestOptions): Promise<Job>;
  listQueues(opts?: RequestOptions): Promise<QueueList>;
  pauseQueue(name: string, opts?: RequestOptions): Promise<QueueState>;
  resumeQueue(name: string, opts?: RequestOptions): Promise<QueueState>;
}

interface WireJob extends Omit<Job, DateField> {
  runAt: string;
  leaseExpiresAt: string | null;
  createdAt: string;
  attemptedAt: string | null;
  finalizedAt: string | null;
  errors: AttemptError[];
}
type DateField = "runAt" | "leaseExpiresAt" | "createdAt" | "attemptedAt" | "finalizedAt";

const date = (s: string | null) => (s === null ? null : new Date(s));

function jobFromWire(w: WireJob): Job {
  return {
    ...w,
    runAt: new Date(w.runAt),
    leaseExpiresAt: date(w.leaseExpiresAt),
    createdAt: new Date(w.createdAt),
    attemptedAt: date(w.attemptedAt),
    finalizedAt: date(w.finalizedAt),
  };
}

const wireInput = (j: EnqueueInput) =>
  j.runAt instanceof Date ? { ...j, runAt: j.runAt.toISOString() } : j;

export function createClient(options: ClientOptions): Client {
  const base = options.baseUrl.replace(/\/+$/, "");
  const doFetch = options.fetch ?? fetch;

  async function request<T>(
    method: "GET" | "POST",
    path: string,
    body: unknown,
    opts: RequestOptions | undefined,
  ): Promise<T> {
    const headers: Record<string, string> = { accept: "application/json" };
    if (options.token !== undefined) headers.authorization = `Bearer ${options.token}`;
    if (body !== undefined) headers["content-type"] = "application/json";
    const res = await doFetch(`${base}${path}`, {
      method,
      headers,
      body: body === undefined ? null : JSON.stringify(body),
      signal: opts?.signal ?? null,
    });
    const text = await res.text();
    let parsed: unknown;
    try {
      parsed = text === "" ? undefined : JSON.parse(text);
    } catch (cause) {
      throw new ApiError(
        res.status,
        "invalid_response",
        `${method} ${path}: HTTP ${res.status} with a body that is not JSON`,
        undefined,
        { cause },
      );
    }
    if (!res.ok) {
      const e = (parsed as { error?: { code?: unknown; message?: unknown; field?: unknown } })
        ?.error;
      throw new ApiError(
        res.status,
        typeof e?.code === "string" ? e.code : "invalid_response",
        typeof e?.message === "string" ? e.message : `${method} ${path}: HTTP ${res.status}`,
        typeof e?.field === "string" ? e.field : undefined,
      );
    }
    return parsed as T;
  }

  const jobPath = (id: string) => `/v1/jobs/${encodeURIComponent(id)}`;
  const queuePath = (name: string, action: string) =>
    `/v1/queues/${encodeURIComponent(name)}/${action}`;
  const queueState = (q: { name: string; paused: boolean; updatedAt: string }): QueueState => ({
    ...q,
    updatedAt: new Date(q.updatedAt),
  });

  const client: Client = {
    async enqueue(job, opts) {
      const r = await request<{ job: WireJob; duplicate: boolean }>(
        "POST",
        "/v1/jobs",
        wireInput(job),
        opts,
      );
      return { job: jobFromWire(r.job), duplicate: r.duplicate };
    },

    async enqueueBatch(jobs, opts) {
      const r = await request<{ results: { job: WireJob; duplicate: boolean }[] }>(
        "POST",
        "/v1/jobs/batch",
        { jobs: jobs.map(wireInput) },
        opts,
      );
      return r.results.map((x) => ({ job: jobFromWire(x.job), duplicate: x.duplicate }));
    },

    async getJob(id, opts) {
      const r = await request<{ job: WireJob }>("GET", jobPath(id), undefined, opts);
      return jobFromWire(r.job);
    },

    async listJobs(filter = {}, opts) {
      const qs = new URLSearchParams();
      for (const [k, v] of Object.entries(filter)) {
        if (v !== undefined) qs.set(k, String(v));
      }
      const query = qs.toString() === "" ? "" : `?${qs}`;
      const r = await request<{ jobs: WireJob[]; nextCursor: string | null }>(
        "GET",
        `/v1/jobs${query}`,
        undefined,
        opts,
      );
      return { jobs: r.jobs.map(jobFromWire), nextCursor: r.nextCursor };
    },

    async *listJobPages(filter = {}, opts) {
      let cursor = filter.cursor;
      for (;;) {
        const page = await client.listJobs({ ...filter, cursor }, opts);
        yield page;
        if (page.nextCursor === null) return;
        cursor = page.nextCursor;
      }
    },

    async cancelJob(id, reason, opts) {
      const body = reason === undefined ? {} : { reason };
      const r = await request<{ job: WireJob }>("POST", `${jobPath(id)}/cancel`, body, opts);
      return jobFromWire(r.job);
    },

    async retryJob(id, opts) {
      const r = await request<{ job: WireJob }>("POST", `${jobPath(id)}/retry`, {}, opts);
      return jobFromWire(r.job);
    },

    listQueues: (opts) => request<QueueList>("GET", "/v1/queues", undefined, opts),

    async pauseQueue(name, opts) {
      const r = await request<{ queue: { name: string; paused: boolean; updatedAt: string } }>(
        "POST",
        queuePath(name, "pause"),
        {},
        opts,
      );
      return queueState(r.queue);
    },

    async resumeQueue(name, opts) {
      const r = await request<{ queue: { name: string; paused: boolean; updatedAt: string } }>(
        "POST",
        queuePath(name, "resume"),
        {},
        opts,
      );
      return queueState(r.queue);
    },
  };
  return client;
}
