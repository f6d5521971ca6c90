// A fault-injecting TCP proxy between workers and Postgres: adds latency to
// every chunk in both directions and drops connections at random (both sides
// closed abruptly, as a network partition or a NAT timeout would). It stands
// in for tc netem, which needs network namespaces this suite should not
// require.
import { connect, createServer, type Server, type Socket } from "node:net";
import type { Rng } from "./rng.ts";

export interface ProxyFaults {
  /** Added one-way delay per chunk, ms. */
  latencyMs: number;
  /** Probability that each open connection is dropped, per second. */
  dropPerSecond: number;
}

export interface FaultProxy {
  readonly port: number;
  readonly dropped: number;
  set(faults: ProxyFaults): void;
  /** Drops every open connection now. */
  dropAll(): void;
  close(): Promise<void>;
}

export async function startProxy(
  target: { host: string; port: number },
  random: Rng,
): Promise<FaultProxy> {
  let faults: ProxyFaults = { latencyMs: 0, dropPerSecond: 0 };
  let dropped = 0;
  const pairs = new Set<[Socket, Socket]>();
  const sockets = new Set<Socket>();
  const relay = (from: Socket, to: Socket) => {
    from.on("data", (chunk) => {
      const send = () => {
        if (!to.destroyed) to.write(chunk);
      };
      // Order is kept: equal delays fire in order.
      if (faults.latencyMs > 0) setTimeout(send, faults.latencyMs);
      else send();
    });
  };
  const server: Server = createServer((client) => {
    const upstream = connect(target.port, target.host);
    const pair: [Socket, Socket] = [client, upstream];
    sockets.add(client);
    sockets.add(upstream);
    pairs.add(pair);
    const close = () => {
      pairs.delete(pair);
      sockets.delete(client);
      sockets.delete(upstream);
      client.destroy();
      upstream.destroy();
    };
    client.on("error", close);
    upstream.on("error", close);
    client.on("close", close);
    upstream.on("close", close);
    relay(client, upstream);
    relay(upstream, client);
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const addr = server.address();
  if (!addr || typeof addr !== "object") throw new Error("proxy did not bind");
  const dropper = setInterval(() => {
    if (faults.dropPerSecond <= 0) return;
    for (const pair of pairs) {
      // Checked 10 times a second.
      if (random.chance(faults.dropPerSecond / 10)) {
        dropped++;
        pair[0].resetAndDestroy();
        pair[1].resetAndDestroy();
        pairs.delete(pair);
      }
    }
  }, 100);
  return {
    port: addr.port,
    get dropped() {
      return dropped;
    },
    set(f) {
      faults = f;
    },
    dropAll() {
      for (const pair of pairs) {
        dropped++;
        pair[0].resetAndDestroy();
        pair[1].resetAndDestroy();
      }
      pairs.clear();
    },
    async close() {
      clearInterval(dropper);
      for (const sock of sockets) sock.destroy();
      // close() waits for every socket; the ones we reset may linger, so do not wait long.
      await Promise.race([new Promise<void>((r) => server.close(() => r())), Bun.sleep(1_000)]);
    },
  };
}
