// Peer loss while a model loads or a context is built over ggml-RPC. The watchdog watches a ready
// engine only; a load or context build that talks to a peer that dies parks its native thread
// (the park hook) and would wait for good. This watches such a call with the watchdog's signals
// that hold while a session is open: a newly parked ggml-RPC client thread, or a peer whose port
// refuses connections (nothing listens there any more). HELLO is not used: upstream's server
// leaves it unread while the load's session is open.
import { connect as tcpConnect } from 'node:net';
import { rpcParkedInfo } from '@hydra-engine/native-ggml';
import { HydraError } from '../errors.js';

/** Socket errors that say nothing listens there (or it cannot be reached), unlike a timeout. */
const GONE = new Set(['ECONNREFUSED', 'ECONNRESET', 'EHOSTUNREACH', 'ENETUNREACH', 'EHOSTDOWN', 'ENETDOWN']);

/** Why `endpoint` is gone (a refused or unreachable port), or undefined when it took the connection or timed out. */
export function portGone(endpoint: string, timeoutMs: number): Promise<string | undefined> {
  const m = /^\[?(.+?)\]?:(\d+)$/.exec(endpoint);
  if (!m) return Promise.resolve(undefined);
  return new Promise((resolve) => {
    const socket = tcpConnect({ host: m[1]!, port: Number(m[2]) });
    const done = (why?: string) => {
      socket.destroy();
      resolve(why);
    };
    socket.setTimeout(timeoutMs, () => done());
    socket.once('connect', () => done());
    socket.once('error', (err: Error & { code?: string }) =>
      done(err.code !== undefined && GONE.has(err.code) ? err.message : undefined),
    );
  });
}

function parkedNow(): number {
  try {
    return rpcParkedInfo().parked;
  } catch {
    return 0;
  }
}

export interface LoadWatchOptions {
  /** Parked-thread check period (default 100 ms). */
  intervalMs?: number;
  /** Port check period (default 500 ms). */
  probeMs?: number;
  parked?: () => number;
  gone?: (endpoint: string, timeoutMs: number) => Promise<string | undefined>;
}

/**
 * `work`, or HYDRA_ERR_PEER_LOST (details.peers) as soon as one of `peers` is seen lost while it
 * runs. `work` is then left running: it waits on a parked thread, and whatever it would return
 * holds buffers on the dead peer, so `onAbandoned` receives it if it ever settles.
 */
export async function watchPeers<T>(
  peers: readonly string[],
  what: string,
  work: Promise<T>,
  onAbandoned: (value: T) => void,
  options: LoadWatchOptions = {},
): Promise<T> {
  if (peers.length === 0) return work;
  const parked = options.parked ?? parkedNow;
  const gone = options.gone ?? portGone;
  const probeMs = options.probeMs ?? 500;
  const start = parked();
  let timer: NodeJS.Timeout | undefined;
  let lastProbe = performance.now();
  let probing = false;
  let settled = false;
  const lost = new Promise<never>((_, reject) => {
    const fail = (why: string) =>
      reject(
        new HydraError('HYDRA_ERR_PEER_LOST', `${what} ended: ${why}`, { details: { peers: [...peers] } }),
      );
    timer = setInterval(() => {
      if (parked() > start) return fail('a ggml-RPC connection to a peer failed');
      if (probing || performance.now() - lastProbe < probeMs) return;
      probing = true;
      lastProbe = performance.now();
      void Promise.all(
        peers.map((p) => gone(p, probeMs).then((why) => (why ? `peer ${p}: ${why}` : undefined))),
      )
        .then((whys) => {
          const why = whys.find((w) => w !== undefined);
          if (why && !settled) fail(why);
        })
        .finally(() => {
          probing = false;
        });
    }, options.intervalMs ?? 100);
    timer.unref();
  });
  lost.catch(() => undefined);
  try {
    return await Promise.race([work, lost]);
  } catch (err) {
    if (err instanceof HydraError && err.code === 'HYDRA_ERR_PEER_LOST')
      work.then(onAbandoned, () => undefined);
    throw err;
  } finally {
    settled = true;
    clearInterval(timer);
  }
}
