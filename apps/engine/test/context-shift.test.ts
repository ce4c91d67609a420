import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { writeSyntheticModel } from '@hydra-engine/native-ggml/synth';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { complete } from './control-helpers.js';
import { engineWith } from './helpers.js';

// llama-server's --context-shift / --keep: a slot whose context fills while it generates drops half
// of what follows the kept tokens and goes on, instead of stopping at the context.

type Engine = Awaited<ReturnType<typeof engineWith>>;
const dir = mkdtempSync(join(tmpdir(), 'hydra-ctx-shift-'));
// llama.cpp rounds n_ctx up to a multiple of 256.
const N_CTX = 256;
const MAX = 300;
const body = (extra: Record<string, unknown> = {}) => ({
  prompt: 'Once upon a time there was a small dragon',
  max_tokens: MAX,
  temperature: 0,
  ignore_eos: true,
  // A prompt re-read from the slot's cache can round differently from one read whole.
  cache_prompt: false,
  ...extra,
});

let path: string;
beforeAll(async () => {
  path = join(dir, 'tiny.gguf');
  await writeSyntheticModel({ arch: 'llama', shape: 'tiny', quant: 'f32', seed: 7, out: path });
}, 60_000);

describe('context shift', () => {
  let off: Engine;
  let on: Engine;
  beforeAll(async () => {
    off = await engineWith(['-m', path, '-c', String(N_CTX)]);
    on = await engineWith(['-m', path, '-c', String(N_CTX), '--context-shift']);
  }, 60_000);
  afterAll(async () => {
    await off?.close();
    await on?.close();
  });

  it('ctx_shift: a generation goes on past the slot context, the same tokens up to it', async () => {
    const a = await complete(off.url, body());
    expect(a.status).toBe(200);
    const prompt = a.json.usage.prompt_tokens as number;
    // Off (the default), it stops where the context is full.
    expect([a.json.usage.completion_tokens, a.json.choices[0].finish_reason]).toEqual([
      N_CTX - prompt,
      'length',
    ]);
    const b = await complete(on.url, body());
    expect(b.status).toBe(200);
    expect([b.json.usage.completion_tokens, b.json.choices[0].finish_reason]).toEqual([MAX, 'length']);
    // The tokens before the first shift are those of the run that stopped there.
    expect((b.json.choices[0].text as string).startsWith(a.json.choices[0].text as string)).toBe(true);
    // A request that fits is not touched by the setting.
    const small = { max_tokens: 8 };
    expect((await complete(on.url, body(small))).json.choices[0].text).toBe(
      (await complete(off.url, body(small))).json.choices[0].text,
    );
  });

  it('n_keep: the tokens kept on a shift change what follows, per request as llama-server', async () => {
    const keep0 = await complete(on.url, body({ n_keep: 0 }));
    const keepAll = await complete(on.url, body({ n_keep: -1 }));
    expect([keep0.status, keepAll.status]).toEqual([200, 200]);
    expect(keepAll.json.usage.completion_tokens).toBe(MAX);
    const t0 = keep0.json.choices[0].text as string;
    const tAll = keepAll.json.choices[0].text as string;
    const before = (await complete(off.url, body())).json.choices[0].text as string;
    expect([t0.startsWith(before), tAll.startsWith(before)]).toEqual([true, true]);
    expect(tAll).not.toBe(t0);
    const bad = await complete(on.url, body({ n_keep: -2 }));
    expect([bad.status, bad.json.error.code]).toEqual([400, 'HYDRA_ERR_BAD_VALUE']);
  });
});

describe('context shift on a memory that cannot shift', () => {
  let eng: Engine;
  beforeAll(async () => {
    const q = join(dir, 'qwen35.gguf');
    await writeSyntheticModel({ arch: 'qwen35', shape: 'tiny', quant: 'f32', seed: 7, out: q });
    eng = await engineWith(['-m', q, '-c', String(N_CTX), '--context-shift']);
  }, 60_000);
  afterAll(async () => {
    await eng?.close();
  });

  it('refuses a generation that would need a shift, by the key; one that fits runs', async () => {
    const r = await complete(eng.url, body());
    expect([r.status, r.json.error?.code]).toEqual([400, 'HYDRA_ERR_UNSUPPORTED_FIELD']);
    const ok = await complete(eng.url, body({ max_tokens: 8 }));
    expect([ok.status, ok.json.usage.completion_tokens]).toEqual([200, 8]);
  });
});
