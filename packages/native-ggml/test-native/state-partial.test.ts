import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { initBackend, Model } from '../src/index.js';
import { writeSyntheticModel } from '../src/synth/index.js';

// Prompt checkpoints (the engine's n_ctx_checkpoints): a decode entry's `checkpoint: true` returns
// the sequence's partial state (the recurrent part of a hybrid memory) read right after the step;
// restoring it with {partial: true} and removing the attention KV after it gives the same logits
// as reading the prompt again from scratch, where a plain partial removal is refused.

const PROMPT = 'the cat and the dog went to the market and then';

let dir: string;
beforeAll(() => {
  initBackend();
  dir = mkdtempSync(join(tmpdir(), 'hydra-state-partial-'));
});
afterAll(() => {
  rmSync(dir, { recursive: true, force: true });
});

describe.each(['qwen35', 'qwen35moe'] as const)('tiny %s partial state', (arch) => {
  let model: Model;
  beforeAll(async () => {
    const path = join(dir, `tiny-${arch}.gguf`);
    await writeSyntheticModel({ arch, shape: 'tiny', quant: 'f32', seed: 7, out: path });
    model = await Model.load({ path });
  }, 60_000);
  afterAll(async () => {
    model?.dispose();
  });

  it('a checkpoint taken by a decode step, restored after the sequence went on, reads on as a fresh sequence', async () => {
    const ctx = await model.createContext({ nCtx: 256, nBatch: 64, nUbatch: 64, nSeqMax: 2 });
    try {
      const tokens = model.tokenize(PROMPT);
      const cut = tokens.length - 4;
      const head = tokens.subarray(0, cut);
      const r = await ctx.decode([{ seq: 0, pos: 0, tokens: head, checkpoint: true }]);
      const state = r.checkpoints?.[0];
      expect(state).toBeInstanceOf(Buffer);
      // Partial: smaller than the whole sequence's state, which carries the attention KV too.
      const whole = await ctx.getSequenceState(0);
      expect(state!.length).toBeGreaterThan(0);
      expect(state!.length).toBeLessThan(whole.length);
      expect((await ctx.getSequenceState(0, { partial: true })).equals(state!)).toBe(true);
      // The sequence goes on past the checkpoint; a recurrent memory cannot drop that tail.
      await ctx.decode([{ seq: 0, pos: cut, tokens: tokens.subarray(cut) }]);
      expect(ctx.removeSequence(0, cut, -1)).toBe(false);
      expect(await ctx.setSequenceState(0, state!, { partial: true })).toBe(state!.length);
      // The recurrent part ends at the checkpoint now: dropping the attention KV after it works.
      expect(ctx.removeSequence(0, cut, -1)).toBe(true);
      expect(ctx.sequenceEnd(0)).toBe(cut - 1);
      const tail = Int32Array.from([
        ...tokens.subarray(cut, cut + 2),
        ...model.tokenize(' river').subarray(1),
      ]);
      const restored = await ctx.decode([{ seq: 0, pos: cut, tokens: tail, logits: true }]);
      const fresh = await ctx.decode([
        { seq: 1, pos: 0, tokens: Int32Array.from([...head, ...tail]), logits: true },
      ]);
      const a = restored.logits[0]!;
      const b = fresh.logits[0]!;
      let diff = 0;
      for (let k = 0; k < a.length; k++) diff = Math.max(diff, Math.abs(a[k]! - b[k]!));
      expect(diff).toBeLessThan(1e-3);
      // A step without the option reads nothing back.
      expect(
        (await ctx.decode([{ seq: 1, pos: head.length + tail.length, tokens: [5] }])).checkpoints,
      ).toBeUndefined();
    } finally {
      await ctx.dispose();
    }
  });
});
