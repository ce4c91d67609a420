import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { HydraClient } from '@hydra-engine/hydra-rpc';
import { writeSyntheticModel } from '@hydra-engine/native-ggml/synth';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { GenerationParams } from '../src/engine.js';
import { expectRestoredContinuation, freePort, complete as http } from './control-helpers.js';
import { engineWith } from './helpers.js';

// What touches a slot's memory, on the hybrid models (recurrent state on most blocks, KV on every
// 4th): slot files across a restart, STATE_GET/PUT migration, context limits, n > 1, four parallel
// slots, the pipelined decode and chunked prefill with a cancel. Greedy tokens are held to a
// reference run each time, because a recurrent state restored or fed wrongly still yields tokens.
type Eng = Awaited<ReturnType<typeof engineWith>>;
const greedy = { temperature: 0, ignore_eos: true, return_tokens: true, cache_prompt: false };
const params = (maxTokens: number): GenerationParams => ({
  maxTokens,
  stop: [],
  sampler: { temp: 0 },
  ignoreEos: true,
});
const PROMPT = 'the cat and the dog went to the market';

let dir: string;
beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), 'hydra-hybrid-memory-'));
});
afterAll(() => {
  rmSync(dir, { recursive: true, force: true });
});

async function tokensOf(eng: Eng, body: Record<string, unknown>): Promise<number[]> {
  const r = await http(eng.url, { ...greedy, ...body });
  expect(r.status, JSON.stringify(r.json)).toBe(200);
  return r.json.choices[0].tokens;
}

async function withPipeline<T>(on: boolean, start: () => Promise<T>): Promise<T> {
  const saved = process.env.HYDRA_PIPELINE;
  process.env.HYDRA_PIPELINE = on ? '1' : '0';
  try {
    return await start();
  } finally {
    if (saved === undefined) delete process.env.HYDRA_PIPELINE;
    else process.env.HYDRA_PIPELINE = saved;
  }
}

describe.each(['qwen35', 'qwen35moe'] as const)('tiny %s memory', (arch) => {
  let model: string;
  let slotDir: string;
  let eng: Eng;
  let port: number;
  const open: Eng[] = [];
  const start = async (flags: string[]) => {
    const e = await engineWith(['-m', model, ...flags]);
    open.push(e);
    return e;
  };
  const close = async (e: Eng) => {
    open.splice(open.indexOf(e), 1);
    await e.close();
  };
  beforeAll(async () => {
    model = join(dir, `${arch}.gguf`);
    slotDir = mkdtempSync(join(dir, `${arch}-slots-`));
    // f32: with q8_0 weights, tiny qwen35moe's 14th token for 'one two three four five' is a near
    // tie (log-probabilities -4.337 and -4.346) that a batch of two rows rounds the other way.
    await writeSyntheticModel({ arch, shape: 'tiny', quant: 'f32', seed: 11, out: model });
    port = await freePort();
    eng = await start(['-np', '4', '-c', '4096', '-b', '512', '--rpc-port', String(port)]);
  }, 60_000);
  afterAll(async () => {
    for (const e of open.reverse()) await e.close();
  });

  it('a slot saved to a file continues identically after a restart', async () => {
    const flags = ['-np', '2', '-c', '2048', '--slot-save-path', slotDir];
    const prompt = Array.from(eng.engine.tokenize(PROMPT));
    const want = await tokensOf(eng, { prompt, max_tokens: 20 });
    const first = await start(flags);
    const got = await tokensOf(first, { prompt, max_tokens: 10, id_slot: 1, cache_prompt: true });
    expect(got).toEqual(want.slice(0, 10));
    const res = await fetch(`${first.url}/slots/1?action=save`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ filename: 'hybrid.bin' }),
    });
    expect(res.status).toBe(200);
    // The prompt and every generated token but the last (never fed).
    expect(((await res.json()) as { n_saved: number }).n_saved).toBe(prompt.length + 9);
    await close(first);
    const again = await start(flags);
    const restore = await fetch(`${again.url}/slots/0?action=restore`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ filename: 'hybrid.bin' }),
    });
    expect(restore.status).toBe(200);
    const cont = [...prompt, ...got];
    await expectRestoredContinuation(
      again.url,
      { ...greedy, prompt: cont, max_tokens: 10, id_slot: 0 },
      want.slice(10),
    );
    await close(again);
  }, 60_000);

  it('STATE_GET on one engine, STATE_PUT on another: the second continues identically', async () => {
    const otherPort = await freePort();
    const other = await start(['-np', '4', '-c', '4096', '--rpc-port', String(otherPort)]);
    const ca = await HydraClient.connect({ port, encoding: 'json' });
    const cb = await HydraClient.connect({ port: otherPort, encoding: 'msgpack' });
    try {
      const prompt = Array.from(eng.engine.tokenize('people who could write the letters'));
      const want = await tokensOf(eng, { prompt, max_tokens: 16 });
      const got = await tokensOf(eng, { prompt, max_tokens: 8, id_slot: 2, cache_prompt: true });
      expect(got).toEqual(want.slice(0, 8));
      const parts: Uint8Array[] = [];
      let offset = 0;
      let total = 0;
      do {
        const r = await ca.stateGet({ slot: 2, offset, chunk_size: 16384 });
        total = r.total;
        parts.push(r.data);
        offset += r.data.length;
      } while (offset < total);
      expect(parts.length).toBeGreaterThan(1);
      let received = 0;
      for (const part of parts) {
        await cb.statePut({ slot: 1, offset: received, total, data: part });
        received += part.length;
      }
      // llama.cpp keeps one KV stream per sequence: a state from -np 4 does not load under -np 2, and
      // the client hears that its bytes are refused (400), not that the engine failed.
      const narrowPort = await freePort();
      const narrow = await start(['-np', '2', '-c', '2048', '--rpc-port', String(narrowPort)]);
      const cn = await HydraClient.connect({ port: narrowPort, encoding: 'json' });
      try {
        let sent = 0;
        const put = async () => {
          for (const part of parts) {
            await cn.statePut({ slot: 1, offset: sent, total, data: part });
            sent += part.length;
          }
        };
        await expect(put()).rejects.toMatchObject({ code: 'HYDRA_ERR_STATE_INVALID' });
      } finally {
        cn.close();
        await close(narrow);
      }
      const cont = [...prompt, ...got];
      await expectRestoredContinuation(
        other.url,
        { ...greedy, prompt: cont, max_tokens: 8, id_slot: 1 },
        want.slice(8),
      );
    } finally {
      ca.close();
      cb.close();
      await close(other);
    }
  }, 60_000);

  // Without a context shift (a recurrent memory cannot shift positions).
  it('a full slot ends with length, a prompt of a whole slot is refused, and the slot still answers right', async () => {
    const nCtxSeq = eng.engine.slots.nCtxSeq;
    expect(nCtxSeq).toBe(1024);
    const long = eng.engine.tokenize('the long day of the water '.repeat(200)).subarray(0, nCtxSeq - 6);
    const full = await http(eng.url, { ...greedy, prompt: Array.from(long), max_tokens: 50, id_slot: 3 });
    expect(full.status, JSON.stringify(full.json)).toBe(200);
    expect(full.json.choices[0].finish_reason).toBe('length');
    expect(full.json.usage.completion_tokens).toBeLessThanOrEqual(6);
    const over = [...long, ...long.subarray(0, 6)];
    expect(over.length).toBe(nCtxSeq);
    const tooLong = await http(eng.url, { prompt: over, max_tokens: 1 });
    expect([tooLong.status, tooLong.json.error.code]).toEqual([400, 'HYDRA_ERR_PROMPT_TOO_LONG']);
    const prompt = Array.from(eng.engine.tokenize(PROMPT));
    expect(await tokensOf(eng, { prompt, max_tokens: 8, id_slot: 3 })).toEqual(
      await tokensOf(eng, { prompt, max_tokens: 8, id_slot: 0 }),
    );
  }, 60_000);

  it('n = 3 greedy choices each equal the single completion', async () => {
    const single = await http(eng.url, { ...greedy, prompt: PROMPT, max_tokens: 12 });
    const r = await http(eng.url, { ...greedy, prompt: PROMPT, max_tokens: 12, n: 3 });
    expect(r.status, JSON.stringify(r.json)).toBe(200);
    expect(r.json.choices.map((c: { text: string }) => c.text)).toEqual(
      Array(3).fill(single.json.choices[0].text),
    );
  });

  it('serves four slots at once (-np 4) with the tokens of each alone', async () => {
    const prompts = ['Hello world', 'one two three four five', 'a long way', 'number 7 of the day'];
    const alone: number[][] = [];
    for (const prompt of prompts) alone.push(await tokensOf(eng, { prompt, max_tokens: 24 }));
    let most = 0;
    eng.engine.onSlotsChanged((b) => {
      most = Math.max(most, b);
    });
    const all = await Promise.all(prompts.map((prompt) => tokensOf(eng, { prompt, max_tokens: 24 })));
    expect(most).toBe(4);
    expect(all).toEqual(alone);
  }, 60_000);

  it('the pipelined decode gives the unpipelined tokens, across max_tokens and a stop string', async () => {
    const plain = await withPipeline(false, () => start(['-np', '2', '-c', '2048']));
    const piped = await withPipeline(true, () => start(['-np', '2', '-c', '2048']));
    for (const max of [1, 2, 3, 17]) {
      const body = { prompt: 'the water of the day', max_tokens: max };
      expect(await tokensOf(piped, body), `max_tokens ${max}`).toEqual(await tokensOf(plain, body));
    }
    const prompt = 'people who could write';
    const full = await http(plain.url, { ...greedy, prompt, max_tokens: 24 });
    const stop = (full.json.choices[0].text as string).slice(8, 11);
    for (const e of [piped, plain]) {
      const body = { ...greedy, prompt, max_tokens: 24, stop: [stop], cache_prompt: true, id_slot: 0 };
      const first = await http(e.url, body);
      expect(first.json.choices[0].finish_reason).toBe('stop');
      // The step queued ahead fed one token past the stop; the next request must not see it.
      expect((await http(e.url, { ...body, stop: [] })).json.choices[0].tokens).toEqual(
        full.json.choices[0].tokens,
      );
    }
    await close(piped);
    await close(plain);
  }, 60_000);

  it('chunked prefill (-b 16) gives the -b 512 tokens, and a cancel mid-prefill leaves the slot clean', async () => {
    const small = await start(['-np', '2', '-c', '4096', '-b', '16']);
    const long = eng.engine.tokenize('the long day of the water '.repeat(100)).subarray(0, 600);
    const chunks0 = small.engine.counters.promptChunks;
    const want = (await eng.engine.submit(long, params(12))).tokens;
    expect((await small.engine.submit(long, params(12))).tokens).toEqual(want);
    expect(small.engine.counters.promptChunks - chunks0).toBeGreaterThanOrEqual(long.length / 16);

    const ctrl = new AbortController();
    const c0 = small.engine.counters.promptChunks;
    const pending = small.engine.submit(long, params(8), { signal: ctrl.signal, slot: 1, cachePrompt: true });
    while (small.engine.counters.promptChunks - c0 < 4) await new Promise((r) => setTimeout(r, 1));
    ctrl.abort();
    const r = await pending;
    expect(r.finishReason).toBe('cancelled');
    expect((small.engine.counters.promptChunks - c0) * 16).toBeLessThan(long.length);
    // The half-fed recurrent state must not be taken for a prefix of the next prompt.
    const again = await small.engine.submit(long, params(12), { slot: 1, cachePrompt: true });
    expect(again.tokens).toEqual(want);
    const short = eng.engine.tokenize(PROMPT);
    expect((await small.engine.submit(short, params(8), { slot: 1, cachePrompt: true })).tokens).toEqual(
      (await eng.engine.submit(short, params(8))).tokens,
    );
    await close(small);
  }, 120_000);
});
