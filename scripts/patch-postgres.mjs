// Patches postgres.js (3.4.x) after install: a write scheduled with
// setImmediate can run after the connection closed and nulled its socket.
// Upstream (porsager/postgres#1066, #1154, #1208; fix proposed in #1209) the
// TypeError escapes as an uncaught exception and, because the pending-write
// timer is never reset, every later small write on that connection object is
// never flushed: reconnects time out and queries hang. Our fault suite hit it
// under pg_terminate_backend: 220 of 10,000 jobs stuck until restart.
//
// The patch settles instead: nextWrite on a closed connection rejects the
// pending queries with CONNECTION_CLOSED, and closed() drops the buffered
// bytes and the timer of the socket it lost. Idempotent; fails loudly if the
// code it patches has changed, so an upgrade cannot silently drop it.
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const MARK = "/* conveyor: guarded nextWrite */";
const files = ["src", "cjs/src", "cf/src"].map((d) =>
  path.join(root, "node_modules", "postgres", d, "connection.js"),
);

const edits = [
  {
    from: "  function nextWrite(fn) {\n    const x = socket.write(chunk, fn)",
    to: `  function nextWrite(fn) {
    ${MARK}
    if (!socket) {
      nextWriteTimer !== null && clearImmediate(nextWriteTimer)
      chunk = nextWriteTimer = null
      error(Errors.connection('CONNECTION_CLOSED', options))
      return false
    }
    const x = socket.write(chunk, fn)`,
  },
  {
    from: "    clearImmediate(nextWriteTimer)\n    socket.removeListener('data', data)\n    socket.removeListener('connect', connected)\n    idleTimer.cancel()",
    to: "    clearImmediate(nextWriteTimer)\n    chunk = nextWriteTimer = null\n    socket.removeListener('data', data)\n    socket.removeListener('connect', connected)\n    idleTimer.cancel()",
  },
];

let patched = 0;
for (const file of files) {
  if (!existsSync(file)) continue;
  let text = readFileSync(file, "utf8");
  if (text.includes(MARK)) continue;
  for (const e of edits) {
    if (!text.includes(e.from)) {
      console.error(
        `patch-postgres: ${file} does not contain the code to patch; review scripts/patch-postgres.mjs for this postgres version`,
      );
      process.exit(1);
    }
    text = text.replace(e.from, e.to);
  }
  writeFileSync(file, text);
  patched++;
}
if (patched > 0) console.log(`patch-postgres: guarded nextWrite in ${patched} file(s)`);
