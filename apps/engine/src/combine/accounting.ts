// Per-peer accounting of the ggml-RPC path (issue 28): the native figures (native-ggml's
// rpcAccounting: client calls counted and timed in ggml's backend tables, and the kernel's TCP_INFO
// of upstream's connection to each peer) turned into STATUS's `peers[].accounting` and the
// `hydra_peer_rpc_*` metrics, with per-decode-step averages over a recent window.
import {
  type RpcAccounting,
  type RpcCommandName,
  type RpcPeerAccounting,
  rpcAccounting,
} from '@hydra-engine/native-ggml';
import type { EngineCounters } from '../core/types.js';
import { HydraError } from '../errors.js';

/** One peer's figures as STATUS reports them (snake_case; times in ms, cumulative unless per_step). */
export interface PeerAccountingStatus {
  commands: Record<RpcCommandName, number>;
  round_trips: number;
  syncs: number;
  wait_reply_ms: number;
  wait_send_ms: number;
  serialize_ms: number;
  enqueue_ms: number;
  /** From the kernel (TCP_INFO of upstream's connection); null until that connection exists. */
  tcp: {
    bytes_sent: number;
    bytes_received: number;
    segments_out: number;
    segments_in: number;
    rtt_us: number;
    min_rtt_us: number;
    retransmits: number;
  } | null;
  /** Averages per decode step over the last window of at least `windowMs` (null: no step in it). */
  per_step: PerStep | null;
}

export interface PerStep {
  window_ms: number;
  steps: number;
  tokens: number;
  commands: number;
  round_trips: number;
  bytes_sent: number;
  bytes_received: number;
  wait_ms: number;
  serialize_ms: number;
  step_ms: number;
}

interface Sample {
  at: number;
  steps: number;
  tokens: number;
  decodeSeconds: number;
  peers: Map<string, RpcPeerAccounting>;
}

export interface AccountingOptions {
  /** The native reader (native-ggml's rpcAccounting). */
  read: () => RpcAccounting;
  /** The engine's decode steps, generated tokens and seconds spent in native decode so far. */
  progress: () => { steps: number; tokens: number; decodeSeconds: number };
  /** Per-step figures compare with a sample at least this old (ms, default 1000). */
  windowMs?: number;
  now?: () => number;
}

/** Sum of a command record. */
export function commandTotal(c: Record<string, number>): number {
  let n = 0;
  for (const v of Object.values(c)) n += v;
  return n;
}

/**
 * Reads the native accounting lazily (at a scrape or a STATUS) and keeps two samples, so per-step
 * figures cover a window of at least `windowMs` whoever reads.
 */
export class PeerAccounting {
  readonly #read: () => RpcAccounting;
  readonly #progress: AccountingOptions['progress'];
  readonly #windowMs: number;
  readonly #now: () => number;
  #base: Sample | undefined;
  #mid: Sample | undefined;
  #current: Sample | undefined;

  constructor(options: AccountingOptions) {
    if (typeof options.read !== 'function')
      throw new HydraError('HYDRA_ERR_BAD_ARGUMENT', 'options.read must be a function');
    if (typeof options.progress !== 'function')
      throw new HydraError('HYDRA_ERR_BAD_ARGUMENT', 'options.progress must be a function');
    const w = options.windowMs ?? 1000;
    if (!Number.isFinite(w) || w < 0)
      throw new HydraError('HYDRA_ERR_BAD_ARGUMENT', 'options.windowMs must be a non-negative number');
    this.#read = options.read;
    this.#progress = options.progress;
    this.#windowMs = w;
    this.#now = options.now ?? (() => performance.now());
  }

  /** The native figures now, every peer ever registered in this process. */
  snapshot(): RpcAccounting {
    const native = this.#read();
    const p = this.#progress();
    const s: Sample = {
      at: this.#now(),
      steps: p.steps,
      tokens: p.tokens,
      decodeSeconds: p.decodeSeconds,
      peers: new Map(native.peers.map((x) => [x.endpoint, x])),
    };
    // base..current is the window: `mid` takes over as its start once it is itself a window old,
    // so the window stays between one and two `windowMs` (plus the time between reads).
    if (this.#base === undefined) this.#base = s;
    else if (this.#mid === undefined) {
      if (s.at - this.#base.at >= this.#windowMs) this.#mid = s;
    } else if (s.at - this.#mid.at >= this.#windowMs) {
      this.#base = this.#mid;
      this.#mid = s;
    }
    this.#current = s;
    return native;
  }

  /** STATUS's `accounting` for one endpoint (null when no such peer was registered). */
  status(endpoint: string): PeerAccountingStatus | null {
    if (this.#current === undefined) this.snapshot();
    const cur = this.#current!.peers.get(endpoint);
    if (cur === undefined) return null;
    return {
      commands: { ...cur.commands },
      round_trips: cur.roundTrips,
      syncs: cur.syncs,
      wait_reply_ms: round(cur.waitReplyMs),
      wait_send_ms: round(cur.waitSendMs),
      serialize_ms: round(cur.serializeMs),
      enqueue_ms: round(cur.enqueueMs),
      tcp: cur.tcp
        ? {
            bytes_sent: cur.tcp.bytesSent,
            bytes_received: cur.tcp.bytesReceived,
            segments_out: cur.tcp.dataSegsOut,
            segments_in: cur.tcp.dataSegsIn,
            rtt_us: cur.tcp.rttUs,
            min_rtt_us: cur.tcp.minRttUs,
            retransmits: cur.tcp.retransmits,
          }
        : null,
      per_step: this.#perStep(endpoint),
    };
  }

  #perStep(endpoint: string): PerStep | null {
    const cur = this.#current;
    // The base, or when the current sample is the base itself, nothing to compare with.
    const base = this.#base;
    if (cur === undefined || base === undefined || base === cur) return null;
    const a = base.peers.get(endpoint);
    const b = cur.peers.get(endpoint);
    const steps = cur.steps - base.steps;
    if (a === undefined || b === undefined || steps <= 0) return null;
    const per = (v: number) => Math.round((v / steps) * 1000) / 1000;
    return {
      window_ms: Math.round(cur.at - base.at),
      steps,
      tokens: cur.tokens - base.tokens,
      commands: per(commandTotal(b.commands) - commandTotal(a.commands)),
      round_trips: per(b.roundTrips - a.roundTrips),
      bytes_sent: per((b.tcp?.bytesSent ?? 0) - (a.tcp?.bytesSent ?? 0)),
      bytes_received: per((b.tcp?.bytesReceived ?? 0) - (a.tcp?.bytesReceived ?? 0)),
      wait_ms: per(b.waitReplyMs + b.waitSendMs - a.waitReplyMs - a.waitSendMs),
      serialize_ms: per(b.serializeMs + b.enqueueMs - a.serializeMs - a.enqueueMs),
      step_ms: per((cur.decodeSeconds - base.decodeSeconds) * 1000),
    };
  }
}

const byEngine = new WeakMap<object, PeerAccounting>();

/**
 * The one accounting of an engine (STATUS and `/metrics` share its window): the native figures
 * are process-wide, the steps and tokens are the engine's counters.
 */
export function engineAccounting(engine: { counters: EngineCounters }): PeerAccounting {
  let a = byEngine.get(engine);
  if (a === undefined) {
    const c = engine.counters;
    a = new PeerAccounting({
      read: rpcAccounting,
      progress: () => ({ steps: c.decodeSteps, tokens: c.generatedTokens, decodeSeconds: c.decodeSeconds }),
    });
    byEngine.set(engine, a);
  }
  return a;
}

function round(ms: number): number {
  return Math.round(ms * 1000) / 1000;
}
