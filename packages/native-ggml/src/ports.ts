import { readFileSync } from 'node:fs';
import { type AddressInfo, createServer } from 'node:net';
import { HydraError } from '@hydra-engine/errors';

/** Binds `port` on loopback (0: any) and closes it again: the port bound, or undefined if taken. */
function tryListen(port: number): Promise<number | undefined> {
  return new Promise((resolve) => {
    const s = createServer();
    s.once('error', () => resolve(undefined));
    s.listen(port, '127.0.0.1', () => {
      const bound = (s.address() as AddressInfo).port;
      s.close(() => resolve(bound));
    });
  });
}

/** The first port of the kernel's ephemeral range (32768 where it cannot be read). */
function ephemeralLow(): number {
  try {
    const [low] = readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/);
    return Number(low) || 32768;
  } catch {
    return 32768; // not Linux: the IANA range starts at 49152, above the ports tried here
  }
}

/**
 * A loopback port free right now, for a listener that must be told its number in advance (a peer
 * engine's `--rpc-port`). Picked below the kernel's ephemeral range: `listen(0)` hands out ports
 * from that range, the one outgoing connections of other processes draw from too, so one of them
 * could take the port between this check and the real bind (seen once in CI as EADDRINUSE).
 */
export async function freeLoopbackPort(): Promise<number> {
  const from = 20000;
  const low = ephemeralLow();
  for (let attempt = 0; attempt < 64 && low > from + 1000; attempt++) {
    const port = await tryListen(from + Math.floor(Math.random() * (low - from)));
    if (port !== undefined) return port;
  }
  const any = await tryListen(0);
  if (any === undefined) throw new HydraError('HYDRA_ERR_INTERNAL', 'no free loopback port');
  return any;
}
