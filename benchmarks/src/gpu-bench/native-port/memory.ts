import { listDevices, Model } from '@hydra-engine/native-ggml';
import { type NativePortContext, nativeFigure } from './context.js';

/**
 * The resolver's split planner predicts, from the GGUF header alone, what a load will take on the
 * GPU; here the same load is made and measured two ways: llama.cpp's own memory breakdown per buffer
 * type (weights, KV, compute) and the device's free memory before and after (which also sees the
 * CUDA runtime's own allocations, e.g. cuBLAS workspace, that no planner input describes).
 */
export async function memoryCheck(
  c: NativePortContext,
  modelPath: string,
  shape: string,
  notes: unknown[],
): Promise<void> {
  const facts = await c.planner.factsOf(modelPath);
  // HYDRA_BENCH_CPU=1: a smoke run without a GPU, against the CPU device (figures meaningless).
  const gpu = () =>
    listDevices().find((d) => d.type === 'gpu') ??
    (process.env.HYDRA_BENCH_CPU === '1' ? listDevices().find((d) => d.type === 'cpu') : undefined);
  const mib = (b: number) => b / 2 ** 20;
  for (const nCtx of c.opts.memoryCtx) {
    const dev = gpu();
    if (!dev) throw new Error('no GPU device');
    const before = dev.free;
    const plan = c.planner.planSplit(facts, {
      devices: [{ name: dev.name, freeBytes: before }],
      nCtx,
      cacheTypeK: 'f16',
      cacheTypeV: 'f16',
      nParallel: 1,
      nUbatch: 512,
      flashAttn: true,
      nGpuLayers: 99,
    });
    const model = await Model.load({ path: modelPath, nGpuLayers: 99 });
    const ctx = await model.createContext({ nCtx, nBatch: 2048, nUbatch: 512, flashAttn: 'on' });
    // One step, so every lazily allocated buffer (cuBLAS handles, graph) exists when measured.
    await ctx.decode([{ seq: 0, pos: 0, tokens: [model.info.bos, 5, 6, 7], logits: false }]);
    const after = gpu()?.free ?? Number.NaN;
    const breakdown = ctx.memory();
    await ctx.dispose();
    model.dispose();
    const onDevice = breakdown.filter((m) => m.bufferType === dev.bufferType || m.bufferType === dev.name);
    const sum = (k: 'model' | 'context' | 'compute') => onDevice.reduce((a, m) => a + m[k], 0);
    const d = plan.devices[0];
    if (!d) throw new Error('the planner returned no device');
    const label = `${shape} q4_0 n_ctx ${nCtx}`;
    const pair = (what: string, predicted: number, measured: number, anchorName: string) =>
      c.h.add(
        nativeFigure(`${label}: planner ${what} on ${dev.name}`, 'MiB', [mib(predicted)], {
          name: anchorName,
          unit: 'MiB',
          median: mib(measured),
        }),
      );
    const total = d.weightBytes + d.kvBytes + d.recurrentBytes + d.computeBytes;
    pair('weights', d.weightBytes, sum('model'), 'llama.cpp memory breakdown: model');
    pair('KV cache', d.kvBytes + d.recurrentBytes, sum('context'), 'llama.cpp memory breakdown: context');
    pair('compute buffer', d.computeBytes, sum('compute'), 'llama.cpp memory breakdown: compute');
    pair(
      'total (weights + KV + compute)',
      total,
      sum('model') + sum('context') + sum('compute'),
      'llama.cpp memory breakdown: model + context + compute',
    );
    pair(
      'total (weights + KV + compute)',
      total,
      before - after,
      'device free memory before load minus after (cudaMemGetInfo)',
    );
    notes.push({ shape, nCtx, breakdown, free_before: before, free_after: after, plan: d });
  }
}
