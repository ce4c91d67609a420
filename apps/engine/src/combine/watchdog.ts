// Peer loss detection for a head engine. Three signals, any one enough:
// - a ggml-RPC client thread was parked (native-ggml's abort hook: a send or receive to a peer
//   failed; the decode waiting on it will never return), checked every tick;
// - `failures` HELLO probes in a row to a configured peer failed (a dead or unreachable peer,
//   also while the engine is idle and nothing would notice otherwise);
// - a decode step has been in flight longer than `stallMs` (a peer that accepts but never answers,
//   e.g. a link that went down without a reset).
import { probeRpcServer, rpcParkedInfo } from '@hydra-engine/native-ggml';
import type { Engine } from '../engine.js';

export interface PeerWatchdogOptions {
  engine: Engine;
  /** Probe period (default 1000 ms). */
  intervalMs?: number;
  /** Consecutive failed probes of one peer that count as a loss (default 2). */
  failures?: number;
  /** A decode step in flight this long with peers configured counts as a loss (default 15000 ms). */
  stallMs?: number;
  /** HELLO probe timeout (default 1000 ms). */
  probeTimeoutMs?: number;
  log?: (line: string) => void;
  probe?: (endpoint: string, timeoutMs: number) => Promise<unknown>;
  parked?: () => number;
}

function positive(v: number | undefined, dflt: number, name: string): number {
  const n = v ?? dflt;
  if (!Number.isFinite(n) || n <= 0) throw new RangeError(`options.${name} must be a positive number`);
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
  readonly #parked: () => number;
  readonly #timer: NodeJS.Timeout;
  readonly #misses = new Map<string, number>();
  #parkedSeen: number;
  #busy = false;
  #lost = 0;

  constructor(options: PeerWatchdogOptions) {
    this.#engine = options.engine;
    const interval = positive(options.intervalMs, 1000, 'intervalMs');
    this.#failuresNeeded = Math.ceil(positive(options.failures, 2, 'failures'));
    this.#stallMs = positive(options.stallMs, 15_000, 'stallMs');
    this.#probeTimeoutMs = positive(options.probeTimeoutMs, 1000, 'probeTimeoutMs');
    this.#log = options.log ?? (() => undefined);
    this.#probe = options.probe ?? ((e, t) => probeRpcServer(e, t));
    this.#parked = options.parked ?? (() => rpcParkedInfo().parked);
    this.#parkedSeen = this.#safeParked();
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

  /** One round of checks (the timer calls it; exposed for tests). */
  async check(): Promise<void> {
    if (this.#busy) return;
    const engine = this.#engine;
    const peers = engine.layers.get('rpc_servers') as string[];
    if (engine.state !== 'ready' || peers.length === 0) {
      this.#misses.clear();
      this.#parkedSeen = this.#safeParked();
      return;
    }
    this.#busy = true;
    try {
      let reason: string | undefined;
      const parked = this.#safeParked();
      if (parked > this.#parkedSeen) reason = 'a ggml-RPC connection to a peer failed';
      this.#parkedSeen = parked;
      const stalled = engine.decodeStalledMs();
      if (!reason && stalled !== undefined && stalled > this.#stallMs)
        reason = `a decode step waited ${Math.round(stalled)} ms for a peer`;
      const results = await Promise.all(
        peers.map((p) =>
          this.#probe(p, this.#probeTimeoutMs).then(
            () => undefined,
            (err: Error) => err.message,
          ),
        ),
      );
      for (const [i, p] of peers.entries()) {
        const miss = results[i] === undefined ? 0 : (this.#misses.get(p) ?? 0) + 1;
        this.#misses.set(p, miss);
        if (!reason && miss >= this.#failuresNeeded)
          reason = `peer ${p} did not answer ${miss} HELLO probes (${results[i]})`;
      }
      if (!reason) return;
      // Only peers still configured and in use are named; all of them are dropped (the model used
      // every one: a loss of one breaks its graph).
      if ((engine.layers.get('rpc_servers') as string[]).join() !== peers.join()) return;
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
