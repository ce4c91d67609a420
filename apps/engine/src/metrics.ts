import type { HydraPortStats } from '@hydra-engine/hydra-rpc';
import type { RpcAccounting, RpcPeerAccounting } from '@hydra-engine/native-ggml';
import { Counter, Gauge, Histogram, Registry } from 'prom-client';
import { engineAccounting } from './combine/accounting.js';
import type { Engine } from './engine.js';

/** One finished HTTP request, as the request log line and the latency histograms see it. */
export interface RequestRecord {
  method: string;
  route: string;
  status: number;
  /** Milliseconds from the request's first byte to the response's end. */
  durationMs: number;
  /** Completion routes only, once the engine ran the request. */
  promptTokens?: number;
  completionTokens?: number;
  cachedTokens?: number;
  /** Milliseconds from the request's first byte to the first generated token. */
  ttftMs?: number;
  /** Milliseconds from the first to the last generated token. */
  decodeMs?: number;
  finishReason?: string;
  epoch?: number;
  /** The slot that ran it, and how long it waited for one (ms). */
  slot?: number;
  queueMs?: number;
  /** The error code the request ended with, if any. */
  code?: string;
}

// Counters the engine and the merged port keep themselves: each scrape copies their value.
type Source = () => number | Iterable<[Record<string, string>, number]>;

const TTFT_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60];
const TPOT_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1];
const DURATION_BUCKETS = [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300];

/**
 * The engine's `/metrics` (Prometheus text, through prom-client): the engine's and the merged
 * port's own counters read at each scrape, and latency histograms fed by {@link observe}.
 */
export class EngineMetrics {
  readonly #registry = new Registry();
  readonly #ttft: Histogram;
  readonly #tpot: Histogram;
  readonly #duration: Histogram;
  readonly #queueWait: Histogram;
  readonly #requests: Counter;
  readonly #cacheHits: Counter;

  /** `port`: the merged port's stats, when the engine has one (`--rpc-port`). */
  constructor(engine: Engine, port?: () => HydraPortStats | undefined) {
    const r = this.#registry;
    const c = engine.counters;
    const labelled =
      (label: string, obj: () => Record<string, number> | undefined): Source =>
      () =>
        Object.entries(obj() ?? {}).map(([k, v]) => [{ [label]: k }, v] as [Record<string, string>, number]);
    this.#gauge('hydra_state', 'engine state (1 for the current one)', () => [[{ state: engine.state }, 1]], [
      'state',
    ]);
    this.#gauge('hydra_config_epoch', 'configuration epoch in force', () => engine.epoch);
    this.#gauge('hydra_model_loaded', '1 when a model is loaded', () => (engine.model ? 1 : 0));
    this.#gauge('hydra_model_load_seconds', 'duration of the last model load', () => c.loadSeconds);
    this.#counter('hydra_prompt_tokens_total', 'prompt tokens evaluated', () => c.promptTokens);
    this.#counter('hydra_generated_tokens_total', 'tokens generated', () => c.generatedTokens);
    this.#gauge('hydra_tokens_per_second', 'generated tokens per second over the last 10 s', () =>
      engine.tokensPerSecond(),
    );
    this.#counter(
      'hydra_decode_steps_total',
      'native decode calls (one per step for all slots)',
      () => c.decodeSteps,
    );
    this.#counter(
      'hydra_decode_steps_ahead_total',
      'decode steps queued before the previous one ended (pipelined loop)',
      () => c.decodeStepsAhead,
    );
    this.#counter(
      'hydra_decode_entries_wasted_total',
      'entries of steps queued ahead whose request had ended (one token of compute each)',
      () => c.decodeEntriesWasted,
    );
    this.#counter('hydra_decode_seconds_total', 'time spent in native decode', () => c.decodeSeconds);
    this.#counter(
      'hydra_prompt_checkpoints_total',
      'prompt checkpoints taken (recurrent or hybrid memory: n_ctx_checkpoints)',
      () => c.checkpointsCreated,
    );
    this.#counter(
      'hydra_prompt_checkpoint_restores_total',
      'prompt checkpoints restored to reuse a cached prefix (recurrent or hybrid memory)',
      () => c.checkpointRestores,
    );
    this.#counter(
      'hydra_spec_drafted_total',
      'tokens guessed by speculative decoding (every speculative.types)',
      () => c.specDrafted,
    );
    this.#counter(
      'hydra_spec_type_drafted_total',
      'tokens guessed, by speculative.types (the n-gram types, draft_simple)',
      labelled('type', () => c.specByType.drafted),
      ['type'],
    );
    this.#counter(
      'hydra_spec_type_accepted_total',
      'guessed tokens the model confirmed, by speculative.types',
      labelled('type', () => c.specByType.accepted),
      ['type'],
    );
    this.#counter(
      'hydra_spec_accepted_total',
      'guessed tokens the model confirmed (each saves one decode step)',
      () => c.specAccepted,
    );
    this.#gauge('hydra_queue_depth', 'requests waiting for a slot', () => engine.queueDepth);
    // Not hydra_slots_total: a gauge named *_total reads as a counter to Prometheus tooling.
    this.#gauge('hydra_slots', 'slots (n_parallel)', () => engine.slots.total);
    this.#gauge('hydra_slots_busy', 'slots generating now', () => engine.slots.busy);
    this.#gauge('hydra_slot_context_tokens', 'KV cache cells of one slot (n_ctx / n_parallel)', () =>
      engine.model ? engine.slots.nCtxSeq : 0,
    );
    this.#gauge(
      'hydra_slot_kv_cells',
      'KV cache cells a slot holds now (running, or kept for cache_prompt), of hydra_slot_context_tokens',
      () =>
        engine
          .slotInfo()
          .map((info, i) => [{ slot: String(i) }, info.kvCells] as [Record<string, string>, number]),
      ['slot'],
    );
    this.#counter(
      'hydra_requests_rejected_queue_full_total',
      'requests answered 429',
      () => c.rejectedQueueFull,
    );
    this.#counter(
      'hydra_rebuild_failures_total',
      'T2/T3 rebuilds that failed, at once or deferred (the previous configuration is restored)',
      labelled('rebuild', () => c.rebuildFailures),
      ['rebuild'],
    );
    this.#counter(
      'hydra_requests_total',
      'finished requests by outcome',
      labelled('finish_reason', () => c.requests),
      ['finish_reason'],
    );
    const p = (pick: (s: HydraPortStats) => unknown, key: string) => () => {
      const s = port?.();
      return s ? num(pick(s), key) : 0;
    };
    const rpc = (s: HydraPortStats) => s.rpc;
    const conn = (s: HydraPortStats) => s.connections;
    const hydra = (s: HydraPortStats) => s.hydra;
    const portCounters: [string, string, () => number][] = [
      ['hydra_port_connections_total', 'connections accepted on the merged port', p(conn, 'accepted')],
      ['hydra_rpc_sessions_served_total', 'ggml-RPC sessions finished', p(rpc, 'served')],
      [
        'hydra_rpc_sessions_refused_total',
        'ggml-RPC connections refused (pool and queue full, per-source cap, closing)',
        p(rpc, 'refused'),
      ],
      ['hydra_rpc_sessions_failed_total', 'ggml-RPC sessions whose host reported an error', p(rpc, 'failed')],
      [
        'hydra_rpc_sessions_crashed_total',
        'ggml-RPC sessions ended by their host process dying',
        p(rpc, 'crashed'),
      ],
      [
        'hydra_rpc_queue_timeouts_total',
        'queued ggml-RPC connections closed for waiting too long',
        p(rpc, 'queueTimeouts'),
      ],
      ['hydra_rpc_refusals_total', 'ggml-RPC messages refused by the session guard', p(rpc, 'refusals')],
      [
        'hydra_port_connections_refused_total',
        'merged-port connections refused by a connection cap',
        p(conn, 'refusedByCap'),
      ],
      ['hydra_hydra_sessions_refused_total', 'Hydra sessions refused by a session cap', p(hydra, 'refused')],
      ['hydra_hydra_idle_timeouts_total', 'Hydra sessions closed for being idle', p(hydra, 'idleTimeouts')],
      // The pool adds the live figures of running sessions (their hosts report every second).
      [
        'hydra_rpc_bytes_in_total',
        'bytes received by ggml-RPC sessions, running ones included',
        p(rpc, 'bytesIn'),
      ],
      [
        'hydra_rpc_bytes_out_total',
        'bytes sent by ggml-RPC sessions, running ones included',
        p(rpc, 'bytesOut'),
      ],
      ['hydra_rpc_commands_total', 'ggml-RPC commands served, running sessions included', p(rpc, 'commands')],
    ];
    const portGauges: [string, string, () => number][] = [
      ['hydra_rpc_sessions_active', 'ggml-RPC sessions being served', p(rpc, 'active')],
      ['hydra_rpc_sessions_queued', 'ggml-RPC connections waiting for a host', p(rpc, 'queued')],
      ['hydra_rpc_hosts', 'ggml-RPC host processes alive', p(rpc, 'hosts')],
      ['hydra_hydra_sessions_active', 'Hydra control sessions open', p(hydra, 'active')],
    ];
    // Only with a merged port: a scrape of a port-less engine names none of them.
    if (port) {
      for (const [name, help, read] of portCounters) this.#counter(name, help, read);
      for (const [name, help, read] of portGauges) this.#gauge(name, help, read);
      this.#counter(
        'hydra_rpc_sessions_ended_total',
        'ggml-RPC sessions served, by how they ended',
        labelled('ended', () => (port()?.rpc as { ended?: Record<string, number> } | undefined)?.ended),
        ['ended'],
      );
    }

    this.#peerSeries(engine);

    this.#ttft = new Histogram({
      name: 'hydra_time_to_first_token_seconds',
      help: 'time from the request to its first generated token (queue wait, tokenizing and prefill included)',
      buckets: TTFT_BUCKETS,
      registers: [r],
    });
    this.#tpot = new Histogram({
      name: 'hydra_time_per_output_token_seconds',
      help: 'time between generated tokens of a request (from its first to its last token)',
      buckets: TPOT_BUCKETS,
      registers: [r],
    });
    this.#duration = new Histogram({
      name: 'hydra_request_duration_seconds',
      help: 'completion requests from their first byte to the end of the response',
      labelNames: ['route'],
      buckets: DURATION_BUCKETS,
      registers: [r],
    });
    this.#queueWait = new Histogram({
      name: 'hydra_queue_wait_seconds',
      help: 'time a completion request waited for a slot',
      buckets: TTFT_BUCKETS,
      registers: [r],
    });
    this.#requests = new Counter({
      name: 'hydra_http_requests_total',
      help: 'HTTP requests answered, by route and status',
      labelNames: ['route', 'status'],
      registers: [r],
    });
    this.#cacheHits = new Counter({
      name: 'hydra_prompt_cache_hit_tokens_total',
      help: 'prompt tokens whose KV came from the slot cache (cache_prompt) instead of a prefill',
      registers: [r],
    });
  }

  /** Feeds one finished request into the histograms and request counters. */
  observe(rec: RequestRecord): void {
    this.#requests.inc({ route: rec.route, status: String(rec.status) });
    if (rec.promptTokens === undefined) return;
    this.#duration.observe({ route: rec.route }, rec.durationMs / 1000);
    if (rec.cachedTokens) this.#cacheHits.inc(rec.cachedTokens);
    if (rec.ttftMs !== undefined) this.#ttft.observe(rec.ttftMs / 1000);
    if (rec.queueMs !== undefined) this.#queueWait.observe(rec.queueMs / 1000);
    const n = rec.completionTokens ?? 0;
    if (rec.decodeMs !== undefined && n > 1) this.#tpot.observe(rec.decodeMs / 1000 / (n - 1));
  }

  /** The Prometheus text exposition (version 0.0.4). */
  render(): Promise<string> {
    return this.#registry.metrics();
  }

  // ggml-RPC accounting per peer (combine/accounting.ts): one native read per scrape, shared by
  // every series below through the snapshot the first of them takes.
  #peerSeries(engine: Engine): void {
    const acc = engineAccounting(engine);
    let cached: { at: number; value: RpcAccounting } | undefined;
    const read = (): RpcAccounting => {
      const now = performance.now();
      if (cached === undefined || now - cached.at > 50) cached = { at: now, value: acc.snapshot() };
      return cached.value;
    };
    const perPeer =
      (pick: (p: RpcPeerAccounting) => number | undefined): Source =>
      () =>
        read().peers.flatMap((p) => {
          const v = pick(p);
          return v === undefined ? [] : [[{ peer: p.endpoint }, v] as [Record<string, string>, number]];
        });
    this.#counter(
      'hydra_peer_rpc_commands_total',
      'ggml-RPC commands this head sent to a peer, by command (client calls counted natively)',
      () =>
        read().peers.flatMap((p) =>
          Object.entries(p.commands).map(
            ([command, n]) => [{ peer: p.endpoint, command }, n] as [Record<string, string>, number],
          ),
        ),
      ['peer', 'command'],
    );
    this.#counter(
      'hydra_peer_rpc_round_trips_total',
      'ggml-RPC commands a peer answered (the client reads a reply before its next command)',
      perPeer((p) => p.roundTrips),
      ['peer'],
    );
    this.#counter(
      'hydra_peer_rpc_wait_seconds_total',
      'time head threads were blocked on a peer: for a reply (reply) or for a send to be written (send)',
      () =>
        read().peers.flatMap((p) => [
          [{ peer: p.endpoint, on: 'reply' }, p.waitReplyMs / 1000] as [Record<string, string>, number],
          [{ peer: p.endpoint, on: 'send' }, p.waitSendMs / 1000] as [Record<string, string>, number],
        ]),
      ['peer', 'on'],
    );
    this.#counter(
      'hydra_peer_rpc_serialize_seconds_total',
      'time serializing graphs and queueing async tensor copies for a peer (not waited for)',
      perPeer((p) => (p.serializeMs + p.enqueueMs) / 1000),
      ['peer'],
    );
    this.#counter(
      'hydra_peer_rpc_sent_bytes_total',
      "bytes sent to a peer (kernel TCP_INFO of upstream's connection)",
      perPeer((p) => p.tcp?.bytesSent),
      ['peer'],
    );
    this.#counter(
      'hydra_peer_rpc_received_bytes_total',
      "bytes received from a peer (kernel TCP_INFO of upstream's connection)",
      perPeer((p) => p.tcp?.bytesReceived),
      ['peer'],
    );
    this.#gauge(
      'hydra_peer_rpc_rtt_seconds',
      "the kernel's smoothed round-trip time of the connection to a peer",
      perPeer((p) => (p.tcp ? p.tcp.rttUs / 1e6 : undefined)),
      ['peer'],
    );
    this.#counter(
      'hydra_local_compute_seconds_total',
      "time in a local device's graph compute (a GPU's is launch only) and synchronize, by device",
      () =>
        read().local.flatMap((l) => [
          [{ device: l.device, call: 'compute' }, l.computeMs / 1000] as [Record<string, string>, number],
          [{ device: l.device, call: 'synchronize' }, l.syncMs / 1000] as [Record<string, string>, number],
        ]),
      ['device', 'call'],
    );
  }

  #gauge(name: string, help: string, read: Source, labelNames: string[] = []): void {
    new Gauge({
      name,
      help,
      labelNames,
      registers: [this.#registry],
      collect() {
        this.reset();
        const v = read();
        if (typeof v === 'number') this.set(finite(v));
        else for (const [labels, n] of v) this.set(labels, finite(n));
      },
    });
  }

  #counter(name: string, help: string, read: Source, labelNames: string[] = []): void {
    new Counter({
      name,
      help,
      labelNames,
      registers: [this.#registry],
      collect() {
        this.reset();
        const v = read();
        if (typeof v === 'number') this.inc(Math.max(0, finite(v)));
        else for (const [labels, n] of v) this.inc(labels, Math.max(0, finite(n)));
      },
    });
  }
}

function finite(v: number): number {
  return Number.isFinite(v) ? v : 0;
}

function num(obj: unknown, key: string): number {
  const v = (obj as Record<string, unknown>)?.[key];
  return typeof v === 'number' ? v : typeof v === 'bigint' ? Number(v) : 0;
}
