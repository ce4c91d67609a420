import { open } from 'node:fs/promises';
import type { Device } from '@hydra-engine/native-ggml';
import { type GgufSource, modelFactsFromGguf, planSplit, readGguf } from '@hydra-engine/resolver';
import type { Params } from '@hydra-engine/tiering';

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

/** Computes the layer placement of a model loaded with `cfg` over the devices the backend lists. */
export async function computePlacement(path: string, cfg: Params, devices: Device[]): Promise<Placement> {
  const src = await fileSource(path);
  let facts: ReturnType<typeof modelFactsFromGguf>;
  try {
    facts = modelFactsFromGguf(await readGguf(src));
  } finally {
    await src.close();
  }
  const named = (cfg.devices as string[]) ?? [];
  const offload =
    named.length > 0
      ? named.map((n) => devices.find((d) => d.name === n)).filter((d): d is Device => d !== undefined)
      : devices.filter((d) => d.type !== 'cpu');
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
