import { Model } from '@hydra-engine/native-ggml';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { engineWith, tinyModel, waitFor } from './helpers.js';

let model: string;
let eng: Awaited<ReturnType<typeof engineWith>>;
let client: OpenAI;

beforeAll(async () => {
  model = await tinyModel();
  eng = await engineWith(['-m', model, '-np', '2', '-c', '2048']);
  client = new OpenAI({ baseURL: `${eng.url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 30_000 });
}, 60_000);
afterAll(async () => {
  await eng?.close();
});

async function nativeGreedy(prompt: string, n: number): Promise<{ text: string; tokens: number[] }> {
  const m = await Model.load({ path: model });
  const ctx = await m.createContext({ nCtx: 512, nSeqMax: 1, nThreads: 1 });
  const s = m.createSampler({ temp: 0 });
  const toks = m.tokenize(prompt);
  let r = await ctx.decode([{ seq: 0, pos: 0, tokens: toks, sampler: s }]);
  const out: number[] = [];
  let pos = toks.length;
  while (out.length < n && !m.isEndOfGeneration(r.tokens[0]!)) {
    out.push(r.tokens[0]!);
    if (out.length === n) break;
    r = await ctx.decode([{ seq: 0, pos: pos++, tokens: [out.at(-1)!], sampler: s }]);
  }
  const text = new TextDecoder().decode(Buffer.concat(out.map((t) => m.tokenBytes(t))));
  s.dispose();
  await ctx.dispose();
  m.dispose();
  return { text, tokens: out };
}

describe('OpenAI client against a running engine', () => {
  it('lists the model', async () => {
    const list = await client.models.list();
    expect(list.data.map((d) => d.id)).toEqual(['tiny.gguf']);
  });

  it('chat completion with usage and finish_reason, epoch header', async () => {
    const { data, response } = await client.chat.completions
      .create({
        model: 'tiny',
        messages: [{ role: 'user', content: 'hello world' }],
        max_tokens: 12,
        temperature: 0,
      })
      .withResponse();
    expect(response.headers.get('x-hydra-config-epoch')).toBe('1');
    expect(data.object).toBe('chat.completion');
    expect(data.choices[0]!.message.role).toBe('assistant');
    expect(['length', 'stop']).toContain(data.choices[0]!.finish_reason);
    expect(data.usage!.completion_tokens).toBeLessThanOrEqual(12);
    expect(data.usage!.prompt_tokens).toBeGreaterThan(3);
    expect(data.usage!.total_tokens).toBe(data.usage!.prompt_tokens + data.usage!.completion_tokens);
  });

  it('streams a chat completion whose text equals the non-streamed one', async () => {
    const req = {
      model: 'tiny',
      messages: [{ role: 'user' as const, content: 'the world' }],
      max_tokens: 16,
      temperature: 0,
    };
    const whole = await client.chat.completions.create(req);
    const stream = await client.chat.completions.create({
      ...req,
      stream: true,
      stream_options: { include_usage: true },
    });
    let text = '';
    let finish: string | null = null;
    let usage: { completion_tokens: number } | undefined;
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices) {
        text += c.delta.content ?? '';
        finish = c.finish_reason ?? finish;
      }
    }
    expect(text).toBe(whole.choices[0]!.message.content);
    expect(finish).toBe(whole.choices[0]!.finish_reason);
    expect(usage!.completion_tokens).toBe(whole.usage!.completion_tokens);
  });

  it('greedy output through the API equals native greedy decoding', async () => {
    const prompt = 'Hello world, this is a test';
    const expected = await nativeGreedy(prompt, 24);
    const got = await client.completions.create({ model: 'tiny', prompt, max_tokens: 24, temperature: 0 });
    expect(got.choices[0]!.text).toBe(expected.text);
    expect(got.usage!.completion_tokens).toBe(expected.tokens.length);
  });

  it('streams completions; stop strings end the text before the stop', async () => {
    const prompt = 'Hello world, this is a test';
    const full = await client.completions.create({ model: 'tiny', prompt, max_tokens: 24, temperature: 0 });
    const text = full.choices[0]!.text;
    const stop = text.slice(6, 9);
    const stream = await client.completions.create({
      model: 'tiny',
      prompt,
      max_tokens: 24,
      temperature: 0,
      stop: [stop],
      stream: true,
    });
    let got = '';
    let finish: string | null = null;
    for await (const chunk of stream) {
      got += chunk.choices[0]?.text ?? '';
      finish = chunk.choices[0]?.finish_reason ?? finish;
    }
    expect(got).toBe(text.slice(0, text.indexOf(stop)));
    expect(finish).toBe('stop');
  });

  it('seeded sampling is reproducible and T1 settings apply per request', async () => {
    const req = {
      model: 'tiny',
      prompt: 'once upon',
      max_tokens: 16,
      temperature: 1.5,
      top_k: 50,
      top_p: 0.9,
      min_p: 0.01,
      seed: 7,
    };
    const a = await client.completions.create(req);
    const b = await client.completions.create(req);
    expect(a.choices[0]!.text).toBe(b.choices[0]!.text);
    const c = await client.completions.create({ ...req, repeat_penalty: 1.3 } as typeof req);
    expect(c.usage!.completion_tokens).toBeGreaterThan(0);
  });

  it('many concurrent streams on two slots all complete, none lost', async () => {
    const n = 12;
    const results = await Promise.all(
      Array.from({ length: n }, async (_, i) => {
        const stream = await client.completions.create({
          model: 'tiny',
          prompt: `request number ${i}`,
          max_tokens: 10 + i,
          temperature: 0,
          stream: true,
          stream_options: { include_usage: true },
          ignore_eos: true,
        } as never);
        let tokens = 0;
        let finish: string | null = null;
        for await (const chunk of stream as unknown as AsyncIterable<{
          usage?: { completion_tokens: number };
          choices: { finish_reason: string | null }[];
        }>) {
          if (chunk.usage) tokens = chunk.usage.completion_tokens;
          finish = chunk.choices[0]?.finish_reason ?? finish;
        }
        return { tokens, finish };
      }),
    );
    expect(results).toEqual(Array.from({ length: n }, (_, i) => ({ tokens: 10 + i, finish: 'length' })));
    // Continuous batching: fewer native steps than tokens generated.
    expect(eng.engine.slots.busy).toBe(0);
  });

  it('a client disconnect frees the slot', async () => {
    const ac = new AbortController();
    const res = await fetch(`${eng.url}/v1/completions`, {
      method: 'POST',
      body: JSON.stringify({ prompt: 'endless', max_tokens: 100000, ignore_eos: true, stream: true }),
      signal: ac.signal,
    });
    const reader = res.body!.getReader();
    await reader.read();
    expect(eng.engine.slots.busy).toBe(1);
    const before = eng.engine.counters.requests.cancelled;
    ac.abort();
    await waitFor(async () => eng.engine.slots.busy === 0, 5000);
    expect(eng.engine.counters.requests.cancelled).toBe(before + 1);
    const after = await client.completions.create({
      model: 'tiny',
      prompt: 'x',
      max_tokens: 2,
      temperature: 0,
    });
    expect(after.usage!.completion_tokens).toBe(2);
  });

  it('serves /metrics in Prometheus text', async () => {
    const text = await (await fetch(`${eng.url}/metrics`)).text();
    for (const name of [
      'hydra_tokens_per_second',
      'hydra_generated_tokens_total',
      'hydra_prompt_tokens_total',
      'hydra_queue_depth',
      'hydra_slots_busy',
      'hydra_model_load_seconds',
      'hydra_config_epoch',
    ]) {
      expect(text).toMatch(new RegExp(`^${name}(\\{[^}]*\\})? [0-9.e+-]+$`, 'm'));
    }
    expect(Number(/^hydra_generated_tokens_total (\d+)/m.exec(text)![1])).toBeGreaterThan(100);
    const steps = Number(/^hydra_decode_steps_total (\d+)/m.exec(text)![1]);
    const gen = Number(/^hydra_generated_tokens_total (\d+)/m.exec(text)![1]);
    expect(steps).toBeLessThan(gen);
  });
});
