import type { HydraPortStats } from '@hydra-engine/hydra-rpc';
import type { Engine } from './engine.js';

type Sample = [
  name: string,
  type: 'counter' | 'gauge',
  help: string,
  value: number,
  labels?: Record<string, string>,
];

/** Prometheus text exposition of the engine's counters and the merged port's pool stats. */
export function renderMetrics(engine: Engine, port: HydraPortStats | undefined): string {
  const c = engine.counters;
  const samples: Sample[] = [
    ['hydra_state', 'gauge', 'engine state (1 for the current one)', 1, { state: engine.state }],
    ['hydra_config_epoch', 'gauge', 'configuration epoch in force', engine.epoch],
    ['hydra_model_loaded', 'gauge', '1 when a model is loaded', engine.model ? 1 : 0],
    ['hydra_model_load_seconds', 'gauge', 'duration of the last model load', c.loadSeconds],
    ['hydra_prompt_tokens_total', 'counter', 'prompt tokens evaluated', c.promptTokens],
    ['hydra_generated_tokens_total', 'counter', 'tokens generated', c.generatedTokens],
    [
      'hydra_tokens_per_second',
      'gauge',
      'generated tokens per second over the last 10 s',
      engine.tokensPerSecond(),
    ],
    [
      'hydra_decode_steps_total',
      'counter',
      'native decode calls (one per step for all slots)',
      c.decodeSteps,
    ],
    [
      'hydra_decode_steps_ahead_total',
      'counter',
      'decode steps queued before the previous one ended (pipelined loop)',
      c.decodeStepsAhead,
    ],
    [
      'hydra_decode_entries_wasted_total',
      'counter',
      'entries of steps queued ahead whose request had ended (one token of compute each)',
      c.decodeEntriesWasted,
    ],
    ['hydra_decode_seconds_total', 'counter', 'time spent in native decode', c.decodeSeconds],
    ['hydra_queue_depth', 'gauge', 'requests waiting for a slot', engine.queueDepth],
    ['hydra_slots_total', 'gauge', 'slots (n_parallel)', engine.slots.total],
    ['hydra_slots_busy', 'gauge', 'slots generating now', engine.slots.busy],
    ['hydra_requests_rejected_queue_full_total', 'counter', 'requests answered 429', c.rejectedQueueFull],
  ];
  for (const [rebuild, n] of Object.entries(c.rebuildFailures)) {
    samples.push([
      'hydra_rebuild_failures_total',
      'counter',
      'T2/T3 rebuilds that failed, at once or deferred (the previous configuration is restored)',
      n,
      { rebuild },
    ]);
  }
  for (const [reason, n] of Object.entries(c.requests)) {
    samples.push([
      'hydra_requests_total',
      'counter',
      'finished requests by outcome',
      n,
      { finish_reason: reason },
    ]);
  }
  if (port) {
    samples.push(
      [
        'hydra_port_connections_total',
        'counter',
        'connections accepted on the merged port',
        num(port.connections, 'accepted'),
      ],
      ['hydra_rpc_sessions_active', 'gauge', 'ggml-RPC sessions being served', port.rpc.active],
      ['hydra_rpc_sessions_queued', 'gauge', 'ggml-RPC connections waiting for a host', port.rpc.queued],
      ['hydra_rpc_sessions_served_total', 'counter', 'ggml-RPC sessions finished', port.rpc.served],
      [
        'hydra_rpc_sessions_refused_total',
        'counter',
        'ggml-RPC connections refused (pool and queue full, per-source cap, closing)',
        port.rpc.refused,
      ],
      [
        'hydra_rpc_sessions_failed_total',
        'counter',
        'ggml-RPC sessions whose host reported an error',
        port.rpc.failed,
      ],
      [
        'hydra_rpc_sessions_crashed_total',
        'counter',
        'ggml-RPC sessions ended by their host process dying',
        num(port.rpc, 'crashed'),
      ],
      [
        'hydra_rpc_queue_timeouts_total',
        'counter',
        'queued ggml-RPC connections closed for waiting too long',
        num(port.rpc, 'queueTimeouts'),
      ],
      ['hydra_rpc_hosts', 'gauge', 'ggml-RPC host processes alive', num(port.rpc, 'hosts')],
      [
        'hydra_rpc_refusals_total',
        'counter',
        'ggml-RPC messages refused by the session guard',
        num(port.rpc, 'refusals'),
      ],
      [
        'hydra_port_connections_refused_total',
        'counter',
        'merged-port connections refused by a connection cap',
        num(port.connections, 'refusedByCap'),
      ],
      ['hydra_hydra_sessions_active', 'gauge', 'Hydra control sessions open', num(port.hydra, 'active')],
      [
        'hydra_hydra_sessions_refused_total',
        'counter',
        'Hydra sessions refused by a session cap',
        num(port.hydra, 'refused'),
      ],
      [
        'hydra_hydra_idle_timeouts_total',
        'counter',
        'Hydra sessions closed for being idle',
        num(port.hydra, 'idleTimeouts'),
      ],
      [
        'hydra_rpc_bytes_in_total',
        'counter',
        'bytes received by ggml-RPC sessions',
        num(port.rpc, 'bytesIn'),
      ],
      ['hydra_rpc_bytes_out_total', 'counter', 'bytes sent by ggml-RPC sessions', num(port.rpc, 'bytesOut')],
    );
  }
  const ended = (port?.rpc as { ended?: Record<string, number> } | undefined)?.ended ?? {};
  for (const [kind, n] of Object.entries(ended)) {
    samples.push([
      'hydra_rpc_sessions_ended_total',
      'counter',
      'ggml-RPC sessions served, by how they ended',
      n,
      { ended: kind },
    ]);
  }
  const out: string[] = [];
  const seen = new Set<string>();
  for (const [name, type, help, value, labels] of samples) {
    if (!seen.has(name)) {
      out.push(`# HELP ${name} ${help}`, `# TYPE ${name} ${type}`);
      seen.add(name);
    }
    const l = labels
      ? `{${Object.entries(labels)
          .map(([k, v]) => `${k}="${v.replace(/["\\\n]/g, '_')}"`)
          .join(',')}}`
      : '';
    out.push(`${name}${l} ${Number.isFinite(value) ? value : 0}`);
  }
  return `${out.join('\n')}\n`;
}

function num(obj: unknown, key: string): number {
  const v = (obj as Record<string, unknown>)?.[key];
  return typeof v === 'number' ? v : typeof v === 'bigint' ? Number(v) : 0;
}
