import type { FitReport } from './fit.js';
import type { SplitPlan } from './planner.js';

const mib = (b: number) => (b / (1024 * 1024)).toFixed(1);

/** A plain-text table of a plan, for terminals (sizes in MiB). */
export function formatPlanTable(plan: SplitPlan): string {
  const header = [
    'device',
    'layers',
    'out',
    'kv layers',
    'weights',
    'kv',
    'recurrent',
    'compute',
    'margin',
    'total',
    'free',
    'headroom',
    'fits',
  ];
  const rows = plan.devices.map((d) => [
    d.name,
    d.layers === null ? '-' : `${d.layers.first}-${d.layers.last} (${d.layers.count})`,
    d.output ? 'yes' : '',
    String(d.kvLayers.length),
    mib(d.weightBytes),
    mib(d.kvBytes),
    mib(d.recurrentBytes),
    mib(d.computeBytes),
    mib(d.marginBytes),
    mib(d.totalBytes),
    mib(d.freeBytes),
    mib(d.headroomBytes),
    d.fits ? 'yes' : `NO (${d.binding})`,
  ]);
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] as string).length)));
  const line = (cells: string[]) =>
    cells
      .map((c, i) => (i === 0 ? c.padEnd(widths[i] as number) : c.padStart(widths[i] as number)))
      .join('  ');
  const out = [
    `model ${plan.model.arch} (${plan.model.modelClass}), ${plan.model.nLayerAll} blocks; n_ctx ${plan.nCtx} (${plan.kvCells} cells x ${plan.nStream} streams), K ${plan.cacheTypeK} / V ${plan.cacheTypeV}, n_parallel ${plan.nParallel}`,
    `tensor_split ${plan.tensorSplit.map((x) => x.toFixed(4)).join(',')}   (sizes in MiB)`,
    line(header),
    ...rows.map(line),
    `host: ${plan.host.layers.length} layers, weights ${mib(plan.host.weightBytes)} MiB, kv ${mib(plan.host.kvBytes)} MiB`,
    `plan ${plan.fits ? 'fits' : 'does NOT fit'}; least headroom on ${plan.bindingDevice}`,
    ...plan.maxFraction.map(
      (m) =>
        `max toward ${m.device}: fraction ${m.fraction.toFixed(4)} (${m.layerCount} layers), tensor_split ${m.tensorSplit.join(',')}`,
    ),
    ...plan.warnings.map((w) => `warning: ${w}`),
  ];
  return `${out.join('\n')}\n`;
}

/** The plan as a JSON-safe object (sizes in bytes). */
export function planToJSON(plan: SplitPlan): Record<string, unknown> {
  return JSON.parse(JSON.stringify(plan)) as Record<string, unknown>;
}

/** A plain-text fit table (sizes in MiB): one row per device, then the verdict. */
export function formatFitTable(fit: FitReport): string {
  const header = ['device', 'layers', 'weights', 'kv', 'recurrent', 'compute', 'free', 'headroom', 'fits'];
  const rows = fit.devices.map((d) => [
    d.name,
    `${d.layers === null ? '-' : `${d.layers.first}-${d.layers.last} (${d.layers.count})`}${d.output ? ' +out' : ''}`,
    mib(d.weightBytes),
    `${mib(d.kvBytes)} (${d.kvLayers})`,
    mib(d.recurrentBytes),
    mib(d.computeBytes),
    `${mib(d.availableBytes)}${d.capBytes !== null && d.capBytes < d.freeBytes + d.heldBytes ? ' cap' : ''}`,
    mib(d.headroomBytes),
    d.fits ? 'yes' : `NO (${d.binding})`,
  ]);
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] as string).length)));
  const line = (cells: string[]) =>
    cells
      .map((c, i) => (i === 0 ? c.padEnd(widths[i] as number) : c.padStart(widths[i] as number)))
      .join('  ');
  const p = fit.plan;
  const split = fit.tensorSplit.map((x) => x.toFixed(4)).join(',');
  const out = [
    `model ${p.model.arch} (${p.model.modelClass}), ${p.model.nLayerAll} blocks; n_ctx ${p.nCtx} (${p.kvCells} cells x ${p.nStream} streams), K ${p.cacheTypeK} / V ${p.cacheTypeV}, n_parallel ${p.nParallel}`,
    `tensor_split ${split}${fit.auto.tensorSplit ? ' (auto)' : ''}, n_gpu_layers ${fit.nGpuLayers}${fit.auto.nGpuLayers ? ' (auto)' : ''}   (sizes in MiB; kv in parentheses: layers)`,
    line(header),
    ...rows.map(line),
    `host: ${p.host.layers.length} layers, weights ${mib(p.host.weightBytes)} MiB, kv ${mib(p.host.kvBytes)} MiB` +
      (fit.host.freeBytes === null
        ? ''
        : ` of ${mib(fit.host.freeBytes)} MiB free${fit.host.fits ? '' : ' (does NOT fit)'}`),
    fit.fits
      ? `fits; least headroom on ${fit.bindingDevice}`
      : `does NOT fit: ${[
          ...fit.devices
            .filter((d) => !d.fits)
            .map((d) => `${d.name} short by ${mib(-d.headroomBytes)} MiB (${d.binding})`),
          ...(fit.host.fits === false
            ? [
                `host short by ${mib(fit.host.weightBytes + fit.host.kvBytes - (fit.host.freeBytes ?? 0))} MiB`,
              ]
            : []),
        ].join(', ')}`,
    ...p.warnings.map((w) => `warning: ${w}`),
  ];
  return `${out.join('\n')}\n`;
}
