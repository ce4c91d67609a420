import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Model } from '@hydra-engine/native-ggml';
import { writeSyntheticModel } from '@hydra-engine/native-ggml/synth';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseServeArgs } from '../src/args.js';
import { startEngine } from '../src/serve.js';
import { engineWith, tinyModel } from './helpers.js';

const KEY = 'sekret';
let modelPath: string;
let model: Model;
let slotDir: string;
let eng: Awaited<ReturnType<typeof engineWith>>;

beforeAll(async () => {
  modelPath = await tinyModel();
  model = await Model.load({ path: modelPath });
  slotDir = mkdtempSync(join(tmpdir(), 'hydra-slots-'));
  eng = await engineWith([
    '-m',
    modelPath,
    '-np',
    '2',
    '-c',
    '1024',
    '--alias',
    'tiny-a,tiny-b',
    '--slot-save-path',
    slotDir,
    '--api-key',
    KEY,
  ]);
}, 60_000);
afterAll(async () => {
  await eng?.close();
  model?.dispose();
});

const auth = { authorization: `Bearer ${KEY}` };

async function post(path: string, body: unknown, headers: Record<string, string> = auth) {
  const res = await fetch(`${eng.url}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify(body),
  });
  return { status: res.status, headers: res.headers, json: (await res.json()) as any };
}

async function get(path: string, headers: Record<string, string> = auth) {
  const res = await fetch(`${eng.url}${path}`, { headers });
  return { status: res.status, headers: res.headers, json: (await res.json()) as any };
}

const greedy = { temperature: 0, n_predict: 10, ignore_eos: true };

describe('llama-server routes in its shapes', () => {
  it('/tokenize: ids as the model tokenizes, add_special, parse_special, with_pieces', async () => {
    const content = 'hello world again';
    const plain = await post('/tokenize', { content });
    expect(plain.status).toBe(200);
    expect(plain.json.tokens).toEqual([...model.tokenize(content, { addSpecial: false })]);
    const bos = await post('/tokenize', { content, add_special: true });
    expect(bos.json.tokens).toEqual([...model.tokenize(content, { addSpecial: true })]);
    const pieces = await post('/tokenize', { content, with_pieces: true });
    expect(pieces.json.tokens.map((t: any) => t.id)).toEqual(plain.json.tokens);
    // SentencePiece pieces: the first carries the word's leading space.
    expect(pieces.json.tokens.map((t: any) => t.piece).join('')).toBe(` ${content}`);
    for (const t of pieces.json.tokens) expect(Object.keys(t)).toEqual(['id', 'piece']);
    expect((await post('/tokenize', {})).json).toEqual({ tokens: [] });
    const bad = await post('/tokenize', { content: 5 });
    expect(bad.status).toBe(400);
    expect(bad.json.error.keys).toEqual(['content']);
    const badFlag = await post('/tokenize', { content: 'x', with_pieces: 'yes' });
    expect(badFlag.json.error.keys).toEqual(['with_pieces']);
  });

  it('/detokenize: the pieces of the ids; ids outside the vocabulary are a 400 naming tokens', async () => {
    const ids = [...model.tokenize('round trip text', { addSpecial: false })];
    const r = await post('/detokenize', { tokens: ids });
    expect(r.status).toBe(200);
    // llama-server concatenates the pieces, specials rendered (a leading space stays).
    const pieces = Buffer.concat(ids.map((t) => model.tokenBytes(t, true))).toString('utf8');
    expect(pieces.trim()).toBe('round trip text');
    expect(r.json).toEqual({ content: pieces });
    expect((await post('/detokenize', {})).json).toEqual({ content: '' });
    const bad = await post('/detokenize', { tokens: [1, model.info.nVocab] });
    expect(bad.status).toBe(400);
    expect(bad.json.error.code).toBe('HYDRA_ERR_BAD_REQUEST');
    expect(bad.json.error.keys).toEqual(['tokens']);
    expect((await post('/detokenize', { tokens: 'x' })).json.error.keys).toEqual(['tokens']);
  });

  it('/apply-template: the prompt the model template renders; bad messages are a 400', async () => {
    const messages = [
      { role: 'system', content: 'be brief' },
      { role: 'user', content: 'hi there' },
    ];
    const r = await post('/apply-template', { messages });
    expect(r.status).toBe(200);
    expect(r.json).toEqual({ prompt: model.applyChatTemplate(messages) });
    const bad = await post('/apply-template', { messages: [] });
    expect(bad.status).toBe(400);
    expect(bad.json.error.keys).toEqual(['messages']);
  });

  it('chat template fields: add_generation_prompt honoured, the Jinja fields taken (--jinja is the default)', async () => {
    const messages = [{ role: 'user', content: 'hi there' }];
    const open = await post('/apply-template', { messages, add_generation_prompt: false });
    expect(open.json).toEqual({ prompt: model.applyChatTemplate(messages, { addAssistant: false }) });
    expect(open.json.prompt).not.toBe(model.applyChatTemplate(messages));
    const chatNoGen = await post('/v1/chat/completions', {
      messages,
      max_tokens: 1,
      add_generation_prompt: false,
    });
    const tokens = await post('/tokenize', { content: open.json.prompt, add_special: true });
    expect(chatNoGen.json.usage.prompt_tokens).toBe(tokens.json.tokens.length);
    for (const [field, value] of [
      ['chat_template_kwargs', { enable_thinking: false }],
      ['reasoning_format', 'deepseek'],
      ['tools', [{ type: 'function', function: { name: 'f', parameters: {} } }]],
    ] as const) {
      for (const path of ['/apply-template', '/v1/chat/completions']) {
        const r = await post(path, { messages, [field]: value, max_tokens: 1 });
        expect(r.status, `${path} ${field}`).toBe(200);
      }
    }
    // Not read by this engine's chat layer call: refused by name, not dropped.
    const cont = await post('/v1/chat/completions', { messages, continue_final_message: true });
    expect(cont.json.error.code).toBe('HYDRA_ERR_UNSUPPORTED_FIELD');
    expect(cont.json.error.keys).toEqual(['continue_final_message']);
    // Message fields the Jinja template renders (the legacy renderer refused them: chat-jinja.test.ts).
    for (const extra of [
      {
        role: 'assistant',
        content: '',
        tool_calls: [{ id: 'c1', type: 'function', function: { name: 'f', arguments: '{}' } }],
      },
      { role: 'tool', content: '42', tool_call_id: 'c1' },
    ]) {
      for (const path of ['/apply-template', '/v1/chat/completions']) {
        const r = await post(path, {
          messages: [...messages, extra, { role: 'user', content: 'go' }],
          max_tokens: 1,
        });
        expect(r.status, `${path} ${extra.role}`).toBe(200);
      }
    }
    expect((await post('/apply-template', { messages, add_generation_prompt: 1 })).json.error.keys).toEqual([
      'add_generation_prompt',
    ]);
  });

  it('GET /props: global properties; POST /props is 501 as without --props', async () => {
    const r = await get('/props');
    expect(r.status).toBe(200);
    expect(r.json.total_slots).toBe(2);
    expect(r.json.model_path).toBe(modelPath);
    expect(r.json.model_alias).toBe('tiny-a');
    expect(r.json.chat_template).toBe(model.info.chatTemplate ?? '');
    expect(r.json.is_sleeping).toBe(false);
    const d = r.json.default_generation_settings;
    expect(d.n_ctx).toBe(512);
    expect(d.is_processing).toBe(false);
    expect(d.params.temperature).toBeCloseTo(0.8);
    expect(d.params.top_k).toBe(40);
    expect(d.params.samplers).toContain('top_k');
    expect([r.json.endpoint_slots, r.json.endpoint_props, r.json.endpoint_metrics]).toEqual([
      true,
      false,
      true,
    ]);
    const p = await post('/props', {});
    expect(p.status).toBe(501);
    expect(p.json.error).toMatchObject({ code: 'HYDRA_ERR_NOT_SUPPORTED', type: 'not_supported_error' });
  });

  it('--props: POST /props answers success to an empty body and refuses a property by name', async () => {
    const withProps = await engineWith(['-m', modelPath, '-c', '512', '--props']);
    try {
      const at = (body: unknown) =>
        fetch(`${withProps.url}/props`, { method: 'POST', body: JSON.stringify(body) }).then(async (r) => ({
          status: r.status,
          json: (await r.json()) as any,
        }));
      expect(await at({})).toEqual({ status: 200, json: { success: true } });
      const named = await at({ n_ctx: 4096 });
      expect([named.status, named.json.error.code, named.json.error.keys]).toEqual([
        400,
        'HYDRA_ERR_UNSUPPORTED_FIELD',
        ['n_ctx'],
      ]);
      const props = await (await fetch(`${withProps.url}/props`)).json();
      expect((props as any).endpoint_props).toBe(true);
    } finally {
      await withProps.close();
    }
  });

  it('GET /slots: one entry per slot with its state', async () => {
    const r = await get('/slots');
    expect(r.status).toBe(200);
    expect(r.json.map((s: any) => s.id)).toEqual([0, 1]);
    for (const s of r.json) {
      expect(s.n_ctx).toBe(512);
      expect(s.is_processing).toBe(false);
      expect(s.params.top_p).toBeCloseTo(0.95);
    }
    expect((await get('/slots?fail_on_no_slot=1')).status).toBe(200);
  });

  it('/completion and /completions answer in the native shape; /v1/completions stays OpenAI', async () => {
    const prompt = 'the native shape';
    const oai = await post('/v1/completions', { prompt, ...greedy, cache_prompt: false });
    expect(oai.json.object).toBe('text_completion');
    for (const path of ['/completion', '/completions']) {
      const r = await post(path, { prompt, ...greedy, return_tokens: true });
      expect(r.status).toBe(200);
      expect(r.json).toMatchObject({
        index: 0,
        content: oai.json.choices[0].text,
        stop: true,
        model: 'tiny-a',
        tokens_predicted: 10,
        tokens_evaluated: oai.json.usage.prompt_tokens,
        prompt,
        stop_type: 'limit',
        stopping_word: '',
        truncated: false,
      });
      expect(r.json.tokens).toHaveLength(10);
      expect(r.json.generation_settings).toMatchObject({
        n_ctx: 512,
        temperature: 0,
        n_predict: 10,
        ignore_eos: true,
      });
      expect(typeof r.json.has_new_line).toBe('boolean');
      expect(typeof r.json.tokens_cached).toBe('number');
    }
    const noTokens = await post('/completion', { prompt, ...greedy });
    expect(noTokens.json.tokens).toEqual([]);
  });

  it('native timings and response_fields as llama-server', async () => {
    const prompt = 'timings and fields';
    const r = await post('/completion', { prompt, ...greedy });
    expect(Object.keys(r.json.timings)).toEqual([
      'cache_n',
      'prompt_n',
      'prompt_ms',
      'prompt_per_token_ms',
      'prompt_per_second',
      'predicted_n',
      'predicted_ms',
      'predicted_per_token_ms',
      'predicted_per_second',
    ]);
    expect(r.json.timings.predicted_n).toBe(10);
    expect(r.json.timings.prompt_n + r.json.timings.cache_n).toBe(r.json.tokens_evaluated);
    expect(r.json.timings.predicted_per_second).toBeGreaterThan(0);
    const pinned = await post('/completion', { prompt, ...greedy, id_slot: 1 });
    expect(pinned.json.id_slot).toBe(1);
    const picked = await post('/completion', {
      prompt,
      ...greedy,
      response_fields: ['content', 'generation_settings/n_predict', 'nothing/here'],
    });
    expect(picked.json).toEqual({ content: r.json.content, 'generation_settings/n_predict': 10 });
    const bad = await post('/completion', { prompt, response_fields: 'content' });
    expect(bad.status).toBe(400);
    expect(bad.json.error.keys).toEqual(['response_fields']);
    const oai = await post('/v1/completions', { prompt, response_fields: ['content'] });
    expect(oai.status).toBe(400);
    expect(oai.json.error.code).toBe('HYDRA_ERR_UNSUPPORTED_FIELD');
  });

  it('native stop_type: word with the stopping word, eos at an end of generation', async () => {
    const prompt = 'stop words here';
    const base = await post('/completion', { prompt, ...greedy, n_predict: 12 });
    const text: string = base.json.content;
    // A stop string from inside the greedy text, past its first characters.
    const word = text.slice(3, 6);
    expect(word.length).toBe(3);
    const r = await post('/completion', { prompt, ...greedy, n_predict: 12, stop: [word] });
    expect(r.json.stop_type).toBe('word');
    expect(r.json.stopping_word).toBe(word);
    expect(r.json.content).toBe(text.slice(0, text.indexOf(word)));
  });

  it('native streaming: data chunks with content and tokens, a final stop: true object, no [DONE]', async () => {
    const prompt = 'stream me natively';
    const whole = await post('/completion', { prompt, ...greedy });
    const res = await fetch(`${eng.url}/completion`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...auth },
      body: JSON.stringify({ prompt, ...greedy, stream: true }),
    });
    expect(res.headers.get('content-type')).toBe('text/event-stream');
    const text = await res.text();
    expect(text).not.toContain('[DONE]');
    const events = text
      .split('\n\n')
      .filter((e) => e.startsWith('data: '))
      .map((e) => JSON.parse(e.slice(6)));
    const last = events.at(-1);
    expect(last.stop).toBe(true);
    expect(last.stop_type).toBe('limit');
    const parts = events.slice(0, -1);
    for (const p of parts) expect(p).toMatchObject({ stop: false, index: 0 });
    expect(parts.map((p) => p.content).join('')).toBe(whole.json.content);
    const streamed = [...parts.flatMap((p) => p.tokens), ...last.tokens];
    expect(streamed).toHaveLength(10);
  });

  it('cache_prompt is on by default: a repeated prompt reuses the slot KV and answers the same', async () => {
    const prompt = 'a prompt that is cached by default for reuse';
    const a = await post('/v1/completions', { prompt, ...greedy, id_slot: 1 });
    const b = await post('/v1/completions', { prompt, ...greedy, id_slot: 1 });
    expect(b.json.usage.prompt_tokens_details.cached_tokens).toBeGreaterThan(0);
    expect(b.json.choices[0].text).toBe(a.json.choices[0].text);
    const off = await post('/v1/completions', { prompt, ...greedy, id_slot: 1, cache_prompt: false });
    expect(off.json.usage.prompt_tokens_details.cached_tokens).toBe(0);
    expect(off.json.choices[0].text).toBe(a.json.choices[0].text);
  });

  it('/v1/models: the alias as id; /v1/models/{id} by any alias, 404 otherwise (OpenAI client)', async () => {
    const client = new OpenAI({ baseURL: `${eng.url}/v1`, apiKey: KEY, maxRetries: 0 });
    const list = await client.models.list();
    expect(list.data.map((m) => m.id)).toEqual(['tiny-a']);
    const one = await client.models.retrieve('tiny-b');
    expect(one.id).toBe('tiny-a');
    expect((one as any).meta).toMatchObject({ n_vocab: 1000, n_ctx_train: 4096, n_embd: 256 });
    const miss = await get('/v1/models/other');
    expect(miss.status).toBe(404);
    expect(miss.json.error.code).toBe('HYDRA_ERR_NOT_FOUND');
    const chat = await client.chat.completions.create({
      model: 'tiny-a',
      messages: [{ role: 'user', content: 'hi' }],
      max_tokens: 2,
    });
    expect(chat.model).toBe('tiny-a');
  });
});

describe('slot save, restore and erase with --slot-save-path', () => {
  it('saves a slot, erases it, restores it and continues identically', async () => {
    const prompt = 'the slot to keep for later';
    const first = await post('/v1/completions', { prompt, ...greedy, id_slot: 0 });
    const save = await post('/slots/0?action=save', { filename: 'keep.bin' });
    expect(save.status).toBe(200);
    expect(Object.keys(save.json)).toEqual(['id_slot', 'filename', 'n_saved', 'n_written', 'timings']);
    expect(save.json).toMatchObject({ id_slot: 0, filename: 'keep.bin' });
    expect(save.json.n_saved).toBeGreaterThan(first.json.usage.prompt_tokens);
    expect(save.json.n_written).toBe(readFileSync(join(slotDir, 'keep.bin')).length);
    expect(typeof save.json.timings.save_ms).toBe('number');
    const slots = (await get('/slots')).json;
    expect(slots[0].n_cached).toBe(save.json.n_saved);

    const erase = await post('/slots/0?action=erase', {});
    expect(erase.json).toEqual({ id_slot: 0, n_erased: save.json.n_saved });
    expect((await get('/slots')).json[0].n_cached).toBe(0);

    const restore = await post('/slots/0?action=restore', { filename: 'keep.bin' });
    expect(restore.status).toBe(200);
    expect(restore.json).toMatchObject({
      id_slot: 0,
      filename: 'keep.bin',
      n_restored: save.json.n_saved,
      n_read: save.json.n_written,
    });
    // The prompt plus what was generated continues from the restored KV, as one uncached run does.
    const next = `${prompt}${first.json.choices[0].text}`;
    const cont = await post('/v1/completions', { prompt: next, ...greedy, id_slot: 0 });
    expect(cont.json.usage.prompt_tokens_details.cached_tokens).toBeGreaterThan(0);
    const fresh = await post('/v1/completions', { prompt: next, ...greedy, id_slot: 1, cache_prompt: false });
    expect(cont.json.choices[0].text).toBe(fresh.json.choices[0].text);
  });

  it('refuses a truncated, altered or foreign file, a bad name, a missing file and a bad action', async () => {
    await post('/v1/completions', { prompt: 'to be saved', ...greedy, id_slot: 0 });
    expect((await post('/slots/0?action=save', { filename: 'good.bin' })).status).toBe(200);
    const good = readFileSync(join(slotDir, 'good.bin'));
    writeFileSync(join(slotDir, 'cut.bin'), good.subarray(0, good.length - 100));
    const flipped = Buffer.from(good);
    flipped[flipped.length - 7]! ^= 0xff;
    writeFileSync(join(slotDir, 'flip.bin'), flipped);
    writeFileSync(join(slotDir, 'junk.bin'), Buffer.from('not a slot file at all'));
    // The same envelope saved from another model.
    const other = join(mkdtempSync(join(tmpdir(), 'hydra-other-')), 'other.gguf');
    await writeSyntheticModel({ arch: 'llama', shape: 'tiny', quant: 'f32', seed: 3, out: other });
    const foreign = await engineWith(['-m', other, '-np', '1', '-c', '512', '--slot-save-path', slotDir]);
    try {
      await fetch(`${foreign.url}/v1/completions`, {
        method: 'POST',
        body: JSON.stringify({ prompt: 'other model', ...greedy }),
      });
      const r = await fetch(`${foreign.url}/slots/0?action=save`, {
        method: 'POST',
        body: JSON.stringify({ filename: 'foreign.bin' }),
      });
      expect(r.status).toBe(200);
    } finally {
      await foreign.close();
    }
    for (const name of ['cut.bin', 'flip.bin', 'junk.bin', 'foreign.bin']) {
      const r = await post('/slots/1?action=restore', { filename: name });
      expect(r.status, name).toBe(400);
      expect(r.json.error.code, name).toBe('HYDRA_ERR_STATE_INVALID');
    }
    // Nothing of them was loaded: the slot still serves, and restores a good file.
    expect((await get('/slots')).json[1].n_cached).toBeGreaterThanOrEqual(0);
    expect((await post('/slots/1?action=restore', { filename: 'good.bin' })).status).toBe(200);
    for (const filename of ['../escape.bin', 'a/b', '', 'dot.', 7]) {
      const r = await post('/slots/0?action=save', { filename });
      expect(r.status, String(filename)).toBe(400);
      expect(r.json.error.keys).toEqual(['filename']);
    }
    const missing = await post('/slots/0?action=restore', { filename: 'absent.bin' });
    expect(missing.status).toBe(404);
    expect((await post('/slots/0?action=fly', {})).json.error.keys).toEqual(['action']);
    expect((await post('/slots/x?action=erase', {})).json.error.keys).toEqual(['id_slot']);
    expect((await post('/slots/9?action=erase', {})).json.error.keys).toEqual(['id_slot']);
  }, 60_000);
});

describe('CORS as llama-server, with the API key rules', () => {
  it('a preflight is answered without a key; answers echo the Origin; other requests still need the key', async () => {
    const pre = await fetch(`${eng.url}/v1/chat/completions`, {
      method: 'OPTIONS',
      headers: { origin: 'http://app.example', 'access-control-request-method': 'POST' },
    });
    expect(pre.status).toBe(200);
    expect(pre.headers.get('access-control-allow-origin')).toBe('http://app.example');
    expect(pre.headers.get('access-control-allow-credentials')).toBe('true');
    expect(pre.headers.get('access-control-allow-methods')).toBe('GET, POST, DELETE, OPTIONS');
    expect(pre.headers.get('access-control-allow-headers')).toBe('*');
    const noKey = await get('/props', { origin: 'http://app.example' });
    expect(noKey.status).toBe(401);
    expect(noKey.headers.get('access-control-allow-origin')).toBe('http://app.example');
    const withKey = await get('/props', { origin: 'http://app.example', ...auth });
    expect(withKey.status).toBe(200);
    expect(withKey.headers.get('access-control-allow-origin')).toBe('http://app.example');
  });

  it('--cors-origins localhost reflects only a localhost Origin', async () => {
    const e = await engineWith(['--cors-origins', 'localhost']);
    try {
      const local = await fetch(`${e.url}/health`, { headers: { origin: 'http://localhost:5173' } });
      expect(local.headers.get('access-control-allow-origin')).toBe('http://localhost:5173');
      const far = await fetch(`${e.url}/health`, { headers: { origin: 'http://evil.example' } });
      expect(far.headers.get('access-control-allow-origin')).toBeNull();
    } finally {
      await e.close();
    }
  });
});

describe('/health as llama-server: 503 while loading, 200 when ready, a model-less engine says so', () => {
  it('model-less: 200 no_model; slot actions without --slot-save-path are 501; /slots needs a model', async () => {
    const e = await engineWith([]);
    try {
      const h = await fetch(`${e.url}/health`);
      expect(h.status).toBe(200);
      expect(await h.json()).toMatchObject({
        status: 'no_model',
        state: 'empty',
        message: 'no model is loaded',
      });
      const act = await fetch(`${e.url}/slots/0?action=erase`, { method: 'POST', body: '{}' });
      expect(act.status).toBe(501);
      expect(((await act.json()) as any).error.code).toBe('HYDRA_ERR_NOT_SUPPORTED');
      expect((await fetch(`${e.url}/slots`)).status).toBe(503);
      expect(((await (await fetch(`${e.url}/v1/models`)).json()) as any).data).toEqual([]);
    } finally {
      await e.close();
    }
  });

  it('loading: 503 with llama-server error body, then 200 {status: ok}', async () => {
    const running = await startEngine(
      parseServeArgs(['--port', '0', '--progress', 'off', '-t', '1', '-m', modelPath]),
      { log: { write: () => true } },
    );
    try {
      const url = `http://127.0.0.1:${running.httpPort}/health`;
      const seen: { status: number; body: any }[] = [];
      for (let i = 0; i < 2000; i++) {
        const r = await fetch(url);
        seen.push({ status: r.status, body: await r.json() });
        if (r.status === 200) break;
      }
      const loading = seen.filter((s) => s.body.status === 'loading');
      expect(loading.length).toBeGreaterThan(0);
      for (const s of loading) {
        expect(s.status).toBe(503);
        expect(s.body.error).toEqual({ code: 503, message: 'Loading model', type: 'unavailable_error' });
      }
      expect(seen.at(-1)!.status).toBe(200);
      expect(seen.at(-1)!.body.status).toBe('ok');
    } finally {
      await running.close();
    }
  }, 60_000);
});
