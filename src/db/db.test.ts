import { expect, test } from "bun:test";
import postgres from "postgres";
import { isConnectionError } from "./db.ts";

test("isConnectionError: waits out an unreachable server, not a wrong password", async () => {
  const closed = postgres("postgres://postgres@127.0.0.1:1/x", { max: 1, connect_timeout: 1 });
  const refused = await closed`select 1`.catch((e) => e);
  await closed.end();
  expect(isConnectionError(refused)).toBe(true);
  expect(isConnectionError(Object.assign(new Error("starting"), { code: "57P03" }))).toBe(true);
  expect(isConnectionError(Object.assign(new Error("auth"), { code: "28P01" }))).toBe(false);
  expect(isConnectionError(new Error("syntax"))).toBe(false);
});
