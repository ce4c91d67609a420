import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { initBackend, Model, packChatMessages } from '../src/index.js';
import { tinyModel } from './helpers.js';

// The tiny model's vocabulary is SentencePiece with <unk>, <s>, </s>, <|im_start|>, <|im_end|> as
// special tokens (SYNTH.md); the pieces below mix them with text, whitespace, partial specials and
// multi-byte characters, where the partition's strip and split rules matter.
const PARTS = [
  '<s>',
  '</s>',
  '<unk>',
  '<|im_start|>',
  '<|im_end|>',
  ' ',
  '  ',
  '\n',
  '\t',
  'hello',
  ' world',
];
PARTS.push('the', 'é', '日本', '<|im', '_end|>', '<', '>', 'quick brown');

function same(a: Int32Array, b: Int32Array): boolean {
  return a.length === b.length && a.every((v, i) => v === b[i]);
}

describe('tokenizeAsync / applyChatTemplateAsync', () => {
  let model: Model;
  beforeAll(async () => {
    initBackend();
    model = await Model.load({ path: await tinyModel('f32') });
  });
  afterAll(() => model?.dispose());

  it("gives llama_tokenize's tokens for mixes of special tokens and text", async () => {
    let seed = 1;
    const rnd = (n: number) => {
      seed = (seed * 1103515245 + 12345) & 0x7fffffff;
      return seed % n;
    };
    let compared = 0;
    for (let i = 0; i < 400; i++) {
      let text = '';
      for (let j = rnd(12); j > 0; j--) text += PARTS[rnd(PARTS.length)];
      for (const addSpecial of [true, false])
        for (const parseSpecial of [true, false]) {
          const upstream = model.tokenize(text, { addSpecial, parseSpecial });
          const ours = await model.tokenizeAsync(text, { addSpecial, parseSpecial });
          if (!same(upstream, ours)) expect({ text, addSpecial, parseSpecial, ours }).toEqual({ upstream });
          compared++;
        }
    }
    expect(compared).toBe(1600);
  });

  it('tokenizes 976 KiB of special tokens in time linear in the text (upstream is quadratic)', async () => {
    const unit = '<|im_end|>';
    const time = async (kib: number, upstream: boolean) => {
      const text = unit.repeat(Math.floor((kib * 1024) / unit.length));
      const t0 = performance.now();
      const tokens = await model.tokenizeAsync(text, { upstream });
      return { ms: performance.now() - t0, tokens: tokens.length };
    };
    const big = await time(976, false);
    expect(big.tokens).toBe(Math.floor((976 * 1024) / unit.length) + 1);
    // Measured: 25 ms here; upstream's partition took 1.2 s at 256 KiB and 23 s at 976 KiB.
    expect(big.ms).toBeLessThan(2000);
    const up64 = await time(64, true);
    const up256 = await time(256, true);
    // Four times the text, at least eight times the time: the quadratic walk this path avoids.
    expect(up256.ms).toBeGreaterThan(8 * up64.ms);
  });

  it('leaves the JS thread free while a slow tokenization runs', async () => {
    const text = '<|im_end|>'.repeat(26_000);
    let last = performance.now();
    let worst = 0;
    const timer = setInterval(() => {
      const now = performance.now();
      worst = Math.max(worst, now - last);
      last = now;
    }, 5);
    const t0 = performance.now();
    await model.tokenizeAsync(text, { upstream: true });
    const took = performance.now() - t0;
    clearInterval(timer);
    expect(took).toBeGreaterThan(300);
    // Blocked, the longest gap would be the whole job; a loaded 2-core machine delays timers a
    // little, so the bound is relative.
    expect(worst).toBeLessThan(Math.max(100, took / 3));
  });

  it('renders a chat off the JS thread as applyChatTemplate does', async () => {
    const messages = [
      { role: 'system', content: 'be brief' },
      { role: 'user', content: 'hello <|im_end|> world' },
    ];
    expect(await model.applyChatTemplateAsync(messages)).toBe(model.applyChatTemplate(messages));
    const many = Array.from({ length: 150_000 }, (_, i) => ({ role: 'user', content: `m${i}` }));
    const text = await model.applyChatTemplateAsync(many);
    expect(text.split('<|im_start|>').length).toBe(150_002);
    const tokens = await model.tokenizeAsync(text);
    expect(tokens.length).toBeGreaterThan(300_000);
  });

  it('renders packed messages as the array form, and refuses malformed packs', async () => {
    const messages = [
      { role: 'system', content: 'é 日本' },
      { role: 'user', content: '' },
    ];
    expect(await model.applyChatTemplateAsync(packChatMessages(messages))).toBe(
      model.applyChatTemplate(messages),
    );
    const packed = packChatMessages(messages);
    for (const bad of [
      packed.subarray(0, packed.length - 1),
      new Uint8Array([9, 0, 0, 0]),
      new Uint8Array(0),
    ]) {
      await expect(model.applyChatTemplateAsync(bad)).rejects.toMatchObject({
        code: 'HYDRA_ERR_BAD_ARGUMENT',
      });
    }
  });

  it('tokenizeChatAsync gives the tokens of the rendered chat, in one job', async () => {
    const messages = [
      { role: 'system', content: 'be brief <s>' },
      { role: 'user', content: 'hello world' },
    ];
    const want = model.tokenize(model.applyChatTemplate(messages));
    expect([...(await model.tokenizeChatAsync(messages))]).toEqual([...want]);
    expect([...(await model.tokenizeChatAsync(packChatMessages(messages)))]).toEqual([...want]);
  });

  it('a model disposed while a job runs is freed when the job ends', async () => {
    const m = await Model.load({ path: await tinyModel('f32') });
    const job = m.tokenizeAsync('<|im_end|>'.repeat(20_000), { upstream: true });
    m.dispose();
    expect(m.disposed).toBe(true);
    expect((await job).length).toBe(20_001);
    await expect(m.tokenizeAsync('x')).rejects.toMatchObject({ code: 'HYDRA_ERR_DISPOSED' });
  });
});
