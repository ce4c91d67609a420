import { writeFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { HydraError } from '@hydra-engine/errors';
import { type Context, initBackend, listDevices, Model } from '@hydra-engine/native-ggml';
import { newResult } from '../../results.js';
import { type Anchor, type Figure, makeFigure } from '../../schema.js';
import { type FlagTable, parseFlags, read } from '../harness/index.js';

const USAGE =
  'usage: second-context.cjs --model FILE [--threads 16] [--tokens 128] [--out FILE] [--bin packages/native-ggml/build-cuda/bin]';

interface Options {
  model: string | undefined;
  threads: number;
  tokens: number;
  out: string | undefined;
  bin: string;
}

const DEFAULTS: Options = {
  model: undefined,
  threads: 16,
  tokens: 128,
  out: undefined,
  bin: 'packages/native-ggml/build-cuda/bin',
};

const FLAGS: FlagTable<Options> = {
  '--model': ['model', read.string],
  '--threads': ['threads', read.int(1)],
  '--tokens': ['tokens', read.int(2)],
  '--out': ['out', read.string],
  '--bin': ['bin', read.string],
};

/**
 * One context's decode rate as other contexts of the process come and go, against the same context
 * alone before any other decoded (the anchor, same run): 4 repetitions of --tokens greedy tokens
 * from an empty cache, steps queued ahead (`follow`) as the engine runs them. Resolves to the exit code.
 */
export async function main(argv: readonly string[]): Promise<number> {
  let opts: Options & { model: string };
  try {
    const parsed = parseFlags(argv, DEFAULTS, FLAGS);
    if (parsed === 'help') {
      console.log(USAGE);
      return 0;
    }
    if (!parsed.model)
      throw new HydraError('HYDRA_ERR_BAD_ARGUMENT', '--model: required', { keys: ['--model'] });
    opts = { ...parsed, model: parsed.model };
  } catch (err) {
    if (!(err instanceof HydraError)) throw err;
    console.error(`second-context: ${err.message}\n${USAGE}`);
    return 2;
  }
  process.env.HYDRA_NATIVE_ADDON ??= resolve(opts.bin, 'hydra_ggml.node');
  initBackend();
  const started = new Date();
  const model = await Model.load({ path: opts.model, nGpuLayers: 99 });
  const sampler = model.createSampler({ temp: 0 });
  const create = () =>
    model.createContext({
      nThreads: opts.threads,
      nCtx: 4096,
      nBatch: 2048,
      nUbatch: 512,
      flashAttn: 'auto',
      backendSampling: true,
    });

  /** Tokens/s of `reps` repetitions of `n` tokens from an empty cache. */
  const decodeRates = async (ctx: Context, n = opts.tokens, reps = 4) => {
    const rates: number[] = [];
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
  };

  const figures: Figure[] = [];
  let anchor: { name: string; samples: number[] } | Anchor | undefined;
  const measure = async (label: string, ctx: Context) => {
    const samples = await decodeRates(ctx);
    const f = makeFigure({ name: label, unit: 'tokens/s', samples, anchor: anchor ?? null });
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
      command: `node benchmarks/dist/gpu/second-context.cjs ${argv.join(' ')}`,
      model: opts.model,
      threads: opts.threads,
      tokens: opts.tokens,
      devices: listDevices().map((d) => d.name),
    },
    started,
  );
  if (opts.out) writeFileSync(opts.out, `${JSON.stringify(result, null, 2)}\n`);
  return 0;
}
