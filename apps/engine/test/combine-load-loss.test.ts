import type { ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { writeSyntheticModel } from '@hydra-engine/native-ggml/synth';
import { healthUntil, sleep } from '@hydra-engine/test-kit';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { greedy, type Proc, spawnCombined, spawnEngine } from './combine-helpers.js';
import { tinyModel } from './helpers.js';

// A peer lost while a CONFIGURE loads a model over ggml-RPC: the load thread must not park on the
// dead peer (the CONFIGURE would never answer, the state loading for good).
// Kills the peer once the head's load is under way (the weights streaming to it); when it did.
async function killPeerWhileLoading(headUrl: string, peer: Proc): Promise<number> {
  await healthUntil<{ state: string }>(headUrl, (h) => h.state === 'loading', 20_000);
  await sleep(300);
  const killedAt = performance.now();
  peer.child.kill('SIGKILL');
  return killedAt;
}

describe('peer loss during a CONFIGURE load', () => {
  const PROMPT = 'Hello world, this is a test';
  let tiny: string;
  let big: string;
  const procs: ChildProcess[] = [];
  beforeAll(async () => {
    tiny = await tinyModel();
    // Large enough that its upload to the peer takes a while on loopback (0.85 GB).
    big = join(mkdtempSync(join(tmpdir(), 'hydra-load-loss-')), '1b.gguf');
    await writeSyntheticModel({ arch: 'llama', shape: '1b', quant: 'q4_0', seed: 1, out: big });
  }, 120_000);
  afterAll(() => {
    for (const p of procs) if (p.exitCode === null) p.kill('SIGKILL');
    // 0.85 GB a run: 41 runs had left 33 GB in /tmp.
    rmSync(dirname(big), { recursive: true, force: true });
  });

  it('ends the CONFIGURE with HYDRA_ERR_PEER_LOST and the previous configuration serves again', async () => {
    const head = await spawnEngine(['-m', tiny, '-c', '1024']);
    procs.push(head.child);
    const before = await greedy(head.url, PROMPT);
    expect(before.status).toBe(200);
    // Not told to index the file: its weights stream over the wire, which the kill interrupts.
    const peer = await spawnEngine(['--no-configure-rpc-weights']);
    procs.push(peer.child);

    const started = performance.now();
    const reply = fetch(`${head.url}/control/configure`, {
      method: 'POST',
      body: JSON.stringify({ model: big, rpc_servers: [peer.rpc], devices: ['RPC0'], n_gpu_layers: 99 }),
    }).then((r) => r.json() as Promise<{ success: boolean; error?: { code: string }; code?: string }>);
    const killedAt = await killPeerWhileLoading(head.url, peer);
    const r = await reply;
    const answered = performance.now();
    console.log(
      `load loss: CONFIGURE answered ${(answered - killedAt).toFixed(0)} ms after kill -9 (${(killedAt - started).toFixed(0)} ms into it)`,
    );
    expect(r.success).toBe(false);
    if (!JSON.stringify(r).includes('HYDRA_ERR_PEER_LOST')) console.log(JSON.stringify(r));
    expect(JSON.stringify(r)).toContain('HYDRA_ERR_PEER_LOST');
    expect(answered - killedAt).toBeLessThan(10_000);
    await healthUntil<{ state: string }>(head.url, (h) => h.state === 'ready', 20_000);
    const status = (await fetch(`${head.url}/control/status`).then((x) => x.json())) as {
      mode: string;
      model: { path?: string };
      last_rebuild_failure?: { code: string; restored: boolean };
    };
    expect(status.mode).toBe('solo');
    expect(status.last_rebuild_failure).toMatchObject({ code: 'HYDRA_ERR_PEER_LOST', restored: true });
    expect(await greedy(head.url, PROMPT)).toEqual(before);
    expect(head.child.exitCode).toBeNull();
  }, 180_000);

  it('a COMBINE head whose peer dies while it loads another model: PEER_LOST, then failover (the previous COMBINE cannot be restored)', async () => {
    // Not told to index the file: its weights stream over the wire, which the kill interrupts.
    const { peer, head } = await spawnCombined(tiny, ['-c', '1024'], procs, ['--no-configure-rpc-weights']);
    const before = await greedy(head.url, PROMPT);
    expect(before.status).toBe(200);
    const reply = fetch(`${head.url}/control/configure`, {
      method: 'POST',
      body: JSON.stringify({ model: big }),
    }).then((r) => r.json() as Promise<{ success: boolean }>);
    const killedAt = await killPeerWhileLoading(head.url, peer);
    const r = await reply;
    expect(r.success).toBe(false);
    expect(JSON.stringify(r)).toContain('HYDRA_ERR_PEER_LOST');
    const h = await healthUntil<{
      state: string;
      status: string;
      degraded?: { reason: string; failover?: { policy: string } };
    }>(head.url, (x) => x.state === 'ready' && x.status === 'degraded', 20_000);
    console.log(
      `load loss, COMBINE before: SOLO failover ready ${(performance.now() - killedAt).toFixed(0)} ms after kill -9`,
    );
    expect(h.degraded!.reason).toMatch(/still gone/);
    expect(h.degraded!.failover?.policy).toBe('solo');
    expect(await greedy(head.url, PROMPT)).toEqual(before);
  }, 180_000);
});
