import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { initBackend, listDevices, Model } from '@hydra-engine/native-ggml';
import { writeSyntheticModel } from '@hydra-engine/native-ggml/synth';
import { modelFactsFromGguf, planSplit } from '@hydra-engine/resolver';
import { beforeAll, describe, expect, it } from 'vitest';
import { fitOf, readGgufFile } from '../src/placement.js';

// The resolver's planner predicts, from the GGUF header alone, what llama.cpp allocates: weights per
// device and KV cache per device. Checked against llama.cpp's own memory breakdown of a real load.
const dir = mkdtempSync(join(tmpdir(), 'hydra-plan-'));

async function facts(path: string) {
  return modelFactsFromGguf(await readGgufFile(path));
}

beforeAll(() => {
  initBackend();
});

describe.each([
  ['llama', 'f32'],
  ['llama', 'f16'],
  ['moe', 'f16'],
] as const)('tiny %s %s', (arch, quant) => {
  let path: string;
  beforeAll(async () => {
    path = join(dir, `${arch}-${quant}.gguf`);
    await writeSyntheticModel({ arch, shape: 'tiny', quant, seed: 5, out: path });
  });

  it.each([
    [512, 'f16', 'f16'],
    [2048, 'q8_0', 'f16'],
    [4096, 'q8_0', 'q8_0'],
  ] as const)('n_ctx %i, K %s, V %s: weights and KV within 2%% of llama.cpp', async (nCtx, typeK, typeV) => {
    const plan = planSplit(await facts(path), {
      devices: [{ name: 'CPU', freeBytes: 64 * 2 ** 30 }],
      nCtx,
      cacheTypeK: typeK,
      cacheTypeV: typeV,
      nParallel: 1,
      nGpuLayers: 0,
      flashAttn: typeV !== 'f16',
    });
    const predictedWeights = plan.host.weightBytes + plan.devices.reduce((a, d) => a + d.weightBytes, 0);
    const predictedKv = plan.host.kvBytes + plan.devices.reduce((a, d) => a + d.kvBytes, 0);

    const model = await Model.load({ path, nGpuLayers: 0 });
    const ctx = await model.createContext({ nCtx, typeK, typeV, flashAttn: typeV === 'f16' ? 'auto' : 'on' });
    const memory = ctx.memory();
    await ctx.dispose();
    model.dispose();
    // No repacking for these types on the CPU: every weight sits in one buffer.
    expect(memory.some((m) => m.bufferType.includes('REPACK'))).toBe(false);
    const weights = memory.reduce((a, m) => a + m.model, 0);
    const kv = memory.reduce((a, m) => a + m.context, 0);
    expect(Math.abs(predictedWeights - weights) / weights).toBeLessThan(0.02);
    expect(Math.abs(predictedKv - kv) / kv).toBeLessThan(0.02);
  });
});

// PLAN's path (placement.ts fitOf, the object PLAN replies and CONFIGURE refuses on) against a real
// CPU load of the same configuration: weights and KV within the same 2%, compute within a factor of 2
// of the compute estimate (it is an estimate: llama.cpp sizes the graph it schedules).
describe('fitOf (PLAN) vs a real CPU load', () => {
  it.each([
    [1024, 'f16', 'f16', 1],
    [4096, 'q8_0', 'q8_0', 2],
  ] as const)('n_ctx %i, K %s, V %s, n_parallel %i', async (nCtx, typeK, typeV, nParallel) => {
    const path = join(dir, 'fit-llama-f16.gguf');
    await writeSyntheticModel({ arch: 'llama', shape: 'tiny', quant: 'f16', seed: 5, out: path });
    const cfg = {
      model: path,
      n_ctx: nCtx,
      cache_type_k: typeK,
      cache_type_v: typeV,
      n_parallel: nParallel,
      flash_attn: 'on',
      n_gpu_layers: -1,
      tensor_split: [],
    };
    const fit = fitOf(await facts(path), cfg, {
      devices: listDevices().filter((d) => d.type === 'cpu'),
      peerDevices: () => undefined,
      fit: {},
    });
    if (!('report' in fit)) throw new Error(fit.unknown);
    const d = fit.report.devices[0]!;
    expect(d.name).toBe('CPU');
    expect(fit.report.fits).toBe(true);
    const model = await Model.load({ path, nGpuLayers: 0 });
    const ctx = await model.createContext({ nCtx, typeK, typeV, flashAttn: 'on', nSeqMax: nParallel });
    const memory = ctx.memory();
    await ctx.dispose();
    model.dispose();
    const weights = memory.reduce((a, m) => a + m.model, 0);
    const kv = memory.reduce((a, m) => a + m.context, 0);
    const compute = memory.reduce((a, m) => a + m.compute, 0);
    expect(Math.abs(d.weightBytes + fit.report.plan.host.weightBytes - weights) / weights).toBeLessThan(0.02);
    expect(Math.abs(d.kvBytes - kv) / kv).toBeLessThan(0.02);
    expect(d.computeBytes).toBeGreaterThan(compute / 2);
    expect(d.computeBytes).toBeLessThan(compute * 2);
  });
});
