// Stock llama-server of the pinned tree (native-ggml's build leaves it in build/bin) and the engine,
// started with the same flags on the same synthetic models, get the same requests: both answer 200,
// rendered prompts are byte-equal, greedy outputs are equal, the JSON shapes have the same deep keys
// (less the short lists below), n_probs agree within a tolerance.
import { type ChildProcess, spawn } from 'node:child_process';
import { existsSync, mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { writeSyntheticModel } from '@hydra-engine/native-ggml/synth';
import { freePort, REPO, waitFor } from '@hydra-engine/test-kit';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { engineWith, pickCityParameters, toolConversation, weatherTool } from './helpers.js';

const LLAMA_SERVER = `${REPO}/packages/native-ggml/build/bin/llama-server`;

interface Server {
  url: string;
  close(): Promise<void>;
}

async function stockServer(flags: string[]): Promise<Server> {
  const port = await freePort();
  const child: ChildProcess = spawn(LLAMA_SERVER, ['--host', '127.0.0.1', '--port', String(port), ...flags], {
    stdio: 'ignore',
  });
  const gone = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  const close = async () => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    await gone;
  };
  const url = `http://127.0.0.1:${port}`;
  try {
    await waitFor(
      async () => {
        if (child.exitCode !== null || child.signalCode !== null)
          throw new Error(`llama-server exited (${child.exitCode ?? child.signalCode})`);
        return fetch(`${url}/health`).then(
          (r) => r.status === 200,
          () => false,
        );
      },
      30_000,
      `llama-server on ${url} ready`,
    );
  } catch (err) {
    await close();
    throw err;
  }
  return { url, close };
}

interface Pair {
  stock: Server;
  engine: Server;
}

// engineWith adds -t 1 itself.
const common = ['-np', '1', '-c', '4096'];
const pairs: Pair[] = [];
async function pair(model: string, flags: string[] = []): Promise<Pair> {
  const [stock, eng] = await Promise.allSettled([
    stockServer(['-m', model, '-t', '1', ...common, ...flags]),
    engineWith(['-m', model, ...common, ...flags]),
  ]);
  // One side up and the other not: the one that started is stopped before the failure goes on.
  if (stock.status === 'rejected' || eng.status === 'rejected') {
    await Promise.all([
      stock.status === 'fulfilled' ? stock.value.close() : undefined,
      eng.status === 'fulfilled' ? eng.value.close() : undefined,
    ]);
    throw stock.status === 'rejected' ? stock.reason : (eng as PromiseRejectedResult).reason;
  }
  const p = { stock: stock.value, engine: { url: eng.value.url, close: () => eng.value.close() } };
  pairs.push(p);
  return p;
}

async function post(url: string, body: unknown): Promise<{ status: number; json: any }> {
  const res = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  return { status: res.status, json: await res.json() };
}

/** Every key path of a JSON value; array items fold into `[]`, so lengths do not matter. */
function keyPaths(v: unknown, at = '', out = new Set<string>()): Set<string> {
  if (Array.isArray(v)) for (const item of v) keyPaths(item, `${at}[]`, out);
  else if (v !== null && typeof v === 'object')
    for (const [k, x] of Object.entries(v)) {
      out.add(`${at}.${k}`);
      keyPaths(x, `${at}.${k}`, out);
    }
  return out;
}

// Fields one side sends and the other does not, each with the reason; filtered from both sides.
// A path covers itself and everything under it.
const ONE_SIDED: Record<string, string> = {
  '.generation_settings.model':
    "/completion: llama-server's README lists model and n_ctx in generation_settings, the engine sends them; the pinned code's params.to_json leaves them out",
  '.generation_settings.n_ctx': 'as .generation_settings.model',
  '.choices[].logprobs':
    "chat: the engine sends OpenAI's logprobs: null when none were asked; llama-server leaves the key out",
};
function covered(path: string): boolean {
  return Object.keys(ONE_SIDED).some(
    (p) => path === p || path.startsWith(`${p}.`) || path.startsWith(`${p}[]`),
  );
}
function expectSameKeys(stock: unknown, engine: unknown): void {
  const a = [...keyPaths(stock)].filter((p) => !covered(p));
  const b = [...keyPaths(engine)].filter((p) => !covered(p));
  expect(b.filter((p) => !a.includes(p)).sort(), 'engine-only keys').toEqual([]);
  expect(a.filter((p) => !b.includes(p)).sort(), 'llama-server-only keys').toEqual([]);
}

async function both(p: Pair, path: string, body: unknown): Promise<[any, any]> {
  const [s, e] = await Promise.all([
    post(`${p.stock.url}${path}`, body),
    post(`${p.engine.url}${path}`, body),
  ]);
  expect({ path, status: s.status, body: s.status === 200 ? undefined : s.json }).toEqual({
    path,
    status: 200,
    body: undefined,
  });
  expect({ path, status: e.status, body: e.status === 200 ? undefined : e.json }).toEqual({
    path,
    status: 200,
    body: undefined,
  });
  return [s.json, e.json];
}

// Random weights emit lone UTF-8 lead/continuation bytes (byte-fallback ids 131..258 are 0x80..0xFF);
// llama-server's output parser refuses invalid UTF-8 with a 500 ("does not match the expected
// Content-only format"), which real models do not produce. Both get those ids banned.
const NO_HIGH_BYTES: [number, false][] = Array.from({ length: 128 }, (_, i) => [3 + 128 + i, false]);
const greedy = { temperature: 0, seed: 1, cache_prompt: false };

/** Message, finish reason, and usage where both count the same (see the `stop` note below). */
function chatResult(j: any) {
  const c = j.choices[0];
  return {
    content: c.message.content ?? '',
    tool_calls: (c.message.tool_calls ?? []).map((t: any) => ({
      name: t.function.name,
      args: t.function.arguments,
    })),
    finish: c.finish_reason,
    prompt_tokens: j.usage.prompt_tokens,
    // When the turn ends on an end-of-generation token or a grammar's end, llama-server's count is
    // 1-2 higher (it counts the end token); equal only for finish "length".
    completion_tokens: c.finish_reason === 'length' ? j.usage.completion_tokens : undefined,
  };
}

const pick = {
  type: 'function',
  function: {
    name: 'pick_city',
    parameters: pickCityParameters,
  },
};
const weather = weatherTool;
const conversation = toolConversation;
const schema = { type: 'object', properties: { n: { type: 'integer' } }, required: ['n'] };

if (!existsSync(LLAMA_SERVER))
  throw new Error(
    `${LLAMA_SERVER} is missing: native-ggml's build makes it (HYDRA_SERVER_TOOLS, on by default)`,
  );

const dir = mkdtempSync(join(tmpdir(), 'hydra-parity-'));
// The two chat models: the tiny llama (q8_0, seed 3) with the tools template, and chat-jinja's f32 seed 5.
// The plain chatml tiny model is not among them: its SPM space prefix makes the generation prompt
// come back as "<|im_start|> assistant", and llama-server then refuses json_schema in chat with a 400
// "Failed to initialize samplers" (SYNTH.md, `chat: 'tools'`).
const chatModels = [
  { name: 'tiny q8_0 seed 3, tools template', seed: 3, quant: 'q8_0' as const },
  { name: 'tiny f32 seed 5, tools template (chat-jinja)', seed: 5, quant: 'f32' as const },
];
const chatPairs: Pair[] = [];
let fimPair: Pair;
let embPair: Pair;

beforeAll(async () => {
  for (const m of chatModels) {
    const out = join(dir, `tools-${m.seed}.gguf`);
    await writeSyntheticModel({
      arch: 'llama',
      shape: 'tiny',
      quant: m.quant,
      seed: m.seed,
      out,
      chat: 'tools',
    });
    chatPairs.push(await pair(out));
  }
  const fim = join(dir, 'fim.gguf');
  await writeSyntheticModel({ arch: 'llama', shape: 'tiny', quant: 'q8_0', seed: 3, out: fim, fim: true });
  fimPair = await pair(fim, ['-b', '512']);
  const plain = join(dir, 'tiny.gguf');
  await writeSyntheticModel({ arch: 'llama', shape: 'tiny', quant: 'q8_0', seed: 3, out: plain });
  embPair = await pair(plain, ['--embedding', '--pooling', 'mean']);
}, 120_000);
afterAll(async () => {
  await Promise.all(pairs.flatMap((p) => [p.stock.close(), p.engine.close()]));
});

describe.each(
  chatModels.map((m, i) => [m.name, i] as const),
)('stock llama-server and the engine on %s', (_, i) => {
  const p = () => chatPairs[i]!;
  const nVocab = 1000;
  // As chat-jinja: "<tool_call>" and "\n" favoured so that greedy random weights open a call (the
  // grammar lets text come first); the favoured newline then fills the arguments' whitespace, so
  // the call is cut by max_tokens after "{", and both parse that partial call the same way.
  const toolBias = [...NO_HIGH_BYTES, [nVocab - 2, 10], [13, 10]];

  it('/apply-template renders byte-equal prompts (plain, system, tools with calls and results)', async () => {
    for (const body of [
      { messages: [{ role: 'user', content: 'hi' }] },
      { messages: conversation },
      { messages: conversation, tools: [weather, pick] },
    ]) {
      const [s, e] = await both(p(), '/apply-template', body);
      expect(e.prompt).toBe(s.prompt);
      expectSameKeys(s, e);
    }
  });

  it('plain chat, response_format json_schema, json_object with a schema: equal greedy replies', async () => {
    for (const extra of [
      {},
      { response_format: { type: 'json_schema', json_schema: { name: 'n', schema } } },
      { response_format: { type: 'json_object', schema } },
    ]) {
      const body = {
        messages: [{ role: 'user', content: 'hi' }],
        max_tokens: 40,
        logit_bias: NO_HIGH_BYTES,
        ...greedy,
        ...extra,
      };
      const [s, e] = await both(p(), '/v1/chat/completions', body);
      expect(chatResult(e)).toEqual(chatResult(s));
      expectSameKeys(s, e);
    }
  });

  it('response_format json_object without a schema: both answer; only the engine holds the reply to JSON', async () => {
    // llama-server turns it into an empty schema, which its chat layer takes as "no response
    // format" (has_response_format needs a non-empty object): free text. The engine constrains it
    // to a JSON object, as OpenAI documents json_object. Documented difference, not compared.
    const body = {
      messages: [{ role: 'user', content: 'hi' }],
      max_tokens: 40,
      logit_bias: NO_HIGH_BYTES,
      response_format: { type: 'json_object' },
      ...greedy,
    };
    const [s, e] = await both(p(), '/v1/chat/completions', body);
    expect(typeof JSON.parse(e.choices[0].message.content)).toBe('object');
    expectSameKeys(s, e);
  });

  it('tools with tool_choice auto, required and named: equal content and tool_calls', async () => {
    for (const tool_choice of ['auto', 'required']) {
      const body = {
        messages: conversation,
        tools: [weather, pick],
        tool_choice,
        max_tokens: 120,
        logit_bias: toolBias,
        ...greedy,
      };
      const [s, e] = await both(p(), '/v1/chat/completions', body);
      expect({ tool_choice, ...chatResult(e) }).toEqual({ tool_choice, ...chatResult(s) });
      // The grammar lets text come first, so whether greedy text reaches a call is the weights'
      // doing: on the q8_0 seed 3 model it does (required), which keeps this about tool_calls.
      if (tool_choice === 'required' && i === 0) expect(chatResult(s).tool_calls.length).toBeGreaterThan(0);
      expectSameKeys(s, e);
    }
    // llama-server reads tool_choice as a string only (json_value falls back to "auto" for the
    // object, every tool rendered): the named form is not honoured there. The engine gives it
    // OpenAI's meaning, that tool alone with the call required, which llama-server answers when
    // asked for exactly that.
    const base = { messages: conversation, max_tokens: 120, logit_bias: toolBias, ...greedy };
    const named = { type: 'function', function: { name: 'pick_city' } };
    const [s, e] = await Promise.all([
      post(`${p().stock.url}/v1/chat/completions`, { ...base, tools: [pick], tool_choice: 'required' }),
      post(`${p().engine.url}/v1/chat/completions`, { ...base, tools: [weather, pick], tool_choice: named }),
    ]);
    expect([s.status, e.status]).toEqual([200, 200]);
    expect(chatResult(e.json)).toEqual(chatResult(s.json));
    if (i === 0)
      expect(chatResult(s.json).tool_calls.map((t: { name: string }) => t.name)).toEqual(['pick_city']);
    expectSameKeys(s.json, e.json);
  });

  it('/v1/completions with grammar and json_schema: equal greedy text', async () => {
    for (const extra of [{ grammar: 'root ::= [a-z ]+ "."' }, { json_schema: schema }]) {
      const body = { prompt: 'hello world', max_tokens: 30, ...greedy, ...extra };
      const [s, e] = await both(p(), '/v1/completions', body);
      const r = (j: any) => ({
        text: j.choices[0].text,
        finish: j.choices[0].finish_reason,
        prompt: j.usage.prompt_tokens,
      });
      expect(r(e)).toEqual(r(s));
      expectSameKeys(s, e);
    }
  });

  it('/tokenize with pieces (specials parsed and not) and /detokenize agree', async () => {
    for (const body of [
      { content: 'hello world', with_pieces: true },
      { content: '<|im_start|>user\nhi<|im_end|>', with_pieces: true, parse_special: true },
      { content: 'hello', add_special: true },
    ]) {
      const [s, e] = await both(p(), '/tokenize', body);
      expect(e).toEqual(s);
    }
    const [s, e] = await both(p(), '/detokenize', { tokens: [1, 259, 400, 500] });
    expect(e).toEqual(s);
  });

  it('/completion with n_probs: equal text and tokens, probabilities within 1e-3', async () => {
    const body = { prompt: 'hello world', n_predict: 6, n_probs: 3, logit_bias: NO_HIGH_BYTES, ...greedy };
    const [s, e] = await both(p(), '/completion', body);
    expect(e.content).toBe(s.content);
    expectSameKeys(s, e);
    expect(e.completion_probabilities.length).toBe(s.completion_probabilities.length);
    s.completion_probabilities.forEach((sp: any, k: number) => {
      const ep = e.completion_probabilities[k];
      expect(ep.id).toBe(sp.id);
      expect(ep.top_logprobs.map((t: any) => t.id)).toEqual(sp.top_logprobs.map((t: any) => t.id));
      expect(Math.abs(ep.logprob - sp.logprob)).toBeLessThan(1e-3);
      sp.top_logprobs.forEach((t: any, j: number) => {
        expect(Math.abs(ep.top_logprobs[j].logprob - t.logprob)).toBeLessThan(1e-3);
      });
    });
  });
});

describe('stock llama-server and the engine, embeddings and infill', () => {
  it('/v1/embeddings with --embedding --pooling mean: same shape, vectors within 1e-4', async () => {
    const [s, e] = await both(embPair, '/v1/embeddings', {
      input: ['hello world', 'the cat'],
      model: 'tiny',
    });
    expectSameKeys(s, e);
    expect(e.data.length).toBe(2);
    s.data.forEach((row: any, k: number) => {
      const other = e.data[k].embedding as number[];
      expect(other.length).toBe(row.embedding.length);
      const worst = Math.max(...row.embedding.map((x: number, j: number) => Math.abs(x - other[j]!)));
      expect(worst).toBeLessThan(1e-4);
    });
  });

  it('/infill on the FIM model: equal greedy text', async () => {
    const body = {
      input_prefix: 'def add(a, b):\n    ',
      input_suffix: '\n    return c\n',
      n_predict: 12,
      logit_bias: NO_HIGH_BYTES,
      ...greedy,
    };
    const [s, e] = await both(fimPair, '/infill', body);
    expect(e.content).toBe(s.content);
    expectSameKeys(s, e);
  });
});
