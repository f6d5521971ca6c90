// Patches postgres.js (3.4.x) after install. Three edits, each idempotent, each
// failing loudly if the code it patches has changed, so an upgrade cannot
// silently drop one.
//
// 1. connection.js, a bug: a write scheduled with
// setImmediate can run after the connection closed and nulled its socket.
// Upstream (porsager/postgres#1066, #1154, #1208; fix proposed in #1209) the
// TypeError escapes as an uncaught exception and, because the pending-write
// timer is never reset, every later small write on that connection object is
// never flushed: reconnects time out and queries hang. Our fault suite hit it
// under pg_terminate_backend: 220 of 10,000 jobs stuck until restart.
//
// The patch settles instead: nextWrite on a closed connection rejects the
// pending queries with CONNECTION_CLOSED, and closed() drops the buffered
// bytes and the timer of the socket it lost.
//
// 2. connection.js, a bug: the array-type fetch (fetch_types, the first
// statement of every new connection) is an async function whose promise
// ReadyForQuery drops. A connection reset during it rejects the caller's
// query (as it should) and also that dropped promise, which surfaces as an
// unhandled rejection (upstream porsager/postgres#1192, #1205, #1223). A
// fault-suite daemon logged one whenever the nemesis reset a connection it
// was opening. The patch handles the promise: the connection's own error path
// has already rejected or retried the caller's query.
//
// 3. index.js, a round trip: `tx.savepoint(fn)` waited for SAVEPOINT's reply
// before calling fn, so every savepoint cost a round trip of its own. The
// patch sends SAVEPOINT and lets fn's first statement follow it on the wire
// (the connection runs them in order; an error of SAVEPOINT is the scope's
// uncaught error, as for any statement of fn, and the scope still rolls back
// to the savepoint and rethrows). Conveyor's shared effect transactions
// (src/worker/effects.ts) run one savepoint per job: with the patch, 100,000
// jobs with a ledger insert each went from 5,800 to 6,700 jobs/s on this
// 2-core machine.
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const dirs = ["src", "cjs/src", "cf/src"];

const patches = [
  {
    name: "guarded nextWrite",
    file: "connection.js",
    mark: "/* conveyor: guarded nextWrite */",
    edits: (mark) => [
      {
        from: "  function nextWrite(fn) {\n    const x = socket.write(chunk, fn)",
        to: `  function nextWrite(fn) {
    ${mark}
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
    ],
  },
  {
    name: "handled array-type fetch",
    file: "connection.js",
    mark: "/* conveyor: handled array-type fetch */",
    edits: (mark) => [
      {
        from: "        return fetchArrayTypes()\n",
        to: `        ${mark}\n        return fetchArrayTypes().catch(noop)\n`,
      },
    ],
  },
  {
    name: "pipelined savepoint",
    file: "index.js",
    mark: "/* conveyor: pipelined savepoint */",
    edits: (mark) => [
      {
        // biome-ignore lint/suspicious/noTemplateCurlyInString: the text to find is postgres.js's own template.
        from: "      name && await sql`savepoint ${ sql(name) }`\n",
        to: `      ${mark}\n      name && sql\`savepoint \${ sql(name) }\`.execute()\n`,
      },
    ],
  },
];

for (const p of patches) {
  let patched = 0;
  for (const dir of dirs) {
    const file = path.join(root, "node_modules", "postgres", dir, p.file);
    if (!existsSync(file)) continue;
    let text = readFileSync(file, "utf8");
    if (text.includes(p.mark)) continue;
    for (const e of p.edits(p.mark)) {
      if (!text.includes(e.from)) {
        console.error(
          `patch-postgres: ${file} does not contain the code to patch (${p.name}); review scripts/patch-postgres.mjs for this postgres version`,
        );
        process.exit(1);
      }
      text = text.replace(e.from, e.to);
    }
    writeFileSync(file, text);
    patched++;
  }
  if (patched > 0) console.log(`patch-postgres: ${p.name} in ${patched} file(s)`);
}
