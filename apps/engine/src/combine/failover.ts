// What a head reloads after a COMBINE peer loss (failover_policy), decided from the split planner's
// figures and the local devices' free memory, with the operator's per-device caps applied.
//
// The local device is the head's own accelerators (local GPUs); on a host without one it is the
// CPU itself, with the host's available memory. `solo` reloads the configuration in force without
// its peers; `offload` reloads with as many layers on the local device as fit (the planner tried
// from all of them down to 0), the rest on the CPU; `none` reloads nothing; `auto` is `solo` when
// the planner says the SOLO configuration fits the local device, else `offload`.
import type { Device } from '@hydra-engine/native-ggml';
import { type ModelFacts, type PlanDevice, planSplit, type SplitPlanOptions } from '@hydra-engine/resolver';
import type { Params } from '@hydra-engine/tiering';
import { ConfigReader } from '../core/params.js';
import { HydraError } from '../errors.js';

const FAILOVER_POLICIES = ['auto', 'solo', 'offload', 'none'] as const;
export type FailoverPolicy = (typeof FAILOVER_POLICIES)[number];

/** The policy a failover took and the figures it was taken on (STATUS and /health show it). */
export interface FailoverDecision {
  /** What the configuration asked for. */
  requested: FailoverPolicy;
  /** What was done: `auto` resolved to `solo` or `offload`. */
  policy: 'solo' | 'offload' | 'none';
  /** The offload count of the reload (`offload` only; n_layer + 1 = all). */
  n_gpu_layers?: number;
  /** The local devices planned on, with the memory the plan could use (free, capped). */
  devices: { name: string; available_bytes: number; capped: boolean }[];
  /** Whether the planner says the SOLO configuration fits them. */
  solo_fits: boolean;
}

const MIB = 1024 * 1024;

/** `device_memory_cap` items (`NAME=MiB`) as bytes per device name; a name given twice is refused. */
export function memoryCaps(items: readonly string[]): Map<string, number> {
  const caps = new Map<string, number>();
  for (const item of items) {
    const at = item.lastIndexOf('=');
    const name = item.slice(0, at);
    const mib = Number(item.slice(at + 1));
    if (at <= 0 || !Number.isSafeInteger(mib) || mib <= 0)
      throw new HydraError('HYDRA_ERR_BAD_VALUE', `device_memory_cap item ${item} is not NAME=MiB`, {
        keys: ['device_memory_cap'],
      });
    if (caps.has(name))
      throw new HydraError('HYDRA_ERR_BAD_VALUE', `device_memory_cap names ${name} twice`, {
        keys: ['device_memory_cap'],
      });
    caps.set(name, mib * MIB);
  }
  return caps;
}

/** The head's own offload devices (RPC devices excluded), or the CPU when it has none. */
function localPlanDevices(
  devices: readonly Device[],
  hostFree: number,
  caps: Map<string, number>,
): { plan: PlanDevice[]; report: FailoverDecision['devices']; onHost: boolean } {
  const gpus = devices.filter((d) => (d.type === 'gpu' || d.type === 'igpu') && !d.name.startsWith('RPC'));
  const raw =
    gpus.length > 0 ? gpus.map((d) => ({ name: d.name, free: d.free })) : [{ name: 'CPU', free: hostFree }];
  const report = raw.map((d) => {
    const cap = caps.get(d.name);
    const free = Math.max(0, Math.floor(d.free));
    return {
      name: d.name,
      available_bytes: cap === undefined ? free : Math.min(free, cap),
      capped: cap !== undefined,
    };
  });
  return {
    plan: report.map((d) => ({ name: d.name, freeBytes: d.available_bytes })),
    report,
    onHost: gpus.length === 0,
  };
}

function planOptions(
  facts: ModelFacts,
  cfg: Params,
  devices: PlanDevice[],
  onHost: boolean,
): SplitPlanOptions {
  const c = new ConfigReader(cfg);
  const nCtx = c.int('n_ctx') || facts.nCtxTrain || 4096;
  return {
    devices,
    nCtx,
    cacheTypeK: c.str('cache_type_k') || 'f16',
    cacheTypeV: c.str('cache_type_v') || 'f16',
    nParallel: c.int('n_parallel') || 1,
    kvUnified: cfg.kv_unified === true,
    nUbatch: c.int('n_ubatch') || 512,
    flashAttn: cfg.flash_attn !== 'off',
    swaFull: cfg.swa_full === true,
    // On the host the cap is the whole budget; a GPU keeps the planner's default margin.
    ...(onHost ? { marginBytes: 0 } : {}),
  };
}

/**
 * The failover to take for `cfg` (the configuration in force, peers already removed) over the
 * local `devices`. Pure: the caller reads the devices and the host's free memory.
 */
export function decideFailover(
  facts: ModelFacts,
  cfg: Params,
  devices: readonly Device[],
  hostFree: number,
): FailoverDecision {
  const c = new ConfigReader(cfg);
  const requested = c.oneOf('failover_policy', FAILOVER_POLICIES) ?? 'auto';
  const caps = memoryCaps(c.strs('device_memory_cap') ?? []);
  const local = localPlanDevices(devices, hostFree, caps);
  const all = facts.nLayerAll + 1;
  const ngl = c.int('n_gpu_layers') ?? -1;
  const base = planOptions(facts, cfg, local.plan, local.onHost);
  const soloFits = planSplit(facts, {
    ...base,
    ...(ngl >= 0 ? { nGpuLayers: Math.min(ngl, all) } : {}),
  }).fits;
  const out: FailoverDecision = { requested, policy: 'none', devices: local.report, solo_fits: soloFits };
  if (requested === 'none') return out;
  if (requested === 'solo' || (requested === 'auto' && soloFits)) {
    out.policy = 'solo';
    return out;
  }
  // The most layers that fit; 0 (everything on the CPU) when not even one does.
  let fit = 0;
  for (let n = all; n > 0; n--) {
    if (planSplit(facts, { ...base, nGpuLayers: n }).fits) {
      fit = n;
      break;
    }
  }
  out.policy = 'offload';
  out.n_gpu_layers = fit;
  return out;
}
