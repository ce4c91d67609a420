// COMBINE onto an engine peer with prompts longer than one micro-batch: every graph a real head
// sends (dense llama and the hybrid qwen35 with its recurrent ops) must pass the peer's ggml-RPC
// guard and give the SOLO greedy text.
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { writeSyntheticModel } from '@hydra-engine/native-ggml/synth';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freeLoopbackPort } from '../src/ports.js';
import { greedy, type Proc, spawnEngine } from './combine-helpers.js';

// ~700 tokens with the tiny SentencePiece vocabulary
const LONG = Array.from({ length: 140 }, (_, i) => `word${i % 37} fox ${i}`).join(' ');

async function tokens(url: string, text: string): Promise<number> {
  const res = await fetch(`${url}/tokenize`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ content: text }),
  });
  return ((await res.json()) as { tokens: unknown[] }).tokens.length;
}

describe.each([
  ['llama', 'tiny'],
  ['qwen35', 'tiny'],
] as const)('COMBINE of a long prompt onto an engine peer (%s %s)', (arch, shape) => {
  let model: string;
  let solo: { status: number; text: string };
  let peer: Proc;
  const open: Proc[] = [];
  const stop = async (p: Proc) => {
    if (p.child.exitCode !== null) return;
    await new Promise<void>((resolve) => {
      p.child.once('exit', () => resolve());
      p.child.kill('SIGTERM');
    });
  };
  beforeAll(async () => {
    const dir = mkdtempSync(join(tmpdir(), 'hydra-combine-long-'));
    model = join(dir, `${arch}.gguf`);
    await writeSyntheticModel({ arch, shape, quant: 'q8_0', seed: 3, out: model });
    const e = await spawnEngine(['-m', model, '-c', '2048', '-b', '512']);
    open.push(e);
    expect(await tokens(e.url, LONG)).toBeGreaterThan(600);
    solo = await greedy(e.url, LONG);
    expect(solo.status).toBe(200);
    await stop(e);
    peer = await spawnEngine([]);
    open.push(peer);
  }, 120_000);
  afterAll(async () => {
    for (const p of open.reverse()) await stop(p);
  });

  for (const batch of ['512', '4096']) {
    it(`all layers on the peer, -b ${batch}: the SOLO greedy text`, async () => {
      const head = await spawnEngine(
        ['-m', model, '-c', '2048', '-b', batch, '--rpc', peer.rpc, '--device', 'RPC0', '-ngl', '99'],
        await freeLoopbackPort(),
      );
      open.push(head);
      const out = await greedy(head.url, LONG);
      await stop(head);
      expect(peer.log()).not.toContain('refused a ggml-RPC');
      expect(out).toEqual(solo);
    }, 180_000);
  }
});
