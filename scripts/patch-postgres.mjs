// Patches postgres.js (3.4.x) after install. Six edits, each idempotent, each
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
//
// 4. index.js, a bug that breaks transactions: when a transaction's connection
// closes (a reset, Postgres ending the session), `sql.begin()` rejects, but
// its callback runs on, and its later statements go to the same connection
// object, which the pool reconnects for other work. They then run outside
// any transaction (each commits on its own) or inside another caller's, and
// the callback's COMMIT or ROLLBACK ends that other transaction. Statements
// queued in the transaction when it closed never settle. Upstream:
// porsager/postgres#1186, #1216, fixes proposed in #1155 and #1215. Here, a
// shared effect transaction whose connection dropped between two jobs' fns
// could, once the pool reused the connection, have committed the later fns'
// writes and the group's fenced completion without the earlier fns' writes,
// which the server had rolled back. The patch keeps the close error on the
// transaction: its queued statements reject with it, and so does every
// later one, COMMIT and ROLLBACK included.
//
// 5. connection.js, a bug on Bun: when a socket closes with an error,
// closed() leaves the statements in flight to the socket's 'error' event,
// which does not always reach them under Bun. Those statements never settled:
// 35 of 600 in a loop that reset connections under queries, 0 with the
// patch; in the fault suite, the likely cause of a daemon's outcome writes
// that "did not settle within 30000 ms" after ECONNRESET. The stale
// statement also stayed the connection's current one, and `sql.end()` waited
// out its timeout for it.
// The patch rejects them on every close and clears the current statement.
//
// 6. index.js and queue.js, a cost: the pool gave each statement the
// connection that had been idle longest, so light traffic rotated through
// every connection of the pool and every backend ran cold. It now takes the
// one idle most recently, as node-postgres's pool (pg-pool) does. One-job
// enqueues at 1,000/s from a pool of 20 with a worker alongside (the bench's
// latency phase, 3 interleaved pairs of runs): the enqueue backends' CPU
// went from 3.29-3.40 s to 2.51-2.85 s per run, and enqueue-to-start p50
// from 2.18-2.44 ms to 1.45-2.10 ms. The connections it no longer rotates
// through stay open, idle, as before.
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
  {
    name: "close settles statements in flight",
    file: "connection.js",
    mark: "/* conveyor: close settles statements in flight */",
    edits: (mark) => [
      {
        from: "    !hadError && (query || sent.length) && error(Errors.connection('CONNECTION_CLOSED', options, socket))\n",
        to: `    ${mark}\n    if (query || sent.length) error(Errors.connection('CONNECTION_CLOSED', options, socket))\n    query = null\n`,
      },
    ],
  },
  {
    name: "closed transaction rejects its statements",
    file: "index.js",
    mark: "/* conveyor: closed transaction rejects its statements */",
    edits: (mark) => [
      {
        from: "      , connection\n      , prepare = null\n",
        to: `      , connection\n      , prepare = null\n      , closedError = null ${mark}\n`,
      },
      {
        from: "        new Promise((_, reject) => connection.onclose = reject)\n",
        to: `        new Promise((_, reject) => connection.onclose = e => {
          closedError = e
          while (queries.length) queries.shift().reject(e)
          reject(e)
        })
`,
      },
      {
        from: "        q.catch(e => uncaughtError || (uncaughtError = e))\n        c.queue === full\n",
        to: "        q.catch(e => uncaughtError || (uncaughtError = e))\n        if (closedError) return q.reject(closedError)\n        c.queue === full\n",
      },
    ],
  },
  {
    name: "queue pop",
    file: "queue.js",
    mark: "/* conveyor: queue pop */",
    edits: (mark) => [
      {
        from: "    push: (x) => (xs.push(x), x),\n",
        to: `    push: (x) => (xs.push(x), x),
    ${mark}
    pop: () => {
      if (xs.length === index) return undefined
      const out = xs.pop()
      if (xs.length === index) {
        index = 0
        xs = []
      }
      return out
    },
`,
      },
    ],
  },
  {
    name: "most recently idle connection first",
    file: "index.js",
    mark: "/* conveyor: most recently idle connection first */",
    edits: (mark) => [
      {
        from: "    if (open.length)\n      return go(open.shift(), query)\n",
        to: `    ${mark}\n    if (open.length)\n      return go(open.pop(), query)\n`,
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
