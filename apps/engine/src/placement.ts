import { open, stat } from 'node:fs/promises';
import { freemem } from 'node:os';
import type { Device } from '@hydra-engine/native-ggml';
import {
  type ClosableGgufSource,
  contextFit,
  type FitDevice,
  type FitOptions,
  type FitReport,
  fitToWire,
  type GgufFile,
  type ModelFacts,
  modelFactsFromGguf,
  type PlanDevice,
  planFit,
  planSplit,
  readGgufFrom,
  rsRollbackArch,
  type SplitPlanOptions,
} from '@hydra-engine/resolver';
import type { Params } from '@hydra-engine/tiering';
import { rsSnapshotsFor } from './core/speculative.js';
import { HydraError } from './errors.js';

/** Where each layer of the loaded model lives, as the resolver's planner (mirroring llama.cpp) places it. */
export interface Placement {
  nLayer: number;
  /** One row per device holding layers, host (CPU) first. */
  rows: { device: string; description: string; first: number; last: number; output: boolean }[];
}

/** A GGUF byte reader over node:fs (the resolver takes its reader injected). */
export async function fileSource(path: string): Promise<ClosableGgufSource> {
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

/** The GGUF header, metadata and tensor table of the file at `path`, its handle closed after. */
export function readGgufFile(path: string): Promise<GgufFile> {
  return readGgufFrom(() => fileSource(path));
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
  const facts = modelFactsFromGguf(await readGgufFile(path));
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
  const ngl = typeof cfg.n_gpu_layers === 'number' ? cfg.n_gpu_layers : -1;
  const onHost = offload.length === 0 || ngl === 0;
  const nCtx = (cfg.n_ctx as number) || facts.nCtxTrain || 4096;
  const nBatch = Math.min((cfg.n_batch as number) || 2048, nCtx);
  const split = Array.isArray(cfg.tensor_split) ? (cfg.tensor_split as number[]) : [];
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
    // Speculation on a recurrent memory keeps rollback snapshots (contextParamsFrom's nRsSeq).
    nRsSeq: rsSnapshotsFor(cfg),
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
  // llama.cpp keeps a sequence's last 1 + n_rs_seq tokens in one ubatch, and aborts the process
  // (GGML_ASSERT in split_equal) when n_ubatch cannot hold more than that.
  const nRsSeq = rsSnapshotsFor(cfg);
  const nUbatch = Math.min((cfg.n_ubatch as number) || 512, (cfg.n_batch as number) || 2048);
  if (nRsSeq > 0 && rsRollbackArch(facts.arch) && facts.layers.some((l) => l.kind === 'recurrent')) {
    if (nRsSeq + 1 >= nUbatch)
      throw new HydraError(
        'HYDRA_ERR_BAD_VALUE',
        `speculation on this recurrent model guesses up to ${nRsSeq} tokens a step, which needs n_ubatch above ${nRsSeq + 1} (have ${nUbatch}): lower the draft length or raise n_ubatch`,
        { keys: ['n_ubatch', 'speculative.types'] },
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
  const ngl = typeof cfg.n_gpu_layers === 'number' ? cfg.n_gpu_layers : -1;
  const split = Array.isArray(cfg.tensor_split) ? (cfg.tensor_split as number[]) : [];
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

/** How the engine judges fit (`--fit-target`, `--device-memory-cap`, `--fit-prefer`). */
export interface FitSettings {
  /** MiB each device keeps free beyond the plan; default 0 (what fits only barely is llama.cpp's to refuse). */
  readonly targetMib?: number;
  /** At most this many MiB per device name (`CPU` for the host) are planned; for budgets and tests. */
  readonly capsMib?: Readonly<Record<string, number>>;
  /** The device `auto` gives the most layers; default the last planned device (the local one). */
  readonly prefer?: string;
}

/** Checks {@link FitSettings} once (HYDRA_ERR_BAD_ARGUMENT naming the option); returns a frozen copy. */
export function checkFitSettings(fit: unknown, where = 'options.fit'): FitSettings {
  if (fit === undefined) return Object.freeze({});
  const badArg = (key: string, msg: string) =>
    new HydraError('HYDRA_ERR_BAD_ARGUMENT', `${where}.${key} ${msg}`, { keys: [key] });
  if (typeof fit !== 'object' || fit === null || Array.isArray(fit))
    throw new HydraError('HYDRA_ERR_BAD_ARGUMENT', `${where} must be an object`);
  const { targetMib, capsMib, prefer, ...extra } = fit as Record<string, unknown>;
  const unknownKey = Object.keys(extra)[0];
  if (unknownKey !== undefined) throw badArg(unknownKey, 'is not a fit setting');
  if (
    targetMib !== undefined &&
    (typeof targetMib !== 'number' || !Number.isFinite(targetMib) || targetMib < 0)
  )
    throw badArg('targetMib', 'must be a number >= 0');
  const caps: Record<string, number> = {};
  if (capsMib !== undefined) {
    if (typeof capsMib !== 'object' || capsMib === null || Array.isArray(capsMib))
      throw badArg('capsMib', 'must map device names to MiB');
    for (const [name, v] of Object.entries(capsMib)) {
      if (name === '' || typeof v !== 'number' || !Number.isFinite(v) || v < 0)
        throw badArg('capsMib', `entry ${JSON.stringify(name)} must be a number of MiB >= 0`);
      caps[name] = v;
    }
  }
  if (prefer !== undefined && (typeof prefer !== 'string' || prefer === ''))
    throw badArg('prefer', 'must be a device name');
  return Object.freeze({
    ...(targetMib !== undefined ? { targetMib: targetMib as number } : {}),
    ...(capsMib !== undefined ? { capsMib: Object.freeze(caps) } : {}),
    ...(prefer !== undefined ? { prefer: prefer as string } : {}),
  });
}

/**
 * The devices a load of `cfg` offloads to, in llama.cpp's order (peers' RPC devices first), with
 * their figures from `devices`; `host` when everything stays in host memory; `unknown` naming a
 * peer whose devices are not registered yet (their memory cannot be read without dialling it).
 */
function loadTargets(
  cfg: Params,
  devices: Device[],
  peerDevices: (endpoint: string) => string[] | undefined,
): { kind: 'devices'; list: Device[] } | { kind: 'host' } | { kind: 'unknown'; peer: string } {
  const peers = (cfg.rpc_servers as string[]) ?? [];
  const named = (cfg.devices as string[]) ?? [];
  let names: string[];
  if (named.length > 0) names = named;
  else {
    const rpc: string[] = [];
    for (const p of peers) {
      const got = peerDevices(p);
      if (!got) return { kind: 'unknown', peer: p };
      rpc.push(...got);
    }
    names = [
      ...rpc,
      ...devices
        .filter((d) => d.type !== 'cpu' && d.type !== 'accel' && !d.name.startsWith('RPC'))
        .map((d) => d.name),
    ];
  }
  const list = names
    .map((n) => devices.find((d) => d.name === n))
    .filter((d): d is Device => d !== undefined);
  if (list.length === 0 || cfg.n_gpu_layers === 0) return { kind: 'host' };
  return { kind: 'devices', list };
}

/** Inputs of {@link fitOf} beyond the model and configuration. */
export interface FitInputs {
  /** Every device the backend lists now (local and registered peers'). */
  devices: Device[];
  /** The RPC device names a registered peer added; undefined for a peer not registered. */
  peerDevices: (endpoint: string) => string[] | undefined;
  fit: FitSettings;
  /** The configuration in force and what a rebuild frees of it (`model`: all of it; `context`: its KV and buffers). */
  current?: { facts: ModelFacts; cfg: Params; frees: 'model' | 'context' } | undefined;
  hostFree?: number;
}

/** The fit verdict of `cfg` (its `auto` split/offload resolved), or why it cannot be judged. */
export type EngineFit =
  | {
      report: FitReport;
      /**
       * Why the figures are not a verdict: tensor overrides (`override_tensors`, `n_cpu_moe`, the
       * experts COMBINE puts on a peer) move weights the planner keeps with their layer.
       */
      approximate?: string;
    }
  | { unknown: string };

function fitOptions(facts: ModelFacts, cfg: Params, list: PlanDevice[]): Omit<FitOptions, 'devices'> {
  const nCtx = (cfg.n_ctx as number) || facts.nCtxTrain || 4096;
  const nBatch = Math.min((cfg.n_batch as number) || 2048, nCtx);
  const split = cfg.tensor_split;
  const ngl = cfg.n_gpu_layers;
  return {
    nCtx,
    cacheTypeK: (cfg.cache_type_k as string) || 'f16',
    cacheTypeV: (cfg.cache_type_v as string) || 'f16',
    nParallel: (cfg.n_parallel as number) || 1,
    kvUnified: cfg.kv_unified === true,
    nUbatch: Math.min((cfg.n_ubatch as number) || 512, nBatch),
    flashAttn: cfg.flash_attn !== 'off',
    swaFull: cfg.swa_full === true,
    // Speculation on a recurrent memory keeps rollback snapshots (contextParamsFrom's nRsSeq).
    nRsSeq: rsSnapshotsFor(cfg),
    ...(split === 'auto'
      ? { tensorSplit: 'auto' as const }
      : Array.isArray(split) && split.length === list.length && split.length > 0
        ? { tensorSplit: split as number[] }
        : {}),
    ...(ngl === 'auto'
      ? { nGpuLayers: 'auto' as const }
      : typeof ngl === 'number' && ngl >= 0
        ? { nGpuLayers: ngl }
        : {}),
  };
}

/**
 * Whether `cfg` fits the devices it loads to, per device: weights, KV, recurrent state and
 * compute (the resolver's planFit) against free memory plus what the configuration in force frees
 * first, under the `--device-memory-cap` caps and `--fit-target` margin. Host-only loads are
 * planned as one device `CPU` against host memory.
 */
export function fitOf(facts: ModelFacts, cfg: Params, inputs: FitInputs): EngineFit {
  const target = loadTargets(cfg, inputs.devices, inputs.peerDevices);
  if (target.kind === 'unknown')
    return {
      unknown: `the devices of peer ${target.peer} are not registered yet (known once it has served a load)`,
    };
  const hostFree = inputs.hostFree ?? hostFreeBytes();
  const list: PlanDevice[] =
    target.kind === 'host'
      ? [{ name: 'CPU', freeBytes: hostFree }]
      : target.list.map((d) => ({ name: d.name, freeBytes: Math.max(0, Math.floor(d.free)) }));
  const held = new Map<string, number>();
  let hostHeld = 0;
  const cur = inputs.current;
  if (cur) {
    const was = fitOf(cur.facts, cur.cfg, { ...inputs, current: undefined, fit: {} });
    if ('report' in was) {
      const h = was.report.host;
      hostHeld = cur.frees === 'model' ? h.weightBytes + h.kvBytes : h.kvBytes;
      for (const d of was.report.devices) {
        const bytes =
          cur.frees === 'model'
            ? d.weightBytes + d.kvBytes + d.recurrentBytes + d.computeBytes
            : d.kvBytes + d.recurrentBytes + d.computeBytes;
        held.set(d.name, bytes);
      }
      // A host-only configuration in force held its memory as the device CPU.
      if (target.kind !== 'host') hostHeld += held.get('CPU') ?? 0;
    }
  }
  const mib = 1024 * 1024;
  // device_memory_cap (NAME=MiB items, the registry's engine setting) over the engine's own caps.
  const caps: Record<string, number> = { ...(inputs.fit.capsMib ?? {}) };
  for (const item of (cfg.device_memory_cap as string[] | undefined) ?? []) {
    const at = item.lastIndexOf('=');
    caps[item.slice(0, at)] = Number(item.slice(at + 1));
  }
  const devices: FitDevice[] = list.map((d) => ({
    ...d,
    heldBytes: held.get(d.name) ?? 0,
    ...(caps[d.name] !== undefined ? { capBytes: Math.floor((caps[d.name] as number) * mib) } : {}),
  }));
  const prefer =
    inputs.fit.prefer && list.some((d) => d.name === inputs.fit.prefer) ? inputs.fit.prefer : undefined;
  // Host-only: every layer is planned onto the one device CPU (no split, nothing left "on the host").
  const { tensorSplit: _s, nGpuLayers: _n, ...hostOnly } = fitOptions(facts, cfg, list);
  const report = planFit(facts, {
    ...(target.kind === 'host' ? hostOnly : fitOptions(facts, cfg, list)),
    devices,
    marginBytes: Math.floor((inputs.fit.targetMib ?? 0) * mib),
    ...(prefer ? { prefer } : {}),
    // What stays off the devices must fit the host too (a host-only plan is the host already).
    ...(target.kind === 'host' ? {} : { hostFreeBytes: hostFree + hostHeld }),
  });
  const overrides = ((cfg.override_tensors as string[] | undefined) ?? []).length > 0;
  const cpuMoe = ((cfg.n_cpu_moe as number | undefined) ?? 0) > 0;
  const moeCombine =
    facts.modelClass === 'moe' && ((cfg.rpc_servers as string[] | undefined) ?? []).length > 0;
  if (overrides || cpuMoe || moeCombine) {
    const what = overrides
      ? 'override_tensors'
      : cpuMoe
        ? 'n_cpu_moe'
        : 'the experts COMBINE places on the peer';
    return {
      report,
      approximate: `${what} moves weights off their layer's device, which the planner does not model`,
    };
  }
  return { report };
}

/** HYDRA_ERR_WONT_FIT with the per-device figures of `report` in `details`. */
export function wontFit(report: FitReport, what: string): HydraError {
  const mibOf = (b: number) => `${Math.ceil(b / (1024 * 1024))} MiB`;
  const short = report.devices.filter((d) => !d.fits);
  return new HydraError(
    'HYDRA_ERR_WONT_FIT',
    `${what} does not fit: ${short
      .map(
        (d) =>
          `${d.name} needs ${mibOf(d.availableBytes - d.headroomBytes)} (${d.binding} the largest) of ${mibOf(d.availableBytes)}`,
      )
      .join('; ')}`,
    {
      keys: [
        'model',
        'tensor_split',
        'n_gpu_layers',
        'n_ctx',
        'cache_type_k',
        'cache_type_v',
        'override_tensors',
      ],
      details: fitToWire(report),
    },
  );
}

/**
 * `cfg` with `tensor_split: "auto"` and `n_gpu_layers: "auto"` replaced by what the planner chose
 * (unchanged without them); HYDRA_ERR_WONT_FIT when no choice fits. `null` fit (a peer not
 * registered) leaves auto for llama.cpp's defaults: an even split by free memory, all layers.
 */
export function resolveAuto(
  facts: ModelFacts,
  cfg: Params,
  inputs: FitInputs,
): { cfg: Params; fit: EngineFit | undefined } {
  if (cfg.tensor_split !== 'auto' && cfg.n_gpu_layers !== 'auto') return { cfg, fit: undefined };
  const fit = fitOf(facts, cfg, inputs);
  const out: Params = { ...cfg };
  if ('unknown' in fit) {
    if (out.tensor_split === 'auto') out.tensor_split = [];
    if (out.n_gpu_layers === 'auto') out.n_gpu_layers = -1;
    return { cfg: out, fit };
  }
  // With overrides the figures over-count the devices: the closest candidate is loaded and
  // llama.cpp has the last word.
  if (!fit.report.fits && !fit.approximate) throw wontFit(fit.report, 'no split or offload count');
  const hostOnly = fit.report.devices.length === 1 && fit.report.devices[0]?.name === 'CPU';
  if (out.tensor_split === 'auto') out.tensor_split = hostOnly ? [] : [...fit.report.tensorSplit];
  if (out.n_gpu_layers === 'auto') out.n_gpu_layers = hostOnly ? -1 : fit.report.nGpuLayers;
  return { cfg: out, fit };
}
