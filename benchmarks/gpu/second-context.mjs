// A context's decode rate as other contexts of the same process come and go, against the same
// context alone before any other decoded (the anchor, same run). Two findings led here:
// - CPU, 2 cores: while two contexts that had both decoded were alive, each decoded the tiny model at
//   1/18 of its rate alone: each context runs on a thread of its own, so two OpenMP teams, and
//   libgomp cuts its spin-wait short once it manages more threads than there are cores. One runner
//   for the process fixed it but blocked COMBINE's failover, so it was reverted.
// - H200 (not explained): a context decodes at llama-bench's rate until a second context of the
//   process has decoded; from then on it decodes 3-4% slower, even after the second is freed, with
//   one runner thread for the process or one per context alike. llama-bench, creating and freeing six contexts in
//   one process, shows no such drop.
// Each figure is 4 repetitions of 128 (--tokens) greedy tokens from an empty cache, steps queued ahead
// (`follow`) as the engine runs them.
// Usage (bundle.mjs makes dist/gpu/second-context.cjs; on the GPU machine after build.sh, with the
// unpacked test carry; --bin picks the addon, default the CUDA build):
//   node benchmarks/dist/gpu/second-context.cjs --model FILE [--threads 16] [--tokens 128] [--out FILE]
//        [--bin packages/native-ggml/build-cuda/bin]
import { writeFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { initBackend, listDevices, Model } from '../../packages/native-ggml/dist/index.js';
import { newResult } from '../dist/results.js';
import { makeFigure } from '../dist/schema.js';

const args = {};
for (const [i, a] of process.argv.entries()) {
  if (i >= 2 && a.startsWith('--')) args[a.slice(2)] = process.argv[i + 1];
}
if (!args.model) {
  console.error('usage: second-context.cjs --model FILE [--threads N] [--out FILE] [--bin DIR]');
  process.exit(2);
}
const threads = Number(args.threads ?? 16);
const tokens = Number(args.tokens ?? 128);
process.env.HYDRA_NATIVE_ADDON ??= resolve(
  args.bin ?? 'packages/native-ggml/build-cuda/bin',
  'hydra_ggml.node',
);
initBackend();

async function main() {
  const started = new Date();
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

  /** Tokens/s of 4 repetitions of `n` tokens (`--tokens`, 128) from an empty cache. */
  async function decodeRates(ctx, n = tokens, reps = 4) {
    const rates = [];
    for (let rep = 0; rep < reps; rep++) {
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
    return rates;
  }

  const figures = [];
  let anchor;
  const measure = async (label, ctx) => {
    const samples = await decodeRates(ctx);
    const f = makeFigure({ name: label, unit: 'tokens/s', samples, anchor });
    anchor ??= { name: 'context A alone, before any other context decoded', samples };
    figures.push(f);
    console.log(`${label}: ${f.median.toFixed(1)} tok/s${f.ratio ? ` (${f.ratio.toFixed(3)}x)` : ''}`);
  };
  const a = await create();
  await decodeRates(a, 8, 1); // warm-up
  await measure('A alone', a);
  await measure('A alone, again', a);
  const unused = await create();
  await measure('A, a second context created, not used', a);
  await unused.dispose();
  await measure('A, after that context was freed', a);
  const b = await create();
  await decodeRates(b, 8, 1);
  await measure('B, a second context that decodes, A alive', b);
  await measure('A, B alive (both have decoded)', a);
  await b.dispose();
  await measure('A, after B was freed', a);
  await a.dispose();
  const c = await create();
  await decodeRates(c, 8, 1);
  await measure('C, alone after A and B were freed', c);
  await c.dispose();
  sampler.dispose();
  model.dispose();
  const result = newResult(
    'second-context',
    figures,
    [],
    {
      command: `node benchmarks/dist/gpu/second-context.cjs ${process.argv.slice(2).join(' ')}`,
      model: args.model,
      threads,
      tokens,
      devices: listDevices().map((d) => d.name),
    },
    started,
  );
  if (args.out) writeFileSync(args.out, `${JSON.stringify(result, null, 2)}\n`);
}

main().then(
  () => process.exit(0),
  (err) => {
    console.error(err);
    process.exit(1);
  },
);
