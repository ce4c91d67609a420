import { fail } from './errors.js';
import type { ModelFacts } from './model-facts.js';
import {
  type DevicePlan,
  type PlanDevice,
  planSplit,
  type SplitPlan,
  type SplitPlanOptions,
} from './planner.js';

/** A device for {@link planFit}: its free memory now and what the caller knows beyond it. */
export interface FitDevice extends PlanDevice {
  /** Bytes the configuration in force holds here and frees before the planned one is built. */
  readonly heldBytes?: number;
  /** At most this many bytes may be used here (an operator's budget, or a test's cap). */
  readonly capBytes?: number;
  /** Bytes to keep free here beyond the plan (upstream's --fit-target); default the plan's margin. */
  readonly marginBytes?: number;
}

/** Inputs of {@link planFit}: the planner's, with `auto` allowed for the split and the offload count. */
export interface FitOptions extends Omit<SplitPlanOptions, 'devices' | 'tensorSplit' | 'nGpuLayers'> {
  readonly devices: readonly FitDevice[];
  /** `auto`: the split that fits with the most layers on `prefer`. */
  readonly tensorSplit?: readonly number[] | 'auto';
  /** `auto`: the most layers offloaded that fit (tried from all down to 0). */
  readonly nGpuLayers?: number | 'auto';
  /** The device `auto` gives the most layers; default the last device (llama.cpp lists RPC devices first, the local one last). */
  readonly prefer?: string;
  /**
   * Host memory for what stays off the devices (token_embd, layers not offloaded, their KV); when
   * given, the host must hold it too, so `nGpuLayers: 'auto'` never answers by keeping more layers
   * on a host that cannot hold them. Omit when the host is itself the planned device.
   */
  readonly hostFreeBytes?: number;
}

/** One device's verdict in a {@link FitReport}. */
export interface FitDeviceReport {
  readonly name: string;
  readonly layers: DevicePlan['layers'];
  readonly output: boolean;
  readonly kvLayers: number;
  readonly weightBytes: number;
  readonly kvBytes: number;
  readonly recurrentBytes: number;
  readonly computeBytes: number;
  /** Free memory read from the device now. */
  readonly freeBytes: number;
  readonly heldBytes: number;
  readonly capBytes: number | null;
  /** What the plan may use: min(free + held, cap). */
  readonly availableBytes: number;
  readonly marginBytes: number;
  /** available - (weights + kv + recurrent + compute + margin); negative when it does not fit. */
  readonly headroomBytes: number;
  readonly fits: boolean;
  readonly binding: DevicePlan['binding'];
}

/** The result of {@link planFit}. */
export interface FitReport {
  readonly fits: boolean;
  /** The split planned (normalised), chosen by the planner when asked `auto`. */
  readonly tensorSplit: readonly number[];
  /** The offload count planned (n_layer + 1 = all). */
  readonly nGpuLayers: number;
  readonly auto: { readonly tensorSplit: boolean; readonly nGpuLayers: boolean };
  readonly devices: readonly FitDeviceReport[];
  /** The device with the least headroom. */
  readonly bindingDevice: string;
  /** What stays in host memory, and whether it fits `hostFreeBytes` (null when not given). */
  readonly host: {
    readonly weightBytes: number;
    readonly kvBytes: number;
    readonly freeBytes: number | null;
    readonly fits: boolean | null;
  };
  readonly plan: SplitPlan;
}

const bad = (key: string, msg: string): never =>
  fail('HYDRA_ERR_BAD_VALUE', `options.${key} ${msg}`, { keys: [key] });

/**
 * Whether a configuration fits its devices, per device (weights, KV, recurrent state, compute,
 * margin against free + held memory, capped), with `auto` split and offload count resolved: the
 * split with the most layers on `prefer` whose every device fits, and the most offloaded layers
 * that fit. When nothing fits, the report is the `auto` candidate closest to fitting (fits false).
 * Bad options throw HYDRA_ERR_BAD_VALUE.
 */
export function planFit(facts: ModelFacts, options: FitOptions): FitReport {
  if (!Array.isArray(options.devices) || options.devices.length === 0)
    bad('devices', 'must be a non-empty array');
  const nonNeg = (key: string, v: unknown) => {
    if (v !== undefined && (!Number.isSafeInteger(v) || (v as number) < 0))
      bad(key, 'must be a non-negative integer');
  };
  for (const d of options.devices) {
    nonNeg('devices.heldBytes', d.heldBytes);
    nonNeg('devices.capBytes', d.capBytes);
    nonNeg('devices.marginBytes', d.marginBytes);
  }
  nonNeg('marginBytes', options.marginBytes);
  nonNeg('hostFreeBytes', options.hostFreeBytes);
  const hostFree = options.hostFreeBytes;
  const hostFits = (p: SplitPlan) =>
    hostFree === undefined || p.host.weightBytes + p.host.kvBytes <= hostFree;
  const fitsAll = (p: SplitPlan) => p.fits && hostFits(p);
  const defaultMargin = options.marginBytes ?? 256 * 1024 * 1024;
  const available = options.devices.map((d) =>
    Math.min(d.freeBytes + (d.heldBytes ?? 0), d.capBytes ?? Number.MAX_SAFE_INTEGER),
  );
  const margins = options.devices.map((d) => d.marginBytes ?? defaultMargin);
  let prefer = options.devices.length - 1;
  if (options.prefer !== undefined) {
    prefer = options.devices.findIndex((d) => d.name === options.prefer);
    if (prefer < 0)
      bad('prefer', `names no planned device (${options.devices.map((d) => d.name).join(', ')})`);
  }
  const autoSplit = options.tensorSplit === 'auto';
  const autoNgl = options.nGpuLayers === 'auto';
  if (typeof options.tensorSplit === 'string' && !autoSplit) bad('tensorSplit', 'must be an array or "auto"');
  if (typeof options.nGpuLayers === 'string' && !autoNgl) bad('nGpuLayers', 'must be an integer or "auto"');
  const { tensorSplit: _ts, nGpuLayers: _ngl, prefer: _p, hostFreeBytes: _h, ...rest } = options;
  // The margin is folded into the free memory, so it can differ per device.
  const base: SplitPlanOptions = {
    ...rest,
    devices: options.devices.map((d, i) => ({
      name: d.name,
      freeBytes: Math.max(0, (available[i] as number) - (margins[i] as number)),
    })),
    marginBytes: 0,
  };
  const all = facts.nLayerAll + 1;
  // Without a split llama.cpp divides by the free memory it reads, not by a cap or margin.
  const given = Array.isArray(options.tensorSplit) ? (options.tensorSplit as readonly number[]) : undefined;
  const fixedSplit = given?.some((x) => x > 0) ? given : options.devices.map((d) => d.freeBytes);
  const tryPlan = (split: readonly number[] | undefined, ngl: number | undefined) =>
    planSplit(facts, {
      ...base,
      ...(split?.some((x) => x > 0) ? { tensorSplit: split } : {}),
      ...(ngl !== undefined ? { nGpuLayers: ngl } : {}),
    });
  const nglCandidates: (number | undefined)[] = autoNgl
    ? Array.from({ length: all + 1 }, (_, i) => all - i)
    : [options.nGpuLayers as number | undefined];
  let chosen: { plan: SplitPlan; ngl: number } | undefined;
  let closest: { plan: SplitPlan; ngl: number } | undefined;
  for (const ngl of nglCandidates) {
    const plan = autoSplit
      ? bestSplit(
          tryPlan,
          ngl,
          base.devices.length,
          prefer,
          base.devices.map((d) => d.freeBytes),
          all,
        )
      : tryPlan(fixedSplit, ngl);
    const at = { plan, ngl: ngl ?? all };
    if (fitsAll(plan)) {
      chosen = at;
      break;
    }
    const worst = (p: SplitPlan) => Math.min(...p.devices.map((d) => d.headroomBytes));
    if (!closest || worst(plan) > worst(closest.plan)) closest = at;
  }
  const { plan, ngl } = chosen ?? (closest as { plan: SplitPlan; ngl: number });
  const devices = plan.devices.map((p, i): FitDeviceReport => {
    const d = options.devices[i] as FitDevice;
    return {
      name: d.name,
      layers: p.layers,
      output: p.output,
      kvLayers: p.kvLayers.length,
      weightBytes: p.weightBytes,
      kvBytes: p.kvBytes,
      recurrentBytes: p.recurrentBytes,
      computeBytes: p.computeBytes,
      freeBytes: d.freeBytes,
      heldBytes: d.heldBytes ?? 0,
      capBytes: d.capBytes ?? null,
      availableBytes: available[i] as number,
      marginBytes: margins[i] as number,
      headroomBytes: p.headroomBytes,
      fits: p.fits,
      binding: p.binding,
    };
  });
  return {
    fits: fitsAll(plan),
    tensorSplit: plan.tensorSplit,
    nGpuLayers: Math.min(ngl < 0 ? all : ngl, all),
    auto: { tensorSplit: autoSplit, nGpuLayers: autoNgl },
    devices,
    bindingDevice: plan.bindingDevice,
    host: {
      weightBytes: plan.host.weightBytes,
      kvBytes: plan.host.kvBytes,
      freeBytes: hostFree ?? null,
      fits: hostFree === undefined ? null : hostFits(plan),
    },
    plan,
  };
}

/** `tensor_split` toward device `d` at fraction `f`, the others sharing the rest by their free memory. */
function toward(free: readonly number[], d: number, f: number): number[] {
  let rest = 0;
  for (let i = 0; i < free.length; i++) if (i !== d) rest += free[i] as number;
  return free.map((x, i) => {
    if (i === d) return f;
    return rest > 0 ? ((1 - f) * x) / rest : (1 - f) / (free.length - 1);
  });
}

/**
 * The split with the largest share on device `d` whose whole plan fits. Layer boundaries sit at
 * k/(n+1), so a grid of half steps from 1 down visits every distinct placement; the first that fits
 * wins, and its fraction is then rounded to 4 decimals when that keeps the same placement.
 */
function bestSplit(
  tryPlan: (split: readonly number[] | undefined, ngl: number | undefined) => SplitPlan,
  ngl: number | undefined,
  nDev: number,
  d: number,
  free: readonly number[],
  all: number,
): SplitPlan {
  if (nDev === 1) return tryPlan([1], ngl);
  const steps = 2 * all;
  let closest: SplitPlan | undefined;
  for (let j = steps; j >= 0; j--) {
    const vec = toward(free, d, j / steps);
    const p = tryPlan(vec, ngl);
    if (p.fits) {
      const f = Math.floor((j / steps) * 1e4) / 1e4;
      const tidy = toward(free, d, f).map((x) => Math.round(x * 1e4) / 1e4);
      const q = tryPlan(tidy, ngl);
      const same = q.fits && q.devices.every((x, i) => samePlacement(x, p.devices[i] as DevicePlan));
      return same ? q : p;
    }
    const worst = (x: SplitPlan) => Math.min(...x.devices.map((y) => y.headroomBytes));
    if (!closest || worst(p) > worst(closest)) closest = p;
  }
  return closest as SplitPlan;
}

function samePlacement(a: DevicePlan, b: DevicePlan): boolean {
  return (
    (a.layers?.count ?? 0) === (b.layers?.count ?? 0) &&
    a.output === b.output &&
    a.kvLayers.length === b.kvLayers.length
  );
}

/** The report as a JSON-safe object in the protocol's snake_case (sizes in bytes). */
export function fitToWire(r: FitReport): Record<string, unknown> {
  return {
    fits: r.fits,
    tensor_split: r.tensorSplit.map((x) => Math.round(x * 1e6) / 1e6),
    n_gpu_layers: r.nGpuLayers,
    auto: { tensor_split: r.auto.tensorSplit, n_gpu_layers: r.auto.nGpuLayers },
    binding_device: r.bindingDevice,
    n_ctx: r.plan.nCtx,
    kv_cells: r.plan.kvCells,
    host: {
      layers: r.plan.host.layers.length,
      weight_bytes: r.host.weightBytes,
      kv_bytes: r.host.kvBytes,
      free_bytes: r.host.freeBytes,
      fits: r.host.fits,
    },
    devices: r.devices.map((d) => ({
      name: d.name,
      layers: d.layers ? { first: d.layers.first, last: d.layers.last, count: d.layers.count } : null,
      output: d.output,
      kv_layers: d.kvLayers,
      weight_bytes: d.weightBytes,
      kv_bytes: d.kvBytes,
      recurrent_bytes: d.recurrentBytes,
      compute_bytes: d.computeBytes,
      free_bytes: d.freeBytes,
      held_bytes: d.heldBytes,
      cap_bytes: d.capBytes,
      available_bytes: d.availableBytes,
      margin_bytes: d.marginBytes,
      headroom_bytes: d.headroomBytes,
      fits: d.fits,
      binding: d.binding,
    })),
  };
}
