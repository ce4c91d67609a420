import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { writeSyntheticModel } from '@hydra-engine/native-ggml/synth';
import { type StockRpcServer, stockRpcServer } from '@hydra-engine/test-kit';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { stream } from './control-helpers.js';
import { engineWith, waitFor } from './helpers.js';

async function greedy(url: string, prompt: string, maxTokens = 16): Promise<string> {
  const res = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt, max_tokens: maxTokens, temperature: 0, ignore_eos: true }),
  });
  expect(res.status).toBe(200);
  return ((await res.json()) as { choices: { text: string }[] }).choices[0]!.text;
}

async function setMode(url: string, mode: string) {
  const res = await fetch(`${url}/control/set_expert_mode`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ mode }),
  });
  return (await res.json()) as {
    success: boolean;
    mode: string;
    previous: string;
    switch_ms: number;
    reloaded: boolean;
  };
}

// MoE + COMBINE against the stock upstream ggml-rpc-server: both expert placements stay loaded and
// SET_EXPERT_MODE switches between them without a reload.
describe('MoE expert placement flip (SET_EXPERT_MODE) without reload', () => {
  const PROMPTS = ['Hello world, this is a test', 'The quick brown fox'];
  let moe: string;
  let server: StockRpcServer | undefined;
  let endpoint: string;
  let solo: string[];
  const open: { close(): Promise<void> }[] = [];

  beforeAll(async () => {
    const dir = mkdtempSync(join(tmpdir(), 'hydra-moe-'));
    moe = join(dir, 'moe.gguf');
    await writeSyntheticModel({ arch: 'moe', shape: 'tiny', quant: 'q8_0', seed: 4, out: moe });
    const e = await engineWith(['-m', moe]);
    solo = [];
    for (const p of PROMPTS) solo.push(await greedy(e.url, p));
    await e.close();
    server = await stockRpcServer({ threads: 1, timeoutMs: 10_000 });
    endpoint = server.endpoint;
  }, 60_000);
  afterAll(async () => {
    for (const e of open.reverse()) await e.close();
    await server?.stop();
  });

  it('keeps both placements resident, flips both ways with the same greedy tokens, mid-stream too', async () => {
    const head = await engineWith(['-m', moe, '--rpc', endpoint, '-c', '1024']);
    open.push(head);
    expect(head.engine.state).toBe('ready');
    expect(head.engine.dualPlacement).toBe(true);
    expect(head.engine.mode).toBe('combined');
    const epoch = head.engine.epoch;
    for (const [i, p] of PROMPTS.entries()) expect(await greedy(head.url, p)).toBe(solo[i]);

    const toSolo = await setMode(head.url, 'solo');
    expect(toSolo).toMatchObject({ success: true, mode: 'solo', previous: 'combined', reloaded: false });
    expect(toSolo.switch_ms).toBeLessThan(100);
    for (const [i, p] of PROMPTS.entries()) expect(await greedy(head.url, p)).toBe(solo[i]);
    const back = await setMode(head.url, 'combined');
    expect(back).toMatchObject({ success: true, mode: 'combined', previous: 'solo', reloaded: false });
    expect(head.engine.epoch).toBe(epoch);

    // A running stream keeps its KV across flips (copied between the contexts): same text.
    const long = { prompt: PROMPTS[0], max_tokens: 200, temperature: 0, ignore_eos: true };
    const reference = await stream(head.url, long);
    let flips = 0;
    const flipping = (async () => {
      await waitFor(async () => head.engine.slots.busy > 0, 10_000);
      while (head.engine.slots.busy > 0 && flips < 20) {
        const r = await setMode(head.url, flips % 2 === 0 ? 'solo' : 'combined');
        expect(r.success).toBe(true);
        flips++;
      }
    })();
    const flipped = await stream(head.url, long);
    await flipping;
    expect(flips).toBeGreaterThan(0);
    expect(flipped.text).toBe(reference.text);
    expect(flipped.finish).toBe('length');
  }, 120_000);

  it('flip latency p99 is under 100 ms and far below a reload', async () => {
    const head = open[0] as Awaited<ReturnType<typeof engineWith>>;
    const samples: number[] = [];
    for (let i = 0; i < 50; i++) {
      const t0 = performance.now();
      const r = await head.controller.setExpertMode({ mode: i % 2 === 0 ? 'solo' : 'combined' });
      samples.push(performance.now() - t0);
      expect(r.reloaded).toBe(false);
    }
    samples.sort((a, b) => a - b);
    const p50 = samples[25]!;
    const p99 = samples[49]!;
    const t0 = performance.now();
    await head.engine.load();
    const reload = performance.now() - t0;
    console.log(
      `expert flip: p50 ${p50.toFixed(3)} ms, p99 ${p99.toFixed(3)} ms; full reload ${reload.toFixed(1)} ms`,
    );
    expect(p99).toBeLessThan(100);
    expect(p50).toBeLessThan(reload);
  }, 60_000);
});
