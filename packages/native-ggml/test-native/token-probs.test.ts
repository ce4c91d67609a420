import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type Context, type DecodeResult, initBackend, Model, type SamplerParams } from '../src/index.js';
import { tinyModel } from './helpers.js';

// Decode entries with `probs: N` (llama-server's n_probs): the sampled token's probability and the
// N most likely tokens, before the sampler chain (softmax over the whole vocabulary) or after it
// (`postSampling`, the chain's candidates). Checked against softmax of the step's own logits.
let model: Model;
let ctx: Context;
let prompt: Int32Array;

beforeAll(async () => {
  initBackend();
  model = await Model.load({ path: await tinyModel('q8_0') });
  ctx = await model.createContext({ nCtx: 512, nBatch: 64, nSeqMax: 2 });
  prompt = model.tokenize('Hello world, this is a test');
});

afterAll(async () => {
  await ctx.dispose();
  model.dispose();
});

/** Softmax in float64 of `logits` divided by `temp`, over `keep` (default: every token). */
function softmax(logits: Float32Array, keep?: number[]): Map<number, number> {
  const ids = keep ?? Array.from(logits.keys());
  let max = -Infinity;
  for (const i of ids) max = Math.max(max, logits[i]!);
  let sum = 0;
  for (const i of ids) sum += Math.exp(logits[i]! - max);
  return new Map(ids.map((i) => [i, Math.exp(logits[i]! - max) / sum]));
}

function ranked(logits: Float32Array): number[] {
  return Array.from(logits.keys()).sort((a, b) => logits[b]! - logits[a]!);
}

/** Generates `n` tokens from the prompt in seq 0 one step at a time; the KV is cleared after. */
async function generate(
  params: SamplerParams,
  n: number,
  entry: { probs?: number; postSampling?: boolean; logits?: boolean } = {},
): Promise<DecodeResult[]> {
  const sampler = model.createSampler(params);
  const steps: DecodeResult[] = [];
  try {
    let r = await ctx.decode([{ seq: 0, pos: 0, tokens: prompt, sampler, ...entry }]);
    steps.push(r);
    for (let i = 1; i < n; i++) {
      r = await ctx.decode([
        { seq: 0, pos: prompt.length + i - 1, tokens: [r.tokens[0]!], sampler, ...entry },
      ]);
      steps.push(r);
    }
    return steps;
  } finally {
    sampler.dispose();
    ctx.removeSequence(0);
  }
}

describe('token probabilities of a decode step', () => {
  it('before sampling: softmax over the whole vocabulary, the N most likely first (greedy)', async () => {
    const steps = await generate({ temp: 0 }, 6, { probs: 5, logits: true });
    for (const r of steps) {
      const p = r.probs![0]!;
      const logits = r.logits[0]!;
      const ref = softmax(logits);
      const order = ranked(logits);
      expect(Array.from(p.ids)).toEqual(order.slice(0, 5));
      for (let k = 0; k < 5; k++) expect(p.probs[k]).toBeCloseTo(ref.get(p.ids[k]!)!, 5);
      // Greedy picks the most likely token: its probability is the first of the list.
      expect(r.tokens[0]).toBe(order[0]);
      expect(p.prob).toBe(p.probs[0]);
      let sum = 0;
      for (const q of p.probs) sum += q;
      expect(sum).toBeLessThanOrEqual(1 + 1e-6);
      for (let k = 1; k < 5; k++) expect(p.probs[k]!).toBeLessThanOrEqual(p.probs[k - 1]!);
    }
  });

  it('asking for probabilities changes no sampled token (greedy and seeded sampling)', async () => {
    const seeded: SamplerParams = { temp: 1.5, topK: 0, topP: 1, minP: 0, seed: 42 };
    for (const params of [{ temp: 0 }, seeded]) {
      const plain = (await generate(params, 10)).map((r) => r.tokens[0]);
      const pre = (await generate(params, 10, { probs: 3 })).map((r) => r.tokens[0]);
      const post = (await generate(params, 10, { probs: 3, postSampling: true })).map((r) => r.tokens[0]);
      expect(pre).toEqual(plain);
      expect(post).toEqual(plain);
    }
  });

  it('the sampled token of seeded sampling gets its own probability, not the top one', async () => {
    const steps = await generate({ temp: 1.5, topK: 0, topP: 1, minP: 0, seed: 3 }, 12, {
      probs: 2,
      logits: true,
    });
    let other = 0;
    for (const r of steps) {
      const ref = softmax(r.logits[0]!);
      expect(r.probs![0]!.prob).toBeCloseTo(ref.get(r.tokens[0]!)!, 5);
      if (r.tokens[0] !== r.probs![0]!.ids[0]) other += 1;
    }
    // Random weights give a flat distribution: temperature 1.5 picks another token most times.
    expect(other).toBeGreaterThan(0);
  });

  it('after sampling: the candidates top_k leaves, with the probabilities dist gave them', async () => {
    const steps = await generate({ temp: 1, topK: 3, topP: 1, minP: 0, seed: 9 }, 6, {
      probs: 10,
      postSampling: true,
      logits: true,
    });
    for (const r of steps) {
      const p = r.probs![0]!;
      const logits = r.logits[0]!;
      const kept = ranked(logits).slice(0, 3);
      const ref = softmax(logits, kept);
      // At most the 3 candidates top_k kept, though 10 were asked for.
      expect(Array.from(p.ids)).toEqual(kept);
      for (let k = 0; k < 3; k++) expect(p.probs[k]).toBeCloseTo(ref.get(kept[k]!)!, 5);
      expect(kept).toContain(r.tokens[0]);
      expect(p.prob).toBeCloseTo(ref.get(r.tokens[0]!)!, 5);
      let sum = 0;
      for (const q of p.probs) sum += q;
      expect(sum).toBeCloseTo(1, 5);
    }
  });

  it('after sampling, greedy: the chosen token alone with probability 1 (upstream temperature 0)', async () => {
    const [r] = await generate({ temp: 0 }, 1, { probs: 4, postSampling: true });
    const p = r!.probs![0]!;
    expect(Array.from(p.ids)).toEqual([r!.tokens[0]]);
    expect(Array.from(p.probs)).toEqual([1]);
    expect(p.prob).toBe(1);
  });

  it('a follow entry reports too; entries without probs get null, steps without any no field', async () => {
    const a = model.createSampler({ temp: 0 });
    const b = model.createSampler({ temp: 0 });
    try {
      const first = await ctx.decode([
        { seq: 0, pos: 0, tokens: prompt, sampler: a, probs: 2 },
        { seq: 1, pos: 0, tokens: prompt, sampler: b },
      ]);
      expect(first.probs![0]!.ids.length).toBe(2);
      expect(first.probs![1]).toBeNull();
      const next = await ctx.decode([
        { seq: 0, pos: prompt.length, follow: true, sampler: a, probs: 2 },
        { seq: 1, pos: prompt.length, follow: true, sampler: b },
      ]);
      expect(next.probs![0]!.ids[0]).toBe(next.tokens[0]);
      const plain = await ctx.decode([{ seq: 1, pos: prompt.length + 1, follow: true, sampler: b }]);
      expect(plain.probs).toBeUndefined();
    } finally {
      a.dispose();
      b.dispose();
      ctx.removeSequence(0);
      ctx.removeSequence(1);
    }
  });

  it('refuses probs without a sampler, with a draft, or not a count', async () => {
    const s = model.createSampler({ temp: 0 });
    try {
      for (const entry of [
        { seq: 0, pos: 0, tokens: prompt, probs: 2 },
        { seq: 0, pos: 0, tokens: prompt, sampler: s, probs: 2, draft: 1 },
        { seq: 0, pos: 0, tokens: prompt, sampler: s, probs: -1 },
        { seq: 0, pos: 0, tokens: prompt, sampler: s, probs: 1.5 },
      ]) {
        await expect(ctx.decode([entry])).rejects.toMatchObject({ code: 'HYDRA_ERR_BAD_ARGUMENT' });
      }
    } finally {
      s.dispose();
    }
  });
});
