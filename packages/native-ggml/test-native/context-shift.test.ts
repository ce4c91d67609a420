import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { initBackend, Model } from '../src/index.js';
import { writeSyntheticModel } from '../src/synth/index.js';

// Context shift (the engine's ctx_shift): the dropped span leaves the KV and the tail moves down
// by its length (llama_memory_seq_add), so the sequence goes on at a lower position; a recurrent
// or hybrid memory cannot move positions and says so.

const PROMPT = 'the cat and the dog went to the market and then they came back home again';

let dir: string;
beforeAll(() => {
  initBackend();
  dir = mkdtempSync(join(tmpdir(), 'hydra-ctx-shift-'));
});
afterAll(() => {
  rmSync(dir, { recursive: true, force: true });
});

async function load(arch: 'llama' | 'qwen35'): Promise<Model> {
  const path = join(dir, `tiny-${arch}.gguf`);
  await writeSyntheticModel({ arch, shape: 'tiny', quant: 'f32', seed: 7, out: path });
  return Model.load({ path });
}

describe('shiftSequence', () => {
  it('moves the tail of a plain KV sequence down over a removed span, and decoding goes on', async () => {
    const model = await load('llama');
    const ctx = await model.createContext({ nCtx: 256 });
    const s = model.createSampler({ temp: 0 });
    try {
      expect(ctx.canShift).toBe(true);
      const tokens = Array.from(model.tokenize(PROMPT));
      const n = tokens.length;
      expect(n).toBeGreaterThan(12);
      await ctx.decode([{ seq: 0, pos: 0, tokens, sampler: s }]);
      expect(ctx.sequenceEnd(0)).toBe(n - 1);
      expect(ctx.removeSequence(0, 4, 10)).toBe(true);
      ctx.shiftSequence(0, 10, n, -6);
      expect(ctx.sequenceEnd(0)).toBe(n - 7);
      const r = await ctx.decode([{ seq: 0, pos: n - 6, tokens: [tokens[0]!], sampler: s }]);
      expect(r.tokens.length).toBe(1);
      expect(ctx.sequenceEnd(0)).toBe(n - 6);
    } finally {
      s.dispose();
      await ctx.dispose();
      model.dispose();
    }
  });

  it('is refused on a hybrid memory, which cannot shift', async () => {
    const model = await load('qwen35');
    const ctx = await model.createContext({ nCtx: 256 });
    try {
      expect(ctx.canShift).toBe(false);
      expect(() => ctx.shiftSequence(0, 0, 4, -1)).toThrow(
        expect.objectContaining({ code: 'HYDRA_ERR_BAD_ARGUMENT' }),
      );
    } finally {
      await ctx.dispose();
      model.dispose();
    }
  });
});
