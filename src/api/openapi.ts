// The OpenAPI 3.1 document, generated from the same zod schemas the routes
// parse with. OpenAPI 3.1 schemas are JSON Schema 2020-12, which is zod's
// default target; only the per-schema $schema/$id that zod adds are dropped.
import { z } from "zod";
import { components, listJobsQuerySchema } from "./schemas.ts";

const ref = (id: string) => ({ $ref: `#/components/schemas/${id}` });
const json = (id: string) => ({ "application/json": { schema: ref(id) } });

function buildComponents(io: "input" | "output"): Record<string, unknown> {
  const { schemas } = z.toJSONSchema(components, {
    io,
    uri: (id) => `#/components/schemas/${id}`,
  }) as { schemas: Record<string, Record<string, unknown>> };
  for (const s of Object.values(schemas)) {
    delete s.$schema;
    delete s.$id;
  }
  return schemas;
}

const error = (description: string) => ({ description, content: json("Error") });
const ERRORS = {
  "400": error("Invalid request; `field` names the offending input."),
  "401": error("Missing or unknown bearer token."),
  "403": error("The token lacks the required scope."),
  "413": error("Body larger than the configured limit."),
  "415": error("Body is not application/json."),
  "500": error("Unexpected server error (details are logged, not returned)."),
  "503": error(
    "The database is unreachable (restarting, say); retry after `Retry-After` seconds. An enqueue retried with its Idempotency-Key is never applied twice.",
  ),
};
const pick = (...codes: (keyof typeof ERRORS)[]) =>
  Object.fromEntries(codes.map((c) => [c, ERRORS[c]]));

const idParam = {
  name: "id",
  in: "path",
  required: true,
  schema: { type: "string", pattern: "^[0-9]{1,19}$" },
};

export function buildOpenApi(version: string): Record<string, unknown> {
  // Request bodies are described as accepted (defaults optional), responses
  // as produced; zod generates each side separately.
  const input = buildComponents("input");
  const output = buildComponents("output");
  const schemas: Record<string, unknown> = {};
  for (const id of Object.keys(output)) {
    schemas[id] = id.endsWith("Request") ? input[id] : output[id];
  }
  const query = Object.entries(listJobsQuerySchema.shape).map(([name, s]) => {
    const schema = z.toJSONSchema(s, { io: "input" }) as Record<string, unknown>;
    delete schema.$schema;
    const { description, ...rest } = schema;
    return { name, in: "query", required: false, schema: rest, description };
  });
  const admin = [{ bearer: ["admin"] }];
  const enqueue = [{ bearer: ["enqueue"] }, { bearer: ["admin"] }];
  return {
    openapi: "3.1.0",
    info: {
      title: "Conveyor",
      version,
      description:
        "Durable job queue on PostgreSQL. Every error is `{ error: { code, message, field? } }`.",
    },
    components: {
      schemas,
      securitySchemes: {
        bearer: {
          type: "http",
          scheme: "bearer",
          description:
            "Scopes: `enqueue` (POST /v1/jobs, /v1/jobs/batch, GET /v1/jobs/{id}), `admin` (all).",
        },
      },
    },
    paths: {
      "/v1/jobs": {
        post: {
          summary: "Enqueue a job",
          security: enqueue,
          parameters: [
            { name: "Idempotency-Key", in: "header", required: false, schema: { type: "string" } },
            { name: "traceparent", in: "header", required: false, schema: { type: "string" } },
            { name: "tracestate", in: "header", required: false, schema: { type: "string" } },
          ],
          requestBody: { required: true, content: json("EnqueueRequest") },
          responses: {
            "201": { description: "Created.", content: json("EnqueueResponse") },
            "200": {
              description:
                "A job with this idempotency key exists; it is returned and nothing was inserted.",
              content: json("EnqueueResponse"),
            },
            ...pick("400", "401", "403", "413", "415", "500", "503"),
          },
        },
        get: {
          summary: "List jobs, newest first, with keyset pagination",
          security: admin,
          parameters: query,
          responses: {
            "200": { description: "One page.", content: json("JobList") },
            ...pick("400", "401", "403", "500", "503"),
          },
        },
      },
      "/v1/jobs/batch": {
        post: {
          summary: "Enqueue jobs in one transaction",
          security: enqueue,
          requestBody: { required: true, content: json("EnqueueBatchRequest") },
          responses: {
            "201": {
              description: "At least one job was inserted.",
              content: json("EnqueueBatchResponse"),
            },
            "200": {
              description: "Every job was a duplicate.",
              content: json("EnqueueBatchResponse"),
            },
            ...pick("400", "401", "403", "413", "415", "500", "503"),
          },
        },
      },
      "/v1/jobs/{id}": {
        get: {
          summary: "Get a job",
          security: enqueue,
          parameters: [idParam],
          responses: {
            "200": { description: "The job.", content: json("JobResponse") },
            "404": error("No such job."),
            ...pick("400", "401", "403", "500", "503"),
          },
        },
      },
      "/v1/jobs/{id}/cancel": {
        post: {
          summary: "Cancel a job no worker holds (pending or available)",
          security: admin,
          parameters: [idParam],
          requestBody: { required: false, content: json("CancelRequest") },
          responses: {
            "200": { description: "Cancelled.", content: json("JobResponse") },
            "404": error("No such job."),
            "409": error(
              "The job is running (`job_running`) or already finished (`job_finished`).",
            ),
            ...pick("400", "401", "403", "413", "415", "500", "503"),
          },
        },
      },
      "/v1/jobs/{id}/retry": {
        post: {
          summary: "Make a finished job (or a scheduled one) available now",
          security: admin,
          parameters: [idParam],
          requestBody: { required: false, content: json("EmptyRequest") },
          responses: {
            "200": { description: "Available again.", content: json("JobResponse") },
            "404": error("No such job."),
            "409": error("The job is running (`job_running`) or pending (`job_pending`)."),
            ...pick("400", "401", "403", "413", "415", "500", "503"),
          },
        },
      },
      "/v1/queues": {
        get: {
          summary: "Queues with pause state and job counts",
          security: admin,
          responses: {
            "200": { description: "Queues by name.", content: json("QueueList") },
            ...pick("401", "403", "500", "503"),
          },
        },
      },
      ...Object.fromEntries(
        (["pause", "resume"] as const).map((action) => [
          `/v1/queues/{name}/${action}`,
          {
            post: {
              summary:
                action === "pause" ? "Stop handing out this queue's jobs" : "Resume the queue",
              security: admin,
              parameters: [
                { name: "name", in: "path", required: true, schema: { type: "string" } },
              ],
              requestBody: { required: false, content: json("EmptyRequest") },
              responses: {
                "200": {
                  description: "The queue's new state.",
                  content: json("QueueStateResponse"),
                },
                ...pick("400", "401", "403", "413", "415", "500", "503"),
              },
            },
          },
        ]),
      ),
      "/healthz": {
        get: {
          summary: "Liveness: the process answers (no database access)",
          security: [],
          responses: { "200": { description: "Up.", content: json("Health") } },
        },
      },
      "/readyz": {
        get: {
          summary: "Readiness: the database answers within a short timeout",
          security: [],
          responses: {
            "200": { description: "Ready.", content: json("Health") },
            "503": error("Not ready."),
          },
        },
      },
      "/openapi.json": {
        get: {
          summary: "This document",
          security: [],
          responses: { "200": { description: "OpenAPI 3.1." } },
        },
      },
    },
  };
}
