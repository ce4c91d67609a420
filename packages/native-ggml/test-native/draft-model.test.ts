import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type Context, initBackend, Model } from '../src/index.js';
import { writeSyntheticModel } from '../src/synth/index.js';
import { tinyModel } from './helpers.js';

// Context.draft (hydra_draft.cpp, llama.cpp's draft-simple) on the tiny model drafting for itself:
// its guesses are its own greedy continuation, p_min and n_min cut them as upstream does, and the
// KV holds what was fed plus every guess but the last.
let model: Model;
let ctx: Context;

function argmax(l: Float32Array): number {
  let b = 0;
  for (let i = 1; i < l.length; i++) if (l[i]! > l[b]!) b = i;
  return b;
}

beforeAll(async () => {
  initBackend({ logLevel: 'error' });
  model = await Model.load({ path: await tinyModel('f32') });
  ctx = await model.createContext({ nCtx: 512, nSeqMax: 2, backendSampling: false });
});
afterAll(async () => {
  await ctx?.dispose();
  model?.dispose();
});

/** The model's greedy continuation of `prompt`, `n` tokens, on a context of its own. */
async function greedy(prompt: Int32Array, n: number): Promise<number[]> {
  const c = await model.createContext({ nCtx: 512 });
  try {
    const out: number[] = [];
    let r = await c.decode([{ seq: 0, pos: 0, tokens: prompt, logits: true }]);
    for (let i = 0; i < n; i++) {
      const t = argmax(r.logits[0]!);
      out.push(t);
      r = await c.decode([{ seq: 0, pos: prompt.length + i, tokens: Int32Array.of(t), logits: true }]);
    }
    return out;
  } finally {
    await c.dispose();
  }
}

describe('draft-simple over a binding context', () => {
  it("guesses the draft model's greedy tokens, for two sequences in one call", async () => {
    const a = model.tokenize('Once upon a time', { addSpecial: true });
    const b = model.tokenize('The quick brown fox', { addSpecial: true });
    ctx.clear();
    const out = await ctx.draft(
      [
        { seq: 0, pos: 0, tokens: a, nMax: 5 },
        { seq: 1, pos: 0, tokens: b, nMax: 3 },
      ],
      0,
      0,
    );
    expect(Array.from(out[0]!.tokens)).toEqual(await greedy(a, 5));
    expect(Array.from(out[1]!.tokens)).toEqual(await greedy(b, 3));
    // Every guess but the last was decoded into the sequence.
    expect(out[0]!.fed).toBe(4);
    expect(ctx.sequenceEnd(0)).toBe(a.length + 4 - 1);
    expect(ctx.sequenceEnd(1)).toBe(b.length + 2 - 1);
    // Fed on from where the KV stands (the scheduler feeds only what the draft lacks).
    const cont = await greedy(a, 8);
    ctx.removeSequence(0, a.length, -1);
    const next = await ctx.draft([{ seq: 0, pos: a.length, tokens: Int32Array.of(cont[0]!), nMax: 4 }], 0, 0);
    expect(Array.from(next[0]!.tokens)).toEqual(cont.slice(1, 5));
  });

  it('p_min stops at an unsure guess and n_min drops a short draft', async () => {
    const a = model.tokenize('hello world', { addSpecial: true });
    ctx.clear();
    const sure = await ctx.draft([{ seq: 0, pos: 0, tokens: a, nMax: 6 }], 0, 1);
    expect(sure[0]!.tokens.length).toBe(0);
    expect(ctx.sequenceEnd(0)).toBe(a.length - 1);
    ctx.clear();
    const short = await ctx.draft([{ seq: 0, pos: 0, tokens: a, nMax: 3 }], 4, 0);
    expect(short[0]!.tokens.length).toBe(0);
    ctx.clear();
    await expect(ctx.draft([{ seq: 5, pos: 0, tokens: a, nMax: 3 }], 0, 0)).rejects.toMatchObject({
      code: 'HYDRA_ERR_BAD_ARGUMENT',
    });
  });

  it('the vocabulary check passes a model for itself and names why another does not match', async () => {
    expect(model.draftVocabMismatch(model)).toBe('');
    const out = join(mkdtempSync(join(tmpdir(), 'hydra-draft-')), 'wide.gguf');
    await writeSyntheticModel({ arch: 'llama', shape: 'small-wide', quant: 'q4_0', seed: 1, out });
    const other = await Model.load({ path: out });
    try {
      expect(model.draftVocabMismatch(other)).toMatch(/vocab size 2304 differs from the target's 1000/);
    } finally {
      other.dispose();
    }
  });
});
