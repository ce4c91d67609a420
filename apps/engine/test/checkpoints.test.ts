import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { writeSyntheticModel } from '@hydra-engine/native-ggml/synth';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { engineWith } from './helpers.js';

// Issue 24, prompt cache for recurrent memory: a hybrid model's sequence cannot be trimmed to a
// prefix, so a slot's cache is reused through prompt checkpoints (the recurrent state read right
// after a prompt chunk a few tokens before the prompt's end, as llama-server's n_ctx_checkpoints).
// Greedy tokens with reuse equal a fresh engine's; without a usable checkpoint the prompt is read
// again whole; none are made on a plain KV model or with n_ctx_checkpoints 0.

type Eng = Awaited<ReturnType<typeof engineWith>>;
interface Turn {
  text: string;
  finish: string;
  cached: number;
  prompt: number;
}

async function chat(
  eng: Eng,
  messages: { role: string; content: string }[],
  extra: object = {},
): Promise<Turn> {
  const res = await fetch(`${eng.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ messages, temperature: 0, max_tokens: 24, ignore_eos: true, ...extra }),
  });
  const json = (await res.json()) as {
    choices: { message: { content: string }; finish_reason: string }[];
    usage: { prompt_tokens: number; prompt_tokens_details?: { cached_tokens: number } };
  };
  expect(res.status, JSON.stringify(json)).toBe(200);
  return {
    text: json.choices[0]!.message.content,
    finish: json.choices[0]!.finish_reason,
    cached: json.usage.prompt_tokens_details?.cached_tokens ?? 0,
    prompt: json.usage.prompt_tokens,
  };
}

async function slots(eng: Eng): Promise<{ n_ctx_checkpoints: number; checkpoints_bytes: number }[]> {
  const res = await fetch(`${eng.url}/slots`);
  expect(res.status).toBe(200);
  return (await res.json()) as { n_ctx_checkpoints: number; checkpoints_bytes: number }[];
}

const USER1 = 'Tell me about the cat and the dog that went to the market';
const USER2 = 'And what did they buy there?';

let dir: string;
const open: Eng[] = [];
beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), 'hydra-ckpt-'));
});
afterAll(async () => {
  for (const e of open.reverse()) await e.close();
  rmSync(dir, { recursive: true, force: true });
});

async function start(model: string, extra: string[] = []): Promise<Eng> {
  const eng = await engineWith(['-m', model, '-np', '1', '-c', '2048', ...extra]);
  open.push(eng);
  return eng;
}

describe.each(['qwen35', 'qwen35moe'] as const)('tiny %s prompt checkpoints', (arch) => {
  let model: string;
  let eng: Eng;
  let fresh: Eng;
  beforeAll(async () => {
    model = join(dir, `tiny-${arch}.gguf`);
    await writeSyntheticModel({ arch, shape: 'tiny', quant: 'f32', seed: 7, out: model });
    eng = await start(model);
    fresh = await start(model);
  }, 60_000);

  it('a second chat turn after a stop string reuses the prefix through a checkpoint, with a fresh engine tokens', async () => {
    const turn1 = [{ role: 'user', content: USER1 }];
    const whole = await chat(fresh, turn1, { cache_prompt: false });
    const stop = whole.text.slice(6, 9);
    expect(stop.length).toBe(3);
    const first = await chat(eng, turn1, { stop: [stop] });
    expect(first.finish).toBe('stop');
    expect(first.text).toBe(whole.text.slice(0, whole.text.indexOf(stop)));
    const held = await slots(eng);
    expect(held[0]!.n_ctx_checkpoints).toBeGreaterThan(0);
    expect(held[0]!.checkpoints_bytes).toBeGreaterThan(0);

    const turn2 = [...turn1, { role: 'assistant', content: first.text }, { role: 'user', content: USER2 }];
    const restores = eng.engine.counters.checkpointRestores;
    const read = eng.engine.counters.promptTokens;
    const second = await chat(eng, turn2);
    const rereadWith = eng.engine.counters.promptTokens - read;
    const readFresh = fresh.engine.counters.promptTokens;
    const reference = await chat(fresh, turn2, { cache_prompt: false });
    const rereadWithout = fresh.engine.counters.promptTokens - readFresh;
    expect(second.text).toBe(reference.text);
    expect(eng.engine.counters.checkpointRestores).toBe(restores + 1);
    // The checkpoint sits 4 tokens before turn 1's prompt end.
    expect(second.cached).toBe(first.prompt - 4);
    expect(rereadWith).toBe(second.prompt - second.cached);
    expect(rereadWithout).toBe(reference.prompt);
    console.log(
      `${arch}: turn 2 of ${second.prompt} tokens re-read ${rereadWith} with the checkpoint, ${rereadWithout} without`,
    );
    const metrics = await (await fetch(`${eng.url}/metrics`)).text();
    expect(metrics).toMatch(/^hydra_prompt_checkpoint_restores_total [1-9]/m);
  });

  it('a divergence before any checkpoint reads the prompt again whole, with a fresh engine tokens', async () => {
    await chat(eng, [{ role: 'user', content: USER1 }]);
    const restores = eng.engine.counters.checkpointRestores;
    // Diverges in the first user message, before the checkpoint 4 tokens before that prompt's end.
    const other = [{ role: 'user', content: 'Tell me a story about a fish' }];
    const r = await chat(eng, other);
    expect(r.cached).toBe(0);
    expect(eng.engine.counters.checkpointRestores).toBe(restores);
    expect(r.text).toBe((await chat(fresh, other, { cache_prompt: false })).text);
  });

  it('takes one every checkpoint_min_step tokens of a chunked prompt, keeps at most n_ctx_checkpoints, and restores a mid-prompt one', async () => {
    const long = Array.from({ length: 24 }, (_, i) => `the ${i} cat`).join(' and ');
    const turn1 = [{ role: 'user', content: `${long} went to the market` }];
    const turn2 = [{ role: 'user', content: `${long} ran to the river` }];
    // Default spacing (8192): only the two cuts before the prompt's end (16 and 4 tokens with -b 16).
    const plain = await start(model, ['-b', '16', '-ub', '16']);
    await chat(plain, turn1, { max_tokens: 4 });
    expect(plain.engine.counters.checkpointsCreated).toBe(2);
    const dense = await start(model, [
      '-b',
      '16',
      '-ub',
      '16',
      '--checkpoint-min-step',
      '16',
      '--ctx-checkpoints',
      '6',
    ]);
    const first = await chat(dense, turn1, { max_tokens: 4 });
    expect(first.prompt).toBeGreaterThan(64);
    expect(dense.engine.counters.checkpointsCreated).toBeGreaterThan(6);
    expect((await slots(dense))[0]!.n_ctx_checkpoints).toBe(6);
    const second = await chat(dense, turn2);
    expect(second.cached).toBeGreaterThan(0);
    expect(second.cached).toBeLessThan(first.prompt - 4);
    expect(dense.engine.counters.checkpointRestores).toBe(1);
    expect(second.text).toBe((await chat(fresh, turn2, { cache_prompt: false })).text);
    for (const e of [plain, dense]) {
      await e.close();
      open.splice(open.indexOf(e), 1);
    }
  });

  it('makes none with n_ctx_checkpoints 0 (--ctx-checkpoints 0) and reads each turn whole', async () => {
    const off = await start(model, ['--ctx-checkpoints', '0']);
    const turn1 = [{ role: 'user', content: USER1 }];
    const first = await chat(off, turn1, { max_tokens: 6 });
    expect((await slots(off))[0]!.n_ctx_checkpoints).toBe(0);
    const turn2 = [
      ...turn1,
      { role: 'assistant', content: `${first.text} x` },
      { role: 'user', content: USER2 },
    ];
    const second = await chat(off, turn2);
    expect(second.cached).toBe(0);
    expect(off.engine.counters.checkpointsCreated).toBe(0);
    expect(off.engine.counters.checkpointRestores).toBe(0);
    expect(second.text).toBe((await chat(fresh, turn2, { cache_prompt: false })).text);
    await off.close();
    open.splice(open.indexOf(off), 1);
  });
});

describe('tiny llama (a plain KV cache)', () => {
  it('never makes a checkpoint: the cache is trimmed to the common prefix instead', async () => {
    const model = join(dir, 'tiny-llama.gguf');
    await writeSyntheticModel({ arch: 'llama', shape: 'tiny', quant: 'f32', seed: 7, out: model });
    const eng = await start(model);
    const turn1 = [{ role: 'user', content: USER1 }];
    const first = await chat(eng, turn1, { max_tokens: 8 });
    const turn2 = [
      ...turn1,
      { role: 'assistant', content: `${first.text} x` },
      { role: 'user', content: USER2 },
    ];
    const second = await chat(eng, turn2);
    expect(second.cached).toBeGreaterThan(first.prompt - 4);
    expect(eng.engine.counters.checkpointsCreated).toBe(0);
    expect(eng.engine.counters.checkpointRestores).toBe(0);
    expect((await slots(eng))[0]!.n_ctx_checkpoints).toBe(0);
  });
});
