import type { ChildProcess } from 'node:child_process';
import { probeRpcServer } from '@hydra-engine/native-ggml';
import { healthUntil } from '@hydra-engine/test-kit';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { configure, greedy, type Proc, spawnCombined, spawnEngine } from './combine-helpers.js';
import { stream } from './control-helpers.js';
import { engineWith, tinyModel, waitFor } from './helpers.js';

interface Health {
  status: string;
  state: string;
  degraded?: {
    reason: string;
    peers: string[];
    failover?: { requested: string; policy: string; n_gpu_layers?: number; solo_fits: boolean };
    held?: { what: string[]; why: string };
    rejoin?: { enabled: boolean; probes: number; last_error?: string };
  };
  placement?: { device: string }[];
}

const status = (url: string) =>
  fetch(`${url}/control/status`).then(
    (r) =>
      r.json() as Promise<{
        success: boolean;
        mode: string;
        peers: unknown[];
        degraded?: Health['degraded'];
      }>,
  );

describe('peer loss: kill -9 of the peer during a streamed generation', () => {
  const PROMPT = 'Hello world, this is a test';
  let tiny: string;
  let solo: string;
  const procs: ChildProcess[] = [];
  beforeAll(async () => {
    tiny = await tinyModel();
    const e = await engineWith(['-m', tiny]);
    solo = (await greedy(e.url, PROMPT)).text;
    await e.close();
  }, 60_000);
  afterAll(() => {
    for (const p of procs) if (p.exitCode === null) p.kill('SIGKILL');
  });

  /** A head in COMBINE with one peer; kills the peer mid-stream; returns when the head is degraded. */
  async function killMidStream(headFlags: string[], before?: (head: Proc) => Promise<void>) {
    const { peer, head } = await spawnCombined(tiny, ['-c', '4096', ...headFlags], procs);
    expect(await greedy(head.url, PROMPT)).toEqual({ status: 200, text: solo });
    if (before) await before(head);
    let killedAt = 0;
    const started = performance.now();
    const out = await stream(
      head.url,
      { prompt: PROMPT, max_tokens: 4000, temperature: 0, ignore_eos: true },
      () => {
        killedAt = performance.now();
        peer.child.kill('SIGKILL');
      },
    );
    const ended = performance.now();
    expect(killedAt).toBeGreaterThan(0);
    expect(out.error?.code).toBe('HYDRA_ERR_PEER_LOST');
    expect(out.finish).toBeUndefined();
    expect(ended - started).toBeLessThan(20_000);
    return { peer, head, killedAt, ended };
  }

  it('solo (auto, the model fits): PEER_LOST, degraded with the policy, SOLO within 10 s, then rejoins on its own with the same tokens', async () => {
    const { peer, head, killedAt, ended } = await killMidStream([]);
    const h = await healthUntil<Health>(
      head.url,
      (x) => x.state === 'ready' && x.status === 'degraded',
      10_000,
    );
    const again = await greedy(head.url, PROMPT);
    const recovered = performance.now() - killedAt;
    console.log(
      `peer loss (solo): request ended ${(ended - killedAt).toFixed(0)} ms after kill -9; SOLO answered ${recovered.toFixed(0)} ms after it`,
    );
    expect(recovered).toBeLessThan(10_000);
    expect(again).toEqual({ status: 200, text: solo });
    expect(h.degraded!.reason).toMatch(/peer|ggml-RPC/);
    expect(h.degraded!.failover).toMatchObject({ requested: 'auto', policy: 'solo', solo_fits: true });
    expect(h.degraded!.held!.what.length).toBeGreaterThan(0);
    expect(h.degraded!.held!.why).toMatch(/parked/);

    const st = await status(head.url);
    expect(st).toMatchObject({ success: true, mode: 'solo', peers: [] });
    expect(st.degraded!.peers).toEqual([peer.rpc]);
    expect(st.degraded!.rejoin).toMatchObject({ enabled: true });
    // Every port of the head still answers: HTTP above, the merged port's ggml-RPC HELLO here.
    await expect(probeRpcServer(head.rpc, 2000)).resolves.toMatchObject({ major: 6 });
    expect(head.child.exitCode).toBeNull();
    // The rejoin probes and backs off while the peer is down.
    await waitFor(async () => ((await status(head.url)).degraded?.rejoin?.probes ?? 0) >= 2, 10_000);

    // The peer comes back at the same address: no operator action, the head restores COMBINE on
    // its own (the peer registered under another spelling; the operator's `--device RPC0` still
    // names it) and serves the same greedy tokens.
    const back = await spawnEngine([], Number(peer.rpc.split(':')[1]));
    procs.push(back.child);
    const backAt = performance.now();
    const rejoined = await healthUntil<Health>(
      head.url,
      (x) => x.state === 'ready' && x.status !== 'degraded',
      30_000,
    );
    console.log(
      `peer rejoin: COMBINE restored ${(performance.now() - backAt).toFixed(0)} ms after the peer restarted`,
    );
    expect(rejoined.placement!.map((r) => r.device)).toEqual(['RPC1']);
    expect(await greedy(head.url, PROMPT)).toEqual({ status: 200, text: solo });
    const after = await status(head.url);
    expect(after.mode).toBe('combined');
    expect(after.peers).toHaveLength(1);
    expect(after.degraded).toBeUndefined();
  }, 150_000);

  it('offload (auto, a memory cap makes SOLO not fit): reloads with the layers that fit, the same greedy tokens as SOLO, within 10 s; --no-peer-rejoin stays degraded', async () => {
    const { head, killedAt } = await killMidStream(['--no-peer-rejoin'], async (h) => {
      // A T1 setting: read at the next loss, nothing reloads now.
      expect(await configure(h.url, { device_memory_cap: ['CPU=1'] })).toMatchObject({
        success: true,
        tier: 'T1',
      });
    });
    const h = await healthUntil<Health>(
      head.url,
      (x) => x.state === 'ready' && x.status === 'degraded',
      10_000,
    );
    const again = await greedy(head.url, PROMPT);
    const recovered = performance.now() - killedAt;
    console.log(`peer loss (offload): answered ${recovered.toFixed(0)} ms after kill -9`);
    expect(recovered).toBeLessThan(10_000);
    expect(again).toEqual({ status: 200, text: solo });
    const f = h.degraded!.failover!;
    expect(f).toMatchObject({ requested: 'auto', policy: 'offload', solo_fits: false });
    expect(f.n_gpu_layers).toBeGreaterThanOrEqual(0);
    expect(h.degraded!.rejoin).toEqual({ enabled: false, probes: 0 });
  }, 120_000);

  it('none: PEER_LOST, nothing reloaded, requests refused saying why; the rejoin restores COMBINE when the peer is back', async () => {
    const { peer, head } = await killMidStream(['--failover-policy', 'none']);
    const h = await healthUntil<Health>(
      head.url,
      (x) => x.degraded !== undefined && x.state === 'error',
      10_000,
    );
    expect(h.degraded!.failover).toMatchObject({ requested: 'none', policy: 'none' });
    const refused = await greedy(head.url, PROMPT);
    expect(refused.code).toBe('HYDRA_ERR_NO_MODEL');
    const back = await spawnEngine([], Number(peer.rpc.split(':')[1]));
    procs.push(back.child);
    await healthUntil<Health>(head.url, (x) => x.state === 'ready' && x.status !== 'degraded', 30_000);
    expect(await greedy(head.url, PROMPT)).toEqual({ status: 200, text: solo });
    expect((await status(head.url)).mode).toBe('combined');
  }, 150_000);
});
