import { type EngineProcess, freePort, spawnEngine } from '@hydra-engine/test-kit';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { engineWith, tinyModel } from './helpers.js';

// tensor_split "auto" over two CPU-backed ggml-RPC devices (two peer engines on loopback), the
// head's share (RPC1, the last device: llama.cpp lists devices in --rpc order) capped with
// device_memory_cap. n_ctx 8192 makes a layer's KV 8 MiB, so a cap in whole MiB separates
// "3 slots fit" from "4 slots fit".
const MIB = 1024 * 1024;
type Peer = Awaited<ReturnType<typeof engineWith>>;
const peers: Peer[] = [];
let head: EngineProcess | undefined;
let url = '';

async function post(path: string, body: object): Promise<any> {
  const res = await fetch(`${url}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  return res.json();
}

const status = async () => (await fetch(`${url}/control/status`).then((r) => r.json())) as any;

beforeAll(async () => {
  const model = await tinyModel();
  const ports: number[] = [];
  for (let i = 0; i < 2; i++) {
    const p = await freePort();
    peers.push(await engineWith(['--rpc-port', String(p)]));
    ports.push(p);
  }
  head = await spawnEngine(
    ['-t', '1', '-m', model, '-c', '8192', '-np', '1', '--rpc', ports.map((p) => `127.0.0.1:${p}`).join(',')],
    { timeoutMs: 90_000 },
  );
  url = head.url;
}, 120_000);

afterAll(async () => {
  await head?.stop(0);
  for (const p of peers) await p.close();
});

describe('tensor_split auto on capped CPU devices', () => {
  it('gives RPC1 the largest share that fits its cap; one layer more is refused before the unload', async () => {
    // What RPC1 needs for the last 3 slots (layers 2-3 + output) and for 4 (layers 1-3 + output).
    const need = async (split: number[]) => {
      const p = await post('/control/plan', { tensor_split: split });
      expect(p.success).toBe(true);
      const d = p.fit.devices.find((x: any) => x.name === 'RPC1');
      return { bytes: d.weight_bytes + d.kv_bytes + d.recurrent_bytes + d.compute_bytes, layers: d.layers };
    };
    const three = await need([2, 3]);
    const four = await need([1, 4]);
    expect(three.layers).toEqual({ first: 2, last: 3, count: 2 });
    expect(four.layers).toEqual({ first: 1, last: 3, count: 3 });
    const capMib = Math.ceil(three.bytes / MIB);
    expect(capMib * MIB).toBeLessThan(four.bytes);

    const r = await post('/control/configure', {
      tensor_split: 'auto',
      device_memory_cap: [`RPC1=${capMib}`],
    });
    expect(r.success).toBe(true);
    expect(r.fit.fits).toBe(true);
    expect(r.auto_chosen.tensor_split).toHaveLength(2);
    const st = await status();
    const rpc1 = st.placement.find((row: any) => row.device === 'RPC1');
    expect(rpc1).toMatchObject({ first: 2, last: 3, output: true });
    expect(st.applied.tensor_split).toBe('auto');

    const epoch = st.epoch;
    const refused = await post('/control/configure', { tensor_split: [1, 4] });
    expect(refused.success).toBe(false);
    expect(refused.error.code).toBe('HYDRA_ERR_WONT_FIT');
    const short = refused.error.details.devices.find((d: any) => d.name === 'RPC1');
    expect(short).toMatchObject({
      fits: false,
      cap_bytes: capMib * MIB,
      layers: { first: 1, last: 3, count: 3 },
    });
    const after = await status();
    expect(after.epoch).toBe(epoch);
    expect(after.state).toBe('ready');
    const res = await fetch(`${url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: 'still', max_tokens: 3, temperature: 0 }),
    });
    expect(res.status).toBe(200);
  }, 120_000);

  it("STATUS memory is what llama.cpp allocated per device: weights and KV within 2% of the plan's, compute within 10%", async () => {
    const plan = await post('/control/plan', {});
    expect(plan.success).toBe(true);
    const st = await status();
    expect(Array.isArray(st.memory)).toBe(true);
    for (const name of ['RPC0', 'RPC1']) {
      const d = plan.fit.devices.find((x: any) => x.name === name);
      const rows = st.memory.filter((m: any) => m.device === name);
      expect(rows.length).toBeGreaterThan(0);
      const sum = (k: string) => rows.reduce((a: number, m: any) => a + m[k], 0);
      expect(Math.abs(sum('model_bytes') - d.weight_bytes) / d.weight_bytes).toBeLessThan(0.02);
      expect(Math.abs(sum('context_bytes') - d.kv_bytes) / d.kv_bytes).toBeLessThan(0.02);
      // The compute estimate, within 10% on these RPC devices (fit-check-bench.mjs measures it).
      const compute = sum('compute_bytes');
      expect(Math.abs(compute - d.compute_bytes) / compute).toBeLessThan(0.1);
    }
  }, 60_000);
});
