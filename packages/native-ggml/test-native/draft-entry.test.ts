import { beforeAll, describe, expect, it } from 'vitest';
import { initBackend, Model } from '../src/index.js';
import { tinyModel } from './helpers.js';

// Decode entries with `draft: N` (speculative verification): the samples after each guessed
// position, up to the first mismatch, are those of one-token steps.
let model: Model;
let prompt: Int32Array;
let expected: number[];

async function greedy(n: number): Promise<number[]> {
  const ctx = await model.createContext({ nCtx: 256, nBatch: 64 });
  const sampler = model.createSampler({ temp: 0 });
  try {
    let r = await ctx.decode([{ seq: 0, pos: 0, tokens: prompt, sampler }]);
    const out = [r.tokens[0]!];
    for (let i = 1; i < n; i++) {
      r = await ctx.decode([{ seq: 0, pos: prompt.length + i - 1, tokens: [out.at(-1)!], sampler }]);
      out.push(r.tokens[0]!);
    }
    return out;
  } finally {
    sampler.dispose();
    await ctx.dispose();
  }
}

beforeAll(async () => {
  initBackend();
  model = await Model.load({ path: await tinyModel('q8_0') });
  prompt = model.tokenize('Hello world, this is a test');
  expected = await greedy(12);
  return () => model.dispose();
});

describe('decode entries with a draft', () => {
  it('a right guess is confirmed whole, plus the token after it', async () => {
    const ctx = await model.createContext({ nCtx: 256, nBatch: 64 });
    const sampler = model.createSampler({ temp: 0 });
    const first = await ctx.decode([{ seq: 0, pos: 0, tokens: prompt, sampler }]);
    expect(first.runs).toBeUndefined();
    const tokens = [expected[0]!, ...expected.slice(1, 5)];
    const r = await ctx.decode([{ seq: 0, pos: prompt.length, tokens, sampler, draft: 4 }]);
    expect(Array.from(r.runs![0]!)).toEqual(expected.slice(1, 6));
    expect(r.tokens[0]).toBe(expected[5]);
    sampler.dispose();
    await ctx.dispose();
  });

  it('stops at the first wrong guess with the right token, beside a plain entry in the same step', async () => {
    const ctx = await model.createContext({ nCtx: 512, nBatch: 64, nSeqMax: 2 });
    const samplers = [model.createSampler({ temp: 0 }), model.createSampler({ temp: 0 })];
    await ctx.decode([
      { seq: 0, pos: 0, tokens: prompt, sampler: samplers[0]! },
      { seq: 1, pos: 0, tokens: prompt, sampler: samplers[1]! },
    ]);
    const wrong = (expected[3]! + 1) % model.info.nVocab;
    const r = await ctx.decode([
      {
        seq: 0,
        pos: prompt.length,
        tokens: [expected[0]!, expected[1]!, expected[2]!, wrong, 7],
        sampler: samplers[0]!,
        draft: 4,
      },
      { seq: 1, pos: prompt.length, tokens: [expected[0]!], sampler: samplers[1]! },
    ]);
    expect(Array.from(r.runs![0]!)).toEqual(expected.slice(1, 4));
    expect(r.runs![1]).toBeNull();
    expect(r.tokens[1]).toBe(expected[1]);
    // Drop the rejected positions; seq 0 goes on from the last confirmed token.
    expect(ctx.removeSequence(0, prompt.length + 3, -1)).toBe(true);
    const next = await ctx.decode([
      { seq: 0, pos: prompt.length + 3, tokens: [expected[3]!], sampler: samplers[0]! },
    ]);
    expect(next.tokens[0]).toBe(expected[4]);
    for (const s of samplers) s.dispose();
    await ctx.dispose();
  });

  it('keeps a draft in one batch chunk when the step has more tokens than n_batch', async () => {
    const ctx = await model.createContext({ nCtx: 512, nBatch: 8, nSeqMax: 2 });
    const samplers = [model.createSampler({ temp: 0 }), model.createSampler({ temp: 0 })];
    const p = prompt.subarray(0, 6);
    // seq 1 feeds 6 prompt tokens first, so seq 0's 5-token draft does not fit the first chunk.
    await ctx.decode([{ seq: 0, pos: 0, tokens: prompt.subarray(0, 8) }]);
    await ctx.decode([{ seq: 0, pos: 8, tokens: prompt.subarray(8), sampler: samplers[0]! }]);
    const r = await ctx.decode([
      { seq: 1, pos: 0, tokens: p },
      { seq: 0, pos: prompt.length, tokens: expected.slice(0, 5), sampler: samplers[0]!, draft: 4 },
    ]);
    expect(Array.from(r.runs![1]!)).toEqual(expected.slice(1, 6));
    for (const s of samplers) s.dispose();
    await ctx.dispose();
  });

  it.each([
    [true, 8],
    [true, 1],
    [false, 1],
  ])('on-device sampling %s, %i outputs per sequence: the same runs, greedy or with a penalty', async (onDevice, perSeq) => {
    const ctx = await model.createContext({
      nCtx: 256,
      nBatch: 64,
      backendSampling: onDevice as boolean,
      nOutputsMaxPerSeq: perSeq as number,
    });
    // Greedy samples every guessed position on the device at once when it can; a chain with a
    // repetition penalty (state: the tokens accepted) samples them on the host in turn.
    for (const params of [{ temp: 0 }, { temp: 0, penaltyRepeat: 1.3, penaltyLastN: 64 }]) {
      const sampler = model.createSampler(params);
      ctx.clear();
      let r = await ctx.decode([{ seq: 0, pos: 0, tokens: prompt, sampler }]);
      const plain = [r.tokens[0]!];
      for (let i = 1; i < 8; i++) {
        r = await ctx.decode([{ seq: 0, pos: prompt.length + i - 1, tokens: [plain.at(-1)!], sampler }]);
        plain.push(r.tokens[0]!);
      }
      sampler.dispose();
      const again = model.createSampler(params);
      ctx.clear();
      const first = await ctx.decode([{ seq: 0, pos: 0, tokens: prompt, sampler: again }]);
      expect(first.tokens[0]).toBe(plain[0]);
      const wrong = (plain[5]! + 1) % model.info.nVocab;
      const v = await ctx.decode([
        { seq: 0, pos: prompt.length, tokens: [...plain.slice(0, 5), wrong], sampler: again, draft: 5 },
      ]);
      expect(Array.from(v.runs![0]!)).toEqual(plain.slice(1, 6));
      again.dispose();
    }
    await ctx.dispose();
  });

  it('refuses a draft without a sampler, with follow or logits, or longer than its tokens or n_batch', async () => {
    const ctx = await model.createContext({ nCtx: 256, nBatch: 8 });
    const sampler = model.createSampler({ temp: 0 });
    const bad = [
      { seq: 0, pos: 0, tokens: [1, 2, 3], draft: 2 },
      { seq: 0, pos: 0, tokens: [1, 2, 3], sampler, draft: 3 },
      { seq: 0, pos: 0, tokens: [1, 2, 3], sampler, draft: 2, logits: true },
      { seq: 0, pos: 0, tokens: [1, 2, 3, 4, 5, 6, 7, 8, 9], sampler, draft: 2 },
    ];
    for (const e of bad)
      await expect(ctx.decode([e])).rejects.toMatchObject({ code: 'HYDRA_ERR_BAD_ARGUMENT' });
    sampler.dispose();
    await ctx.dispose();
  });
});
