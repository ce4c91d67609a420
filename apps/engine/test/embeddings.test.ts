import { spawn } from 'node:child_process';
import { closeSync, existsSync, mkdtempSync, openSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { HydraClient } from '@hydra-engine/hydra-rpc';
import { addonCandidates } from '@hydra-engine/native-ggml';
import { writeSyntheticModel } from '@hydra-engine/native-ggml/synth';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { complete, freePort, stream } from './control-helpers.js';
import { engineWith, runCli } from './helpers.js';

// Issue 21: /v1/embeddings, /embedding(s) and /v1/rerank as llama-server serves them, checked
// against the pinned tree's own llama-embedding on the same synthetic models.

const tool = join(dirname(addonCandidates().find((p) => existsSync(p)) ?? '.'), 'llama-embedding');
const TEXTS = ['Hello world, this is a test', 'the cat sat on the mat'];

// stdout to a file, not a pipe: llama-embedding prints through llama.cpp's asynchronous log, whose
// worker thread a filling pipe held back long enough for the exit to cut the output.
async function run(args: string[]): Promise<string> {
  const dir = mkdtempSync(join(tmpdir(), 'hydra-embd-out-'));
  const out = join(dir, 'stdout');
  const fd = openSync(out, 'w');
  try {
    await new Promise<void>((resolve, reject) => {
      // libhydra-log-flush (native-ggml's native-tools/log_flush.cpp) joins that worker at exit.
      const env = { ...process.env, LD_PRELOAD: join(dirname(tool), 'libhydra-log-flush.so') };
      const child = spawn(tool, args, { stdio: ['ignore', fd, 'ignore'], env });
      const timer = setTimeout(() => child.kill('SIGKILL'), 120_000);
      child.once('error', reject);
      child.once('exit', (code, signal) => {
        clearTimeout(timer);
        if (code === 0) resolve();
        else reject(new Error(`llama-embedding exited ${code ?? signal}`));
      });
    });
  } finally {
    closeSync(fd);
  }
  const text = readFileSync(out, 'utf8');
  rmSync(dir, { recursive: true, force: true });
  return text;
}

/**
 * llama-embedding's rows (`--embd-output-format array`), once per arguments. Its log thread can
 * still be printing when main returns (common_log is never destroyed), which cuts the output
 * short now and then, more often on a loaded machine: run again, at most 20 times.
 */
const references = new Map<string, Promise<number[][]>>();
function reference(model: string, pooling: string, normalize: number, texts = TEXTS, rows = texts.length) {
  const key = JSON.stringify([model, pooling, normalize, texts]);
  let got = references.get(key);
  if (!got) {
    got = referenceRun(model, pooling, normalize, texts, rows);
    references.set(key, got);
  }
  return got;
}

async function referenceRun(
  model: string,
  pooling: string,
  normalize: number,
  texts: string[],
  rows: number,
) {
  for (let attempt = 0; attempt < 20; attempt++) {
    const out = await run([
      '-m',
      model,
      '--pooling',
      pooling,
      '--embd-normalize',
      String(normalize),
      '--embd-output-format',
      'array',
      '-c',
      '512',
      '-p',
      texts.join('\n'),
    ]);
    const start = out.indexOf('[[');
    const end = out.lastIndexOf(']]');
    if (start < 0 || end < 0) continue;
    try {
      const parsed = JSON.parse(out.slice(start, end + 2)) as number[][];
      if (parsed.length === rows && parsed.every((r) => r.length === 256)) return parsed;
    } catch {}
  }
  throw new Error('llama-embedding printed no complete output in 20 runs');
}

const maxDiff = (a: readonly number[], b: readonly number[]) =>
  a.length !== b.length
    ? Number.POSITIVE_INFINITY
    : a.reduce((m, v, i) => Math.max(m, Math.abs(v - b[i]!)), 0);

/** CONFIGURE over a fresh Hydra session (the engine closes sessions that stay idle). */
async function configure(port: number, delta: Record<string, unknown>): Promise<void> {
  const client = await HydraClient.connect({ port, encoding: 'json' });
  try {
    await client.configure(delta);
  } finally {
    client.close();
  }
}

async function post(url: string, path: string, body: unknown): Promise<{ status: number; json: any }> {
  const r = await fetch(`${url}${path}`, { method: 'POST', body: JSON.stringify(body) });
  return { status: r.status, json: await r.json() };
}

const dir = mkdtempSync(join(tmpdir(), 'hydra-embed-'));
const tiny = join(dir, 'tiny.gguf');
const reranker = join(dir, 'rerank.gguf');
beforeAll(async () => {
  await writeSyntheticModel({ arch: 'llama', shape: 'tiny', quant: 'f32', seed: 7, out: tiny });
  await writeSyntheticModel({
    arch: 'llama',
    shape: 'tiny',
    quant: 'f32',
    seed: 7,
    out: reranker,
    head: 'rank',
  });
}, 60_000);

describe.skipIf(!existsSync(tool))('embeddings on --embedding --pooling mean', () => {
  let eng: Awaited<ReturnType<typeof engineWith>>;
  let port: number;
  let openai: OpenAI;
  beforeAll(async () => {
    port = await freePort();
    eng = await engineWith([
      '-m',
      tiny,
      '--embedding',
      '--pooling',
      'mean',
      '-c',
      '1024',
      '-np',
      '2',
      '--rpc-port',
      String(port),
    ]);
    openai = new OpenAI({ baseURL: `${eng.url}/v1`, apiKey: 'unused', maxRetries: 0 });
  }, 60_000);
  afterAll(async () => {
    await eng?.close();
  });

  it('the openai client: float embeddings equal llama-embedding, with usage', async () => {
    const r = await openai.embeddings.create({ model: 'tiny', input: TEXTS, encoding_format: 'float' });
    const want = await reference(tiny, 'mean', 2);
    expect(r.object).toBe('list');
    expect(r.model).toBe('tiny');
    expect(r.data.map((d) => [d.object, d.index])).toEqual([
      ['embedding', 0],
      ['embedding', 1],
    ]);
    for (let i = 0; i < 2; i++) expect(maxDiff(r.data[i]!.embedding, want[i]!)).toBeLessThan(2e-6);
    const tokens = await post(eng.url, '/tokenize', { content: TEXTS[0], add_special: true });
    const tokens1 = await post(eng.url, '/tokenize', { content: TEXTS[1], add_special: true });
    const n = tokens.json.tokens.length + tokens1.json.tokens.length;
    expect(r.usage).toEqual({ prompt_tokens: n, total_tokens: n });
  });

  it('the openai client: base64 embeddings decode to the float ones', async () => {
    // The client asks for base64 by default and decodes it into numbers itself.
    const b = await openai.embeddings.create({ model: 'tiny', input: TEXTS[1]! });
    const f = await openai.embeddings.create({ model: 'tiny', input: TEXTS[1]!, encoding_format: 'float' });
    expect(b.data[0]!.embedding).toEqual(f.data[0]!.embedding);
    const raw = await post(eng.url, '/v1/embeddings', { input: TEXTS[1], encoding_format: 'base64' });
    expect(raw.json.data[0].encoding_format).toBe('base64');
    const bytes = Buffer.from(raw.json.data[0].embedding, 'base64');
    expect(Array.from(new Float32Array(bytes.buffer, bytes.byteOffset, bytes.length / 4))).toEqual(
      f.data[0]!.embedding,
    );
  });

  it('token arrays and mixed inputs embed as their text does', async () => {
    const ids = (await post(eng.url, '/tokenize', { content: TEXTS[0], add_special: true })).json.tokens;
    const r = await post(eng.url, '/v1/embeddings', { input: [ids, TEXTS[0]] });
    expect(r.status).toBe(200);
    expect(maxDiff(r.json.data[0].embedding, r.json.data[1].embedding)).toBeLessThan(1e-6);
    const one = await post(eng.url, '/v1/embeddings', { input: ids });
    expect(one.json.data).toHaveLength(1);
    expect(maxDiff(one.json.data[0].embedding, r.json.data[0].embedding)).toBeLessThan(1e-6);
  });

  it('embd_normalize -1, 0 and 3 on /embedding in its native shape equal llama-embedding', async () => {
    for (const normalize of [-1, 0, 3]) {
      const r = await post(eng.url, '/embedding', { content: TEXTS, embd_normalize: normalize });
      expect(r.status).toBe(200);
      const want = await reference(tiny, 'mean', normalize);
      expect(r.json.map((e: any) => e.index)).toEqual([0, 1]);
      for (let i = 0; i < 2; i++) {
        expect(r.json[i].embedding).toHaveLength(1);
        expect(maxDiff(r.json[i].embedding[0], want[i]!)).toBeLessThan(normalize === 0 ? 1 : 2e-6);
      }
    }
    // /embeddings is the same route; "content" takes the native shape even on /v1/embeddings.
    const a = await post(eng.url, '/embeddings', { content: TEXTS[0] });
    const b = await post(eng.url, '/v1/embeddings', { content: TEXTS[0] });
    expect(b.json).toEqual(a.json);
  }, 180_000);

  it('bad input gets a 400 naming the field', async () => {
    const cases: [unknown, string][] = [
      [{}, 'input'],
      [{ input: [] }, 'input'],
      [{ input: [{}] }, 'input'],
      [{ input: 'x', encoding_format: 'hex' }, 'encoding_format'],
      [{ input: 'x', embd_normalize: 'two' }, 'embd_normalize'],
      [{ input: 'x', dimensions: 8 }, 'dimensions'],
      [{ input: [[999999]] }, 'input'],
      [{ input: 'hello world '.repeat(600) }, 'input'],
    ];
    for (const [body, key] of cases) {
      const r = await post(eng.url, '/v1/embeddings', body);
      expect(r.status, JSON.stringify(body).slice(0, 60)).toBe(400);
      expect(r.json.error.keys).toEqual([key]);
    }
    const get = await fetch(`${eng.url}/v1/embeddings`);
    expect(get.status).toBe(405);
    await get.body?.cancel();
  });

  it('completions still work, and embeddings between their decode steps leave their tokens unchanged', async () => {
    const body = { prompt: 'Once upon a time', max_tokens: 48, temperature: 0, ignore_eos: true };
    const alone = (await complete(eng.url, body)).json.choices[0].text;
    const inputs = Array.from({ length: 12 }, (_, i) => `${TEXTS[i % 2]} ${i}`);
    const [together, emb] = await Promise.all([
      complete(eng.url, body),
      // One slot is free while the completion runs: the 12 inputs take 12 batches between its steps.
      post(eng.url, '/v1/embeddings', { input: inputs }),
    ]);
    expect(together.json.choices[0].text).toBe(alone);
    expect(emb.status).toBe(200);
    expect(emb.json.data).toHaveLength(12);
    const solo = await post(eng.url, '/v1/embeddings', { input: inputs[5] });
    expect(maxDiff(emb.json.data[5].embedding, solo.json.data[0].embedding)).toBeLessThan(1e-6);
  });

  it('a running request waits at most one embedding batch between two of its steps', async () => {
    // 80 inputs through the one free slot take 80 batches, each followed by a decode step of the
    // running completion; embeddings that ran all before its next step would leave it ~0 steps.
    const ids = (await post(eng.url, '/tokenize', { content: TEXTS[0], add_special: true })).json.tokens;
    const engine = (eng as unknown as { engine: { counters: { decodeSteps: number } } }).engine;
    let during = -1;
    let emb: Promise<{ status: number; json: any }> | undefined;
    const gen = stream(
      eng.url,
      { prompt: 'Once upon a time', max_tokens: 400, temperature: 0, ignore_eos: true },
      () => {
        const before = engine.counters.decodeSteps;
        emb = post(eng.url, '/v1/embeddings', { input: Array.from({ length: 80 }, () => ids) });
        emb.then(() => {
          during = engine.counters.decodeSteps - before;
        });
      },
    );
    const done = await gen;
    expect(done.finish).toBe('length');
    const r = await emb!;
    expect(r.json.data).toHaveLength(80);
    expect(during).toBeGreaterThanOrEqual(40);
  });

  it('pooling_type: CONFIGURE rebuilds the context with the new pooling (cls, last, none)', async () => {
    for (const pooling of ['cls', 'last']) {
      await configure(port, { pooling_type: pooling });
      const r = await openai.embeddings.create({ model: 'tiny', input: TEXTS, encoding_format: 'float' });
      const want = await reference(tiny, pooling, 2);
      for (let i = 0; i < 2; i++) expect(maxDiff(r.data[i]!.embedding, want[i]!)).toBeLessThan(2e-6);
    }
    await configure(port, { pooling_type: 'none' });
    // llama-server: pooling none is not OpenAI's; the native route gives every token's row.
    const oai = await post(eng.url, '/v1/embeddings', { input: TEXTS[0] });
    expect(oai.status).toBe(400);
    const native = await post(eng.url, '/embedding', { content: TEXTS[0] });
    const n = (await post(eng.url, '/tokenize', { content: TEXTS[0], add_special: true })).json.tokens.length;
    expect(native.json[0].embedding).toHaveLength(n);
    const want = await reference(tiny, 'none', -1, [TEXTS[0]!], n);
    expect(maxDiff(native.json[0].embedding.flat(), want.flat())).toBeLessThan(2e-6);
    await configure(port, { pooling_type: 'mean' });
  }, 180_000);

  it('embd_normalize: CONFIGURE sets the normalization of requests that name none', async () => {
    await configure(port, { embd_normalize: -1 });
    const r = await post(eng.url, '/v1/embeddings', { input: TEXTS });
    const want = await reference(tiny, 'mean', -1);
    for (let i = 0; i < 2; i++) expect(maxDiff(r.json.data[i].embedding, want[i]!)).toBeLessThan(2e-6);
    await configure(port, { embd_normalize: 2 });
  });

  it('/v1/rerank without --reranking answers 501 as llama-server', async () => {
    const r = await post(eng.url, '/v1/rerank', { query: 'q', documents: ['a'] });
    expect(r.status).toBe(501);
    expect(r.json.error.code).toBe('HYDRA_ERR_NOT_SUPPORTED');
  });
});

describe.skipIf(!existsSync(tool))('an engine without --embedding', () => {
  let eng: Awaited<ReturnType<typeof engineWith>>;
  let port: number;
  beforeAll(async () => {
    port = await freePort();
    eng = await engineWith(['-m', tiny, '-c', '512', '--rpc-port', String(port)]);
  }, 60_000);
  afterAll(async () => {
    await eng?.close();
  });

  it('answers the embedding routes 501 until CONFIGURE embedding turns them on', async () => {
    for (const path of ['/embedding', '/embeddings', '/v1/embeddings']) {
      const r = await post(eng.url, path, { input: 'x' });
      expect(r.status, path).toBe(501);
      expect(r.json.error.code).toBe('HYDRA_ERR_NOT_SUPPORTED');
    }
    await configure(port, { embedding: true });
    // The model's own pooling (none for the llama layout): not OpenAI's, and a row per token.
    const oai = await post(eng.url, '/v1/embeddings', { input: TEXTS[0] });
    expect(oai.status).toBe(400);
    expect(oai.json.error.keys).toEqual(['pooling_type']);
    const n = (await post(eng.url, '/tokenize', { content: TEXTS[0], add_special: true })).json.tokens.length;
    expect((await post(eng.url, '/embedding', { content: TEXTS[0] })).json[0].embedding).toHaveLength(n);
    await configure(port, { embedding: false });
  });
});

describe.skipIf(!existsSync(tool))('rerank on --reranking with the synthetic reranker', () => {
  let eng: Awaited<ReturnType<typeof engineWith>>;
  const QUERY = 'hello there';
  const DOCS = ['the cat sat', 'a dog ran far away', 'hello there friend', 'one two three'];
  beforeAll(async () => {
    eng = await engineWith(['-m', reranker, '--reranking', '-c', '1024', '-np', '2']);
  }, 60_000);
  afterAll(async () => {
    await eng?.close();
  });

  it('Jina shape: every document scored, sorted, top_n, usage; scores equal llama-embedding', async () => {
    const r = await post(eng.url, '/v1/rerank', { model: 'rr', query: QUERY, documents: DOCS });
    expect(r.status).toBe(200);
    expect(r.json.object).toBe('list');
    expect(r.json.model).toBe('rr');
    const results = r.json.results as { index: number; relevance_score: number }[];
    expect(results.map((x) => x.index).sort()).toEqual([0, 1, 2, 3]);
    for (let i = 1; i < results.length; i++)
      expect(results[i - 1]!.relevance_score).toBeGreaterThanOrEqual(results[i]!.relevance_score);
    expect(new Set(results.map((x) => x.relevance_score)).size).toBe(4);
    const top = await post(eng.url, '/rerank', { query: QUERY, documents: DOCS, top_n: 2 });
    expect(top.json.results).toEqual(results.slice(0, 2));
    // The prompt is BOS, query, document (the vocabulary adds no EOS or SEP): the same tokens as
    // the joined text, which llama-embedding scores.
    const tok = async (content: string, add_special: boolean) =>
      (await post(eng.url, '/tokenize', { content, add_special })).json.tokens as number[];
    let tokens = 0;
    for (const [i, doc] of DOCS.entries()) {
      const joined = await tok(`${QUERY} ${doc}`, true);
      expect(joined).toEqual([...(await tok(QUERY, true)), ...(await tok(doc, false))]);
      tokens += joined.length;
      // Retried as reference() is: llama-embedding's output is cut short now and then.
      let m: RegExpExecArray | null = null;
      for (let attempt = 0; attempt < 20 && !m; attempt++) {
        const out = await run([
          '-m',
          reranker,
          '--pooling',
          'rank',
          '--embd-normalize',
          '-1',
          '-c',
          '512',
          '-p',
          `${QUERY} ${doc}`,
        ]);
        m = /rerank score 0:\s+(-?[\d.]+) \[yes\]/.exec(out);
      }
      const score = Number(m![1]);
      expect(Math.abs(results.find((x) => x.index === i)!.relevance_score - score)).toBeLessThan(6e-4);
    }
    expect(r.json.usage).toEqual({ prompt_tokens: tokens, total_tokens: tokens });
  }, 180_000);

  it('TEI shape with texts and return_text; /reranking and /v1/reranking are the same route', async () => {
    const r = await post(eng.url, '/reranking', { query: QUERY, texts: DOCS, return_text: true });
    expect(Array.isArray(r.json)).toBe(true);
    for (const x of r.json) expect(x.text).toBe(DOCS[x.index]);
    const jina = await post(eng.url, '/v1/reranking', { query: QUERY, documents: DOCS });
    expect(r.json.map((x: any) => [x.index, x.score])).toEqual(
      jina.json.results.map((x: any) => [x.index, x.relevance_score]),
    );
  });

  it('bad input gets a 400 naming the field', async () => {
    const cases: [unknown, string][] = [
      [{ documents: DOCS }, 'query'],
      [{ query: 3, documents: DOCS }, 'query'],
      [{ query: QUERY }, 'texts'],
      [{ query: QUERY, documents: [] }, 'documents'],
      [{ query: QUERY, documents: [1] }, 'documents'],
      [{ query: QUERY, documents: DOCS, top_n: -1 }, 'top_n'],
      [{ query: QUERY, documents: DOCS, return_text: true }, 'return_text'],
    ];
    for (const [body, key] of cases) {
      const r = await post(eng.url, '/v1/rerank', body);
      expect(r.status, JSON.stringify(body)).toBe(400);
      expect(r.json.error.keys).toEqual([key]);
    }
  });
});

describe.skipIf(!existsSync(tool))('--reranking on a model without a classification head', () => {
  it('answers /v1/rerank 501 naming --reranking', async () => {
    const eng = await engineWith(['-m', tiny, '--reranking', '-c', '512']);
    try {
      const r = await post(eng.url, '/v1/rerank', { query: 'q', documents: ['a'] });
      expect(r.status).toBe(501);
      expect(r.json.error.message).toContain('--reranking');
    } finally {
      await eng.close();
    }
  });
});

describe('the flags', () => {
  it('--pooling takes llama-server values only (exit 2 naming it)', async () => {
    const r = await runCli(['--pooling', 'max', '-m', 'x.gguf']);
    expect(r.code).toBe(2);
    expect(r.out).toContain('--pooling');
  });
});
