import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { addRpcServer, initBackend, Model } from '@hydra-engine/native-ggml';
import { writeSyntheticModel } from '@hydra-engine/native-ggml/synth';
import { modelFactsFromGguf, planSplit } from '@hydra-engine/resolver';
import { type StockRpcServer, stockRpcServer } from '@hydra-engine/test-kit';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { readGgufFile } from '../src/placement.js';

// The planner on the hybrid synthetic models: attention KV only on the full-attention blocks (3, 7)
// and recurrent state (f32 conv + delta-net rows, one set per sequence) on the others, per device.
// Checked against llama.cpp's memory breakdown of real loads, whole on the CPU and split with a
// stock ggml-rpc-server.
const dir = mkdtempSync(join(tmpdir(), 'hydra-hybrid-plan-'));
let server: StockRpcServer;
let rpcDevice: string;

async function facts(path: string) {
  return modelFactsFromGguf(await readGgufFile(path));
}

beforeAll(async () => {
  initBackend();
  server = await stockRpcServer({ threads: 1, timeoutMs: 10_000 });
  const { endpoint } = server;
  rpcDevice = (await addRpcServer(endpoint))[0]!.name;
}, 30_000);
afterAll(async () => {
  await server?.stop();
  rmSync(dir, { recursive: true, force: true });
});

describe.each(['qwen35', 'qwen35moe'] as const)('tiny %s', (arch) => {
  let path: string;
  beforeAll(async () => {
    path = join(dir, `${arch}.gguf`);
    await writeSyntheticModel({ arch, shape: 'tiny', quant: 'f32', seed: 5, out: path });
  });

  it('has recurrent blocks and attention blocks 3 and 7 in the model facts', async () => {
    const f = await facts(path);
    expect(f.layers.map((l) => l.kind)).toEqual([
      'recurrent',
      'recurrent',
      'recurrent',
      'attention',
      'recurrent',
      'recurrent',
      'recurrent',
      'attention',
    ]);
  });

  it.each([
    [512, 1, 'f16'],
    [2048, 2, 'q8_0'],
    [4096, 4, 'f16'],
  ] as const)('on the CPU, n_ctx %i, %i sequences, K %s: weights and KV + recurrent state as llama.cpp', async (nCtx, nParallel, typeK) => {
    const plan = planSplit(await facts(path), {
      devices: [{ name: 'CPU', freeBytes: 64 * 2 ** 30 }],
      nCtx,
      cacheTypeK: typeK,
      cacheTypeV: 'f16',
      nParallel,
      nGpuLayers: 0,
      flashAttn: typeK !== 'f16',
    });
    const model = await Model.load({ path, nGpuLayers: 0 });
    const ctx = await model.createContext({
      nCtx,
      nSeqMax: nParallel,
      typeK,
      typeV: 'f16',
      flashAttn: typeK === 'f16' ? 'auto' : 'on',
    });
    const memory = ctx.memory();
    await ctx.dispose();
    model.dispose();
    const weights = memory.reduce((a, m) => a + m.model, 0);
    const state = memory.reduce((a, m) => a + m.context, 0);
    expect(Math.abs(plan.host.weightBytes - weights) / weights).toBeLessThan(0.001);
    // Exact: KV of the two attention blocks plus the recurrent rows of the six others.
    expect(plan.host.kvBytes).toBe(state);
  });

  it.each([
    2, 4, 5, 9,
  ])('split with a peer at -ngl %i: each side holds what llama.cpp puts there', async (ngl) => {
    const plan = planSplit(await facts(path), {
      devices: [{ name: rpcDevice, freeBytes: 8 * 2 ** 30 }],
      nCtx: 2048,
      nParallel: 2,
      nGpuLayers: ngl,
    });
    const model = await Model.load({ path, nGpuLayers: ngl, devices: [rpcDevice] });
    const ctx = await model.createContext({ nCtx: 2048, nSeqMax: 2 });
    const memory = ctx.memory();
    await ctx.dispose();
    model.dispose();
    const remote = memory.filter((m) => m.bufferType.startsWith(rpcDevice));
    const local = memory.filter((m) => !m.bufferType.startsWith(rpcDevice));
    const sum = (ms: typeof memory, k: 'model' | 'context') => ms.reduce((a, m) => a + m[k], 0);
    const dev = plan.devices[0]!;
    expect(dev.kvBytes + dev.recurrentBytes).toBe(sum(remote, 'context'));
    expect(plan.host.kvBytes).toBe(sum(local, 'context'));
    expect(Math.abs(dev.weightBytes - sum(remote, 'model'))).toBeLessThan(1024);
    expect(Math.abs(plan.host.weightBytes - sum(local, 'model'))).toBeLessThan(1024);
    // The recurrent state moves with the blocks: none on the peer when it holds only block 7.
    expect(dev.recurrentBytes > 0).toBe(ngl > 2);
  });
});
