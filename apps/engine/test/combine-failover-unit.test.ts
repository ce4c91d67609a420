import type { Device } from '@hydra-engine/native-ggml';
import { planSplit } from '@hydra-engine/resolver';
import { defaults } from '@hydra-engine/tiering';
import { beforeAll, describe, expect, it } from 'vitest';
import { decideFailover, memoryCaps } from '../src/combine/failover.js';
import { portGone, watchPeers } from '../src/combine/load-watch.js';
import { PeerRejoin } from '../src/combine/rejoin.js';
import { modelFacts } from '../src/placement.js';
import { tinyModel } from './helpers.js';

const MIB = 1024 * 1024;
const dev = (name: string, type: Device['type'], freeMib: number): Device => ({
  name,
  description: name,
  type,
  free: freeMib * MIB,
  total: freeMib * MIB,
  bufferType: name,
});

describe('failover decision (failover_policy over the planner and the local devices)', () => {
  let facts: Awaited<ReturnType<typeof modelFacts>>;
  const cfg = { ...defaults(), n_ctx: 4096, n_gpu_layers: -1 };
  beforeAll(async () => {
    facts = await modelFacts(await tinyModel());
  });
  // What the planner says SOLO needs on one device, with the decision's options.
  const soloNeed = (margin: number) =>
    planSplit(facts, { devices: [{ name: 'X', freeBytes: 0 }], nCtx: 4096, marginBytes: margin }).devices[0]!
      .totalBytes;

  it('auto is solo when the configuration fits the local device (host without GPUs: the CPU)', () => {
    const d = decideFailover(facts, cfg, [dev('CPU', 'cpu', 1)], 8192 * MIB);
    expect(d).toMatchObject({ requested: 'auto', policy: 'solo', solo_fits: true });
    expect(d.devices).toEqual([{ name: 'CPU', available_bytes: 8192 * MIB, capped: false }]);
  });

  it('auto is offload with the most layers that fit when a cap makes SOLO not fit', () => {
    const need = soloNeed(0);
    const capMib = Math.floor(need / MIB) - 1;
    expect(capMib).toBeGreaterThan(0);
    const d = decideFailover(facts, { ...cfg, device_memory_cap: [`CPU=${capMib}`] }, [], 8192 * MIB);
    expect(d.policy).toBe('offload');
    expect(d.solo_fits).toBe(false);
    const all = facts.nLayerAll + 1;
    expect(d.n_gpu_layers).toBeLessThan(all);
    // The largest count the planner fits under the cap, and one more does not fit.
    const fits = (n: number) =>
      planSplit(facts, {
        devices: [{ name: 'CPU', freeBytes: capMib * MIB }],
        nCtx: 4096,
        nGpuLayers: n,
        marginBytes: 0,
      }).fits;
    if (d.n_gpu_layers! > 0) expect(fits(d.n_gpu_layers!)).toBe(true);
    expect(fits(d.n_gpu_layers! + 1)).toBe(false);
    expect(d.devices[0]).toEqual({ name: 'CPU', available_bytes: capMib * MIB, capped: true });
  });

  it('plans on local GPUs, never on RPC devices, with the GPU margin', () => {
    const need = soloNeed(256 * MIB);
    const gpuMib = Math.ceil(need / MIB) + 1;
    const devices = [dev('RPC0', 'gpu', 100_000), dev('CUDA0', 'gpu', gpuMib), dev('CPU', 'cpu', 1)];
    const d = decideFailover(facts, cfg, devices, 1);
    expect(d.devices.map((x) => x.name)).toEqual(['CUDA0']);
    expect(d.policy).toBe('solo');
    const small = decideFailover(facts, cfg, [dev('CUDA0', 'gpu', gpuMib - 2)], 1);
    expect(small.policy).toBe('offload');
    expect(small.n_gpu_layers).toBeLessThan(facts.nLayerAll + 1);
  });

  it('solo and none are taken as asked, whatever fits', () => {
    const capped = { ...cfg, device_memory_cap: ['CPU=1'] };
    expect(decideFailover(facts, { ...capped, failover_policy: 'solo' }, [], 8192 * MIB)).toMatchObject({
      policy: 'solo',
      solo_fits: false,
    });
    expect(decideFailover(facts, { ...cfg, failover_policy: 'none' }, [], 8192 * MIB)).toMatchObject({
      requested: 'none',
      policy: 'none',
      solo_fits: true,
    });
    expect(decideFailover(facts, { ...capped, failover_policy: 'offload' }, [], 8192 * MIB).policy).toBe(
      'offload',
    );
  });

  it('memoryCaps reads NAME=MiB and refuses a name given twice', () => {
    expect([...memoryCaps(['CPU=2', 'CUDA0=3'])]).toEqual([
      ['CPU', 2 * MIB],
      ['CUDA0', 3 * MIB],
    ]);
    expect(() => memoryCaps(['CPU=2', 'CPU=3'])).toThrow(
      expect.objectContaining({ code: 'HYDRA_ERR_BAD_VALUE', keys: ['device_memory_cap'] }),
    );
    expect(() => memoryCaps(['CPU'])).toThrow(expect.objectContaining({ code: 'HYDRA_ERR_BAD_VALUE' }));
  });
});

describe('PeerRejoin (probe backoff, idle wait, bound)', () => {
  const wait = (ms: number) => new Promise((r) => setTimeout(r, ms));

  it('backs off while the peer does not answer, then restores once, at an idle moment', async () => {
    const probedAt: number[] = [];
    let answers = false;
    let idle = false;
    let restored = 0;
    const started = performance.now();
    const r = new PeerRejoin({
      peers: ['127.0.0.1:1'],
      probe: async () => {
        probedAt.push(performance.now() - started);
        if (!answers) throw new Error('ECONNREFUSED');
      },
      restore: async () => {
        restored++;
      },
      idle: () => idle,
      active: () => restored === 0,
      initialDelayMs: 20,
      maxDelayMs: 80,
      idlePollMs: 5,
    });
    await wait(400);
    expect(restored).toBe(0);
    expect(r.state.probes).toBe(probedAt.length);
    expect(r.state.last_error).toMatch(/ECONNREFUSED/);
    // Delays double from 20 ms and stop growing at 80 ms.
    const gaps = probedAt.slice(1).map((t, i) => t - probedAt[i]!);
    expect(gaps[0]).toBeGreaterThanOrEqual(35);
    expect(Math.max(...gaps)).toBeLessThan(80 + 60);
    expect(r.state.next_probe_ms).toBe(80);
    answers = true;
    await wait(200);
    expect(restored).toBe(0); // not idle yet
    idle = true;
    await wait(50);
    expect(restored).toBe(1);
    expect(r.state.next_probe_ms).toBeUndefined();
    await wait(200);
    expect(restored).toBe(1);
  });

  it('a failed restore counts as a failed probe; maxProbes ends the probing', async () => {
    let restores = 0;
    const r = new PeerRejoin({
      peers: ['127.0.0.1:1', '127.0.0.1:2'],
      probe: async () => undefined,
      restore: async () => {
        restores++;
        throw new Error('the peer went away again');
      },
      idle: () => true,
      active: () => true,
      initialDelayMs: 5,
      maxDelayMs: 10,
      maxProbes: 3,
    });
    await wait(300);
    expect(restores).toBe(3);
    expect(r.state).toMatchObject({
      probes: 3,
      gave_up: true,
      last_error: 'restore: the peer went away again',
    });
  });

  it('stops when the loss it serves is over (active false) and refuses bad options by name', async () => {
    let probes = 0;
    let active = true;
    const r = new PeerRejoin({
      peers: ['127.0.0.1:1'],
      probe: async () => {
        probes++;
        throw new Error('no');
      },
      restore: async () => undefined,
      idle: () => true,
      active: () => active,
      initialDelayMs: 5,
      maxDelayMs: 5,
    });
    await wait(60);
    active = false;
    await wait(30);
    const seen = probes;
    await wait(60);
    expect(probes).toBe(seen);
    expect(r.state.next_probe_ms).toBeUndefined();
    const base = {
      peers: ['a:1'],
      probe: async () => 0,
      restore: async () => undefined,
      idle: () => true,
      active: () => false,
    };
    expect(() => new PeerRejoin({ ...base, maxDelayMs: 0 })).toThrow(
      expect.objectContaining({ code: 'HYDRA_ERR_BAD_ARGUMENT' }),
    );
    expect(() => new PeerRejoin({ ...base, peers: [] })).toThrow(
      expect.objectContaining({ code: 'HYDRA_ERR_BAD_ARGUMENT' }),
    );
  });
});

describe('watchPeers (peer loss while a load or a context build runs)', () => {
  const never = () => new Promise<string>(() => undefined);

  it('a newly parked ggml-RPC thread ends the call with PEER_LOST; what it returns later is abandoned', async () => {
    let parked = 3;
    let release: (v: string) => void = () => undefined;
    const work = new Promise<string>((r) => {
      release = r;
    });
    const abandoned: string[] = [];
    const p = watchPeers(['127.0.0.1:1'], 'the model load', work, (v) => abandoned.push(v), {
      intervalMs: 5,
      parked: () => parked,
      gone: async () => undefined,
    });
    setTimeout(() => {
      parked = 4;
    }, 30);
    await expect(p).rejects.toMatchObject({
      code: 'HYDRA_ERR_PEER_LOST',
      details: { peers: ['127.0.0.1:1'] },
    });
    release('model');
    await new Promise((r) => setTimeout(r, 10));
    expect(abandoned).toEqual(['model']);
  });

  it('a refused port ends it too; a live peer (or none configured) leaves the call alone', async () => {
    const refused = watchPeers(['127.0.0.1:1'], 'the context build', never(), () => undefined, {
      intervalMs: 5,
      probeMs: 10,
      parked: () => 0,
      gone: async () => 'connect ECONNREFUSED',
    });
    await expect(refused).rejects.toMatchObject({ code: 'HYDRA_ERR_PEER_LOST' });
    const ok = watchPeers(['127.0.0.1:1'], 'the model load', Promise.resolve('m'), () => undefined, {
      parked: () => 0,
      gone: async () => 'x',
    });
    await expect(ok).resolves.toBe('m');
    await expect(watchPeers([], 'x', Promise.resolve(1), () => undefined)).resolves.toBe(1);
  });

  it('portGone names a port nothing listens on and passes one that accepts', async () => {
    const { createServer } = await import('node:net');
    const srv = createServer((s) => s.destroy());
    await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
    const port = (srv.address() as { port: number }).port;
    expect(await portGone(`127.0.0.1:${port}`, 1000)).toBeUndefined();
    await new Promise<void>((r) => srv.close(() => r()));
    expect(await portGone(`127.0.0.1:${port}`, 1000)).toMatch(/ECONNREFUSED/);
  });
});
