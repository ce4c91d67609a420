import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { initBackend, Model } from '@hydra-engine/native-ggml';
import { writeSyntheticModel } from '@hydra-engine/native-ggml/synth';
import { modelFactsFromGguf, planSplit, readGguf } from '@hydra-engine/resolver';
import { beforeAll, describe, expect, it } from 'vitest';
import { fileSource } from '../src/placement.js';

// The resolver's planner predicts, from the GGUF header alone, what llama.cpp allocates: weights per
// device and KV cache per device. Checked against llama.cpp's own memory breakdown of a real load.
const dir = mkdtempSync(join(tmpdir(), 'hydra-plan-'));

async function facts(path: string) {
  const src = await fileSource(path);
  try {
    return modelFactsFromGguf(await readGguf(src));
  } finally {
    await src.close();
  }
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
