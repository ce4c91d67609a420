import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { FLAGS, parseServeArgs, usage } from '../src/args.js';
import type { HydraError } from '../src/errors.js';
import { UNSUPPORTED_FLAGS } from '../src/llama-flags.js';
import { engineWith, runCli, tinyModel } from './helpers.js';

const NO_ENV = {};

function refusal(fn: () => unknown): HydraError {
  try {
    fn();
  } catch (err) {
    return err as HydraError;
  }
  throw new Error('expected a refusal');
}

describe("llama-server's flag names, values and defaults", () => {
  it('maps its names and words to registry keys', () => {
    const dir = mkdtempSync(join(tmpdir(), 'hydra-flags-'));
    const grammar = join(dir, 'g.gbnf');
    writeFileSync(grammar, 'root ::= "a"');
    const a = parseServeArgs(
      [
        '--ctx-size',
        '2048',
        '-ngl',
        'all',
        '--temperature',
        '0.5',
        '--typical',
        '0.9',
        '--presence-penalty',
        '0.25',
        '--mirostat-lr',
        '0.2',
        '-l',
        '15+1.5',
        '-l',
        '20-2',
        '--samplers',
        'top_k;temperature',
        '--grammar-file',
        grammar,
        '-nkvo',
        '--predict',
        '7',
      ],
      NO_ENV,
    ).layers;
    expect(a.get('n_ctx')).toBe(2048);
    expect(a.get('n_gpu_layers')).toBe(-2);
    expect(a.get('sampling.temp')).toBe(0.5);
    expect(a.get('sampling.typ_p')).toBe(0.9);
    expect(a.get('sampling.penalty_present')).toBe(0.25);
    expect(a.get('sampling.mirostat_eta')).toBe(0.2);
    expect(a.get('sampling.logit_bias')).toEqual({ 15: 1.5, 20: -2 });
    expect(a.get('sampling.samplers')).toEqual(['top_k', 'temperature']);
    expect(a.get('sampling.grammar')).toBe('root ::= "a"');
    expect(a.get('no_kv_offload')).toBe(true);
    expect(a.get('n_predict')).toBe(7);
    expect(parseServeArgs(['-ngl', 'auto'], NO_ENV).layers.get('n_gpu_layers')).toBe('auto');
    const np = parseServeArgs(['-np', 'auto'], NO_ENV).layers;
    expect([np.get('n_parallel'), np.get('kv_unified')]).toEqual([4, true]);
    const s = parseServeArgs(
      ['--alias', 'x,y', '--no-cache-prompt', '--chat-template', 'chatml', '--metrics', '-cb', '--no-jinja'],
      NO_ENV,
    ).settings;
    expect(s.aliases).toEqual(['x', 'y']);
    expect(s.cachePrompt).toBe(false);
    expect(s.chatTemplate).toBe('chatml');
    expect(s.jinja).toBe(false);
    expect(parseServeArgs([], NO_ENV).settings.jinja).toBe(true);
    for (const [flags, key] of [
      [['-l', '15*2'], '-l'],
      [['-ngl', 'most'], '-ngl'],
      [['--grammar-file', join(dir, 'absent')], '--grammar-file'],
    ] as const) {
      const e = refusal(() => parseServeArgs([...flags], NO_ENV));
      expect(e.code).toBe('HYDRA_ERR_BAD_ARGUMENT');
      expect(e.keys).toEqual([key]);
    }
  });

  it('reads LLAMA_ARG_* variables when the flag is not given; the flag wins', () => {
    const env = {
      LLAMA_ARG_CTX_SIZE: '3072',
      LLAMA_ARG_MMAP: 'false',
      LLAMA_API_KEY: 'k1,k2',
      LLAMA_ARG_ALIAS: 'from-env',
      LLAMA_ARG_ENDPOINT_SLOTS: 'off',
      LLAMA_ARG_KV_OFFLOAD: '0',
      LLAMA_ARG_N_GPU_LAYERS: 'all',
      LLAMA_ARG_JINJA: 'false',
    };
    const a = parseServeArgs([], env);
    expect(a.layers.get('n_ctx')).toBe(3072);
    expect(a.layers.get('use_mmap')).toBe(false);
    expect(a.layers.startOnly().api_key).toBe('k1,k2');
    expect(a.layers.get('no_kv_offload')).toBe(true);
    expect(a.layers.get('n_gpu_layers')).toBe(-2);
    expect(a.settings.aliases).toEqual(['from-env']);
    expect(a.settings.slotsEndpoint).toBe(false);
    expect(parseServeArgs(['-c', '512'], env).layers.get('n_ctx')).toBe(512);
    const badBool = refusal(() => parseServeArgs([], { LLAMA_ARG_MLOCK: 'maybe' }));
    expect(badBool.keys).toEqual(['LLAMA_ARG_MLOCK']);
    const badInt = refusal(() => parseServeArgs([], { LLAMA_ARG_CTX_SIZE: 'big' }));
    expect(badInt.keys).toEqual(['LLAMA_ARG_CTX_SIZE']);
    const refused = refusal(() => parseServeArgs([], { LLAMA_ARG_MMPROJ: 'p.gguf' }));
    expect(refused.code).toBe('HYDRA_ERR_BAD_ARGUMENT');
    expect(refused.keys).toEqual(['LLAMA_ARG_MMPROJ']);
    expect(refused.message).toMatch(/not supported yet/);
  });

  it('--embedding, --pooling, --reranking, --embd-normalize and their variables', () => {
    const flags = parseServeArgs(
      ['--embeddings', '--pooling', 'cls', '--embd-normalize', '-1'],
      NO_ENV,
    ).layers;
    expect([flags.get('embedding'), flags.get('pooling_type'), flags.get('embd_normalize')]).toEqual([
      true,
      'cls',
      -1,
    ]);
    const env = parseServeArgs([], { LLAMA_ARG_EMBEDDINGS: '1', LLAMA_ARG_POOLING: 'last' }).layers;
    expect([env.get('embedding'), env.get('pooling_type')]).toEqual([true, 'last']);
    for (const a of [parseServeArgs(['--rerank'], NO_ENV), parseServeArgs([], { LLAMA_ARG_RERANKING: 'on' })])
      expect([a.layers.get('embedding'), a.layers.get('pooling_type')]).toEqual([true, 'rank']);
    expect(parseServeArgs([], { LLAMA_ARG_RERANKING: '0' }).layers.get('embedding')).toBe(false);
    expect(refusal(() => parseServeArgs(['--pooling', 'max'], NO_ENV)).keys).toEqual(['--pooling']);
  });

  it('refuses every flag of a feature that does not exist yet, by name', () => {
    for (const f of UNSUPPORTED_FLAGS) {
      for (const name of f.names) {
        const e = refusal(() => parseServeArgs([name, ...(f.takesValue ? ['x'] : [])], NO_ENV));
        expect(e.code, name).toBe('HYDRA_ERR_BAD_ARGUMENT');
        expect(e.keys, name).toEqual([name]);
        expect(e.message, name).toMatch(new RegExp(`^${name} is not supported yet: `));
      }
      // None of them is also an accepted flag.
      for (const name of f.names)
        expect(
          FLAGS.some((s) => s.names.includes(name)),
          name,
        ).toBe(false);
    }
  });

  it('--help lists the flags in llama-server groups with their variables', () => {
    const text = usage();
    const at = (s: string) => text.indexOf(s);
    expect(at('----- common params -----')).toBeGreaterThan(0);
    expect(at('----- sampling params -----')).toBeGreaterThan(at('----- common params -----'));
    expect(at('----- example-specific params -----')).toBeGreaterThan(at('----- sampling params -----'));
    expect(at('----- hydra-engine params -----')).toBeGreaterThan(at('----- example-specific params -----'));
    expect(text).toMatch(/-c, --ctx-size .*\(env: LLAMA_ARG_CTX_SIZE\)/);
    expect(text).toMatch(/--temp .*\n/);
    expect(text).toMatch(/not supported yet \(exit 2\): .*--reasoning-budget/);
    // Every flag is listed exactly once.
    for (const f of FLAGS) expect(text.split(`  ${f.names.join(', ')} `).length - 1, f.names[0]).toBe(1);
  });

  it('the CLI exits 2 naming an unsupported flag', async () => {
    const r = await runCli(['--reasoning-budget', '0']);
    expect(r.code).toBe(2);
    expect(r.out).toContain('--reasoning-budget is not supported yet');
    const e = await runCli(['--mmproj', 'p.gguf', '-m', 'x.gguf']);
    expect(e.code).toBe(2);
    expect(e.out).toContain('--mmproj is not supported yet');
  });
});

describe('the flags take effect on a running engine', () => {
  let model: string;
  let eng: Awaited<ReturnType<typeof engineWith>>;
  beforeAll(async () => {
    model = await tinyModel();
    eng = await engineWith(['-m', model, '--no-cache-prompt', '--chat-template', 'chatml', '-c', '512']);
  }, 60_000);
  afterAll(async () => {
    await eng?.close();
  });

  const post = async (path: string, body: unknown) =>
    (await (await fetch(`${eng.url}${path}`, { method: 'POST', body: JSON.stringify(body) })).json()) as any;

  it('--no-cache-prompt: a request without cache_prompt reuses nothing; cache_prompt: true still does', async () => {
    const req = { prompt: 'no reuse unless asked', max_tokens: 4, temperature: 0 };
    await post('/v1/completions', req);
    expect((await post('/v1/completions', req)).usage.prompt_tokens_details.cached_tokens).toBe(0);
    await post('/v1/completions', { ...req, cache_prompt: true });
    const again = await post('/v1/completions', { ...req, cache_prompt: true });
    expect(again.usage.prompt_tokens_details.cached_tokens).toBeGreaterThan(0);
  });

  it('--chat-template chatml renders chats with it, in /apply-template and in chat requests', async () => {
    const messages = [{ role: 'user', content: 'hello' }];
    const r = await post('/apply-template', { messages });
    expect(r.prompt).toBe('<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n');
    const tokenized = await post('/tokenize', { content: r.prompt, add_special: true });
    const chat = await post('/v1/chat/completions', { messages, max_tokens: 2, temperature: 0 });
    expect(chat.usage.prompt_tokens).toBe(tokenized.tokens.length);
  });
});
