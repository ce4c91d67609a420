// Peer loss detection for a head engine. Three signals, any one enough:
// - a ggml-RPC client thread was parked (native-ggml's abort hook: a send or receive to a peer
//   failed; the decode waiting on it will never return), checked every tick;
// - `failures` probes in a row to a configured peer failed (a dead or unreachable peer, also
//   while the engine is idle and nothing would notice otherwise). Upstream's ggml-rpc-server
//   serves one connection at a time: while the head's session is open it leaves a HELLO on a new
//   connection unread, idle or not, and with its listen backlog of 1 soon lets new connections
//   time out too. So a failed HELLO is followed by a TCP connect: a peer that takes the connection
//   is alive (and marked one-connection: from then on only a refused or unreachable port is a
//   miss, a killed server; a hung one or a link down while idle is found by the progress check at
//   the next step). A peer that answered HELLO while the engine was ready (our merged port serves
//   connections side by side), or was never seen to take a connection, misses on a failed HELLO
//   and connect. A round that saw decode steps complete counts no miss: progress proves the peers
//   alive;
// - no decode progress for `stallMs` while a step is in flight (a peer that accepts but never
//   answers, e.g. a link that went down without a reset). Progress is a completed step, and the
//   scheduler feeds prompts in steps of at most n_batch tokens (chunked prefill), so a long prompt
//   on a live pair is many short steps, never one long call: `stallMs` only has to exceed one
//   n_batch step on the slowest pair (2,048 tokens at 600 tok/s: 3.4 s, under the 15 s default).
import { connect as tcpConnect } from 'node:net';
import { probeRpcServer, rpcParkedInfo } from '@hydra-engine/native-ggml';
import { stringsInForce } from '../core/params.js';
import type { Engine } from '../engine.js';
import { HydraError } from '../errors.js';

export interface PeerWatchdogOptions {
  engine: Engine;
  /** Probe period (default 1000 ms). */
  intervalMs?: number;
  /** Consecutive failed probes of one peer that count as a loss (default 2). */
  failures?: number;
  /** No decode progress this long, with a step in flight and peers configured, is a loss (default 15000 ms). */
  stallMs?: number;
  /** HELLO probe timeout (default 1000 ms). */
  probeTimeoutMs?: number;
  log?: (line: string) => void;
  probe?: (endpoint: string, timeoutMs: number) => Promise<unknown>;
  /**
   * TCP connect check for peers that never answered HELLO while in use (default: node:net);
   * rejects with the socket error (`code` ECONNREFUSED etc.) or a timeout.
   */
  reachable?: (endpoint: string, timeoutMs: number) => Promise<unknown>;
  parked?: () => number;
}

/** Resolves once a TCP connection to `endpoint` (host:port) opens; rejects on error or timeout. */
function tcpReachable(endpoint: string, timeoutMs: number): Promise<void> {
  const m = /^\[?(.+?)\]?:(\d+)$/.exec(endpoint);
  if (!m) return Promise.reject(new Error(`endpoint must be host:port, got ${endpoint}`));
  return new Promise((resolve, reject) => {
    const socket = tcpConnect({ host: m[1]!, port: Number(m[2]) });
    const done = (err?: Error) => {
      socket.destroy();
      if (err) reject(err);
      else resolve();
    };
    socket.setTimeout(timeoutMs, () => done(new Error(`no TCP connection within ${timeoutMs} ms`)));
    socket.once('connect', () => done());
    socket.once('error', (err) => done(err));
  });
}

/** Socket errors that say nothing listens there (or cannot be reached), unlike a timeout. */
const GONE = new Set(['ECONNREFUSED', 'ECONNRESET', 'EHOSTUNREACH', 'ENETUNREACH', 'EHOSTDOWN', 'ENETDOWN']);

function positive(v: number | undefined, dflt: number, name: string): number {
  const n = v ?? dflt;
  if (!Number.isFinite(n) || n <= 0)
    throw new HydraError('HYDRA_ERR_BAD_ARGUMENT', `options.${name} must be a positive number`);
  return n;
}

/**
 * Watches the configured `rpc_servers` of a ready engine and calls {@link Engine.failOver} on the
 * first sign of loss (see the module comment). One check at a time; the timer is unref'd.
 */
export class PeerWatchdog {
  readonly #engine: Engine;
  readonly #failuresNeeded: number;
  readonly #stallMs: number;
  readonly #probeTimeoutMs: number;
  readonly #log: (line: string) => void;
  readonly #probe: (endpoint: string, timeoutMs: number) => Promise<unknown>;
  readonly #reachable: (endpoint: string, timeoutMs: number) => Promise<unknown>;
  /** Peers that answered HELLO while the engine was ready (they serve connections side by side). */
  readonly #answersWhileInUse = new Set<string>();
  /** Peers that took a TCP connection but left HELLO unread while in use (upstream's server). */
  readonly #oneConnection = new Set<string>();
  readonly #parked: () => number;
  readonly #timer: NodeJS.Timeout;
  readonly #misses = new Map<string, number>();
  #parkedSeen: number;
  #stepsSeen: number;
  /** A failover is running. */
  #busy = false;
  #probing = false;
  #lost = 0;

  constructor(options: PeerWatchdogOptions) {
    this.#engine = options.engine;
    const interval = positive(options.intervalMs, 1000, 'intervalMs');
    this.#failuresNeeded = Math.ceil(positive(options.failures, 2, 'failures'));
    this.#stallMs = positive(options.stallMs, 15_000, 'stallMs');
    this.#probeTimeoutMs = positive(options.probeTimeoutMs, 1000, 'probeTimeoutMs');
    this.#log = options.log ?? (() => undefined);
    this.#probe = options.probe ?? ((e, t) => probeRpcServer(e, t));
    this.#reachable = options.reachable ?? tcpReachable;
    this.#parked = options.parked ?? (() => rpcParkedInfo().parked);
    this.#parkedSeen = this.#safeParked();
    this.#stepsSeen = this.#engine.counters.decodeSteps;
    this.#timer = setInterval(() => void this.check(), interval);
    this.#timer.unref();
  }

  /** Peer losses acted on so far. */
  get losses(): number {
    return this.#lost;
  }

  #safeParked(): number {
    try {
      return this.#parked();
    } catch {
      return 0;
    }
  }

  /**
   * One round of checks (the timer calls it; exposed for tests). The parked-thread and progress
   * checks act at once; the HELLO probes of a round run apart (a probe may wait its whole timeout,
   * and the other checks keep their period meanwhile). Resolves once this round's probes settled.
   */
  async check(): Promise<void> {
    if (this.#busy) return;
    const engine = this.#engine;
    const peers = stringsInForce(engine.layers, 'rpc_servers');
    if (engine.state !== 'ready' || peers.length === 0) {
      this.#misses.clear();
      this.#answersWhileInUse.clear();
      this.#oneConnection.clear();
      this.#parkedSeen = this.#safeParked();
      return;
    }
    const parked = this.#safeParked();
    const lostLink = parked > this.#parkedSeen;
    this.#parkedSeen = parked;
    if (lostLink) return this.#lose('a ggml-RPC connection to a peer failed', peers);
    const stalled = engine.decodeStalledMs();
    if (stalled !== undefined && stalled > this.#stallMs)
      return this.#lose(`no decode progress for ${Math.round(stalled)} ms (a step waits on a peer)`, peers);
    if (this.#probing) return;
    this.#probing = true;
    try {
      const results = await Promise.all(peers.map((p) => this.#probeOne(p)));
      const steps = engine.counters.decodeSteps;
      const progressed = steps !== this.#stepsSeen;
      this.#stepsSeen = steps;
      let reason: string | undefined;
      for (const [i, p] of peers.entries()) {
        const miss = results[i] === undefined || progressed ? 0 : (this.#misses.get(p) ?? 0) + 1;
        this.#misses.set(p, miss);
        if (!reason && miss >= this.#failuresNeeded)
          reason = `peer ${p} did not answer ${miss} HELLO probes (${results[i]})`;
      }
      if (reason && !this.#busy) await this.#lose(reason, peers);
    } finally {
      this.#probing = false;
    }
  }

  /** A peer's probe: undefined when it is alive, else why not (see the module comment). */
  async #probeOne(peer: string): Promise<string | undefined> {
    const hello = this.#probe(peer, this.#probeTimeoutMs).then(
      () => undefined,
      (err: Error) => err.message,
    );
    // Side by side with HELLO, so a round takes one timeout, not two.
    const tcp = this.#answersWhileInUse.has(peer)
      ? undefined
      : this.#reachable(peer, this.#probeTimeoutMs).then(
          () => undefined,
          (err: Error & { code?: string }) => err,
        );
    const helloFailed = await hello;
    if (helloFailed === undefined) {
      if (this.#engine.state === 'ready') this.#answersWhileInUse.add(peer);
      return undefined;
    }
    if (tcp === undefined) return helloFailed;
    const tcpFailed = await tcp;
    if (tcpFailed === undefined) {
      if (this.#engine.state === 'ready') this.#oneConnection.add(peer);
      return undefined;
    }
    const gone = tcpFailed.code !== undefined && GONE.has(tcpFailed.code);
    return gone || !this.#oneConnection.has(peer) ? `${helloFailed}; TCP: ${tcpFailed.message}` : undefined;
  }

  async #lose(reason: string, peers: string[]): Promise<void> {
    const engine = this.#engine;
    // Only peers still configured and in use are named; all of them are dropped (the model used
    // every one: a loss of one breaks its graph).
    if (engine.state !== 'ready' || stringsInForce(engine.layers, 'rpc_servers').join() !== peers.join())
      return;
    this.#busy = true;
    try {
      this.#lost += 1;
      this.#misses.clear();
      this.#log(`hydra-engine: peer loss: ${reason}`);
      await engine.failOver(reason, peers).catch((err: Error) => {
        this.#log(`hydra-engine: SOLO reload after peer loss failed: ${err.message}`);
      });
      this.#parkedSeen = this.#safeParked();
    } finally {
      this.#busy = false;
    }
  }

  stop(): void {
    clearInterval(this.#timer);
  }
}
