// n > 1 (choices sharing their prompt's KV), prompt arrays and echo on the completion routes.

import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { writeSyntheticModel } from '@hydra-engine/native-ggml/synth';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { engineWith, postJson, tinyModel } from './helpers.js';

let eng: Awaited<ReturnType<typeof engineWith>>;
let client: OpenAI;

beforeAll(async () => {
  eng = await engineWith(['-m', await tinyModel(), '-np', '3', '-c', '3072']);
  client = new OpenAI({ baseURL: `${eng.url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 30_000 });
}, 60_000);
afterAll(async () => {
  await eng?.close();
});

const post = postJson;

async function promptTokensEvaluated(url: string): Promise<number> {
  const text = await (await fetch(`${url}/metrics`)).text();
  return Number(/^hydra_prompt_tokens_total (\d+)/m.exec(text)![1]);
}

async function tokenCount(text: string): Promise<number> {
  return (await post(eng.url, '/tokenize', { content: text, add_special: true })).json.tokens.length;
}

const greedy = { temperature: 0, max_tokens: 12, ignore_eos: true };

describe('n > 1', () => {
  it('greedy choices are equal, indexed, and the prompt is prefilled once', async () => {
    const prompt = 'The fox jumped over the lazy dog and then it ran far away into the woods';
    const single = await post(eng.url, '/v1/completions', { prompt, ...greedy, cache_prompt: false });
    const before = await promptTokensEvaluated(eng.url);
    const r = await post(eng.url, '/v1/completions', { prompt, ...greedy, n: 3, cache_prompt: false });
    const evaluated = (await promptTokensEvaluated(eng.url)) - before;
    expect(r.status).toBe(200);
    expect(r.json.choices.map((c: any) => c.index)).toEqual([0, 1, 2]);
    for (const c of r.json.choices) expect(c.text).toBe(single.json.choices[0].text);
    const nPrompt = await tokenCount(prompt);
    // OpenAI's usage: the prompt once, every choice's tokens.
    expect(r.json.usage).toMatchObject({
      prompt_tokens: nPrompt,
      completion_tokens: 36,
      total_tokens: nPrompt + 36,
    });
    // The leader reads the prompt; each other choice copies its KV and reads the last token only.
    expect(evaluated).toBe(nPrompt + 2);
  });

  it('seeded sampling: the choices differ, and the same seed gives the same choices again', async () => {
    const body = { prompt: 'Once upon a time', max_tokens: 16, temperature: 1.5, top_k: 0, seed: 11, n: 3 };
    const a = await post(eng.url, '/v1/completions', body);
    const b = await post(eng.url, '/v1/completions', body);
    const texts = a.json.choices.map((c: any) => c.text);
    expect(new Set(texts).size).toBeGreaterThan(1);
    expect(b.json.choices.map((c: any) => c.text)).toEqual(texts);
    // Choice 0 is the request with the seed itself.
    const one = await post(eng.url, '/v1/completions', { ...body, n: 1 });
    expect(one.json.choices[0].text).toBe(texts[0]);
  });

  it('chat through the openai client, whole and streamed', async () => {
    const messages = [{ role: 'user' as const, content: 'Say something nice.' }];
    const whole = await client.chat.completions.create({ model: 'x', messages, n: 2, ...greedy });
    expect(whole.choices.map((c) => c.index)).toEqual([0, 1]);
    expect(whole.choices[1]!.message.content).toBe(whole.choices[0]!.message.content);
    expect(whole.usage!.completion_tokens).toBe(24);
    const stream = await client.chat.completions.create({
      model: 'x',
      messages,
      n: 2,
      ...greedy,
      stream: true,
      stream_options: { include_usage: true },
    });
    const text = ['', ''];
    const finish: (string | null)[] = [null, null];
    const roles = [0, 0];
    let usage: OpenAI.CompletionUsage | undefined;
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices) {
        text[c.index] += c.delta.content ?? '';
        if (c.delta.role) roles[c.index]! += 1;
        if (c.finish_reason) finish[c.index] = c.finish_reason;
      }
    }
    expect(text).toEqual([whole.choices[0]!.message.content, whole.choices[0]!.message.content]);
    expect(roles).toEqual([1, 1]);
    expect(finish).toEqual(['length', 'length']);
    expect(usage).toMatchObject({ prompt_tokens: whole.usage!.prompt_tokens, completion_tokens: 24 });
  });

  it('more choices than slots is a 400 naming n; n below 1 too; best_of stays refused', async () => {
    for (const n of [4, 0, 1.5, 'two']) {
      const r = await post(eng.url, '/v1/completions', { prompt: 'a', n });
      expect([r.status, r.json.error.code, r.json.error.keys]).toEqual([400, 'HYDRA_ERR_BAD_VALUE', ['n']]);
    }
    const b = await post(eng.url, '/v1/completions', { prompt: 'a', n: 2, best_of: 3 });
    expect([b.status, b.json.error.code, b.json.error.keys]).toEqual([
      400,
      'HYDRA_ERR_UNSUPPORTED_FIELD',
      ['best_of'],
    ]);
    const c = await post(eng.url, '/v1/completions', { prompt: 'a', n: 2, n_cmpl: 3 });
    expect([c.status, c.json.error.keys]).toEqual([400, ['n']]);
  });

  it('/completion: n choices are an array of llama-server objects, streamed with their index', async () => {
    const body = { prompt: 'The red fox', n_predict: 6, temperature: 0, n: 2 };
    const r = await post(eng.url, '/completion', body);
    expect(r.json.map((o: any) => o.index)).toEqual([0, 1]);
    expect(r.json[1].content).toBe(r.json[0].content);
    const res = await fetch(`${eng.url}/completion`, {
      method: 'POST',
      body: JSON.stringify({ ...body, stream: true }),
    });
    const events = (await res.text())
      .split('\n\n')
      .filter((e) => e.startsWith('data: '))
      .map((e) => JSON.parse(e.slice(6)));
    const text = ['', ''];
    for (const e of events) text[e.index] += e.content;
    expect(text).toEqual([r.json[0].content, r.json[0].content]);
    expect(events.filter((e) => e.stop).map((e) => e.index)).toEqual([0, 1]);
  });

  it('choices wait for slots taken by another request', async () => {
    const long = post(eng.url, '/v1/completions', {
      prompt: 'Busy busy',
      temperature: 0,
      max_tokens: 200,
      ignore_eos: true,
    });
    const r = await post(eng.url, '/v1/completions', { prompt: 'Wait for me', ...greedy, n: 3 });
    expect(r.status).toBe(200);
    expect(r.json.choices).toHaveLength(3);
    expect((await long).status).toBe(200);
  });
});

describe('prompt arrays and echo', () => {
  it('one choice per prompt (x n), ordered by prompt then choice, each as the prompt alone', async () => {
    const prompts = ['The red fox', 'A blue whale'];
    const alone = await Promise.all(
      prompts.map(
        async (p) => (await post(eng.url, '/v1/completions', { prompt: p, ...greedy })).json.choices[0].text,
      ),
    );
    const r = await client.completions.create({ model: 'x', prompt: prompts, n: 2, ...greedy });
    expect(r.choices.map((c) => [c.index, c.text])).toEqual([
      [0, alone[0]],
      [1, alone[0]],
      [2, alone[1]],
      [3, alone[1]],
    ]);
    const nPrompt = (await tokenCount(prompts[0]!)) + (await tokenCount(prompts[1]!));
    expect(r.usage).toMatchObject({ prompt_tokens: nPrompt, completion_tokens: 48 });
  });

  it('token arrays, arrays of them, and strings mixed with ids read as llama-server does', async () => {
    const ids: number[] = (await post(eng.url, '/tokenize', { content: 'The red fox', add_special: true }))
      .json.tokens;
    const tail: number[] = (await post(eng.url, '/tokenize', { content: ' jumps', add_special: false })).json
      .tokens;
    const text = (p: unknown) => post(eng.url, '/v1/completions', { prompt: p, ...greedy });
    // A text then ids is the text's tokens (with BOS) then the ids; several prompts, one each.
    const base = (await text([...ids, ...tail])).json.choices[0].text;
    expect((await text(['The red fox', ...tail])).json.choices[0].text).toBe(base);
    const many = await text([[...ids, ...tail], 'The red fox', ['The red fox', ...tail]]);
    const alone = (await text('The red fox')).json.choices[0].text;
    expect(many.json.choices.map((c: any) => c.text)).toEqual([base, alone, base]);
    expect(alone).not.toBe(base);
    for (const bad of [[], [[]], [{}], [-1], [true]]) {
      const r = await text(bad);
      expect([r.status, r.json.error.keys]).toEqual([400, ['prompt']]);
    }
    const multimodal = await text([{ prompt_string: 'x', multimodal_data: ['AAAA'] }]);
    expect([multimodal.status, multimodal.json.error.code]).toEqual([400, 'HYDRA_ERR_UNSUPPORTED_FIELD']);
  });

  it('/completion: several prompts answer an array of llama-server objects with their index', async () => {
    const r = await post(eng.url, '/completion', {
      prompt: ['The red fox', 'A blue whale'],
      n_predict: 6,
      temperature: 0,
    });
    expect(r.status).toBe(200);
    expect(r.json.map((o: any) => [o.index, o.prompt, o.tokens_predicted])).toEqual([
      [0, 'The red fox', 6],
      [1, 'A blue whale', 6],
    ]);
    const one = await post(eng.url, '/completion', { prompt: 'The red fox', n_predict: 6, temperature: 0 });
    expect(one.json.content).toBe(r.json[0].content);
  });

  it('echo puts the prompt before each choice, streamed first', async () => {
    const prompt = 'The red fox';
    const plain = (await post(eng.url, '/v1/completions', { prompt, ...greedy })).json.choices[0].text;
    const r = await client.completions.create({ model: 'x', prompt, echo: true, n: 2, ...greedy });
    expect(r.choices.map((c) => c.text)).toEqual([prompt + plain, prompt + plain]);
    const stream = await client.completions.create({
      model: 'x',
      prompt,
      echo: true,
      ...greedy,
      stream: true,
    });
    const pieces: string[] = [];
    for await (const chunk of stream) pieces.push(chunk.choices[0]?.text ?? '');
    expect(pieces[0]).toBe(prompt);
    expect(pieces.join('')).toBe(prompt + plain);
    // Two choices streamed: each starts with the prompt, and each adds up to the whole answer.
    const two = await client.completions.create({
      model: 'x',
      prompt,
      echo: true,
      n: 2,
      ...greedy,
      stream: true,
    });
    const byIndex: string[][] = [[], []];
    const finish: (string | null)[] = [null, null];
    for await (const chunk of two)
      for (const c of chunk.choices) {
        byIndex[c.index]!.push(c.text);
        if (c.finish_reason) finish[c.index] = c.finish_reason;
      }
    expect(byIndex.map((p) => p[0])).toEqual([prompt, prompt]);
    expect(byIndex.map((p) => p.join(''))).toEqual([prompt + plain, prompt + plain]);
    expect(finish).toEqual(['length', 'length']);
    for (const path of ['/v1/chat/completions', '/completion']) {
      const body = path.includes('chat')
        ? { messages: [{ role: 'user', content: 'x' }], echo: true }
        : { prompt, echo: true };
      const e = await post(eng.url, path, body);
      expect([e.status, e.json.error.code, e.json.error.keys]).toEqual([
        400,
        'HYDRA_ERR_UNSUPPORTED_FIELD',
        ['echo'],
      ]);
    }
  });
});

describe('n > 1 on a hybrid (recurrent) memory', () => {
  it('each choice prefills alone and greedy choices still agree', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'hydra-choices-'));
    const out = join(dir, 'qwen35.gguf');
    await writeSyntheticModel({ arch: 'qwen35', shape: 'tiny', quant: 'q8_0', seed: 3, out });
    const hy = await engineWith(['-m', out, '-np', '2', '-c', '1024']);
    try {
      const prompt = 'The fox jumped over the lazy dog';
      const single = await post(hy.url, '/v1/completions', { prompt, ...greedy });
      const before = await promptTokensEvaluated(hy.url);
      const r = await post(hy.url, '/v1/completions', { prompt, ...greedy, n: 2, cache_prompt: false });
      const evaluated = (await promptTokensEvaluated(hy.url)) - before;
      expect(r.json.choices.map((c: any) => c.text)).toEqual([
        single.json.choices[0].text,
        single.json.choices[0].text,
      ]);
      expect(evaluated).toBe(2 * r.json.usage.prompt_tokens);
    } finally {
      await hy.close();
    }
  });
});
