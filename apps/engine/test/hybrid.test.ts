import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { writeSyntheticModel } from '@hydra-engine/native-ggml/synth';
import { EXPERT_TENSOR_REGEX } from '@hydra-engine/resolver';
import { type StockRpcServer, stockRpcServer } from '@hydra-engine/test-kit';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { readGgufFile } from '../src/placement.js';
import { engineWith } from './helpers.js';

// The hybrid synthetic models (qwen35: gated delta-net recurrent blocks with full attention every
// 4th block; qwen35moe: the same with routed + shared experts) through the engine's HTTP API.
// Their memory cannot drop a partial range of positions (llama_memory_seq_rm refuses it), which
// prompt-cache reuse relies on for a plain KV cache.

const exec = promisify(execFile);
const BIN = '../../../packages/native-ggml/build/bin/';
const SIMPLE = new URL(`${BIN}llama-simple`, import.meta.url).pathname;
const PROMPT = 'the cat and the dog went to the market';
type Eng = Awaited<ReturnType<typeof engineWith>>;

interface Completion {
  text: string;
  finish: string;
  cached: number;
}

async function complete(eng: Eng, body: Record<string, unknown>): Promise<Completion> {
  const res = await fetch(`${eng.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ temperature: 0, ...body }),
  });
  const json = (await res.json()) as {
    choices: { text: string; finish_reason: string }[];
    usage: { prompt_tokens_details?: { cached_tokens: number } };
  };
  expect(res.status, JSON.stringify(json)).toBe(200);
  return {
    text: json.choices[0]!.text,
    finish: json.choices[0]!.finish_reason,
    cached: json.usage.prompt_tokens_details?.cached_tokens ?? 0,
  };
}

let dir: string;
beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), 'hydra-hybrid-'));
});
afterAll(() => {
  rmSync(dir, { recursive: true, force: true });
});

describe.each(['qwen35', 'qwen35moe'] as const)('tiny %s through the HTTP API', (arch) => {
  let model: string;
  let eng: Eng;
  const open: Eng[] = [];
  beforeAll(async () => {
    model = join(dir, `tiny-${arch}.gguf`);
    await writeSyntheticModel({ arch, shape: 'tiny', quant: 'f32', seed: 7, out: model });
    eng = await engineWith(['-m', model, '-np', '2', '-c', '2048']);
    open.push(eng);
  }, 60_000);
  afterAll(async () => {
    for (const e of open.reverse()) await e.close();
  });

  it('gives the greedy text of stock llama-simple', async () => {
    const ours = await complete(eng, { prompt: PROMPT, max_tokens: 16 });
    const { stdout } = await exec(SIMPLE, ['-m', model, '-n', '16', PROMPT], { timeout: 60_000 });
    // llama-simple prints pieces with printf("%s"): the <0x00> byte token prints nothing.
    expect(stdout.trimEnd()).toBe(`<s> ${PROMPT}${ours.text.replaceAll('\0', '')}`.trimEnd());
  });

  it('gives the same tokens with cache_prompt as without, however the cached prefix ends', async () => {
    const base = { max_tokens: 12, ignore_eos: true };
    const fresh = async (prompt: string) =>
      (await complete(eng, { ...base, prompt, cache_prompt: false, id_slot: 1 })).text;
    const prompts = [
      PROMPT,
      // The same prompt again: a plain KV cache would keep all but its last token.
      PROMPT,
      // Diverges inside the cached prompt.
      'the cat and the dog ran to the river',
      // Extends what the slot holds (its prompt and generated text): the whole of it is reusable.
      '',
    ];
    let held = '';
    for (const [i, p] of prompts.entries()) {
      const prompt = p === '' ? held : p;
      const cached = await complete(eng, { ...base, prompt, cache_prompt: true, id_slot: 0 });
      expect(cached.text, `request ${i}`).toBe(await fresh(prompt));
      held = `${prompt}${cached.text} and more`;
    }
  });

  it('reuses a slot whole when the prompt extends it, else from a checkpoint or from scratch (token prompts)', async () => {
    const engine = eng.engine;
    const params = { maxTokens: 8, stop: [], sampler: { temp: 0 }, ignoreEos: true };
    const fresh = async (prompt: Int32Array) => (await engine.submit(prompt, params, { slot: 1 })).tokens;
    const cached = (prompt: Int32Array) => engine.submit(prompt, params, { slot: 0, cachePrompt: true });
    const p = engine.tokenize(PROMPT);
    // Text tokens without the <s> that tokenize puts first.
    const words = (text: string) => engine.tokenize(text).subarray(1);
    expect(engine.tokenize(' x')[0]).toBe(p[0]);
    const first = await cached(p);
    expect(first.tokens).toEqual(await fresh(p));
    // The slot holds the prompt and every generated token but the last (never fed).
    const extended = Int32Array.from([...p, ...first.tokens, ...words(' and more')]);
    const ext = await cached(extended);
    expect(ext.cachedTokens).toBe(p.length + first.tokens.length - 1);
    expect(ext.tokens).toEqual(await fresh(extended));
    // Anything shorter than what the slot holds needs a partial removal: the prompt checkpoint 4
    // tokens before the first prompt's end is restored (test/checkpoints.test.ts), and a prompt
    // that diverges before it is read from the start.
    for (const [k, q] of [
      p,
      Int32Array.from([...p.subarray(0, 4), ...words(' ran to the river')]),
    ].entries()) {
      const r = await cached(q);
      expect(r.cachedTokens).toBe(k === 0 ? p.length - 4 : 0);
      expect(r.tokens).toEqual(await fresh(q));
    }
  });

  it('ends on a stop string (the step queued ahead fed one token more) and the slot still answers right', async () => {
    const prompt = 'people who could write';
    const full = await complete(eng, {
      prompt,
      max_tokens: 24,
      ignore_eos: true,
      cache_prompt: false,
      id_slot: 1,
    });
    const stop = full.text.slice(8, 11);
    const body = { prompt, max_tokens: 24, ignore_eos: true, stop: [stop], cache_prompt: true, id_slot: 0 };
    const first = await complete(eng, body);
    expect(first.finish).toBe('stop');
    expect(first.text).toBe(full.text.slice(0, full.text.indexOf(stop)));
    expect((await complete(eng, { ...body, stop: [] })).text).toBe(full.text);
  });

  it('feeds a long prompt in chunks of n_batch beside a running stream with the one-step tokens', async () => {
    const chunked = await engineWith(['-m', model, '-np', '2', '-c', '2048', '-b', '16']);
    open.push(chunked);
    const long = Array.from({ length: 20 }, (_, i) => `the ${i} cat`).join(' and ');
    const body = (prompt: string) => ({ prompt, max_tokens: 12, ignore_eos: true, cache_prompt: false });
    const [stream, whole] = [await complete(eng, body('Hello world')), await complete(eng, body(long))];
    const [s, w] = await Promise.all([complete(chunked, body('Hello world')), complete(chunked, body(long))]);
    expect(chunked.engine.counters.promptChunks).toBeGreaterThan(4);
    expect([s.text, w.text]).toEqual([stream.text, whole.text]);
  });

  it('serves two slots at once with the same tokens as one at a time', async () => {
    const prompts = ['Hello world', 'one two three four five'];
    const alone: string[] = [];
    for (const prompt of prompts)
      alone.push((await complete(eng, { prompt, max_tokens: 24, ignore_eos: true })).text);
    const both = await Promise.all(
      prompts.map((prompt) => complete(eng, { prompt, max_tokens: 24, ignore_eos: true })),
    );
    expect(both.map((c) => c.text)).toEqual(alone);
  });

  it('restores a saved slot into another engine and continues identically', async () => {
    const other = await engineWith(['-m', model, '-np', '2', '-c', '2048']);
    open.push(other);
    const body = { prompt: PROMPT, max_tokens: 8, ignore_eos: true, cache_prompt: true, id_slot: 1 };
    const first = await complete(eng, body);
    const state = await eng.engine.getSlotState(1);
    await other.engine.setSlotState(1, state);
    const next = { ...body, prompt: `${PROMPT}${first.text} then` };
    expect((await complete(other, next)).text).toBe(
      (await complete(eng, { ...next, cache_prompt: false })).text,
    );
  });

  // A stock ggml-rpc-server as the peer; the same split onto a Hydra peer engine (whose ggml-RPC
  // guard checks SSM_CONV and the other recurrent ops) is in hybrid-split.test.ts.
  it('splits its layers with a stock ggml-RPC peer (-ngl 4: blocks 5-7 and the output remote) with the SOLO tokens', async () => {
    const solo = await complete(eng, { prompt: PROMPT, max_tokens: 16, ignore_eos: true });
    const server = await stockRpcServer({ threads: 1, timeoutMs: 10_000 });
    try {
      const { endpoint } = server;
      const head = await engineWith(['-m', model, '--rpc', endpoint, '-ngl', '4', '-c', '1024']);
      open.push(head);
      const health = (await (await fetch(`${head.url}/health`)).json()) as {
        placement?: { device: string }[];
      };
      expect(health.placement?.some((r) => r.device.startsWith('RPC'))).toBe(true);
      expect(health.placement?.some((r) => !r.device.startsWith('RPC'))).toBe(true);
      expect((await complete(head, { prompt: PROMPT, max_tokens: 16, ignore_eos: true })).text).toBe(
        solo.text,
      );
      await head.close();
      open.pop();
    } finally {
      await server.stop();
    }
  }, 60_000);
});

describe('tiny qwen35moe expert placement on a stock ggml-RPC peer', () => {
  const open: Eng[] = [];
  let server: StockRpcServer | undefined;
  afterAll(async () => {
    for (const e of open.reverse()) await e.close();
    await server?.stop();
  });

  it('puts the routed experts on the peer, keeps shared experts local, and flips with the SOLO tokens', async () => {
    const model = join(dir, 'tiny-qwen35moe-experts.gguf');
    await writeSyntheticModel({ arch: 'qwen35moe', shape: 'tiny', quant: 'q8_0', seed: 4, out: model });
    const names = (await readGgufFile(model)).tensors.map((t) => t.name);
    const pattern = new RegExp(EXPERT_TENSOR_REGEX);
    const remote = names.filter((n) => pattern.test(n));
    expect(remote.length).toBe(8 * 3);
    expect(remote.every((n) => n.endsWith('_exps.weight'))).toBe(true);
    expect(names.filter((n) => n.includes('_shexp')).some((n) => pattern.test(n))).toBe(false);
    const body = { prompt: PROMPT, max_tokens: 16, ignore_eos: true };
    const solo = await engineWith(['-m', model]);
    open.push(solo);
    const reference = (await complete(solo, body)).text;
    server = await stockRpcServer({ threads: 1, timeoutMs: 10_000 });
    const { endpoint } = server;
    const head = await engineWith(['-m', model, '--rpc', endpoint, '-c', '1024']);
    open.push(head);
    expect(head.engine.dualPlacement).toBe(true);
    expect(head.engine.mode).toBe('combined');
    expect((await complete(head, body)).text).toBe(reference);
    for (const mode of ['solo', 'combined', 'solo']) {
      const res = await fetch(`${head.url}/control/set_expert_mode`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ mode }),
      });
      expect(await res.json()).toMatchObject({ success: true, mode, reloaded: false });
      expect((await complete(head, body)).text).toBe(reference);
    }
  }, 60_000);
});
