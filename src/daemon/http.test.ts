import { expect, test } from "bun:test";
import { Hono } from "hono";
import { hostName, loopbackHostGuard } from "./http.ts";

test("hostName strips the port, IPv6 brackets included", () => {
  expect(hostName("localhost:8080")).toBe("localhost");
  expect(hostName("[::1]:8080")).toBe("::1");
  expect(hostName("127.0.0.1")).toBe("127.0.0.1");
});

test("without tokens, only loopback Host names are answered (DNS rebinding)", async () => {
  const app = new Hono().get("/", (c) => c.text("ok"));
  const fetch = loopbackHostGuard(app.fetch);
  const get = (host: string) => fetch(new Request("http://127.0.0.1:8080/", { headers: { host } }));
  expect((await get("127.0.0.1:8080")).status).toBe(200);
  expect((await get("localhost:8080")).status).toBe(200);
  const evil = await get("rebind.attacker.example:8080");
  expect(evil.status).toBe(403);
  expect(((await evil.json()) as { error: { code: string } }).error.code).toBe("forbidden_host");
});
