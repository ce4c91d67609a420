import { fail } from './errors.js';
import { type GgmlTypeInfo, ggmlTypeByName, KV_CACHE_TYPES, rowBytes } from './gguf/ggml-types.js';
import type { ModelFacts } from './model-facts.js';

const MIB = 1024 * 1024;

/** A device as llama.cpp will see it, in llama.cpp's device order (RPC devices come first). */
export interface PlanDevice {
  readonly name: string;
  /** Free memory in bytes before the model loads. */
  readonly freeBytes: number;
}

/**
 * Where a layer's KV cache goes. `layer`: on the device holding the layer's weights, as the pinned
 * llama.cpp's llama_kv_cache does (model.dev_layer(il)). `rounded-fraction`: device d keeps the KV of
 * layers [round(S(d-1) * (n+1)), round(S(d) * (n+1))), S being the cumulative split; this is the rule
 * measured on llama.cpp b10433 in the split-limit notes, kept so those measurements can be replayed.
 */
export type KvPlacement = 'layer' | 'rounded-fraction';

/** Inputs of {@link planSplit}. */
export interface SplitPlanOptions {
  readonly devices: readonly PlanDevice[];
  readonly nCtx: number;
  /** KV cache types (llama.cpp names); default f16. */
  readonly cacheTypeK?: string;
  readonly cacheTypeV?: string;
  /** n_parallel (n_seq_max); default 1. */
  readonly nParallel?: number;
  /** One KV stream shared by all sequences (llama.cpp kv_unified); default false. */
  readonly kvUnified?: boolean;
  /** Default 512. */
  readonly nUbatch?: number;
  /** Default true. Without flash attention the compute estimate includes the KQ matrix. */
  readonly flashAttn?: boolean;
  /** Full-size SWA cache (llama.cpp swa_full); default false. */
  readonly swaFull?: boolean;
  /** Layers to offload, counting the output layer (llama.cpp n_gpu_layers); default all, negative = all. */
  readonly nGpuLayers?: number;
  /** Split proportions per device; default (and when all zero) the devices' free memory, as llama.cpp does. */
  readonly tensorSplit?: readonly number[];
  /** Bytes each device must keep free beyond the plan; default 256 MiB. */
  readonly marginBytes?: number;
  /** Load MTP/nextn layer weights (llama.cpp load_mtp); default false. */
  readonly loadMtp?: boolean;
  /**
   * Recurrent-state snapshots per sequence (llama.cpp n_rs_seq, for speculative rollback); default
   * 0. The recurrent rows grow (1 + nRsSeq) times on an arch with partial rollback
   * ({@link rsRollbackArch}); llama.cpp clamps it to 0 on the others.
   */
  readonly nRsSeq?: number;
  /** Default `layer`. */
  readonly kvPlacement?: KvPlacement;
}

/** The memory category that stops a device from fitting. */
export type BindingConstraint = 'weights' | 'kv' | 'recurrent' | 'compute';

/** The plan for one device. */
export interface DevicePlan {
  readonly name: string;
  readonly freeBytes: number;
  /** Repeating layers whose weights live here, as an inclusive range, or null. */
  readonly layers: { readonly first: number; readonly last: number; readonly count: number } | null;
  /** Whether the output layer (output, output_norm) lives here. */
  readonly output: boolean;
  /** Layers whose attention KV cache lives here (full attention and SWA). */
  readonly kvLayers: readonly number[];
  /** Layers whose recurrent state lives here. */
  readonly recurrentLayers: readonly number[];
  readonly weightBytes: number;
  /** Attention KV bytes (full-attention and SWA layers). */
  readonly kvBytes: number;
  /** Recurrent-state bytes (linear/SSM layers). */
  readonly recurrentBytes: number;
  /** Compute buffer estimate (activations of one ubatch, logits on the output device). */
  readonly computeBytes: number;
  readonly marginBytes: number;
  /** weight + kv + recurrent + compute + margin. */
  readonly totalBytes: number;
  /** freeBytes - totalBytes; negative when it does not fit. */
  readonly headroomBytes: number;
  readonly fits: boolean;
  /** The largest category on a device that does not fit; null when it fits. */
  readonly binding: BindingConstraint | null;
}

/** The largest share of layers a device can take while it still fits. */
export interface MaxFraction {
  readonly device: string;
  /** Fraction of the offloaded layers (output layer included) toward this device. */
  readonly fraction: number;
  /** Repeating layers (plus the output layer when it lands there) the device then holds. */
  readonly layerCount: number;
  /** A tensor_split vector that realises it, the other devices keeping their relative proportions. */
  readonly tensorSplit: readonly number[];
}

/** The result of {@link planSplit}. */
export interface SplitPlan {
  readonly model: {
    readonly arch: string;
    readonly nLayerAll: number;
    readonly nLayerNextn: number;
    readonly modelClass: string;
  };
  readonly nCtx: number;
  readonly kvCells: number;
  readonly nStream: number;
  readonly cacheTypeK: string;
  readonly cacheTypeV: string;
  readonly nParallel: number;
  readonly kvPlacement: KvPlacement;
  /** Normalised split proportions used (sums to 1). */
  readonly tensorSplit: readonly number[];
  readonly devices: readonly DevicePlan[];
  /** What stays in host memory: token_embd, layers not offloaded. */
  readonly host: {
    readonly layers: readonly number[];
    readonly weightBytes: number;
    readonly kvBytes: number;
  };
  readonly fits: boolean;
  /** The device with the least headroom. */
  readonly bindingDevice: string;
  readonly maxFraction: readonly MaxFraction[];
  readonly warnings: readonly string[];
}

interface Resolved {
  readonly devices: readonly PlanDevice[];
  readonly typeK: GgmlTypeInfo;
  readonly typeV: GgmlTypeInfo;
  readonly nSeq: number;
  readonly unified: boolean;
  readonly nUbatch: number;
  readonly flashAttn: boolean;
  readonly swaFull: boolean;
  readonly ngl: number;
  readonly margin: number;
  readonly loadMtp: boolean;
  /** Recurrent row sets per sequence: 1 + n_rs_seq after llama.cpp's clamp. */
  readonly rsRows: number;
  readonly placement: KvPlacement;
  readonly kvCells: number;
  readonly swaCells: number;
  readonly nStream: number;
}

const pad = (x: number, n: number) => Math.ceil(x / n) * n;

// The archs whose recurrent memory keeps n_rs_seq rollback snapshots (llm_arch_supports_rs_rollback).
const RS_ROLLBACK_ARCHS: readonly string[] = [
  'qwen35',
  'qwen35moe',
  'qwen4exp',
  'deepseek4',
  'nemotron_h',
  'nemotron_h_moe',
  'lfm2',
  'lfm2moe',
  'bailingmoe3',
];

/** Whether llama.cpp keeps n_rs_seq rollback snapshots for `arch` (else it clamps n_rs_seq to 0). */
export function rsRollbackArch(arch: string): boolean {
  return RS_ROLLBACK_ARCHS.includes(arch);
}

/**
 * Predicts, before loading, how llama.cpp spreads a model over devices and what each device must
 * hold: weights (layer assignment mirrors llama_model::load_tensors), attention KV and recurrent
 * state (as llama_kv_cache / llama_memory_recurrent size them), a compute estimate and a margin.
 * Bad options throw HYDRA_ERR_BAD_VALUE.
 */
export function planSplit(facts: ModelFacts, options: SplitPlanOptions): SplitPlan {
  const r = resolve(facts, options);
  const split = options.tensorSplit ?? [];
  const plan = assemble(facts, r, split);
  const maxFraction = r.devices.map((_, d) => maxFractionFor(facts, r, split, d));
  const bindingDevice = plan.devices.reduce((a, b) => (b.headroomBytes < a.headroomBytes ? b : a)).name;
  return {
    model: {
      arch: facts.arch,
      nLayerAll: facts.nLayerAll,
      nLayerNextn: facts.nLayerNextn,
      modelClass: facts.modelClass,
    },
    nCtx: options.nCtx,
    kvCells: r.kvCells,
    nStream: r.nStream,
    cacheTypeK: r.typeK.name,
    cacheTypeV: r.typeV.name,
    nParallel: r.nSeq,
    kvPlacement: r.placement,
    tensorSplit: plan.splits,
    devices: plan.devices,
    host: plan.host,
    fits: plan.devices.every((d) => d.fits),
    bindingDevice,
    maxFraction,
    warnings: facts.warnings,
  };
}

function resolve(facts: ModelFacts, o: SplitPlanOptions): Resolved {
  const bad = (key: string, msg: string): never =>
    fail('HYDRA_ERR_BAD_VALUE', `options.${key} ${msg}`, { keys: [key] });
  if (!Array.isArray(o.devices) || o.devices.length === 0) bad('devices', 'must be a non-empty array');
  const names = new Set<string>();
  for (const d of o.devices) {
    if (typeof d?.name !== 'string' || d.name === '') bad('devices', 'entries need a name');
    if (names.has(d.name)) bad('devices', `names device ${d.name} twice`);
    names.add(d.name);
    if (!Number.isSafeInteger(d.freeBytes) || d.freeBytes < 0)
      bad('devices', 'freeBytes must be a non-negative integer');
  }
  const posInt = (key: keyof SplitPlanOptions, v: unknown, dflt: number): number => {
    if (v === undefined) return dflt;
    if (!Number.isSafeInteger(v) || (v as number) <= 0) bad(key, 'must be a positive integer');
    return v as number;
  };
  const nCtx = posInt('nCtx', o.nCtx, Number.NaN);
  if (Number.isNaN(nCtx)) bad('nCtx', 'must be a positive integer');
  const cacheType = (key: 'cacheTypeK' | 'cacheTypeV'): GgmlTypeInfo => {
    const name = o[key] ?? 'f16';
    const t = typeof name === 'string' ? ggmlTypeByName(name) : undefined;
    if (t === undefined || !(KV_CACHE_TYPES as readonly string[]).includes(t.name)) {
      return bad(key, `must be one of ${KV_CACHE_TYPES.join(', ')}`);
    }
    return t;
  };
  const typeK = cacheType('cacheTypeK');
  const typeV = cacheType('cacheTypeV');
  const nSeq = posInt('nParallel', o.nParallel, 1);
  const nUbatch = posInt('nUbatch', o.nUbatch, 512);
  const nRsSeq = o.nRsSeq ?? 0;
  if (!Number.isSafeInteger(nRsSeq) || nRsSeq < 0) bad('nRsSeq', 'must be a non-negative integer');
  const margin = o.marginBytes ?? 256 * MIB;
  if (!Number.isSafeInteger(margin) || margin < 0) bad('marginBytes', 'must be a non-negative integer');
  let ngl = facts.nLayerAll + 1;
  if (o.nGpuLayers !== undefined) {
    if (!Number.isSafeInteger(o.nGpuLayers)) bad('nGpuLayers', 'must be an integer');
    if (o.nGpuLayers >= 0) ngl = Math.min(o.nGpuLayers, ngl);
  }
  if (o.tensorSplit !== undefined) {
    if (!Array.isArray(o.tensorSplit) || o.tensorSplit.length !== o.devices.length) {
      bad('tensorSplit', 'must have one entry per device');
    }
    if (o.tensorSplit.some((x) => typeof x !== 'number' || !Number.isFinite(x) || x < 0)) {
      bad('tensorSplit', 'entries must be finite non-negative numbers');
    }
  }
  const placement = o.kvPlacement ?? 'layer';
  if (placement !== 'layer' && placement !== 'rounded-fraction')
    bad('kvPlacement', 'must be layer or rounded-fraction');
  for (const l of facts.layers) {
    if (l.nEmbdKGqa % typeK.blockSize !== 0)
      bad('cacheTypeK', `${typeK.name} needs n_embd_k_gqa divisible by ${typeK.blockSize}`);
    if (l.nEmbdVGqa % typeV.blockSize !== 0)
      bad('cacheTypeV', `${typeV.name} needs n_embd_v_gqa divisible by ${typeV.blockSize}`);
  }

  // llama_context: n_ctx is padded to 256; without a unified cache each sequence gets its own stream.
  const unified = o.kvUnified ?? false;
  const nCtxPadded = pad(nCtx, 256);
  const kvCells = unified ? nCtxPadded : pad(Math.floor(nCtxPadded / nSeq), 256);
  const nStream = unified ? 1 : nSeq;
  const swaFull = o.swaFull ?? false;
  const swaCells = swaFull
    ? kvCells
    : pad(Math.min(kvCells, facts.nSwa * (unified ? nSeq : 1) + nUbatch), 256);
  return {
    devices: o.devices,
    typeK,
    typeV,
    nSeq,
    unified,
    nUbatch,
    flashAttn: o.flashAttn ?? true,
    swaFull,
    ngl,
    margin,
    loadMtp: o.loadMtp ?? false,
    rsRows: rsRollbackArch(facts.arch) ? 1 + nRsSeq : 1,
    placement,
    kvCells,
    swaCells,
    nStream,
  };
}

/** Normalised cumulative split points in float32, as llama_model::load_tensors computes them. */
function splitPoints(r: Resolved, split: readonly number[]): number[] {
  const f = Math.fround;
  const allZero = split.length === 0 || split.every((x) => x === 0);
  const raw = allZero ? r.devices.map((d) => d.freeBytes) : split;
  if (raw.every((x) => x === 0)) return r.devices.map((_, i) => (i + 1) / r.devices.length);
  const cum: number[] = [];
  let sum = f(0);
  for (const x of raw) {
    sum = f(sum + f(x));
    cum.push(sum);
  }
  return cum.map((c) => f(c / sum));
}

interface Assembled {
  splits: number[];
  devices: DevicePlan[];
  host: { layers: number[]; weightBytes: number; kvBytes: number };
}

function assemble(facts: ModelFacts, r: Resolved, split: readonly number[]): Assembled {
  const nDev = r.devices.length;
  const points = splitPoints(r, split);
  const n1 = facts.nLayerAll + 1;
  const iGpuStart = Math.max(n1 - r.ngl, 0);
  const act = Math.min(r.ngl, n1);
  const deviceOf = (il: number): number => {
    if (il < iGpuStart || il - iGpuStart >= act) return -1;
    const x = Math.fround(Math.fround(il - iGpuStart) / act);
    let d = 0;
    while (d < nDev && !((points[d] as number) > x)) d++;
    return Math.min(d, nDev - 1);
  };
  const kvDeviceOf = (il: number): number => {
    if (r.placement === 'layer') return deviceOf(il);
    let lo = 0;
    for (let d = 0; d < nDev; d++) {
      const hi = Math.round((points[d] as number) * n1);
      if (il >= lo && il < hi) return d;
      lo = hi;
    }
    return nDev - 1;
  };

  const acc = r.devices.map(() => ({
    layers: [] as number[],
    output: false,
    kvLayers: [] as number[],
    recurrentLayers: [] as number[],
    weight: 0,
    kv: 0,
    rec: 0,
  }));
  const host = { layers: [] as number[], weightBytes: facts.inputBytes, kvBytes: 0 };
  const vMax = Math.max(0, ...facts.layers.map((l) => l.nEmbdVGqa));
  for (const l of facts.layers) {
    const d = deviceOf(l.index);
    const skipped = l.kind === 'nextn' && !r.loadMtp;
    const w = skipped ? 0 : l.weightBytes;
    if (d < 0) {
      host.layers.push(l.index);
      host.weightBytes += w;
    } else {
      const a = acc[d] as (typeof acc)[number];
      a.layers.push(l.index);
      a.weight += w;
    }
    let kv = 0;
    let rec = 0;
    if (l.kind === 'recurrent') {
      // llama_memory_recurrent: f32 r and s rows per layer, 1 + n_rs_seq row sets per sequence.
      rec = 4 * (facts.nEmbdR + facts.nEmbdS) * Math.max(1, r.nSeq) * r.rsRows;
    } else if (l.kind !== 'nextn' || facts.nextnHasKv) {
      const cells = l.kind === 'swa' ? r.swaCells : r.kvCells;
      // Without flash attention V is stored transposed and padded to the widest layer.
      const v = r.flashAttn ? l.nEmbdVGqa : vMax;
      kv = (rowBytes(r.typeK, l.nEmbdKGqa) + rowBytes(r.typeV, v)) * cells * r.nStream;
    }
    if (kv === 0 && rec === 0) continue;
    const kd = kvDeviceOf(l.index);
    if (kd < 0) {
      host.kvBytes += kv + rec;
      continue;
    }
    const a = acc[kd] as (typeof acc)[number];
    if (kv > 0) {
      a.kvLayers.push(l.index);
      a.kv += kv;
    }
    if (rec > 0) {
      a.recurrentLayers.push(l.index);
      a.rec += rec;
    }
  }
  const outDev = deviceOf(facts.nLayerAll);
  if (outDev < 0) host.weightBytes += facts.outputBytes;
  else {
    const a = acc[outDev] as (typeof acc)[number];
    a.output = true;
    a.weight += facts.outputBytes;
  }

  const maxHead = Math.max(0, ...facts.layers.map((l) => l.nHead));
  const swaLayers = new Set(facts.layers.filter((l) => l.kind === 'swa').map((l) => l.index));
  const devices = acc.map((a, d): DevicePlan => {
    const dev = r.devices[d] as PlanDevice;
    const busy = a.layers.length > 0 || a.output;
    let compute = 0;
    if (busy) {
      // ggml-alloc reuses the buffer between stages, so the reservation is the largest stage, per
      // ubatch token: attention (the KQ mask, F16 with flash attention, which every layer reads and
      // so stays alive through the FFNs; without flash attention the F32 scores of every head;
      // q/k/v and their views), the FFN (gate, up, their product), or the output (the logits
      // row). Calibrated against llama.cpp's breakdown on the CPU (docs/decisions.md, 2026-12-01).
      const swa = a.kvLayers.some((i) => swaLayers.has(i));
      const cells = a.kvLayers.length > 0 ? r.kvCells + (swa ? r.swaCells : 0) : 0;
      const mask = cells * (r.flashAttn ? 2 : 4);
      const attn = mask + (r.flashAttn ? 0 : 4 * maxHead * r.kvCells) + 24 * facts.nEmbd;
      const ffn = mask + 4 * (3 * facts.nFfMax + 3 * facts.nEmbd);
      const out = a.output ? 4 * facts.nVocab + 8 * facts.nEmbd : 0;
      compute = r.nUbatch * Math.max(a.layers.length > 0 ? Math.max(attn, ffn) : 0, out);
      // A local device reads the step's inputs from pinned host buffers; a ggml-RPC device holds
      // its own copies (the embeddings, positions and output ids, and the mask in F32 and F16).
      if (dev.name.startsWith('RPC')) compute += r.nUbatch * (10 * facts.nEmbd + 6 * cells);
    }
    const total = a.weight + a.kv + a.rec + compute + r.margin;
    const headroom = dev.freeBytes - total;
    const fits = headroom >= 0;
    const parts: [BindingConstraint, number][] = [
      ['weights', a.weight],
      ['kv', a.kv],
      ['recurrent', a.rec],
      ['compute', compute],
    ];
    const binding = fits ? null : parts.reduce((x, y) => (y[1] > x[1] ? y : x))[0];
    const first = a.layers[0];
    const last = a.layers[a.layers.length - 1];
    return {
      name: dev.name,
      freeBytes: dev.freeBytes,
      layers: first === undefined || last === undefined ? null : { first, last, count: a.layers.length },
      output: a.output,
      kvLayers: a.kvLayers,
      recurrentLayers: a.recurrentLayers,
      weightBytes: a.weight,
      kvBytes: a.kv,
      recurrentBytes: a.rec,
      computeBytes: compute,
      marginBytes: r.margin,
      totalBytes: total,
      headroomBytes: headroom,
      fits,
      binding,
    };
  });
  const splits = points.map((p, i) => (i === 0 ? p : p - (points[i - 1] as number)));
  return { splits, devices, host };
}

function splitToward(base: readonly number[], nDev: number, d: number, f: number, r: Resolved): number[] {
  const raw = base.length === nDev && base.some((x) => x > 0) ? base : r.devices.map((x) => x.freeBytes);
  let rest = 0;
  for (let i = 0; i < nDev; i++) if (i !== d) rest += raw[i] as number;
  return Array.from({ length: nDev }, (_, i) => {
    if (i === d) return f;
    return rest > 0 ? ((1 - f) * (raw[i] as number)) / rest : (1 - f) / (nDev - 1);
  });
}

function maxFractionFor(facts: ModelFacts, r: Resolved, base: readonly number[], d: number): MaxFraction {
  const nDev = r.devices.length;
  const name = (r.devices[d] as PlanDevice).name;
  if (nDev === 1) {
    const p = assemble(facts, r, [1]).devices[0] as DevicePlan;
    return { device: name, fraction: p.fits ? 1 : 0, layerCount: countOf(p), tensorSplit: [1] };
  }
  // Layer boundaries sit at k/act (weights) and, for rounded-fraction KV, at (k+0.5)/(n+1): a grid
  // of half steps visits every distinct placement.
  const steps = 2 * (facts.nLayerAll + 1);
  let best: MaxFraction = {
    device: name,
    fraction: 0,
    layerCount: 0,
    tensorSplit: splitToward(base, nDev, d, 0, r),
  };
  for (let j = 0; j <= steps; j++) {
    const f = j / steps;
    const vec = splitToward(base, nDev, d, f, r);
    const p = assemble(facts, r, vec).devices[d] as DevicePlan;
    if (!p.fits) break;
    best = { device: name, fraction: f, layerCount: countOf(p), tensorSplit: vec };
  }
  return tidy(facts, r, best, d);
}

/** Rounds the found split down to 4 decimals when that keeps the same placement on the device. */
function tidy(facts: ModelFacts, r: Resolved, m: MaxFraction, d: number): MaxFraction {
  const f = Math.floor(m.fraction * 1e4) / 1e4;
  const vec = splitToward(m.tensorSplit, r.devices.length, d, f, r).map((x) => Math.round(x * 1e4) / 1e4);
  const want = assemble(facts, r, m.tensorSplit).devices[d] as DevicePlan;
  const got = assemble(facts, r, vec).devices[d] as DevicePlan;
  const same =
    got.fits &&
    countOf(got) === countOf(want) &&
    got.kvLayers.length === want.kvLayers.length &&
    got.output === want.output;
  return same ? { ...m, fraction: f, tensorSplit: vec } : m;
}

function countOf(p: DevicePlan): number {
  return (p.layers?.count ?? 0) + (p.output ? 1 : 0);
}

/** Inputs of {@link contextFit}. */
export interface ContextFitOptions {
  /** The context to build (its devices carry their free memory now). */
  readonly next: SplitPlanOptions;
  /**
   * The context in force on the same model and devices, freed before the new one is built: what it
   * holds counts as free. Omit when nothing is freed first.
   */
  readonly current?: SplitPlanOptions;
  /** The model of `current` when it is not the one planned (a reload); default the same. */
  readonly currentFacts?: ModelFacts;
  /** n_batch: llama.cpp caps it at n_ctx; its batch buffers go to host memory. Default 2048. */
  readonly nBatch?: number;
  /** Host memory available to the context (KV of layers kept on the host, batch buffers). */
  readonly hostFreeBytes: number;
}

/** A device (or `host`) that cannot hold a planned context, as {@link contextFit} reports it. */
export interface ContextShortfall {
  readonly device: string;
  /** Context bytes the device would have to find (KV, recurrent state, compute, margin). */
  readonly needBytes: number;
  readonly freeBytes: number;
}

// llama_batch_init: token, pos, n_seq_id, seq_id pointer, one seq_id and logits flag per entry.
const BATCH_BYTES_PER_TOKEN = 4 + 4 + 4 + 8 + 4 + 1;

/**
 * Whether a context (KV cache, recurrent state, compute buffers, batch) fits the memory left,
 * computed with {@link planSplit} before anything is allocated; null when it fits, else the first
 * device short of memory. Bytes the current context holds are counted as free, since a rebuild
 * frees it first. Bad options throw HYDRA_ERR_BAD_VALUE as planSplit's do.
 */
export function contextFit(facts: ModelFacts, options: ContextFitOptions): ContextShortfall | null {
  const { next, current } = options;
  if (!Number.isSafeInteger(options.hostFreeBytes) || options.hostFreeBytes < 0) {
    fail('HYDRA_ERR_BAD_VALUE', 'options.hostFreeBytes must be a non-negative integer', {
      keys: ['hostFreeBytes'],
    });
  }
  const nBatch = options.nBatch ?? 2048;
  if (!Number.isSafeInteger(nBatch) || nBatch <= 0) {
    fail('HYDRA_ERR_BAD_VALUE', 'options.nBatch must be a positive integer', { keys: ['nBatch'] });
  }
  const contextOf = (p: SplitPlan) => ({
    devices: p.devices.map((d) => d.kvBytes + d.recurrentBytes + d.computeBytes),
    host: p.host.kvBytes,
  });
  const want = planSplit(facts, next);
  const held = current ? contextOf(planSplit(options.currentFacts ?? facts, current)) : undefined;
  const need = contextOf(want);
  for (let i = 0; i < want.devices.length; i++) {
    const d = want.devices[i] as DevicePlan;
    const bytes = (need.devices[i] as number) + d.marginBytes;
    const free = d.freeBytes + (held?.devices[i] ?? 0);
    if (bytes > free) return { device: d.name, needBytes: bytes, freeBytes: free };
  }
  const batch = Math.min(nBatch, pad(next.nCtx, 256)) * BATCH_BYTES_PER_TOKEN;
  const hostNeed = need.host + batch;
  const hostFree = options.hostFreeBytes + (held?.host ?? 0);
  if (hostNeed > hostFree) return { device: 'host', needBytes: hostNeed, freeBytes: hostFree };
  return null;
}
