// Probe of a drop seen on the H200: a context decodes at llama-bench's rate until a second context
// of the process has decoded; from then on the first decodes 3-4% slower, even after the second is
// freed. llama-bench, which creates and frees six contexts in one process, shows no such drop.
// Each line is the median of 4 repetitions of 128 greedy tokens from an empty cache, steps queued
// ahead (`follow`) as the engine runs them. Not a ratio against an anchor: a probe, labelled so.
// Usage (after build.sh; bundle.mjs makes dist/gpu/second-context.cjs):
//   node benchmarks/dist/gpu/second-context.cjs --model FILE [--threads 16] [--out FILE]
//        [--bin packages/native-ggml/build-cuda/bin]
import { writeFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { initBackend, Model } from '../../packages/native-ggml/dist/index.js';

const args = {};
for (const [i, a] of process.argv.entries()) {
  if (i >= 2 && a.startsWith('--')) args[a.slice(2)] = process.argv[i + 1];
}
if (!args.model) {
  console.error('usage: second-context.cjs --model FILE [--threads N] [--out FILE]');
  process.exit(2);
}
const threads = Number(args.threads ?? 16);
// The addon of the CUDA build (the loader's default is the CPU build beside the package).
process.env.HYDRA_NATIVE_ADDON ??= resolve(
  args.bin ?? 'packages/native-ggml/build-cuda/bin',
  'hydra_ggml.node',
);
initBackend();
async function main() {
  const model = await Model.load({ path: args.model, nGpuLayers: 99 });
  const sampler = model.createSampler({ temp: 0 });
  const create = () =>
    model.createContext({
      nThreads: threads,
      nCtx: 4096,
      nBatch: 2048,
      nUbatch: 512,
      flashAttn: 'auto',
      backendSampling: true,
    });

  /** Median tokens/s of 4 repetitions of `n` tokens from an empty cache. */
  async function decodeRate(ctx, n = 128) {
    const rates = [];
    for (let rep = 0; rep < 4; rep++) {
      ctx.clear();
      const t0 = performance.now();
      let prev = ctx.decode([{ seq: 0, pos: 0, tokens: [model.info.bos], sampler }]);
      for (let i = 1; i < n; i++) {
        const next = ctx.decode([{ seq: 0, pos: i, follow: true, sampler }]);
        await prev;
        prev = next;
      }
      await prev;
      rates.push(n / ((performance.now() - t0) / 1000));
    }
    rates.sort((a, b) => a - b);
    return (rates[1] + rates[2]) / 2;
  }

  const lines = [];
  const note = async (label, ctx) => {
    const rate = await decodeRate(ctx);
    lines.push({ label, tokensPerSecond: Math.round(rate * 10) / 10 });
    console.log(`${label}: ${rate.toFixed(1)} tok/s`);
  };
  const a = await create();
  await decodeRate(a, 8); // warm-up
  await note('A alone', a);
  await note('A alone, again', a);
  const unused = await create();
  await note('A, a second context created, not used', a);
  await unused.dispose();
  await note('A, after that context was freed', a);
  const b = await create();
  await decodeRate(b, 8);
  await note('B, a context that decodes, A alive', b);
  await note('A, B alive', a);
  await b.dispose();
  await note('A, after B was freed', a);
  await a.dispose();
  const c = await create();
  await decodeRate(c, 8);
  await note('C, alone after A and B were freed', c);
  await c.dispose();
  sampler.dispose();
  model.dispose();
  if (args.out)
    writeFileSync(
      args.out,
      `${JSON.stringify({ probe: 'second-context', model: args.model, threads, date: new Date().toISOString(), commit: process.env.HYDRA_BENCH_COMMIT ?? 'unknown', lines }, null, 2)}\n`,
    );
}

main().then(
  () => process.exit(0),
  (err) => {
    console.error(err);
    process.exit(1);
  },
);
