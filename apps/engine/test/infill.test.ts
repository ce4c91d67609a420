// llama-server's /infill and OpenAI's suffix on /v1/completions: the prompt built with the model's
// FIM tokens as format_prompt_infill builds it; a model without them is refused naming the cause.
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Model } from '@hydra-engine/native-ggml';
import { writeSyntheticModel } from '@hydra-engine/native-ggml/synth';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { engineWith, postJson, tinyModel } from './helpers.js';

let model: Model;
let eng: Awaited<ReturnType<typeof engineWith>>;
let plain: Awaited<ReturnType<typeof engineWith>>;

beforeAll(async () => {
  const path = join(mkdtempSync(join(tmpdir(), 'hydra-fim-')), 'tiny-fim.gguf');
  await writeSyntheticModel({ arch: 'llama', shape: 'tiny', quant: 'q8_0', seed: 3, out: path, fim: true });
  model = await Model.load({ path, nGpuLayers: 0 });
  // n_batch 512 under a 4096 slot: the extra chunks fit (format_prompt_infill keeps n_ctx - n_batch - 2 n_predict).
  eng = await engineWith(['-m', path, '-np', '1', '-c', '4096', '-b', '512']);
  plain = await engineWith(['-m', await tinyModel(), '-np', '1', '-c', '1024']);
}, 60_000);
afterAll(async () => {
  await eng?.close();
  await plain?.close();
  model?.dispose();
});

const post = postJson;

const tok = (text: string) => [...model.tokenize(text, { addSpecial: false, parseSpecial: false })];
// No prompt cache: a prefix reused from the slot and the rest decoded in another batch split can
// flip a near-tie of the random weights' greedy pick.
const greedy = { temperature: 0, n_predict: 8, ignore_eos: true, return_tokens: true, cache_prompt: false };

describe('/infill', () => {
  it('the synthetic model with fim: true carries the FIM tokens', () => {
    const n = model.info.nVocab;
    expect([model.info.fimPre, model.info.fimSuf, model.info.fimMid]).toEqual([n - 5, n - 4, n - 3]);
    expect(model.tokenBytes(model.info.fimPre, true).toString()).toBe('<|fim_prefix|>');
    expect([model.info.fimRep, model.info.fimSep]).toEqual([-1, -1]);
  });

  it('answers what /completion answers for the prompt format_prompt_infill builds', async () => {
    const body = { input_prefix: 'def add(a, b):\n    ', input_suffix: '\n    return c\n', prompt: 'c =' };
    const r = await post(eng.url, '/infill', { ...body, ...greedy });
    expect(r.status).toBe(200);
    const { bos, fimPre, fimSuf, fimMid } = model.info;
    const prompt = [
      bos,
      fimPre,
      ...tok(body.input_prefix),
      ...model.tokenize(body.prompt, { addSpecial: false }),
      fimSuf,
      ...tok(body.input_suffix),
      fimMid,
    ];
    const byHand = await post(eng.url, '/completion', { prompt, ...greedy });
    expect(r.json.tokens).toEqual(byHand.json.tokens);
    expect(r.json.content).toBe(byHand.json.content);
    expect(r.json.tokens_evaluated).toBe(prompt.length);
    // Extra chunks go before BOS, each after llama-server's snippet separator (no FIM_SEP token).
    const extra = [{ filename: 'util.py', text: 'x = 1' }];
    const withExtra = await post(eng.url, '/infill', { ...body, input_extra: extra, ...greedy });
    const chunk = [...tok('\n\n--- snippet ---\n\n'), ...tok('x = 1')];
    const byHand2 = await post(eng.url, '/completion', { prompt: [...chunk, ...prompt], ...greedy });
    expect(withExtra.json.tokens_evaluated, 'extra length').toBe(chunk.length + prompt.length);
    expect(withExtra.json.tokens, 'extra tokens').toEqual(byHand2.json.tokens);
    expect(withExtra.json.tokens_evaluated).toBe(chunk.length + prompt.length);
  });

  it('cuts the prefix to 3/4 of a batch and the suffix to the rest, as llama-server', async () => {
    const prefix = 'alpha beta gamma '.repeat(300);
    const suffix = 'omega '.repeat(200);
    expect(tok(prefix).length).toBeGreaterThan(384);
    const r = await post(eng.url, '/infill', {
      input_prefix: prefix,
      input_suffix: suffix,
      prompt: 'x',
      ...greedy,
    });
    const p = model.tokenize('x', { addSpecial: false }).length;
    // BOS, FIM_PRE, the last 384 prefix tokens, the prompt, FIM_SUF, 128 - (2 + p) suffix tokens, FIM_MID.
    expect(r.json.tokens_evaluated).toBe(2 + 384 + p + 1 + (128 - (2 + p)) + 1);
  });

  it('streams in the native shape', async () => {
    const res = await fetch(`${eng.url}/infill`, {
      method: 'POST',
      body: JSON.stringify({
        input_prefix: 'a',
        input_suffix: 'b',
        temperature: 0,
        n_predict: 6,
        stream: true,
      }),
    });
    const events = (await res.text()).split('\n\n').filter((e) => e.startsWith('data: '));
    const last = JSON.parse(events.at(-1)!.slice(6));
    expect(last.stop).toBe(true);
    expect(last.tokens_predicted).toBe(6);
  });

  it('suffix on /v1/completions is the same fill-in-the-middle prompt', async () => {
    const r = await post(eng.url, '/v1/completions', {
      prompt: 'def f():',
      suffix: '\nreturn 1',
      ...greedy,
      max_tokens: 8,
    });
    const i = await post(eng.url, '/infill', {
      input_prefix: 'def f():',
      input_suffix: '\nreturn 1',
      ...greedy,
    });
    expect(r.status).toBe(200);
    expect(r.json.choices[0].text).toBe(i.json.content);
    expect(r.json.usage.prompt_tokens).toBe(i.json.tokens_evaluated);
    const e = await post(eng.url, '/v1/completions', { prompt: ['a', 'b'], suffix: 'x' });
    expect([e.status, e.json.error.keys]).toEqual([400, ['prompt']]);
  });

  it('a model without FIM tokens: 501 naming the missing tokens, as llama-server', async () => {
    for (const [path, body] of [
      ['/infill', { input_prefix: 'a', input_suffix: 'b' }],
      ['/v1/completions', { prompt: 'a', suffix: 'b' }],
    ] as const) {
      const r = await post(plain.url, path, body);
      expect([r.status, r.json.error.code]).toEqual([501, 'HYDRA_ERR_NOT_SUPPORTED']);
      expect(r.json.error.message).toBe(
        'Infill is not supported by this model: prefix token is missing. suffix token is missing. middle token is missing.',
      );
    }
  });

  it('bad input is a 400 naming the field; suffix elsewhere is refused by name', async () => {
    for (const [body, key] of [
      [{ input_suffix: 'b' }, 'input_prefix'],
      [{ input_prefix: 'a' }, 'input_suffix'],
      [{ input_prefix: 'a', input_suffix: 'b', input_extra: 'x' }, 'input_extra'],
      [{ input_prefix: 'a', input_suffix: 'b', input_extra: [{ filename: 'f' }] }, 'input_extra'],
      [{ input_prefix: 'a', input_suffix: 'b', prompt: 3 }, 'prompt'],
      [{ input_prefix: 'a', input_suffix: 'b', prompt: [1, 2] }, 'prompt'],
      [{ input_prefix: {}, input_suffix: 'b' }, 'input_prefix'],
    ] as const) {
      const r = await post(eng.url, '/infill', body);
      expect([r.status, r.json.error.keys], JSON.stringify(body)).toEqual([400, [key]]);
    }
    for (const [path, body] of [
      ['/v1/chat/completions', { messages: [{ role: 'user', content: 'x' }], suffix: 'y' }],
      ['/completion', { prompt: 'x', suffix: 'y' }],
    ] as const) {
      const r = await post(eng.url, path, body);
      expect([r.status, r.json.error.code, r.json.error.keys]).toEqual([
        400,
        'HYDRA_ERR_UNSUPPORTED_FIELD',
        ['suffix'],
      ]);
    }
  });
});
