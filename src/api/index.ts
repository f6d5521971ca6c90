export { type ApiOptions, createApi } from "./app.ts";
export type { Scope } from "./auth.ts";
export { buildOpenApi } from "./openapi.ts";
