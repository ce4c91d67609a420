import { writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { HydraClient } from '@hydra-engine/hydra-rpc';
import { type StockRpcServer, stockRpcServer } from '@hydra-engine/test-kit';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { readGgufFile } from '../src/placement.js';
import { complete, freePort, variant } from './control-helpers.js';
import { engineWith, tinyModel } from './helpers.js';

type Running = Awaited<ReturnType<typeof engineWith>>;
let model: string;
let a: Running;
let aPort: number;
const clients: HydraClient[] = [];
let peer: StockRpcServer | undefined;

async function client(port: number, encoding: 'json' | 'msgpack'): Promise<HydraClient> {
  const c = await HydraClient.connect({ port, encoding, timeoutMs: 30_000 });
  clients.push(c);
  return c;
}

async function code(p: Promise<unknown>): Promise<{ code: string; keys?: string[] }> {
  try {
    await p;
  } catch (err) {
    return err as { code: string; keys?: string[] };
  }
  throw new Error('expected a rejection');
}

beforeAll(async () => {
  model = await tinyModel();
  aPort = await freePort();
  a = await engineWith(['-m', model, '-np', '2', '-c', '1024', '--rpc-port', String(aPort)]);
}, 60_000);
afterAll(async () => {
  for (const c of clients) c.close();
  await a?.close();
  await peer?.stop();
});

describe.each(['json', 'msgpack'] as const)('control opcodes over %s', (encoding) => {
  it('HELLO and STATUS', async () => {
    const c = await client(aPort, encoding);
    const hello = await c.hello({ client: 'test' });
    expect(hello.protocol).toBe(1);
    expect(hello.opcodes).toEqual(expect.arrayContaining([0x30, 0x31, 0x40, 0x41, 0x42, 0x43, 0x44, 0x45]));
    const st = (await c.status()) as any;
    expect(st.state).toBe('ready');
    expect(st.model).toMatchObject({ arch: 'llama', n_layer: 4, n_embd: 256, n_vocab: 1000, n_expert: 0 });
    expect(st.mode).toBe('solo');
    expect(st.applied.n_parallel).toBe(2);
    expect(st.applied_sources.n_parallel).toBe('startup');
    expect(st.slots).toMatchObject({ total: 2, busy: 0 });
    expect(st.devices.length).toBeGreaterThan(0);
    expect(st.devices[0]).toHaveProperty('free');
    expect(st.peers).toEqual([]);
    expect(st.pool).toHaveProperty('active');
    expect(st.deferred_keys).toEqual([]);
  });

  it('CONFIGURE T1 applies at once; the same request again is none', async () => {
    const c = await client(aPort, encoding);
    const before = (await c.status()).epoch;
    const temp = encoding === 'json' ? 0.25 : 0.5;
    const r = await c.configure({ sampling: { temp }, seed: 7 });
    expect(r.tier).toBe('T1');
    expect(r.params_applied).toEqual({ 'sampling.temp': temp, seed: 7 });
    expect(r.deferred_keys).toEqual([]);
    expect(r.epoch).toBe(before + 1);
    const again = await c.configure({ 'sampling.temp': temp, seed: 7 });
    expect(again.tier).toBe('none');
    expect(again.epoch).toBe(before + 1);
    const st = (await c.status()) as any;
    expect(st.applied['sampling.temp']).toBe(temp);
    expect(st.applied_sources['sampling.temp']).toBe('configure');
  });

  it('CONFIGURE rejects the whole request on unknown, T4 or bad keys', async () => {
    const c = await client(aPort, encoding);
    const before = (await c.status()) as any;
    const e1 = await code(c.configure({ 'sampling.temp': 0.9, nonsense_key: 1 }));
    expect(e1.code).toBe('HYDRA_ERR_UNKNOWN_KEY');
    expect(e1.keys).toEqual(['nonsense_key']);
    const e2 = await code(c.configure({ port: 9, n_ctx: 512 }));
    expect(e2.code).toBe('HYDRA_ERR_T4_FIELD');
    expect(e2.keys).toEqual(['port']);
    const e3 = await code(c.configure({ 'sampling.top_k': 'many' }));
    expect(e3.code).toBe('HYDRA_ERR_BAD_VALUE');
    const e4 = await code(c.configure({ model: join(dirname(model), 'missing.gguf') }));
    expect(e4.code).toBe('HYDRA_ERR_UNKNOWN_MODEL');
    const after = (await c.status()) as any;
    expect(after.applied).toEqual(before.applied);
    expect(after.epoch).toBe(before.epoch);
  });

  it('CONFIGURE with unreachable rpc_servers fails and keeps the running state', async () => {
    const c = await client(aPort, encoding);
    const before = (await c.status()) as any;
    const dead = await freePort();
    const e = await code(c.configure({ rpc_servers: [`127.0.0.1:${dead}`] }));
    expect(e.code).toBe('HYDRA_ERR_PEER_UNREACHABLE');
    const after = (await c.status()) as any;
    expect(after.state).toBe('ready');
    expect(after.epoch).toBe(before.epoch);
    expect(after.applied).toEqual(before.applied);
    const r = await complete(a.url, { prompt: 'still serving', max_tokens: 3 });
    expect(r.status).toBe(200);
  });

  it('PLAN applies nothing', async () => {
    const c = await client(aPort, encoding);
    const before = (await c.status()) as any;
    const n = before.applied.n_ctx === 2048 ? 1536 : 2048;
    const p = await c.plan({ n_ctx: n, 'sampling.top_k': 5 });
    expect(p.tier).toBe('T2');
    expect(p.rebuild).toBe('context');
    expect(p.changes).toEqual(
      expect.arrayContaining([
        { key: 'n_ctx', from: before.applied.n_ctx, to: n, tier: 'T2' },
        expect.objectContaining({ key: 'sampling.top_k', to: 5, tier: 'T1' }),
      ]),
    );
    expect((await code(c.plan({ host: 'x' }))).code).toBe('HYDRA_ERR_T4_FIELD');
    const after = (await c.status()) as any;
    expect(after.applied).toEqual(before.applied);
    expect(after.epoch).toBe(before.epoch);
  });

  it('legacy state_chunk_size answers T1 with the clamped value, and sets the STATE_GET chunk', async () => {
    const c = await client(aPort, encoding);
    const r = await c.configure({ state_chunk_size: 1000 });
    expect(r.tier).toBe('T1');
    expect(r.params_applied).toEqual({ state_chunk_size: 65536 });
    expect(r.state_chunk_size_applied).toBe(65536);
    const big = await c.configure({ state_chunk_size: 1 << 30 });
    expect(big.state_chunk_size_applied).toBe(64 * 1024 * 1024);
    await c.configure({ state_chunk_size: 65536 });
    await complete(a.url, { prompt: 'chunk me', max_tokens: 4, slot_id: 1, cache_prompt: true });
    const first = await c.stateGet({ slot: 1 });
    expect(first.offset).toBe(0);
    expect(first.data.length).toBe(Math.min(65536, first.total));
  });

  it('T2 CONFIGURE on an idle engine rebuilds the context at once', async () => {
    const c = await client(aPort, encoding);
    const n = encoding === 'json' ? 2048 : 1024;
    const before = (await c.status()) as any;
    const r = await c.configure({ n_ctx: n });
    expect(r.tier).toBe(before.applied.n_ctx === n ? 'none' : 'T2');
    expect(r.deferred_keys).toEqual([]);
    const st = (await c.status()) as any;
    expect(st.slots.n_ctx_seq).toBe(n / 2);
    const res = await complete(a.url, { prompt: 'after rebuild', max_tokens: 3 });
    expect(res.status).toBe(200);
    expect(Number(res.epoch)).toBe(st.epoch);
  });

  it('STATE_GET / STATE_PUT error paths', async () => {
    const c = await client(aPort, encoding);
    expect((await code(c.stateGet({ slot: 9 }))).code).toBe('HYDRA_ERR_BAD_VALUE');
    expect((await code(c.stateGet({ slot: 0, chunk_size: 0 }))).code).toBe('HYDRA_ERR_BAD_VALUE');
    expect((await code(c.statePut({ slot: 0, offset: 5, total: 10, data: new Uint8Array(5) }))).code).toBe(
      'HYDRA_ERR_BAD_VALUE',
    );
    expect((await code(c.statePut({ slot: 0, offset: 0, total: 4, data: new Uint8Array(8) }))).code).toBe(
      'HYDRA_ERR_BAD_VALUE',
    );
    const junk = new Uint8Array(64).fill(7);
    expect((await code(c.statePut({ slot: 0, offset: 0, total: 64, data: junk }))).code).toBe(
      'HYDRA_ERR_STATE_INVALID',
    );
    const raw = await c.request(0x43, { slot: 0, offset: 0, total: 4 });
    expect(raw.success).toBe(false);
  });

  it('SET_EXPERT_MODE: bad mode and dense model', async () => {
    const c = await client(aPort, encoding);
    expect((await code(c.setExpertMode('both' as 'solo'))).code).toBe('HYDRA_ERR_BAD_VALUE');
    expect((await code(c.setExpertMode('combined'))).code).toBe('HYDRA_ERR_NOT_MOE');
  });

  it('PIPELINE_ATTACH is retired', async () => {
    const c = await client(aPort, encoding);
    expect((await code(c.pipelineAttach())).code).toBe('HYDRA_ERR_RETIRED');
  });
});

describe('SWAP_QUANT and SET_EXPERT_MODE on other models', () => {
  it('swaps to another quantization and refuses another shape', async () => {
    const c = await client(aPort, 'msgpack');
    const q4 = await variant(model, 'llama', 'q4_0');
    const moe = await variant(model, 'moe', 'q8_0');
    const e = await code(c.swapQuant(moe));
    expect(e.code).toBe('HYDRA_ERR_QUANT_PARITY');
    expect(e.keys).toEqual(['n_expert']);
    expect((await code(c.swapQuant(join(dirname(model), 'nope.gguf')))).code).toBe('HYDRA_ERR_UNKNOWN_MODEL');
    const before = (await c.status()).epoch;
    const r = await c.swapQuant(q4);
    expect(r.tier).toBe('T3');
    expect(r.epoch).toBe(before + 1);
    const st = await c.status();
    expect(st.model!.path).toBe(q4);
    expect((await complete(a.url, { prompt: 'q4 now', max_tokens: 3 })).status).toBe(200);
    const back = await c.swapQuant(model);
    expect(back.tier).toBe('T3');
  });
});

describe('lazy load and the /control routes', () => {
  it('a model-less engine loads on its first CONFIGURE with a registry alias', async () => {
    const cfg = join(dirname(model), 'registry.yaml');
    writeFileSync(cfg, `models:\n  tiny:\n    path: ${model}\n`);
    const port = await freePort();
    const e = await engineWith(['--config', cfg, '--rpc-port', String(port), '-c', '512']);
    try {
      const c = await client(port, 'json');
      const st0 = await c.status();
      expect(st0.state).toBe('empty');
      expect(st0.model).toBeNull();
      expect((await code(c.configure({ model: 'no-such-alias' }))).code).toBe('HYDRA_ERR_UNKNOWN_MODEL');
      const r = await c.configure({ model: 'tiny' });
      expect(r.tier).toBe('T3');
      expect(r.deferred_keys).toEqual([]);
      const st = await c.status();
      expect(st.state).toBe('ready');
      expect(st.model!.path).toBe(model);
      expect((await c.configure({ model: 'tiny' })).tier).toBe('none');
      expect((await complete(e.url, { prompt: 'lazy', max_tokens: 3 })).status).toBe(200);
    } finally {
      await e.close();
    }
  });

  it('serves /control/status, configure, load_model and set_expert_mode', async () => {
    const st = await fetch(`${a.url}/control/status`);
    expect(st.status).toBe(200);
    const body = (await st.json()) as any;
    expect(body).toMatchObject({ success: true, state: 'ready' });
    const cfg = await fetch(`${a.url}/control/configure`, {
      method: 'POST',
      body: JSON.stringify({ 'sampling.top_p': 0.8 }),
    });
    expect(await cfg.json()).toMatchObject({ success: true, tier: 'T1' });
    const bad = await fetch(`${a.url}/control/configure`, {
      method: 'POST',
      body: JSON.stringify({ port: 1 }),
    });
    expect(bad.status).toBe(400);
    expect(((await bad.json()) as any).error.code).toBe('HYDRA_ERR_T4_FIELD');
    // keep_layer_range is refused by name before anything changes (issue 22: llama.cpp cannot load
    // only some blocks within the patch budget); a misspelled key is not ignored either.
    const epoch0 = ((await (await fetch(`${a.url}/control/status`)).json()) as any).epoch;
    for (const [extra, want] of [
      [{ keep_layer_range: { lo: 1, hi: 2 } }, 'HYDRA_ERR_UNSUPPORTED_FIELD'],
      [{ keep_layer_range: { lo: 3, hi: 9 } }, 'HYDRA_ERR_UNSUPPORTED_FIELD'],
      [{ keep_layers: { lo: 1, hi: 2 } }, 'HYDRA_ERR_UNKNOWN_KEY'],
    ] as const) {
      const r = await fetch(`${a.url}/control/load_model`, {
        method: 'POST',
        body: JSON.stringify({ model, ...extra }),
      });
      expect(r.status).toBe(400);
      expect(((await r.json()) as any).error).toMatchObject({ code: want, keys: Object.keys(extra) });
    }
    const st1 = (await (await fetch(`${a.url}/control/status`)).json()) as any;
    expect(st1.epoch).toBe(epoch0);
    expect(st1.applied.override_tensors ?? []).toEqual([]);
    const lm = await fetch(`${a.url}/control/load_model`, {
      method: 'POST',
      body: JSON.stringify({ model }),
    });
    const lmb = (await lm.json()) as any;
    expect(lmb).toMatchObject({ success: true, loaded: true });
    expect(lmb).not.toHaveProperty('keep_layer_range');
    // Every tensor of the GGUF header, none left out.
    expect(lmb.n_tensors).toBe((await readGgufFile(model)).tensors.length);
    expect(lmb.size_mb).toBeGreaterThan(0);
    const em = await fetch(`${a.url}/control/set_expert_mode`, {
      method: 'POST',
      body: JSON.stringify({ mode: 'solo' }),
    });
    expect(em.status).toBe(409);
    expect(((await em.json()) as any).error.code).toBe('HYDRA_ERR_NOT_MOE');
    expect((await fetch(`${a.url}/control/configure`)).status).toBe(405);
  });

  it('refuses /control from outside --control-allow-from', async () => {
    const e = await engineWith(['--control-allow-from', '10.0.0.0/8']);
    try {
      const r = await fetch(`${e.url}/control/status`);
      expect(r.status).toBe(403);
      expect(((await r.json()) as any).error.code).toBe('HYDRA_ERR_FORBIDDEN');
      expect((await fetch(`${e.url}/health`)).status).toBe(200);
    } finally {
      await e.close();
    }
  });
});

// Last: upstream keeps an RPC device registered for the whole process and aborts when a later load
// cannot reach it, so the peer lives until every engine of this file is closed.
describe('SET_EXPERT_MODE with a peer', () => {
  it('SET_EXPERT_MODE on an MoE model: no peer, then a real peer', async () => {
    const moe = await variant(model, 'moe', 'q8_0');
    const headPort = await freePort();
    // The stock ggml-rpc-server of the same pin, in its own process.
    peer = await stockRpcServer();
    const head = await engineWith(['-m', moe, '-np', '1', '-c', '512', '--rpc-port', String(headPort)]);
    try {
      const c = await client(headPort, 'json');
      expect((await code(c.setExpertMode('combined'))).code).toBe('HYDRA_ERR_NO_PEER');
      const r = await c.configure({ rpc_servers: [peer.endpoint], n_gpu_layers: 0 });
      expect(r.tier).toBe('T3');
      expect((await c.status()).mode).toBe('combined');
      const m = await c.setExpertMode('solo');
      expect(m).toMatchObject({ mode: 'solo', previous: 'combined', reloaded: false });
      expect(m.switch_ms).toBeGreaterThanOrEqual(0);
      expect((await c.status()).mode).toBe('solo');
      expect((await complete(head.url, { prompt: 'moe', max_tokens: 3 })).status).toBe(200);
    } finally {
      await head.close();
    }
  });
});
