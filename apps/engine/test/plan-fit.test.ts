import { writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { HydraClient } from '@hydra-engine/hydra-rpc';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseServeArgs } from '../src/args.js';
import { complete, freePort, variant } from './control-helpers.js';
import { engineWith, runCli, tinyModel } from './helpers.js';

// PLAN's fit verdict, CONFIGURE's refusal of what will not fit (before anything is unloaded),
// "auto" offload, and registry defaults by alias, on a CPU host: the host is the device `CPU`,
// capped with device_memory_cap.
type Running = Awaited<ReturnType<typeof engineWith>>;
let model: string;
let other: string;
let a: Running;
let rpcPort: number;
const MIB = 1024 * 1024;

async function code(p: Promise<unknown>): Promise<{ code: string; keys?: string[]; details?: any }> {
  try {
    await p;
  } catch (err) {
    return err as { code: string };
  }
  throw new Error('expected a rejection');
}

beforeAll(async () => {
  model = await tinyModel();
  other = await variant(model, 'llama', 'f16');
  const cfg = join(dirname(model), 'fit.yaml');
  writeFileSync(cfg, `models:\n  tiny2:\n    path: ${other}\n    n_ctx: 768\n    cache_type_k: q8_0\n`);
  rpcPort = await freePort();
  a = await engineWith(['-m', model, '-c', '1024', '--config', cfg, '--rpc-port', String(rpcPort)]);
}, 60_000);
afterAll(async () => {
  await a?.close();
});

describe('PLAN answers the fit question', () => {
  it('per device weights, KV, compute, free, headroom and fits, applying nothing', async () => {
    const epoch = a.engine.epoch;
    const p = (await a.controller.plan({ n_ctx: 2048 })) as any;
    expect(p.rebuild).toBe('context');
    expect(p.fit.fits).toBe(true);
    const d = p.fit.devices[0];
    expect(d.name).toBe('CPU');
    expect(d.weight_bytes).toBeGreaterThan(0);
    // tiny llama: 4 layers x 2048 cells x (K + V) f16 rows of n_embd_k_gqa.
    expect(d.kv_bytes).toBeGreaterThan(0);
    expect(d.available_bytes - d.headroom_bytes).toBe(
      d.weight_bytes + d.kv_bytes + d.recurrent_bytes + d.compute_bytes + d.margin_bytes,
    );
    // The context in force is freed first: it counts as held.
    expect(d.held_bytes).toBeGreaterThan(0);
    expect(p.fit.n_ctx).toBe(2048);
    expect(a.engine.epoch).toBe(epoch);
  });

  it('tensor overrides make the figures approximate: fits null, nothing refused for them', async () => {
    const p = (await a.controller.plan({
      model: other,
      device_memory_cap: ['CPU=1'],
      override_tensors: ['token_embd=CPU'],
    })) as any;
    expect(p.fit.fits).toBe(null);
    expect(p.fit.predicted_fits).toBe(false);
    expect(p.fit.reason).toMatch(/override_tensors/);
    expect(p.fit.devices[0].name).toBe('CPU');
  });

  it('a capped device that cannot hold the model does not fit; the largest category is named binding', async () => {
    const p = (await a.controller.plan({ model: other, device_memory_cap: ['CPU=1'] })) as any;
    expect(p.rebuild).toBe('model');
    expect(p.fit.fits).toBe(false);
    expect(p.fit.devices[0]).toMatchObject({
      name: 'CPU',
      cap_bytes: MIB,
      available_bytes: MIB,
      fits: false,
    });
    const d = p.fit.devices[0];
    const parts: [string, number][] = [
      ['weights', d.weight_bytes],
      ['kv', d.kv_bytes],
      ['recurrent', d.recurrent_bytes],
      ['compute', d.compute_bytes],
    ];
    expect(d.binding).toBe(parts.reduce((x, y) => (y[1] > x[1] ? y : x))[0]);
  });
});

describe.each(['json', 'msgpack'] as const)('over the Hydra port (%s)', (encoding) => {
  it('PLAN carries fit; a refused CONFIGURE carries the figures in error.details', async () => {
    const c = await HydraClient.connect({ port: rpcPort, encoding, timeoutMs: 30_000 });
    try {
      const p = (await c.plan({ model: other, device_memory_cap: ['CPU=1'] })) as any;
      expect(p.fit.fits).toBe(false);
      expect(p.fit.devices[0]).toMatchObject({ name: 'CPU', cap_bytes: MIB });
      const e = await code(c.configure({ model: other, device_memory_cap: ['CPU=1'] }));
      expect(e.code).toBe('HYDRA_ERR_WONT_FIT');
      expect(e.details.devices[0]).toMatchObject({ name: 'CPU', fits: false });
      expect(a.engine.modelPath).toBe(model);
    } finally {
      c.close();
    }
  });
});

describe('CONFIGURE refuses what will not fit before unloading anything', () => {
  it('HYDRA_ERR_WONT_FIT with per-device figures; the running model keeps answering', async () => {
    const before = { epoch: a.engine.epoch, path: a.engine.modelPath };
    const e = await code(a.controller.configure({ model: other, device_memory_cap: ['CPU=1'] }));
    expect(e.code).toBe('HYDRA_ERR_WONT_FIT');
    expect(e.details.fits).toBe(false);
    expect(e.details.devices[0]).toMatchObject({ name: 'CPU', fits: false, cap_bytes: MIB });
    expect(a.engine.epoch).toBe(before.epoch);
    expect(a.engine.modelPath).toBe(before.path);
    expect(a.engine.state).toBe('ready');
    expect(a.engine.layers.get('device_memory_cap')).toEqual([]);
    const r = await complete(a.url, { prompt: 'still serving', max_tokens: 3 });
    expect(r.status).toBe(200);
  });

  it('force_fit loads it anyway and says so; force_fit must be a boolean', async () => {
    expect((await code(a.controller.configure({ model: other, force_fit: 'yes' }))).keys).toEqual([
      'force_fit',
    ]);
    const r = await a.controller.configure({ model: other, device_memory_cap: ['CPU=1'], force_fit: true });
    expect(r.forced).toBe(true);
    expect((r.fit as any).fits).toBe(false);
    expect(a.engine.modelPath).toBe(other);
    const back = await a.controller.configure({ model, device_memory_cap: [] });
    expect(back.forced).toBeUndefined();
    expect((back.fit as any).fits).toBe(true);
    expect(a.engine.modelPath).toBe(model);
  });

  it('an "auto" choice that fits nowhere is refused before the unload, force_fit or not', async () => {
    const epoch = a.engine.epoch;
    for (const force of [false, true]) {
      const e = await code(
        a.controller.configure({ n_gpu_layers: 'auto', device_memory_cap: ['CPU=1'], force_fit: force }),
      );
      expect(e.code).toBe('HYDRA_ERR_WONT_FIT');
    }
    expect(a.engine.epoch).toBe(epoch);
    expect(a.engine.state).toBe('ready');
  });

  it('n_gpu_layers "auto" loads with the offload count the planner chose (all on the host here)', async () => {
    const r = await a.controller.configure({ n_gpu_layers: 'auto' });
    expect(r.params_applied).toMatchObject({ n_gpu_layers: 'auto' });
    expect(r.auto_chosen).toEqual({ tensor_split: [], n_gpu_layers: -1 });
    expect(a.engine.state).toBe('ready');
    const c = await complete(a.url, { prompt: 'auto', max_tokens: 2 });
    expect(c.status).toBe(200);
    await a.controller.configure({ n_gpu_layers: -1 });
  });
});

describe('registry defaults by alias', () => {
  it('apply under the request keys, with provenance', async () => {
    const r = await a.controller.configure({ model: 'tiny2' });
    expect(r.defaults_applied).toEqual({ n_ctx: 'registry:tiny2', cache_type_k: 'registry:tiny2' });
    expect(a.engine.layers.get('n_ctx')).toBe(768);
    expect(a.engine.layers.get('cache_type_k')).toBe('q8_0');
    const own = await a.controller.configure({ model: 'tiny2', n_ctx: 512 });
    expect(own.defaults_applied).toEqual({ cache_type_k: 'registry:tiny2' });
    expect(a.engine.layers.get('n_ctx')).toBe(512);
    const p = (await a.controller.plan({ model: 'tiny2', n_ctx: 640 })) as any;
    expect(p.defaults_applied).toEqual({ cache_type_k: 'registry:tiny2' });
    await a.controller.configure({ model, n_ctx: 1024, cache_type_k: 'f16' });
  });
});

describe('registry defaults at startup (-m ALIAS)', () => {
  it('apply above the config file keys and below the flags', () => {
    const cfg = join(dirname(model), 'fit-start.yaml');
    writeFileSync(
      cfg,
      `n_ctx: 4096\nmodels:\n  tiny2:\n    path: ${other}\n    n_ctx: 768\n    cache_type_k: q8_0\n`,
    );
    const byAlias = parseServeArgs(['--config', cfg, '-m', 'tiny2']);
    expect(byAlias.layers.get('n_ctx')).toBe(768);
    expect(byAlias.layers.get('cache_type_k')).toBe('q8_0');
    expect(byAlias.defaultsApplied).toEqual({ n_ctx: 'registry:tiny2', cache_type_k: 'registry:tiny2' });
    const flagged = parseServeArgs(['--config', cfg, '-m', 'tiny2', '-c', '512']);
    expect(flagged.layers.get('n_ctx')).toBe(512);
    expect(flagged.defaultsApplied).toEqual({ cache_type_k: 'registry:tiny2' });
    const byPath = parseServeArgs(['--config', cfg, '-m', other]);
    expect(byPath.layers.get('n_ctx')).toBe(4096);
    expect(byPath.defaultsApplied).toEqual({});
  });
});

describe('hydra-engine plan', () => {
  it('prints the fit table, exits 1 when it does not fit, 0 when it does; --json; --help', async () => {
    const ok = await runCli([
      'plan',
      '-m',
      model,
      '--device',
      'RPC0=4096',
      '--device',
      'CUDA0=4096',
      '-ts',
      'auto',
    ]);
    expect(ok.code).toBe(0);
    expect(ok.out).toMatch(/device\s+layers\s+weights\s+kv\s+recurrent\s+compute\s+free\s+headroom\s+fits/);
    expect(ok.out).toContain('(auto)');
    const no = await runCli(['plan', '-m', model, '--device', 'CUDA0=1', '--json']);
    expect(no.code).toBe(1);
    const j = JSON.parse(no.out);
    expect(j.fits).toBe(false);
    expect(j.devices[0]).toMatchObject({ name: 'CUDA0', fits: false });
    const capped = await runCli([
      'plan',
      '-m',
      model,
      '--device',
      'CUDA0=4096',
      '--device-memory-cap',
      'CUDA0=1',
    ]);
    expect(capped.code).toBe(1);
    expect(capped.out).toMatch(/does NOT fit: CUDA0 short by/);
    for (const sub of ['plan', 'bench-client', 'demo', 'synth-model', 'rpc-host', 'serve']) {
      const h = await runCli([sub, '--help']);
      expect([sub, h.code]).toEqual([sub, 0]);
      expect(h.out).toContain(sub === 'synth-model' ? 'synth' : sub === 'serve' ? '--port' : sub);
    }
    const bad = await runCli(['plan', '-m', model, '--device', 'X=1', '--device-memory-cap', 'Y=1']);
    expect(bad.code).toBe(2);
  }, 60_000);
});
