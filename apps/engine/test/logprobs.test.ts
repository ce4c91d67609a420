// Token probabilities end to end (issue 21): OpenAI chat's logprobs/top_logprobs and completions'
// logprobs through the official `openai` client, llama-server's n_probs / post_sampling_probs on
// /completion, streamed and not, stop strings, CONFIGURE sampling.n_probs, bad values. Values are
// checked against a softmax of the logits the same model gives in this process.
import { HydraClient } from '@hydra-engine/hydra-rpc';
import { initBackend, Model } from '@hydra-engine/native-ggml';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freePort } from './control-helpers.js';
import { engineWith, postJson, tinyModel, tinyToolsModel } from './helpers.js';

let eng: Awaited<ReturnType<typeof engineWith>>;
let client: OpenAI;
let hydra: HydraClient;
let modelPath: string;

beforeAll(async () => {
  modelPath = await tinyModel();
  const port = await freePort();
  eng = await engineWith(['-m', modelPath, '-np', '2', '-c', '2048', '--rpc-port', String(port)]);
  client = new OpenAI({ baseURL: `${eng.url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 30_000 });
  hydra = await HydraClient.connect({ port, encoding: 'json' });
}, 60_000);
afterAll(async () => {
  hydra?.close();
  await eng?.close();
});

const post = (path: string, body: unknown) => postJson(eng.url, path, body);

/** The `data:` objects of a server-sent event stream. */
async function events(path: string, body: Record<string, unknown>): Promise<any[]> {
  const res = await fetch(`${eng.url}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ ...body, stream: true }),
  });
  const text = await res.text();
  return text
    .split('\n')
    .filter((l) => l.startsWith('data: ') && l !== 'data: [DONE]')
    .map((l) => JSON.parse(l.slice(6)));
}

const utf8 = (entries: { bytes: number[] }[]) =>
  Buffer.concat(entries.map((e) => Buffer.from(e.bytes))).toString('utf8');
const messages = [{ role: 'user' as const, content: 'Tell me a story about a fox' }];
// Each request reads its prompt whole: a prompt read from a slot's cache gives logits that differ
// in the last bits, and these tests compare streamed answers with whole ones exactly.
const greedy = { temperature: 0, max_tokens: 8, cache_prompt: false };

describe('chat logprobs through the openai client', () => {
  it('greedy: the sampled token is the most likely, the alternatives in order, probabilities sum <= 1', async () => {
    const r = await client.chat.completions.create({
      model: 'local',
      messages,
      ...greedy,
      logprobs: true,
      top_logprobs: 5,
    });
    const choice = r.choices[0]!;
    const content = choice.logprobs!.content!;
    expect(content.length).toBe(r.usage!.completion_tokens);
    // The pieces' bytes make up the reply exactly (a character split across tokens included).
    expect(utf8(content as any)).toBe(choice.message.content);
    for (const t of content) {
      expect(t.top_logprobs.length).toBe(5);
      expect(t.logprob).toBeLessThanOrEqual(0);
      expect(t.logprob).toBe(t.top_logprobs[0]!.logprob);
      expect(t.token).toBe(t.top_logprobs[0]!.token);
      for (let k = 1; k < 5; k++)
        expect(t.top_logprobs[k]!.logprob).toBeLessThanOrEqual(t.top_logprobs[k - 1]!.logprob);
      const sum = t.top_logprobs.reduce((a, c) => a + Math.exp(c.logprob), 0);
      expect(sum).toBeLessThanOrEqual(1 + 1e-6);
      for (const c of t.top_logprobs) expect(Array.isArray(c.bytes)).toBe(true);
    }
  });

  it('logprobs: true alone gives the sampled tokens with no alternatives (OpenAI top_logprobs 0)', async () => {
    const r = await client.chat.completions.create({ model: 'local', messages, ...greedy, logprobs: true });
    const content = r.choices[0]!.logprobs!.content!;
    expect(content.length).toBe(r.usage!.completion_tokens);
    for (const t of content) expect(t.top_logprobs).toEqual([]);
    const none = await client.chat.completions.create({ model: 'local', messages, ...greedy });
    expect(none.choices[0]!.logprobs).toBeNull();
  });

  it('streamed: the chunks carry the same entries as the whole answer', async () => {
    const whole = await client.chat.completions.create({
      model: 'local',
      messages,
      ...greedy,
      logprobs: true,
      top_logprobs: 3,
    });
    const stream = await client.chat.completions.create({
      model: 'local',
      messages,
      ...greedy,
      logprobs: true,
      top_logprobs: 3,
      stream: true,
    });
    const got: unknown[] = [];
    let text = '';
    for await (const chunk of stream) {
      const c = chunk.choices[0];
      if (!c) continue;
      text += c.delta.content ?? '';
      got.push(...(c.logprobs?.content ?? []));
    }
    expect(text).toBe(whole.choices[0]!.message.content);
    expect(got).toEqual(whole.choices[0]!.logprobs!.content);
  });

  it('values equal a softmax over the logits the same model gives (greedy)', async () => {
    const prompt = Array.from({ length: 12 }, (_, i) => 10 + i * 7);
    const r = await post('/v1/completions', { prompt, ...greedy, logprobs: 5 });
    expect(r.status).toBe(200);
    const content = r.json.choices[0].logprobs.content;
    initBackend();
    const model = await Model.load({ path: modelPath });
    const ctx = await model.createContext({ nCtx: 256, nBatch: 64 });
    try {
      let pos = 0;
      let feed = Int32Array.from(prompt);
      for (const entry of content) {
        const out = await ctx.decode([{ seq: 0, pos, tokens: feed, logits: true }]);
        pos += feed.length;
        const logits = out.logits[0]!;
        let max = -Infinity;
        for (const l of logits) max = Math.max(max, l);
        let sum = 0;
        for (const l of logits) sum += Math.exp(l - max);
        const logp = (t: number) => logits[t]! - max - Math.log(sum);
        const order = Array.from(logits.keys()).sort((a, b) => logits[b]! - logits[a]!);
        // This context's threads and batch differ from the engine's: logits agree to ~1e-4, so two
        // random-weight tokens that close may swap places; each value must match its own token's.
        const near = (a: number, b: number) => expect(Math.abs(a - b)).toBeLessThan(2e-3);
        near(entry.logprob, logp(entry.id));
        near(logp(entry.id), logp(order[0]!));
        for (const c of entry.top_logprobs) near(c.logprob, logp(c.id));
        // The listed five are the five most likely, but for such swaps at the fifth place.
        expect(logp(entry.top_logprobs[4].id)).toBeGreaterThan(logp(order[5]!) - 2e-3);
        const listed = new Set(entry.top_logprobs.map((c: any) => c.id));
        for (const t of order.slice(0, 5)) if (!listed.has(t)) near(logp(t), logp(order[4]!));
        feed = Int32Array.of(entry.id);
      }
    } finally {
      await ctx.dispose();
      model.dispose();
    }
  });
});

describe('completions logprobs (OpenAI shape, with llama-server content)', () => {
  it('tokens, token_logprobs, top_logprobs and text_offset, greedy maximum first', async () => {
    const r = await client.completions.create({
      model: 'local',
      prompt: 'Once upon a time',
      ...greedy,
      logprobs: 3,
    });
    const c = r.choices[0]!;
    const lp = c.logprobs!;
    const n = r.usage!.completion_tokens;
    expect(lp.tokens!.length).toBe(n);
    expect(lp.token_logprobs!.length).toBe(n);
    expect(lp.top_logprobs!.length).toBe(n);
    expect(lp.text_offset![0]).toBe(0);
    for (let i = 0; i < n; i++) {
      const top = Object.values(lp.top_logprobs![i]!);
      expect(top.length).toBeGreaterThan(0);
      expect(top.length).toBeLessThanOrEqual(3);
      expect(lp.token_logprobs![i]).toBe(Math.max(...top));
      if (i > 0) expect(lp.text_offset![i]).toBeGreaterThanOrEqual(lp.text_offset![i - 1]!);
    }
    expect(utf8((lp as any).content)).toBe(c.text);
  });

  it('streamed: the chunks carry the same tokens as the whole answer', async () => {
    const body = { prompt: 'Once upon a time', ...greedy, logprobs: 2 };
    const whole = (await post('/v1/completions', body)).json.choices[0].logprobs;
    const chunks = (await events('/v1/completions', body)).filter((e) => e.choices?.[0]?.logprobs);
    const joined = { tokens: [] as string[], token_logprobs: [] as number[], text_offset: [] as number[] };
    for (const e of chunks) {
      const lp = e.choices[0].logprobs;
      joined.tokens.push(...lp.tokens);
      joined.token_logprobs.push(...lp.token_logprobs);
      joined.text_offset.push(...lp.text_offset);
    }
    expect(joined).toEqual({
      tokens: whole.tokens,
      token_logprobs: whole.token_logprobs,
      text_offset: whole.text_offset,
    });
  });

  it('a stop string: only the tokens whose text is in the reply are reported, streamed or not', async () => {
    const base = {
      prompt: 'Once upon a time',
      temperature: 0,
      max_tokens: 10,
      logprobs: 1,
      cache_prompt: false,
    };
    const free = (await post('/v1/completions', base)).json.choices[0];
    const pieces: string[] = free.logprobs.tokens;
    // A stop string that starts inside the fourth token's text.
    const offset = free.logprobs.text_offset[3] as number;
    const stop = free.text.slice(offset + (pieces[3]!.length > 1 ? 1 : 0), offset + pieces[3]!.length + 2);
    expect(stop.length).toBeGreaterThan(0);
    const cut = (await post('/v1/completions', { ...base, stop })).json.choices[0];
    expect(cut.finish_reason).toBe('stop');
    const at = free.text.indexOf(stop);
    expect(cut.text).toBe(free.text.slice(0, at));
    const kept = (free.logprobs.text_offset as number[]).filter((o) => o < at).length;
    expect(cut.logprobs.tokens).toEqual(pieces.slice(0, kept));
    const streamed = (await events('/v1/completions', { ...base, stop }))
      .filter((e) => e.choices?.[0]?.logprobs)
      .flatMap((e) => e.choices[0].logprobs.tokens);
    expect(streamed).toEqual(pieces.slice(0, kept));
  });
});

describe("llama-server's n_probs and post_sampling_probs on /completion", () => {
  it('completion_probabilities before sampling: logprob and top_logprobs', async () => {
    const r = await post('/completion', {
      prompt: 'Once upon a time',
      n_predict: 4,
      temperature: 0,
      n_probs: 3,
    });
    expect(r.status).toBe(200);
    const probs = r.json.completion_probabilities;
    expect(probs.length).toBe(4);
    for (const p of probs) {
      expect(Object.keys(p).sort()).toEqual(['bytes', 'id', 'logprob', 'token', 'top_logprobs']);
      expect(p.top_logprobs.length).toBe(3);
      expect(p.id).toBe(p.top_logprobs[0].id);
      expect(Object.keys(p.top_logprobs[0]).sort()).toEqual(['bytes', 'id', 'logprob', 'token']);
    }
    expect(utf8(probs)).toBe(r.json.content);
  });

  it('post_sampling_probs: prob and top_probs; greedy leaves the chosen token alone with 1', async () => {
    const r = await post('/completion', {
      prompt: 'Once upon a time',
      n_predict: 3,
      temperature: 0,
      n_probs: 3,
      post_sampling_probs: true,
    });
    for (const p of r.json.completion_probabilities) {
      expect(p.prob).toBe(1);
      expect(p.top_probs).toEqual([{ id: p.id, token: p.token, bytes: p.bytes, prob: 1 }]);
    }
    // Sampling with top_k 2: the two candidates' probabilities, summing to 1.
    const warm = await post('/completion', {
      prompt: 'Once upon a time',
      n_predict: 3,
      temperature: 1,
      top_k: 2,
      top_p: 1,
      min_p: 0,
      seed: 4,
      n_probs: 5,
      post_sampling_probs: true,
    });
    for (const p of warm.json.completion_probabilities) {
      expect(p.top_probs.length).toBe(2);
      expect(p.top_probs[0].prob + p.top_probs[1].prob).toBeCloseTo(1, 5);
      expect(p.top_probs.map((c: any) => c.id)).toContain(p.id);
    }
  });

  it('streamed: each chunk carries its tokens; the final object none', async () => {
    const body = {
      prompt: 'Once upon a time',
      n_predict: 4,
      temperature: 0,
      n_probs: 2,
      cache_prompt: false,
    };
    const whole = (await post('/completion', body)).json.completion_probabilities;
    const chunks = await events('/completion', body);
    const streamed = chunks.flatMap((c) => c.completion_probabilities ?? []);
    expect(streamed).toEqual(whole);
    expect(chunks.at(-1).stop).toBe(true);
    expect(chunks.at(-1).completion_probabilities).toBeUndefined();
  });
});

describe('bad values and the configured default', () => {
  it.each([
    [
      '/v1/chat/completions',
      { messages, logprobs: true, top_logprobs: 21 },
      'HYDRA_ERR_BAD_VALUE',
      'top_logprobs',
    ],
    [
      '/v1/chat/completions',
      { messages, logprobs: true, top_logprobs: -1 },
      'HYDRA_ERR_BAD_VALUE',
      'top_logprobs',
    ],
    ['/v1/chat/completions', { messages, top_logprobs: 2 }, 'HYDRA_ERR_BAD_VALUE', 'top_logprobs'],
    ['/v1/chat/completions', { messages, logprobs: 'yes' }, 'HYDRA_ERR_BAD_VALUE', 'logprobs'],
    ['/v1/completions', { prompt: 'x', logprobs: -1 }, 'HYDRA_ERR_BAD_VALUE', 'logprobs'],
    ['/v1/completions', { prompt: 'x', logprobs: 21 }, 'HYDRA_ERR_BAD_VALUE', 'logprobs'],
    ['/v1/completions', { prompt: 'x', logprobs: 2, echo: true }, 'HYDRA_ERR_UNSUPPORTED_FIELD', 'logprobs'],
    ['/completion', { prompt: 'x', n_probs: -1 }, 'HYDRA_ERR_BAD_VALUE', 'n_probs'],
    ['/v1/responses', { input: 'x', n_probs: 2 }, 'HYDRA_ERR_UNSUPPORTED_FIELD', 'n_probs'],
    [
      '/completion',
      { prompt: 'x', n_probs: 2, post_sampling_probs: 1 },
      'HYDRA_ERR_BAD_VALUE',
      'post_sampling_probs',
    ],
  ] as const)('%s %j: 400 %s naming %s', async (path, body, code, key) => {
    const r = await post(path, { ...body, max_tokens: 2 });
    expect([r.status, r.json.error.code, r.json.error.keys]).toEqual([400, code, [key]]);
  });

  it('CONFIGURE sampling.n_probs is the default of requests that do not say', async () => {
    const body = { prompt: 'Once upon a time', n_predict: 3, temperature: 0 };
    expect((await post('/completion', body)).json.completion_probabilities).toBeUndefined();
    await hydra.configure({ 'sampling.n_probs': 2 });
    try {
      const r = await post('/completion', body);
      expect(r.json.completion_probabilities.length).toBe(3);
      for (const p of r.json.completion_probabilities) expect(p.top_logprobs.length).toBe(2);
      const chat = await post('/v1/chat/completions', { messages, ...greedy });
      expect(chat.json.choices[0].logprobs.content[0].top_logprobs.length).toBe(2);
      // A request's own answer wins: none asked, none given.
      const off = await post('/v1/chat/completions', { messages, ...greedy, logprobs: false });
      expect(off.json.choices[0].logprobs).toBeNull();
      expect(
        (await post('/completion', { ...body, n_probs: 0 })).json.completion_probabilities,
      ).toBeUndefined();
      // A Responses answer has no place for them: the default does not make it fail.
      const resp = await post('/v1/responses', { input: 'Hello', temperature: 0, max_output_tokens: 3 });
      expect([resp.status, resp.json.status]).toEqual([200, 'completed']);
    } finally {
      await hydra.configure({ 'sampling.n_probs': 0 });
    }
  });
});

describe('streamed tool calls (the chat layer parses the text): no probabilities lost', () => {
  let tools: Awaited<ReturnType<typeof engineWith>>;
  beforeAll(async () => {
    const path = await tinyToolsModel('hydra-logprobs-');
    tools = await engineWith(['-m', path, '-np', '1', '-c', '2048']);
  }, 60_000);
  afterAll(async () => {
    await tools?.close();
  });

  it('the chunks of a required tool call carry every token the whole answer reports', async () => {
    const body = {
      messages: [{ role: 'user', content: 'Pick a city' }],
      tools: [
        {
          type: 'function',
          function: {
            name: 'pick_city',
            parameters: { type: 'object', properties: { city: { type: 'string', enum: ['Paris', 'Rome'] } } },
          },
        },
      ],
      tool_choice: 'required',
      temperature: 0,
      max_tokens: 40,
      cache_prompt: false,
      logprobs: true,
      top_logprobs: 2,
    };
    const ask = (stream: boolean) =>
      fetch(`${tools.url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ ...body, stream }),
      });
    const whole = (await (await ask(false)).json()) as any;
    const content = whole.choices[0].logprobs.content;
    expect(content.length).toBe(whole.usage.completion_tokens);
    const text = await (await ask(true)).text();
    const streamed = text
      .split('\n')
      .filter((l) => l.startsWith('data: {'))
      .flatMap((l) => JSON.parse(l.slice(6)).choices[0]?.logprobs?.content ?? []);
    expect(streamed).toEqual(content);
  });
});
