import type { IncomingMessage, ServerResponse } from 'node:http';
import { Allowlist, type HydraPort, type HydraPortStats } from '@hydra-engine/hydra-rpc';
import { readJsonObject } from '../body.js';
import { engineAccounting } from '../combine/accounting.js';
import { HydraError, httpStatus } from '../errors.js';
import type { Controller } from './controller.js';

/** The Hydra STATUS reply (protocol.md) with the extra facts a coordinator uses. */
export function controlStatus(c: Controller, poolStats?: () => HydraPortStats | undefined) {
  const { engine } = c;
  const m = engine.model?.info;
  const applied = engine.layers.overrides();
  const sources: Record<string, string> = {};
  for (const key of Object.keys(applied)) sources[key] = engine.layers.sourceOf(key) ?? 'default';
  const stats = poolStats?.();
  return {
    state: engine.state,
    model: m
      ? {
          path: engine.modelPath ?? '',
          arch: m.arch,
          n_layer: m.nLayer,
          n_embd: m.nEmbd,
          n_vocab: m.nVocab,
          n_expert: m.nExpert,
          n_params: m.nParams,
          size: m.size,
          n_ctx_train: m.nCtxTrain,
        }
      : null,
    mode: engine.mode,
    epoch: engine.epoch,
    applied,
    applied_sources: sources,
    deferred_keys: c.deferredKeys,
    holds: engine.holders,
    drain_timeout_ms: c.drainTimeoutMs,
    slots: {
      total: engine.slots.total,
      busy: engine.slots.busy,
      queued: engine.queueDepth,
      n_ctx_seq: engine.slots.nCtxSeq,
    },
    speculative: {
      drafted: engine.counters.specDrafted,
      accepted: engine.counters.specAccepted,
      acceptance:
        engine.counters.specDrafted > 0 ? engine.counters.specAccepted / engine.counters.specDrafted : 0,
      // The same per speculative.types.
      types: Object.fromEntries(
        Object.entries(engine.counters.specByType.drafted).map(([type, drafted]) => {
          const accepted = engine.counters.specByType.accepted[type] ?? 0;
          return [type, { drafted, accepted, acceptance: drafted > 0 ? accepted / drafted : 0 }];
        }),
      ),
    },
    state_chunk_size: c.stateChunkSize,
    devices: engine
      .devices()
      .map(({ name, description, type, free, total }) => ({ name, description, type, free, total })),
    peers: peersStatus(engine),
    ...(stats ? { pool: stats.rpc, connections: stats.connections } : {}),
    ...(engine.placement ? { placement: engine.placement.rows } : {}),
    ...(engine.memory ? { memory: memoryStatus(engine.memory) } : {}),
    ...(engine.lastError ? { last_error: engine.lastError } : {}),
    ...(c.lastRebuildFailure ? { last_rebuild_failure: c.lastRebuildFailure } : {}),
    ...(engine.degraded ? { degraded: engine.degraded } : {}),
  };
}

// llama.cpp's allocation per device, what PLAN's fit predicts per device: a buffer in host memory
// counts as "host" whatever its type names (a pinned CUDA_Host names a CUDA device; CPU_REPACK
// names the CPU device but is not "host" to ggml, since its layout is not plain).
function memoryStatus(rows: NonNullable<Controller['engine']['memory']>) {
  return rows.map((r) => ({
    device: r.host || r.device === null || r.device === 'CPU' ? 'host' : r.device,
    buffer_type: r.bufferType,
    model_bytes: r.model,
    context_bytes: r.context,
    compute_bytes: r.compute,
  }));
}

// Each configured peer with its ggml-RPC accounting (null until the head registered it).
function peersStatus(engine: Controller['engine']) {
  const acc = engineAccounting(engine);
  acc.snapshot();
  return (engine.layers.get('rpc_servers') as string[]).map((endpoint) => ({
    endpoint,
    accounting: acc.status(endpoint),
  }));
}

/**
 * Registers every control opcode of protocol.md on the merged port (HELLO stays the caller's;
 * the port itself answers the retired PIPELINE_ATTACH).
 */
export function registerControl(port: HydraPort, c: Controller): void {
  port.handle('STATUS', () => controlStatus(c, () => port.stats()));
  port.handle('CONFIGURE', (req) => c.configure(req));
  port.handle('PLAN', (req) => c.plan(req));
  port.handle('STATE_GET', (req) => c.stateGet(req));
  port.handle('STATE_PUT', (req) => c.statePut(req));
  port.handle('SET_EXPERT_MODE', (req) => c.setExpertMode(req));
  port.handle('SWAP_QUANT', (req) => c.swapQuant(req));
}

function reply(res: ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
  res.end(text);
}

function fail(res: ServerResponse, err: unknown): void {
  const e = err instanceof HydraError ? err : undefined;
  const code = e?.code ?? 'HYDRA_ERR_INTERNAL';
  if (res.headersSent) return;
  reply(res, httpStatus(code), {
    success: false,
    error: {
      code,
      message: (err as Error)?.message ?? String(err),
      ...(e?.keys?.length ? { keys: e.keys } : {}),
      // As the wire carries them (HYDRA_ERR_WONT_FIT's per-device figures, a peer's address).
      ...(e?.details ? { details: e.details } : {}),
    },
  });
}

export interface ControlRoutesOptions {
  /** CIDR list (`--control-allow-from`); the peer address must be on it. */
  allowFrom: readonly string[];
  maxBodyBytes: number;
  bodyTimeoutMs: number;
  poolStats?: () => HydraPortStats | undefined;
}

/**
 * The operator mirrors of the control opcodes under `/control/`. Returns a handler that answers
 * `/control/*` requests (true) and leaves other paths alone (false).
 */
export function controlRoutes(
  c: Controller,
  options: ControlRoutesOptions,
): (req: IncomingMessage, res: ServerResponse, path: string) => Promise<boolean> {
  const allow = new Allowlist(options.allowFrom);
  const post: Record<string, (body: Record<string, unknown>) => Promise<object>> = {
    '/control/configure': async (b) => c.configure(b),
    '/control/plan': async (b) => c.plan(b),
    '/control/load_model': (b) => c.loadModel(b),
    '/control/set_expert_mode': (b) => c.setExpertMode(b),
  };
  return async (req, res, path) => {
    if (path !== '/control' && !path.startsWith('/control/')) return false;
    try {
      if (!allow.allows(req.socket.remoteAddress)) {
        req.resume();
        throw new HydraError(
          'HYDRA_ERR_FORBIDDEN',
          `${req.socket.remoteAddress} is not in --control-allow-from`,
        );
      }
      if (path === '/control/status') {
        req.resume();
        if (req.method !== 'GET') throw new HydraError('HYDRA_ERR_METHOD_NOT_ALLOWED', 'use GET');
        reply(res, 200, { success: true, ...controlStatus(c, options.poolStats) });
        return true;
      }
      const handler = post[path];
      if (!handler) {
        req.resume();
        throw new HydraError('HYDRA_ERR_NOT_FOUND', `no route ${req.method} ${path}`);
      }
      if (req.method !== 'POST') {
        req.resume();
        throw new HydraError('HYDRA_ERR_METHOD_NOT_ALLOWED', 'use POST');
      }
      const body = await readJsonObject(req, options.maxBodyBytes, options.bodyTimeoutMs);
      reply(res, 200, { success: true, ...(await handler(body)) });
    } catch (err) {
      fail(res, err);
    }
    return true;
  };
}
