import { mkdtempSync, realpathSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { rpcWeightsIndexInfo } from '@hydra-engine/native-ggml';
import { synthHparams, writeSyntheticModel } from '@hydra-engine/native-ggml/synth';
import { type EngineProcess, freePort as freeLoopbackPort, spawnEngine } from '@hydra-engine/test-kit';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { engineWith, tinyModel, waitFor } from './helpers.js';

async function freePort(): Promise<string> {
  return String(await freeLoopbackPort());
}

async function complete(url: string, prompt: string): Promise<{ text: string; tokens: number }> {
  const res = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt, max_tokens: 12, temperature: 0, ignore_eos: true }),
  });
  expect(res.status).toBe(200);
  const body = (await res.json()) as { choices: { text: string }[]; usage: { completion_tokens: number } };
  return { text: body.choices[0]!.text, tokens: body.usage.completion_tokens };
}

/**
 * The head as its own process (as deployed): llama.cpp's RPC devices live for the whole process,
 * and an in-process head would share the peer's addon state.
 */
async function startHead(flags: string[]): Promise<EngineProcess & { close(): Promise<void> }> {
  const head = await spawnEngine(['-t', '1', ...flags], { timeoutMs: 90_000 });
  return Object.assign(head, { close: () => head.stop() });
}

/** Bytes on the peer when every layer and the output are remote: all but the token embeddings. */
function wideShareBytes(): number {
  const h = synthHparams('llama', 'small-wide');
  const layer = (4 * h.nEmbd * h.nEmbd + 3 * h.nEmbd * h.nFf) * 2 + 2 * h.nEmbd * 4;
  return h.nLayer * layer + h.nEmbd * h.nVocab * 2 + h.nEmbd * 4;
}

// One process: the SOLO reference runs before any RPC device is registered (llama.cpp would
// otherwise place a model without explicit devices on them too).
describe('COMBINE between two engines through the peer merged port', () => {
  const PROMPTS = ['Hello world, this is a test', 'The quick brown fox'];
  let tiny: string;
  let solo: { text: string; tokens: number }[];
  const open: { close(): Promise<void> }[] = [];
  beforeAll(async () => {
    tiny = await tinyModel();
    const e = await engineWith(['-m', tiny]);
    solo = [];
    for (const p of PROMPTS) solo.push(await complete(e.url, p));
    await e.close();
  }, 60_000);
  afterAll(async () => {
    for (const e of open.reverse()) await e.close();
  });

  it('dense layer split (layers 2-3 and the output on the peer) gives the SOLO greedy text', async () => {
    const peer = await engineWith(['--rpc-port', await freePort()]);
    open.push(peer);
    const head = await startHead([
      '-m',
      tiny,
      '--rpc',
      `127.0.0.1:${peer.rpcPort}`,
      '--device',
      'RPC0',
      '-ngl',
      '3',
    ]);
    open.push(head);
    for (const [i, p] of PROMPTS.entries()) expect(await complete(head.url, p)).toEqual(solo[i]);
    expect(peer.port!.stats().rpc.active).toBeGreaterThan(0);
  }, 120_000);

  it('a peer indexes its own loaded model for SET_TENSOR_HASH', async () => {
    const peer = await engineWith(['--rpc-port', await freePort(), '-m', tiny]);
    open.push(peer);
    await waitFor(async () => rpcWeightsIndexInfo().files.includes(realpathSync(tiny)), 5_000);
  }, 60_000);

  it('no weight transfer: a peer given --rpc-weights receives at most 1% of its share', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'hydra-combine-'));
    const wide = join(dir, 'wide.gguf');
    await writeSyntheticModel({ arch: 'llama', shape: 'small-wide', quant: 'f16', seed: 5, out: wide });
    const peer = await engineWith(['--rpc-port', await freePort(), '--rpc-weights', wide]);
    open.push(peer);
    const indexed = (await peer.weightsIndexed) as { indexed: number }[];
    expect(indexed[0]!.indexed).toBe(16);
    const before = peer.port!.stats().rpc;
    const head = await startHead([
      '-m',
      wide,
      '--rpc',
      `127.0.0.1:${peer.rpcPort}`,
      '--device',
      'RPC0',
      '-ngl',
      '99',
      '-c',
      '256',
    ]);
    const out = await complete(head.url, 'Hello');
    expect(out.tokens).toBe(12);
    await head.close();
    // Session totals are added when a session ends: the head's went with its close.
    // ...and every session of it (probes end first) before the bytes are read.
    await waitFor(async () => {
      const s = peer.port!.stats().rpc;
      return s.served > before.served && s.active === 0 && s.queued === 0;
    }, 10_000);
    const sent = peer.port!.stats().rpc.setTensorBytes - before.setTensorBytes;
    const share = wideShareBytes();
    console.log(
      `engine COMBINE load: ${sent} weight bytes on the wire for a ${share}-byte peer share (${((100 * sent) / share).toFixed(3)}%)`,
    );
    expect(sent).toBeLessThanOrEqual(0.01 * share);
  }, 180_000);
});
