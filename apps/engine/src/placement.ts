import { open, stat } from 'node:fs/promises';
import { freemem } from 'node:os';
import type { Device } from '@hydra-engine/native-ggml';
import {
  contextFit,
  type GgufSource,
  type ModelFacts,
  modelFactsFromGguf,
  planSplit,
  readGguf,
  type SplitPlanOptions,
} from '@hydra-engine/resolver';
import type { Params } from '@hydra-engine/tiering';
import { HydraError } from './errors.js';

/** Where each layer of the loaded model lives, as the resolver's planner (mirroring llama.cpp) places it. */
export interface Placement {
  nLayer: number;
  /** One row per device holding layers, host (CPU) first. */
  rows: { device: string; description: string; first: number; last: number; output: boolean }[];
}

/** A GGUF byte reader over node:fs (the resolver takes its reader injected). */
export async function fileSource(path: string): Promise<GgufSource & { close(): Promise<void> }> {
  const fh = await open(path, 'r');
  const { size } = await fh.stat();
  return {
    size,
    async read(offset: number, length: number): Promise<Uint8Array> {
      const buf = Buffer.alloc(length);
      const { bytesRead } = await fh.read(buf, 0, length, offset);
      return buf.subarray(0, bytesRead);
    },
    close: () => fh.close(),
  };
}

const factsCache = new Map<string, { size: number; mtimeMs: number; facts: ModelFacts }>();

/**
 * The model facts of a GGUF, read and checked before llama.cpp is handed the file: the resolver's
 * reader refuses a malformed header, absurd dimensions and tensor data past the end of the file
 * (HYDRA_ERR_GGUF_INVALID), and hyperparameters the pinned llama.cpp asserts on (block_count 0 or
 * 1e9, expert counts: HYDRA_ERR_MODEL_METADATA), which would abort the process. Cached per path,
 * size and modification time.
 */
export async function modelFacts(path: string): Promise<ModelFacts> {
  const st = await stat(path);
  const hit = factsCache.get(path);
  if (hit && hit.size === st.size && hit.mtimeMs === st.mtimeMs) return hit.facts;
  const src = await fileSource(path);
  let facts: ModelFacts;
  try {
    facts = modelFactsFromGguf(await readGguf(src));
  } finally {
    await src.close();
  }
  factsCache.set(path, { size: st.size, mtimeMs: st.mtimeMs, facts });
  return facts;
}

function offloadDevices(cfg: Params, devices: Device[]): Device[] {
  const named = (cfg.devices as string[]) ?? [];
  return named.length > 0
    ? named.map((n) => devices.find((d) => d.name === n)).filter((d): d is Device => d !== undefined)
    : devices.filter((d) => d.type !== 'cpu');
}

/** llama.cpp's LLAMA_MAX_SEQ (src/llama-cparams.h of the pinned version). */
export const LLAMA_MAX_SEQ = 256;

/** Host memory a new context may use: available memory, within the cgroup limit when there is one. */
export function hostFreeBytes(): number {
  let free = freemem();
  const limit = process.constrainedMemory?.() ?? 0;
  if (limit > 0 && limit < Number.MAX_SAFE_INTEGER)
    free = Math.min(free, Math.max(0, limit - process.memoryUsage.rss()));
  return Math.floor(free);
}

/** The planner's view of the context `cfg` asks for, over the devices its KV goes to. */
function contextPlan(facts: ModelFacts, cfg: Params, devices: Device[], hostFree: number): SplitPlanOptions {
  const offload = cfg.no_kv_offload ? [] : offloadDevices(cfg, devices);
  const ngl = cfg.n_gpu_layers as number;
  const onHost = offload.length === 0 || ngl === 0;
  const nCtx = (cfg.n_ctx as number) || facts.nCtxTrain || 4096;
  const nBatch = Math.min((cfg.n_batch as number) || 2048, nCtx);
  const split = (cfg.tensor_split as number[]) ?? [];
  return {
    // Everything on the host is planned as one device holding every layer.
    devices: onHost
      ? [{ name: 'host', freeBytes: hostFree }]
      : offload.map((d) => ({ name: d.name, freeBytes: Math.max(0, Math.floor(d.free)) })),
    nCtx,
    cacheTypeK: (cfg.cache_type_k as string) || 'f16',
    cacheTypeV: (cfg.cache_type_v as string) || 'f16',
    nParallel: (cfg.n_parallel as number) || 1,
    kvUnified: cfg.kv_unified === true,
    nUbatch: Math.min((cfg.n_ubatch as number) || 512, nBatch),
    flashAttn: cfg.flash_attn !== 'off',
    swaFull: cfg.swa_full === true,
    // No margin: this refuses what cannot fit; what fits only barely is llama.cpp's to refuse.
    marginBytes: 0,
    ...(onHost ? {} : ngl >= 0 ? { nGpuLayers: ngl } : {}),
    ...(!onHost && split.length === offload.length && split.length > 0 ? { tensorSplit: split } : {}),
  };
}

/**
 * Refuses, before anything is allocated, a context that cannot be built: `n_parallel` above
 * llama.cpp's 256 sequences (HYDRA_ERR_BAD_VALUE), or KV cache, recurrent state, compute and
 * batch buffers that do not fit the memory of the devices they go to (the resolver's contextFit;
 * HYDRA_ERR_INSUFFICIENT_MEMORY naming the size keys). What `current` (the context in force, freed
 * before the rebuild) holds counts as free.
 */
export function checkContext(
  facts: ModelFacts,
  cfg: Params,
  devices: Device[],
  current?: { facts: ModelFacts; cfg: Params },
  hostFree = hostFreeBytes(),
): void {
  const nParallel = (cfg.n_parallel as number) || 1;
  if (nParallel > LLAMA_MAX_SEQ) {
    throw new HydraError(
      'HYDRA_ERR_BAD_VALUE',
      `n_parallel ${nParallel} is above llama.cpp's ${LLAMA_MAX_SEQ} sequences`,
      { keys: ['n_parallel'] },
    );
  }
  const next = contextPlan(facts, cfg, devices, hostFree);
  let held = current ? contextPlan(current.facts, current.cfg, devices, hostFree) : undefined;
  const sameDevices =
    held && held.devices.map((d) => d.name).join() === next.devices.map((d) => d.name).join();
  if (!sameDevices) held = undefined;
  const short = contextFit(facts, {
    next,
    ...(held ? { current: held, currentFacts: current!.facts } : {}),
    nBatch: Math.min((cfg.n_batch as number) || 2048, next.nCtx),
    hostFreeBytes: hostFree,
  });
  if (!short) return;
  const mib = (b: number) => `${Math.ceil(b / (1024 * 1024))} MiB`;
  throw new HydraError(
    'HYDRA_ERR_INSUFFICIENT_MEMORY',
    `a context of n_ctx ${next.nCtx} x ${next.nParallel} sequence(s) needs ${mib(short.needBytes)} on ${short.device}, ` +
      `which has ${mib(short.freeBytes)} free`,
    {
      keys: ['n_ctx', 'n_batch', 'n_ubatch', 'n_parallel', 'cache_type_k', 'cache_type_v'],
      details: { device: short.device, need_bytes: short.needBytes, free_bytes: short.freeBytes },
    },
  );
}

/** Computes the layer placement of a model loaded with `cfg` over the devices the backend lists. */
export async function computePlacement(path: string, cfg: Params, devices: Device[]): Promise<Placement> {
  const facts = await modelFacts(path);
  const offload = offloadDevices(cfg, devices);
  const nLayer = facts.layers.length;
  const ngl = cfg.n_gpu_layers as number;
  const split = (cfg.tensor_split as number[]) ?? [];
  const rows: Placement['rows'] = [];
  if (offload.length === 0 || ngl === 0) {
    rows.push({ device: 'CPU', description: 'host', first: 0, last: nLayer - 1, output: true });
    return { nLayer, rows };
  }
  const plan = planSplit(facts, {
    devices: offload.map((d) => ({ name: d.name, freeBytes: d.free })),
    nCtx: Math.max(256, (cfg.n_ctx as number) || 4096),
    ...(ngl >= 0 ? { nGpuLayers: ngl } : {}),
    ...(split.length > 0 ? { tensorSplit: split } : {}),
  });
  const firstOffloaded = Math.min(
    ...plan.devices.filter((d) => d.layers).map((d) => d.layers!.first),
    nLayer,
  );
  if (firstOffloaded > 0) {
    const outputOnDevice = plan.devices.some((d) => d.output);
    rows.push({
      device: 'CPU',
      description: 'host',
      first: 0,
      last: firstOffloaded - 1,
      output: !outputOnDevice,
    });
  }
  for (const d of plan.devices) {
    if (!d.layers && !d.output) continue;
    const dev = offload.find((x) => x.name === d.name);
    rows.push({
      device: d.name,
      description: dev?.description ?? '',
      first: d.layers?.first ?? -1,
      last: d.layers?.last ?? -1,
      output: d.output,
    });
  }
  return { nLayer, rows };
}

/** One line per row: `layers 0-1 on CPU (host)`. */
export function formatPlacement(p: Placement): string[] {
  return p.rows.map((r) => {
    const layers =
      r.first < 0
        ? 'no repeating layers'
        : r.first === r.last
          ? `layer ${r.first}`
          : `layers ${r.first}-${r.last}`;
    return `${layers}${r.output ? ' + output' : ''} on ${r.device}${r.description ? ` (${r.description})` : ''}`;
  });
}
