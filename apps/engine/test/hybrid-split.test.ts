import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { addRpcServer, initBackend, listDevices, Model } from '@hydra-engine/native-ggml';
import { writeSyntheticModel } from '@hydra-engine/native-ggml/synth';
import { modelFactsFromGguf, resolveCombine } from '@hydra-engine/resolver';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { isMoe } from '../src/combine/moe.js';
import { fitOf, readGgufFile } from '../src/placement.js';
import { freeLoopbackPort } from '../src/ports.js';
import { greedy, type Proc, spawnEngine } from './combine-helpers.js';

// The hybrid models split between this host and a Hydra peer engine (not a stock ggml-rpc-server,
// as hybrid.test.ts and hybrid-plan.test.ts use): PLAN's fit (placement.ts fitOf) against the
// memory llama.cpp allocates, a layer split against SOLO, and (qwen35moe) the routed experts on the
// peer with SET_EXPERT_MODE flips. Every graph the head sends passes the peer's ggml-RPC guard.
const dir = mkdtempSync(join(tmpdir(), 'hydra-hybrid-split-'));
const PROMPT = 'the cat and the dog went to the market';
let peer: Proc;
let rpcDevice: string;
const open: Proc[] = [];

async function stop(p: Proc): Promise<void> {
  open.splice(open.indexOf(p), 1);
  await p.stop(0);
}

beforeAll(async () => {
  initBackend();
  peer = await spawnEngine([]);
  rpcDevice = (await addRpcServer(peer.rpc))[0]!.name;
}, 60_000);
afterAll(async () => {
  for (const p of open.reverse()) await p.stop(0);
  await peer?.stop(0);
  rmSync(dir, { recursive: true, force: true });
});

const sum = (ms: { model: number; context: number }[], k: 'model' | 'context') =>
  ms.reduce((a, m) => a + m[k], 0);
const near = (got: number, want: number) => expect(Math.abs(got - want) / want).toBeLessThan(0.02);

describe.each(['qwen35', 'qwen35moe'] as const)('tiny %s', (arch) => {
  let model: string;
  let solo: { status: number; text: string };
  beforeAll(async () => {
    model = join(dir, `${arch}.gguf`);
    await writeSyntheticModel({ arch, shape: 'tiny', quant: 'f32', seed: 5, out: model });
    const e = await spawnEngine(['-m', model, '-c', '1024']);
    solo = await greedy(e.url, PROMPT);
    expect(solo.status).toBe(200);
    await e.stop(0);
  }, 60_000);

  it('is the model class the COMBINE table needs (moe only with routed experts)', async () => {
    const moe = await isMoe(model);
    expect(moe).toBe(arch === 'qwen35moe');
    const delta = resolveCombine({
      model: model,
      mode: 'combined',
      peer: peer.rpc,
      modelClass: moe ? 'moe' : 'dense',
      tensorSplit: [1, 1],
    });
    if (moe) expect(delta.override_tensors?.at(-1)).toMatch(/_\(ch\|\)exps=RPC0\[/);
    else expect(delta).toMatchObject({ split_mode: 'layer', tensor_split: [1, 1] });
  });

  it.each([
    [1024, 1, 'f16', 'f16'],
    [4096, 2, 'q8_0', 'q8_0'],
  ] as const)('PLAN on the CPU, n_ctx %i, %i sequences, K %s: within 2%% of llama.cpp', async (nCtx, nParallel, typeK, typeV) => {
    const facts = modelFactsFromGguf(await readGgufFile(model));
    const cfg = {
      model,
      n_ctx: nCtx,
      cache_type_k: typeK,
      cache_type_v: typeV,
      n_parallel: nParallel,
      flash_attn: 'on',
      n_gpu_layers: -1,
      tensor_split: [],
    };
    const fit = fitOf(facts, cfg, {
      devices: listDevices().filter((d) => d.type === 'cpu'),
      peerDevices: () => undefined,
      fit: {},
    });
    if (!('report' in fit)) throw new Error(fit.unknown);
    const d = fit.report.devices[0]!;
    expect([d.name, fit.report.fits]).toEqual(['CPU', true]);
    const m = await Model.load({ path: model, nGpuLayers: 0 });
    const ctx = await m.createContext({ nCtx, typeK, typeV, flashAttn: 'on', nSeqMax: nParallel });
    const memory = ctx.memory();
    await ctx.dispose();
    m.dispose();
    near(d.weightBytes + fit.report.plan.host.weightBytes, sum(memory, 'model'));
    // Attention KV on blocks 3 and 7, recurrent rows per sequence on the six others.
    expect(d.recurrentBytes).toBeGreaterThan(0);
    near(d.kvBytes + d.recurrentBytes, sum(memory, 'context'));
  });

  it('PLAN with the peer engine at -ngl 4: each side within 2% of what llama.cpp puts there', async () => {
    const facts = modelFactsFromGguf(await readGgufFile(model));
    const cfg = {
      model,
      n_ctx: 2048,
      n_parallel: 2,
      n_gpu_layers: 4,
      rpc_servers: [peer.rpc],
      tensor_split: [],
    };
    const fit = fitOf(facts, cfg, {
      devices: listDevices(),
      peerDevices: (e) => (e === peer.rpc ? [rpcDevice] : undefined),
      fit: {},
    });
    if (!('report' in fit)) throw new Error(fit.unknown);
    const d = fit.report.devices.find((x) => x.name === rpcDevice)!;
    // As llama.cpp counts -ngl: the output layer is one of the 4, so blocks 5-7 go remote.
    expect(d.layers).toMatchObject({ first: 5, last: 7, count: 3 });
    const m = await Model.load({ path: model, nGpuLayers: 4, devices: [rpcDevice] });
    const ctx = await m.createContext({ nCtx: 2048, nSeqMax: 2 });
    const memory = ctx.memory();
    await ctx.dispose();
    m.dispose();
    const remote = memory.filter((x) => x.bufferType.startsWith(rpcDevice));
    const local = memory.filter((x) => !x.bufferType.startsWith(rpcDevice));
    near(d.weightBytes, sum(remote, 'model'));
    near(fit.report.plan.host.weightBytes, sum(local, 'model'));
    // Blocks 5-7: attention block 7's KV and recurrent blocks 5 and 6's state on the peer.
    expect(d.kvBytes).toBeGreaterThan(0);
    expect(d.recurrentBytes).toBeGreaterThan(0);
    near(d.kvBytes + d.recurrentBytes, sum(remote, 'context'));
    near(fit.report.plan.host.kvBytes, sum(local, 'context'));
  });

  it('a layer split onto the peer engine (-ngl 4) gives the SOLO greedy text', async () => {
    const head = await spawnEngine(
      ['-m', model, '-c', '1024', '--rpc', peer.rpc, '--device', 'RPC0', '-ngl', '4'],
      await freeLoopbackPort(),
    );
    open.push(head);
    const placement = (
      (await (await fetch(`${head.url}/health`)).json()) as { placement?: { device: string }[] }
    ).placement;
    expect(placement?.some((r) => r.device.startsWith('RPC'))).toBe(true);
    expect(placement?.some((r) => !r.device.startsWith('RPC'))).toBe(true);
    expect(await greedy(head.url, PROMPT)).toEqual(solo);
    await stop(head);
    expect(peer.log()).not.toContain('refused a ggml-RPC');
  }, 60_000);
});

describe('tiny qwen35moe routed experts on the peer engine', () => {
  it('routed and shared experts on the peer give the SOLO text through SET_EXPERT_MODE flips', async () => {
    const model = join(dir, 'qwen35moe-experts.gguf');
    await writeSyntheticModel({ arch: 'qwen35moe', shape: 'tiny', quant: 'f32', seed: 4, out: model });
    const alone = await spawnEngine(['-m', model, '-c', '1024']);
    const reference = await greedy(alone.url, PROMPT);
    await alone.stop(0);
    const head = await spawnEngine(['-m', model, '-c', '1024', '--rpc', peer.rpc], await freeLoopbackPort());
    open.push(head);
    const setMode = async (mode: string) =>
      (await fetch(`${head.url}/control/set_expert_mode`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ mode }),
      }).then((r) => r.json())) as Record<string, unknown>;
    const status = async () =>
      (await fetch(`${head.url}/control/status`).then((r) => r.json())) as { mode?: string };
    expect((await status()).mode).toBe('combined');
    expect(await greedy(head.url, PROMPT)).toEqual(reference);
    for (const mode of ['solo', 'combined', 'solo', 'combined']) {
      expect(await setMode(mode)).toMatchObject({ success: true, mode, reloaded: false });
      expect(await greedy(head.url, PROMPT)).toEqual(reference);
    }
    await stop(head);
    expect(peer.log()).not.toContain('refused a ggml-RPC');
  }, 90_000);
});
