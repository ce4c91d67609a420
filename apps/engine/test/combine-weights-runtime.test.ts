import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { HydraClient } from '@hydra-engine/hydra-rpc';
import { synthHparams, writeSyntheticModel } from '@hydra-engine/native-ggml/synth';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freeLoopbackPort } from '../src/ports.js';
import { spawnEngine } from './combine-helpers.js';
import { engineWith, waitFor } from './helpers.js';

/**
 * True once a session ended since `served` and none is running or queued: a head opens probe
 * sessions beside its loading one, and the first probe to end must not stand for the load's total.
 */
function sessionsEnded(
  peer: { port?: { stats(): { rpc: { served: number; active: number; queued: number } } } },
  served: number,
): boolean {
  const s = peer.port!.stats().rpc;
  return s.served > served && s.active === 0 && s.queued === 0;
}

/** Bytes on the peer when every layer and the output are remote: all but the token embeddings. */
function wideShareBytes(): number {
  const h = synthHparams('llama', 'small-wide');
  const layer = (4 * h.nEmbd * h.nEmbd + 3 * h.nEmbd * h.nFf) * 2 + 2 * h.nEmbd * 4;
  return h.nLayer * layer + h.nEmbd * h.nVocab * 2 + h.nEmbd * 4;
}

// A bare peer (no model, no --rpc-weights) is told at run time which GGUF to index.
describe('no weight transfer on a bare peer at run time (CONFIGURE rpc_weights)', () => {
  let wide: string;
  const open: { close(): Promise<void> }[] = [];
  beforeAll(async () => {
    wide = join(mkdtempSync(join(tmpdir(), 'hydra-weights-rt-')), 'wide.gguf');
    await writeSyntheticModel({ arch: 'llama', shape: 'small-wide', quant: 'f16', seed: 5, out: wide });
  }, 120_000);
  afterAll(async () => {
    for (const e of open.reverse()) await e.close();
  });

  // A Hydra peer in this process and a head as its own process with every layer of `wide` on it.
  async function headOverPeer(peerFlags: string[]) {
    const rpcPort = await freeLoopbackPort();
    const peer = await engineWith(['--rpc-port', String(rpcPort), ...peerFlags]);
    open.push(peer);
    const before = peer.port!.stats().rpc;
    const head = await spawnEngine([
      '-m',
      wide,
      '--rpc',
      `127.0.0.1:${rpcPort}`,
      '--device',
      'RPC0',
      '-ngl',
      '99',
      '-c',
      '256',
    ]);
    return { peer, before, head };
  }

  it("a head's COMBINE load tells its Hydra peer the file: the peer receives at most 1% of its share", async () => {
    const { peer, before, head } = await headOverPeer([]);
    open.push({ close: () => head.stop() });
    const res = await fetch(`${head.url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: 'Hello', max_tokens: 12, temperature: 0, ignore_eos: true }),
    });
    expect(res.status).toBe(200);
    expect(head.log()).toMatch(/indexed .*wide\.gguf \((16 tensors|already)\)/);
    await open.pop()!.close();
    // Session totals are added when a session ends: the head's went with its exit.
    await waitFor(async () => sessionsEnded(peer, before.served), 10_000);
    const sent = peer.port!.stats().rpc.setTensorBytes - before.setTensorBytes;
    const share = wideShareBytes();
    console.log(
      `run-time rpc_weights: ${sent} weight bytes on the wire for a ${share}-byte peer share (${((100 * sent) / share).toFixed(3)}%)`,
    );
    expect(sent).toBeLessThanOrEqual(0.01 * share);
  }, 180_000);

  it('the control: a bare peer that refuses rpc_weights receives its whole share over the wire', async () => {
    const { peer, before, head } = await headOverPeer(['--no-configure-rpc-weights']);
    expect(head.log()).toMatch(/not told to index/);
    await head.stop();
    await waitFor(async () => sessionsEnded(peer, before.served), 10_000);
    const sent = peer.port!.stats().rpc.setTensorBytes - before.setTensorBytes;
    console.log(
      `run-time rpc_weights refused: ${sent} weight bytes on the wire for a ${wideShareBytes()}-byte share`,
    );
    expect(sent).toBeGreaterThanOrEqual(0.99 * wideShareBytes());
  }, 180_000);

  it('CONFIGURE rpc_weights: indexed files in the reply; bad values and engines without a port refused by name', async () => {
    const rpcPort = await freeLoopbackPort();
    const peer = await engineWith(['--rpc-port', String(rpcPort)]);
    open.push(peer);
    const client = await HydraClient.connect({ port: rpcPort, encoding: 'json' });
    try {
      const r = (await client.configure({ rpc_weights: [wide] })) as unknown as Record<string, unknown>;
      // The index is the process's: the first test's peer (this process too) may have added it.
      const [one] = r.rpc_weights_indexed as { file: string; tensors: number; already: boolean }[];
      expect(one!.file).toContain('wide.gguf');
      expect(one!.tensors).toBe(one!.already ? 0 : 16);
      expect(r.tier).toBe('none');
      await expect(client.configure({ rpc_weights: 'x' })).rejects.toMatchObject({
        code: 'HYDRA_ERR_BAD_VALUE',
        keys: ['rpc_weights'],
      });
      await expect(
        client.configure({ rpc_weights: [join(tmpdir(), 'no-such-file.gguf')] }),
      ).rejects.toHaveProperty('code');
    } finally {
      await client.close();
    }
    const noPort = await engineWith([]);
    open.push(noPort);
    const res = await fetch(`${noPort.url}/control/configure`, {
      method: 'POST',
      body: JSON.stringify({ rpc_weights: [wide] }),
    });
    const body = (await res.json()) as { error?: { code: string; keys?: string[] } };
    expect(body.error).toMatchObject({ code: 'HYDRA_ERR_UNSUPPORTED_FIELD' });
  }, 120_000);
});
