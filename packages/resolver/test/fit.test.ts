import { beforeAll, describe, expect, it } from 'vitest';
import { fitToWire, planFit } from '../src/fit.js';
import { formatFitTable } from '../src/format.js';
import { readGguf } from '../src/gguf/reader.js';
import { type ModelFacts, modelFactsFromGguf } from '../src/model-facts.js';
import { planSplit } from '../src/planner.js';
import { hybrid27b, llamaModel } from './helpers/models.js';

const MIB = 1024 * 1024;
const GIB = 1024 * MIB;

let hybrid: ModelFacts;
let small: ModelFacts;
beforeAll(async () => {
  hybrid = modelFactsFromGguf(await readGguf(hybrid27b().source));
  small = modelFactsFromGguf(
    await readGguf(
      llamaModel({ nLayer: 8, nEmbd: 256, nHead: 8, nHeadKv: 2, nFf: 512, nVocab: 1024 }).source,
    ),
  );
});

// Qwen3.8-27B hybrid, q8_0/f16 KV at 262144, worker RPC0 (24 GiB) first, head ROCm0.
describe('27B hybrid split limits through planFit', () => {
  const common = {
    nCtx: 262144,
    cacheTypeK: 'q8_0',
    cacheTypeV: 'f16',
    kvPlacement: 'rounded-fraction' as const,
    marginBytes: 0,
  };
  // The worker's budget: what the measured production split needed plus the 273 MiB it left free.
  const at68 = () =>
    planSplit(hybrid, {
      ...common,
      devices: [
        { name: 'RPC0', freeBytes: 24 * GIB },
        { name: 'ROCm0', freeBytes: 96 * GIB },
      ],
      tensorSplit: [0.68, 0.32],
    }).devices[0]!.totalBytes;
  const devices = () => [
    { name: 'RPC0', freeBytes: 24 * GIB, capBytes: at68() + 273 * MIB },
    { name: 'ROCm0', freeBytes: 96 * GIB },
  ];

  it('0.68 fits with 273 MiB left; 0.7196 still keeps 11 FA layers; 0.7197 takes the 12th and does not fit', () => {
    const f = (x: number) => planFit(hybrid, { ...common, devices: devices(), tensorSplit: [x, 1 - x] });
    const ok = f(0.68);
    expect(ok.fits).toBe(true);
    expect(ok.devices[0]?.headroomBytes).toBe(273 * MIB);
    expect(ok.devices[0]?.layers?.count).toBe(45);
    expect(ok.devices[0]?.kvLayers).toBe(11);
    // The round(f x 66) boundary: the same 48 blocks, one more FA layer's KV (784 MiB).
    const below = f(0.7196);
    const above = f(0.7197);
    expect([below.devices[0]?.layers?.count, above.devices[0]?.layers?.count]).toEqual([48, 48]);
    expect([below.devices[0]?.kvBytes, above.devices[0]?.kvBytes]).toEqual([8624 * MIB, 9408 * MIB]);
    expect(above.devices[0]!.kvBytes - below.devices[0]!.kvBytes).toBe(784 * MIB);
    expect(below.fits).toBe(false);
    expect(above.fits).toBe(false);
    expect(above.devices[0]?.fits).toBe(false);
    expect(above.devices[0]?.headroomBytes).toBeLessThan(below.devices[0]!.headroomBytes);
    expect(above.devices[1]?.fits).toBe(true);
    expect(formatFitTable(above)).toMatch(/does NOT fit: RPC0 short by/);
    const wire = fitToWire(above) as { fits: boolean; devices: { name: string; kv_layers: number }[] };
    expect(wire.fits).toBe(false);
    expect(wire.devices[0]).toMatchObject({ name: 'RPC0', kv_layers: 12, fits: false });
  });

  it('tensorSplit auto toward the worker finds the production maximum, 45 blocks', () => {
    const r = planFit(hybrid, { ...common, devices: devices(), tensorSplit: 'auto', prefer: 'RPC0' });
    expect(r.fits).toBe(true);
    expect(r.auto.tensorSplit).toBe(true);
    expect(r.devices[0]?.layers?.count).toBe(45);
    // The chosen split realises the same placement when planned as a fixed split.
    const again = planFit(hybrid, { ...common, devices: devices(), tensorSplit: [...r.tensorSplit] });
    expect(again.devices[0]?.layers?.count).toBe(45);
    expect(again.fits).toBe(true);
  });
});

describe('auto on capped CPU devices', () => {
  // Two CPU-backed devices (ggml-RPC peers on loopback in the engine), capped like --device-memory-cap.
  const caps = (head: number) => [
    { name: 'RPC0', freeBytes: 64 * GIB, capBytes: 64 * GIB },
    { name: 'CPU1', freeBytes: 64 * GIB, capBytes: head },
  ];
  const o = { nCtx: 4096, marginBytes: 0 };
  const block = () => small.layers[0]!.weightBytes;

  it('gives the head the largest share that fits, and one more layer would not', () => {
    for (const blocks of [2, 4, 7]) {
      const probe = planFit(small, { ...o, devices: caps(64 * GIB), tensorSplit: [8 - blocks, blocks + 1] });
      const need = probe.devices[1]!.weightBytes + probe.devices[1]!.kvBytes + probe.devices[1]!.computeBytes;
      const r = planFit(small, { ...o, devices: caps(need), tensorSplit: 'auto' });
      expect(r.fits).toBe(true);
      const head = r.devices[1]!;
      expect((head.layers?.count ?? 0) + (head.output ? 1 : 0)).toBe(blocks + 1);
      const more = planFit(small, {
        ...o,
        devices: caps(need),
        tensorSplit: [8 - blocks - 1, blocks + 2],
      });
      expect(more.devices[1]?.fits).toBe(false);
      expect(block()).toBeGreaterThan(0);
    }
  });

  it('a margin per device is kept free, and a cap below everything does not fit at any split', () => {
    const r = planFit(small, {
      ...o,
      devices: [
        { name: 'RPC0', freeBytes: 64 * GIB, capBytes: 1024 },
        { name: 'CPU1', freeBytes: 64 * GIB, capBytes: 1024 },
      ],
      tensorSplit: 'auto',
    });
    expect(r.fits).toBe(false);
    const m = planFit(small, {
      ...o,
      devices: [{ name: 'CPU1', freeBytes: 64 * GIB, marginBytes: 5 * MIB }],
    });
    expect(m.devices[0]?.marginBytes).toBe(5 * MIB);
    expect(m.devices[0]!.availableBytes - m.devices[0]!.headroomBytes).toBe(
      m.devices[0]!.weightBytes + m.devices[0]!.kvBytes + m.devices[0]!.computeBytes + 5 * MIB,
    );
  });

  it('n_gpu_layers auto offloads the most layers that fit; held memory counts as free', () => {
    const one = (cap: number, held = 0) => [
      { name: 'RPC0', freeBytes: cap - held, capBytes: cap, heldBytes: held },
    ];
    const full = planFit(small, { ...o, devices: one(64 * GIB), nGpuLayers: 'auto' });
    expect(full.nGpuLayers).toBe(9);
    const d = full.devices[0]!;
    const cap = d.weightBytes + d.kvBytes + d.computeBytes - 1;
    const part = planFit(small, { ...o, devices: one(cap), nGpuLayers: 'auto' });
    expect(part.fits).toBe(true);
    expect(part.nGpuLayers).toBeLessThan(9);
    expect(part.plan.host.layers.length).toBeGreaterThan(0);
    // The same device with the memory the configuration in force frees (held) fits it whole.
    const heldFit = planFit(small, { ...o, devices: one(64 * GIB, 60 * GIB), nGpuLayers: 'auto' });
    expect(heldFit.nGpuLayers).toBe(9);
    expect(heldFit.devices[0]?.availableBytes).toBe(64 * GIB);
  });

  it('with host memory given, n_gpu_layers auto keeps on the host only what the host holds', () => {
    const dev = (cap: number) => [{ name: 'RPC0', freeBytes: 64 * GIB, capBytes: cap }];
    const whole = planFit(small, { ...o, devices: dev(64 * GIB) }).devices[0]!;
    const need = whole.weightBytes + whole.kvBytes + whole.computeBytes;
    // Without host memory the device's cap alone decides: some layers stay on the host.
    const free = planFit(small, { ...o, devices: dev(Math.floor(need / 2)), nGpuLayers: 'auto' });
    expect(free.fits).toBe(true);
    expect(free.host.fits).toBe(null);
    const kept = free.host.weightBytes + free.host.kvBytes;
    // A host with a byte less than that cannot take them: no offload count fits.
    const tight = planFit(small, {
      ...o,
      devices: dev(Math.floor(need / 2)),
      nGpuLayers: 'auto',
      hostFreeBytes: kept - 1,
    });
    expect(tight.fits).toBe(false);
    expect(tight.host.fits).toBe(false);
    expect(formatFitTable(tight)).toMatch(/host short by/);
    const enough = planFit(small, {
      ...o,
      devices: dev(Math.floor(need / 2)),
      nGpuLayers: 'auto',
      hostFreeBytes: kept,
    });
    expect(enough.fits).toBe(true);
    expect(enough.nGpuLayers).toBe(free.nGpuLayers);
    expect(fitToWire(enough).host).toMatchObject({ free_bytes: kept, fits: true });
  });

  it('refuses bad options by name', () => {
    const dev = [{ name: 'A', freeBytes: GIB }];
    const code = (f: () => unknown) => {
      try {
        f();
      } catch (err) {
        return [(err as { code: string }).code, (err as { keys: string[] }).keys];
      }
      return undefined;
    };
    expect(code(() => planFit(small, { ...o, devices: dev, prefer: 'B' }))).toEqual([
      'HYDRA_ERR_BAD_VALUE',
      ['prefer'],
    ]);
    expect(code(() => planFit(small, { ...o, devices: dev, tensorSplit: 'most' as never }))).toEqual([
      'HYDRA_ERR_BAD_VALUE',
      ['tensorSplit'],
    ]);
    expect(code(() => planFit(small, { ...o, devices: [{ ...dev[0]!, capBytes: -1 }] }))).toEqual([
      'HYDRA_ERR_BAD_VALUE',
      ['devices.capBytes'],
    ]);
  });
});
