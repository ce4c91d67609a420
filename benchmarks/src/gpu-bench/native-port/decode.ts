import { type Context, Model, type Sampler } from '@hydra-engine/native-ggml';
import { runTool } from '../harness/index.js';
import type { NativePortContext } from './context.js';

/**
 * Decode loops through the binding, measured as llama-bench measures: prefill and decode are
 * separate tests, each warmed up first (pp: one 512-token call; tg: one single-token step, as
 * llama-bench's `test_gen(ctx, 1)`), then --reps repetitions from an empty KV cache. 'backend'
 * samples greedily on the device and awaits each step; 'chained' too, but queues step k+1 (follow:
 * the token sampled at step k) before step k ends, as the engine does; 'after-prefill' is 'chained'
 * with a 512-token prefill before each repetition: its first step rebuilds the graph and re-captures
 * the CUDA graph, which llama-bench's tg repetitions never do. 'none' samples nothing and reads
 * nothing back (no output row): the call path alone; 'none-chained' queues those steps ahead with
 * pseudo-random tokens, and '-ctx256' in llama-bench's context size.
 */
export const MODES: Record<
  string,
  { backendSampling: boolean; sampler: boolean; chained?: boolean; prefillEachRep?: boolean; nCtx?: number }
> = {
  backend: { backendSampling: true, sampler: true },
  chained: { backendSampling: true, sampler: true, chained: true },
  'after-prefill': { backendSampling: true, sampler: true, chained: true, prefillEachRep: true },
  none: { backendSampling: true, sampler: false },
  'none-chained': { backendSampling: true, sampler: false, chained: true },
  'none-chained-ctx256': { backendSampling: true, sampler: false, chained: true, nCtx: 256 },
};

export const MODE_LABELS: Record<string, string> = {
  chained: 'decode, native loop, greedy sampled on the device, next step queued ahead (follow)',
  backend: 'decode, native loop, greedy sampled on the device, each step awaited',
  'after-prefill':
    'decode, native loop, greedy sampled on the device, next step queued ahead, a 512-token prefill before each repetition',
  none: 'decode, native loop, no sampling and no output row (call path only)',
  'none-chained': 'decode, native loop, no sampling and no output row, next step queued ahead',
  'none-chained-ctx256':
    'decode, native loop, no sampling and no output row, next step queued ahead, n_ctx 256',
};

/** Refuses a --modes entry that names no loop (before anything is loaded). */
export function checkModes(modes: readonly string[]): void {
  for (const mode of modes) {
    const base = mode.split('#')[0] as string;
    if (base !== 'reload' && !MODES[base])
      throw new Error(`unknown mode ${mode}; modes: ${Object.keys(MODES).join(', ')}`);
  }
}

export interface ModeResult {
  pp: number[];
  tg: number[];
  steps: {
    median_ms: number | undefined;
    p90_ms: number | undefined;
    max_ms: number | undefined;
    first_ms: number[];
  };
  buffers: string[];
}

/** Runs the decode loops of `modes`, in order, each in a new context of one loaded model. */
export async function nativeDecode(
  c: NativePortContext,
  modelPath: string,
  modes: readonly string[],
): Promise<Record<string, ModeResult>> {
  const reps = c.opts.reps;
  let model = await Model.load({ path: modelPath, nGpuLayers: 99 });
  const out: Record<string, ModeResult> = {};
  const prompt = Int32Array.from({ length: 512 }, (_, i) => 3 + ((i * 7919) % (model.info.nVocab - 3)));
  for (const mode of modes) {
    const base = mode.split('#')[0] as string;
    // `reload`: dispose of the model and load it again (is a later context's drop in the model?).
    if (base === 'reload') {
      model.dispose();
      model = await Model.load({ path: modelPath, nGpuLayers: 99 });
      continue;
    }
    // `chained#2`: the `chained` loop again, in a later context of the same process.
    const m = MODES[base];
    if (!m) throw new Error(`unknown mode ${mode}; modes: ${Object.keys(MODES).join(', ')}`);
    const ctx: Context = await model.createContext({
      ...(c.opts.threads ? { nThreads: c.opts.threads } : {}),
      nCtx: m.nCtx ?? 4096,
      nBatch: 2048,
      nUbatch: 512,
      flashAttn: 'auto',
      backendSampling: m.backendSampling,
    });
    const sampler: Sampler | undefined = m.sampler ? model.createSampler({ temp: 0 }) : undefined;
    const pp: number[] = [];
    const tg: number[] = [];
    const stepMs: number[] = []; // intervals between consecutive step completions, every rep
    const firstMs: number[] = []; // call to completion of each rep's first step
    const prefill = async () => {
      ctx.clear();
      const t0 = performance.now();
      await ctx.decode([{ seq: 0, pos: 0, tokens: prompt, logits: false }]);
      return 512 / ((performance.now() - t0) / 1000);
    };
    const nVocab = model.info.nVocab;
    const randomToken = (i: number) => 3 + ((i * 7919) % (nVocab - 3));
    const bos = model.info.bos;
    const generate = async (n: number) => {
      let token = bos;
      const t0 = performance.now();
      let last = t0;
      const done = (i: number) => {
        const now = performance.now();
        if (i === 0) firstMs.push(now - t0);
        else stepMs.push(now - last);
        last = now;
      };
      if (m.chained) {
        let prev = ctx.decode([{ seq: 0, pos: 0, tokens: [token], ...(sampler ? { sampler } : {}) }]);
        for (let i = 1; i < n; i++) {
          const next = ctx.decode([
            sampler
              ? { seq: 0, pos: i, follow: true, sampler }
              : { seq: 0, pos: i, tokens: [randomToken(i)] },
          ]);
          await prev;
          done(i - 1);
          prev = next;
        }
        await prev;
        done(n - 1);
      } else {
        for (let i = 0; i < n; i++) {
          const r = await ctx.decode([{ seq: 0, pos: i, tokens: [token], ...(sampler ? { sampler } : {}) }]);
          done(i);
          token = sampler ? (r.tokens[0] as number) : randomToken(i);
        }
      }
      return n / ((performance.now() - t0) / 1000);
    };
    if (base === 'backend') {
      await prefill(); // warm-up
      for (let rep = 0; rep < reps; rep++) pp.push(await prefill());
    }
    ctx.clear();
    await generate(1); // warm-up
    stepMs.length = 0;
    firstMs.length = 0;
    for (let rep = 0; rep < reps; rep++) {
      if (m.prefillEachRep) await prefill();
      ctx.clear();
      tg.push(await generate(128));
    }
    sampler?.dispose();
    // Which buffer types this context got (a pinned CUDA_Host compute buffer, or a plain CPU one
    // when pinning failed, which llama.cpp reports at debug level only).
    const buffers = ctx
      .memory()
      .map(
        (b) =>
          `${b.bufferType}: compute ${(b.compute / 2 ** 20).toFixed(1)} MiB, context ${(b.context / 2 ** 20).toFixed(1)} MiB`,
      );
    await ctx.dispose();
    const sorted = [...stepMs].sort((a, b) => a - b);
    out[mode] = {
      pp,
      tg,
      steps: {
        median_ms: sorted[Math.floor(sorted.length / 2)],
        p90_ms: sorted[Math.floor(sorted.length * 0.9)],
        max_ms: sorted.at(-1),
        first_ms: firstMs,
      },
      buffers,
    };
  }
  model.dispose();
  return out;
}

const GREEDY_PROMPT = 'Hello world, this is a test';

/**
 * Greedy generation through the binding equals upstream llama-simple's on the same device, model
 * and prompt (llama-simple prints each piece as it goes).
 */
export async function greedyCheck(
  c: NativePortContext,
  modelPath: string,
  n = 32,
): Promise<{ tokens: number; equal: boolean; ours: string; upstream: string }> {
  // A load of its own, so that the decode loops after it start on a model no prompt has touched
  // (a context created after a prefill decoded 3-4% slower on the H200: 20261129g).
  const model = await Model.load({ path: modelPath, nGpuLayers: 99 });
  try {
    const ctx = await model.createContext({ nCtx: 512, nBatch: 512 });
    const sampler = model.createSampler({ temp: 0 });
    const prompt = Array.from(model.tokenize(GREEDY_PROMPT));
    let r = await ctx.decode([{ seq: 0, pos: 0, tokens: prompt, sampler }]);
    const ours = [r.tokens[0] as number];
    for (let i = 1; i < n; i++) {
      r = await ctx.decode([
        { seq: 0, pos: prompt.length + i - 1, tokens: [ours.at(-1) as number], sampler },
      ]);
      ours.push(r.tokens[0] as number);
    }
    sampler.dispose();
    await ctx.dispose();
    const text = Buffer.concat([...prompt, ...ours].map((t) => model.tokenBytes(t, true))).toString('utf8');
    const { stdout: upstream } = await runTool(
      c.tool('llama-simple'),
      ['-m', modelPath, '-ngl', '99', '-n', String(n), GREEDY_PROMPT],
      600_000,
    );
    return { tokens: n, equal: upstream.trimEnd() === text.trimEnd(), ours: text, upstream };
  } finally {
    model.dispose();
  }
}
