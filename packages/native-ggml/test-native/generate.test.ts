import { join } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { initBackend, Model } from '../src/index.js';
import { binDir, greedyBatched, run, tinyModel } from './helpers.js';

const PROMPT = 'Hello world, this is a test';

async function greedy(model: Model, prompt: string, n: number): Promise<number[]> {
  const ctx = await model.createContext({ nCtx: 256, nBatch: 64 });
  const sampler = model.createSampler({ temp: 0 });
  try {
    const tokens = model.tokenize(prompt);
    let r = await ctx.decode([{ seq: 0, pos: 0, tokens, sampler }]);
    const out = [r.tokens[0]!];
    for (let i = 1; i < n; i++) {
      r = await ctx.decode([{ seq: 0, pos: tokens.length + i - 1, tokens: [out.at(-1)!], sampler }]);
      out.push(r.tokens[0]!);
    }
    return out;
  } finally {
    sampler.dispose();
    await ctx.dispose();
  }
}

describe.each(['f32', 'q8_0', 'q4_0'] as const)('greedy generation on the tiny %s model', (quant) => {
  let path: string;
  let model: Model;
  beforeAll(async () => {
    initBackend();
    path = await tinyModel(quant);
    model = await Model.load({ path });
    return () => model.dispose();
  });

  it('is deterministic', async () => {
    expect(await greedy(model, PROMPT, 16)).toEqual(await greedy(model, PROMPT, 16));
  });

  it('samples the first index of the largest logit', async () => {
    const ctx = await model.createContext({ nCtx: 256, nBatch: 64 });
    const sampler = model.createSampler({ temp: 0 });
    try {
      const tokens = model.tokenize(PROMPT);
      let r = await ctx.decode([{ seq: 0, pos: 0, tokens, sampler, logits: true }]);
      for (let i = 0; i < 6; i++) {
        const row = r.logits[0]!;
        let best = 0;
        for (let j = 1; j < row.length; j++) if (row[j]! > row[best]!) best = j;
        expect(r.tokens[0]).toBe(best);
        r = await ctx.decode([{ seq: 0, pos: tokens.length + i, tokens: [best], sampler, logits: true }]);
      }
    } finally {
      sampler.dispose();
      await ctx.dispose();
    }
  });

  it('equals upstream llama-simple for the same model and prompt', async () => {
    const ours = await greedy(model, PROMPT, 16);
    // llama-simple prints each token's piece (special pieces too) as it goes.
    const pieces = [...model.tokenize(PROMPT), ...ours].map((t) => model.tokenBytes(t, true));
    const text = Buffer.concat(pieces).toString('utf8');
    const { stdout } = await run(join(binDir, 'llama-simple'), ['-m', path, '-n', '16', PROMPT]);
    expect(stdout.trimEnd()).toBe(text.trimEnd());
  });
});

describe('sequences and state', () => {
  let model: Model;
  beforeAll(async () => {
    initBackend();
    model = await Model.load({ path: await tinyModel('f32') });
    return () => model.dispose();
  });

  it('batches several sequences in one step with the same result as one at a time', async () => {
    const prompts = ['Hello world', 'The quick brown fox', 'one two three four'];
    const alone = await Promise.all(prompts.map((p) => greedy(model, p, 6)));
    expect(await greedyBatched(model, prompts, 6)).toEqual(alone);
  });

  it('splits a prompt longer than n_batch across native chunks', async () => {
    const long = Array.from({ length: 40 }, (_, i) => `word${i}`).join(' ');
    const ctx = await model.createContext({ nCtx: 512, nBatch: 16, nUbatch: 16 });
    const sampler = model.createSampler({ temp: 0 });
    const tokens = model.tokenize(long);
    expect(tokens.length).toBeGreaterThan(16);
    const r = await ctx.decode([{ seq: 0, pos: 0, tokens, sampler, logits: true }]);
    const ctx2 = await model.createContext({ nCtx: 512, nBatch: 512 });
    const r2 = await ctx2.decode([
      { seq: 0, pos: 0, tokens, sampler: model.createSampler({ temp: 0 }), logits: true },
    ]);
    expect(r.tokens[0]).toBe(r2.tokens[0]);
    expect(r.logits[0]!.length).toBe(model.info.nVocab);
    sampler.dispose();
    await ctx.dispose();
    await ctx2.dispose();
  });

  it('saves a sequence state and restores it into another context to continue identically', async () => {
    const ctx = await model.createContext({ nCtx: 256, nBatch: 64 });
    const sampler = model.createSampler({ temp: 0 });
    const tokens = model.tokenize(PROMPT);
    let r = await ctx.decode([{ seq: 0, pos: 0, tokens, sampler }]);
    const first = r.tokens[0]!;
    const state = await ctx.getSequenceState(0);
    expect(state.length).toBeGreaterThan(0);
    const original: number[] = [];
    let last = first;
    for (let i = 0; i < 8; i++) {
      r = await ctx.decode([{ seq: 0, pos: tokens.length + i, tokens: [last], sampler }]);
      last = r.tokens[0]!;
      original.push(last);
    }
    const ctx2 = await model.createContext({ nCtx: 256, nBatch: 64 });
    const sampler2 = model.createSampler({ temp: 0 });
    expect(await ctx2.setSequenceState(0, state)).toBe(state.length);
    expect(ctx2.sequenceEnd(0)).toBe(tokens.length - 1);
    const restored: number[] = [];
    last = first;
    for (let i = 0; i < 8; i++) {
      r = await ctx2.decode([{ seq: 0, pos: tokens.length + i, tokens: [last], sampler: sampler2 }]);
      last = r.tokens[0]!;
      restored.push(last);
    }
    expect(restored).toEqual(original);
    await expect(ctx2.setSequenceState(0, state.subarray(0, 10))).rejects.toMatchObject({
      code: 'HYDRA_ERR_STATE_FAILED',
    });
    sampler.dispose();
    sampler2.dispose();
    await ctx.dispose();
    await ctx2.dispose();
  });

  it('refuses to free a model with live contexts and frees deterministically afterwards', async () => {
    const m = await Model.load({ path: await tinyModel('q8_0') });
    const ctx = await m.createContext({ nCtx: 128 });
    expect(() => m.dispose()).toThrow(expect.objectContaining({ code: 'HYDRA_ERR_BAD_ARGUMENT' }));
    await ctx.dispose();
    m.dispose();
    expect(m.disposed).toBe(true);
    expect(() => m.tokenize('x')).toThrow(expect.objectContaining({ code: 'HYDRA_ERR_DISPOSED' }));
  });
});

describe('queued decode steps (follow)', () => {
  let model: Model;
  beforeAll(async () => {
    initBackend();
    model = await Model.load({ path: await tinyModel('q8_0') });
    return () => model.dispose();
  });

  it('queues every step up front and gives the same tokens as awaiting each one', async () => {
    const expected = await greedy(model, PROMPT, 12);
    const ctx = await model.createContext({ nCtx: 256, nBatch: 64 });
    const sampler = model.createSampler({ temp: 0 });
    const tokens = model.tokenize(PROMPT);
    // All 12 steps are issued before the first one has ended.
    const steps = [ctx.decode([{ seq: 0, pos: 0, tokens, sampler }])];
    for (let i = 1; i < 12; i++)
      steps.push(ctx.decode([{ seq: 0, pos: tokens.length + i - 1, follow: true, sampler }]));
    const out = (await Promise.all(steps)).map((r) => r.tokens[0]);
    expect(out).toEqual(expected);
    sampler.dispose();
    await ctx.dispose();
  });

  it('mixes follow and explicit entries of several sequences in one step', async () => {
    const prompts = ['Hello world', 'The quick brown fox'];
    const alone = await Promise.all(prompts.map((p) => greedy(model, p, 5)));
    const ctx = await model.createContext({ nCtx: 512, nBatch: 64, nSeqMax: 2 });
    const samplers = prompts.map(() => model.createSampler({ temp: 0 }));
    const tokens = prompts.map((p) => model.tokenize(p));
    const first = await ctx.decode(
      prompts.map((_, i) => ({ seq: i, pos: 0, tokens: tokens[i]!, sampler: samplers[i]! })),
    );
    const outs = prompts.map((_, i) => [first.tokens[i]!]);
    // seq 0 follows (two steps queued at once); seq 1 is fed explicitly one step behind.
    const a = ctx.decode([
      { seq: 0, pos: tokens[0]!.length, follow: true, sampler: samplers[0]! },
      { seq: 1, pos: tokens[1]!.length, tokens: [outs[1]![0]!], sampler: samplers[1]! },
    ]);
    const b = ctx.decode([{ seq: 0, pos: tokens[0]!.length + 1, follow: true, sampler: samplers[0]! }]);
    const [ra, rb] = await Promise.all([a, b]);
    outs[0]!.push(ra.tokens[0]!, rb.tokens[0]!);
    outs[1]!.push(ra.tokens[1]!);
    expect(outs[0]).toEqual(alone[0]!.slice(0, 3));
    expect(outs[1]).toEqual(alone[1]!.slice(0, 2));
    for (const s of samplers) s.dispose();
    await ctx.dispose();
  });

  it('fails a follow step whose previous step failed, and the context stays usable', async () => {
    const ctx = await model.createContext({ nCtx: 64, nBatch: 64 });
    const sampler = model.createSampler({ temp: 0 });
    // A token id outside the vocabulary: llama_decode rejects the batch.
    const bad = ctx.decode([{ seq: 0, pos: 0, tokens: [5, model.info.nVocab + 5], sampler }]);
    const next = ctx.decode([{ seq: 0, pos: 2, follow: true, sampler }]);
    await expect(bad).rejects.toMatchObject({ code: 'HYDRA_ERR_DECODE_FAILED' });
    await expect(next).rejects.toMatchObject({ code: 'HYDRA_ERR_DECODE_FAILED' });
    ctx.clear();
    const ok = await ctx.decode([{ seq: 0, pos: 0, tokens: model.tokenize(PROMPT), sampler }]);
    expect(ok.tokens[0]).toBeGreaterThanOrEqual(0);
    sampler.dispose();
    await ctx.dispose();
  });

  it('rejects follow without a sampler, and KV edits while a step is queued', async () => {
    const ctx = await model.createContext({ nCtx: 256, nBatch: 64 });
    const sampler = model.createSampler({ temp: 0 });
    await expect(ctx.decode([{ seq: 0, pos: 0, follow: true } as never])).rejects.toMatchObject({
      code: 'HYDRA_ERR_BAD_ARGUMENT',
    });
    const step = ctx.decode([{ seq: 0, pos: 0, tokens: model.tokenize(PROMPT), sampler }]);
    expect(() => ctx.removeSequence(0)).toThrow(expect.objectContaining({ code: 'HYDRA_ERR_BAD_ARGUMENT' }));
    await step;
    expect(ctx.removeSequence(0)).toBe(true);
    sampler.dispose();
    await ctx.dispose();
  });

  it('keeps call order with a state save queued between steps', async () => {
    const ctx = await model.createContext({ nCtx: 256, nBatch: 64 });
    const sampler = model.createSampler({ temp: 0 });
    const tokens = model.tokenize(PROMPT);
    const s1 = ctx.decode([{ seq: 0, pos: 0, tokens, sampler }]);
    const state = ctx.getSequenceState(0);
    const s2 = ctx.decode([{ seq: 0, pos: tokens.length, follow: true, sampler }]);
    await s1;
    // The save ran after step 1 and before step 2: it holds the prompt only.
    const ctx2 = await model.createContext({ nCtx: 256, nBatch: 64 });
    await ctx2.setSequenceState(0, await state);
    expect(ctx2.sequenceEnd(0)).toBe(tokens.length - 1);
    await s2;
    expect(ctx.sequenceEnd(0)).toBe(tokens.length);
    sampler.dispose();
    await ctx.dispose();
    await ctx2.dispose();
  });

  it('queues a step behind a state save that is already running', async () => {
    const ctx = await model.createContext({ nCtx: 256, nBatch: 64 });
    const sampler = model.createSampler({ temp: 0 });
    const tokens = model.tokenize(PROMPT);
    await ctx.decode([{ seq: 0, pos: 0, tokens, sampler }]);
    const state = ctx.getSequenceState(0);
    await new Promise((resolve) => setImmediate(resolve)); // the save has started on the native side
    const step = ctx.decode([{ seq: 0, pos: tokens.length, follow: true, sampler }]);
    expect((await state).length).toBeGreaterThan(0);
    expect((await step).tokens[0]).toBeGreaterThanOrEqual(0);
    sampler.dispose();
    await ctx.dispose();
  });

  it('interleaves the queued steps of two live contexts with the tokens each gets alone', async () => {
    const alone = await greedy(model, PROMPT, 8);
    const contexts = [
      await model.createContext({ nCtx: 256, nBatch: 64 }),
      await model.createContext({ nCtx: 256, nBatch: 64 }),
    ];
    const samplers = contexts.map(() => model.createSampler({ temp: 0 }));
    const tokens = model.tokenize(PROMPT);
    const runs = contexts.map((ctx, k) => {
      const sampler = samplers[k]!;
      const queued = [ctx.decode([{ seq: 0, pos: 0, tokens, sampler }])];
      for (let i = 1; i < 8; i++) {
        queued.push(ctx.decode([{ seq: 0, pos: tokens.length + i - 1, follow: true, sampler }]));
      }
      return Promise.all(queued);
    });
    for (const out of await Promise.all(runs)) expect(out.map((r) => r.tokens[0])).toEqual(alone);
    for (const sampler of samplers) sampler.dispose();
    for (const ctx of contexts) await ctx.dispose();
  });
});
